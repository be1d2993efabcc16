//! Between the resources and the core model: the reconciler works on
//! `proxyfleet_core::proxy` types, the API server stores these.

use k8s_openapi::jiff::Timestamp;
use proxyfleet_core::credential::ProxyCredential;
use proxyfleet_core::proxy::{
    Condition as CoreCondition, ConditionStatus as CoreConditionStatus, ConditionType, Phase,
    ProxyDesired, ProxyStatus as CoreStatus,
};

use crate::crd::{
    CONDITION_MESSAGE_MAX, Condition, ConditionStatus, ProxyPhase, ProxySpec, ProxyStatus,
};

/// The desired state of a Proxy; `user_data` is the content of its
/// user-data Secret (empty without one) and `proxy_auth` the credential in
/// its proxy-auth Secret, both read by the caller.
pub fn desired(
    spec: &ProxySpec,
    user_data: Vec<u8>,
    proxy_auth: Option<ProxyCredential>,
    replace_token: Option<String>,
) -> ProxyDesired {
    ProxyDesired {
        provider: spec.provider.clone(),
        cores: spec.cores,
        memory_mib: spec.memory_mib,
        disk_gib: spec.disk_gib,
        image: spec.image.clone().unwrap_or_default(),
        placement: spec.placement.clone(),
        vlan_tag: spec.network.vlan_tag,
        port: spec.port,
        user_data,
        proxy_auth,
        labels: spec.labels.clone(),
        replace_token,
    }
}

/// The resource status of a core status.
pub fn status_to_crd(status: &CoreStatus) -> ProxyStatus {
    ProxyStatus {
        phase: match status.phase {
            Phase::Pending => ProxyPhase::Pending,
            Phase::Provisioning => ProxyPhase::Provisioning,
            Phase::Running => ProxyPhase::Running,
            Phase::Failed => ProxyPhase::Failed,
            Phase::Deleting => ProxyPhase::Deleting,
        },
        provider_id: status.provider_id.clone(),
        ip: status.ip.clone(),
        port: status.port,
        conditions: status
            .conditions
            .iter()
            .map(|c| Condition {
                type_: format!("{:?}", c.kind),
                status: match c.status {
                    CoreConditionStatus::True => ConditionStatus::True,
                    CoreConditionStatus::False => ConditionStatus::False,
                    CoreConditionStatus::Unknown => ConditionStatus::Unknown,
                },
                // Every pass re-derives every condition from the spec of
                // the generation it records.
                observed_generation: Some(status.observed_generation),
                reason: c.reason.clone(),
                message: Some(bounded(&c.message)).filter(|m| !m.is_empty()),
                last_transition_time: rfc3339(c.last_transition_time),
            })
            .collect(),
        observed_generation: status.observed_generation,
        spec_hash: status.spec_hash.clone(),
        plugin: status.plugin.clone(),
        plugin_version: status.plugin_version.clone(),
        attempts: status.attempts,
        failed_spec_hash: status.failed_spec_hash.clone(),
        flaps: status.flaps,
    }
}

/// The core status of a resource status. Conditions of unknown types
/// (another writer's) are dropped: the reconciler owns only its own.
pub fn status_from_crd(status: &ProxyStatus) -> CoreStatus {
    CoreStatus {
        phase: match status.phase {
            ProxyPhase::Pending => Phase::Pending,
            ProxyPhase::Provisioning => Phase::Provisioning,
            ProxyPhase::Running => Phase::Running,
            ProxyPhase::Failed => Phase::Failed,
            ProxyPhase::Deleting => Phase::Deleting,
        },
        provider_id: status.provider_id.clone(),
        ip: status.ip.clone(),
        port: status.port,
        conditions: status
            .conditions
            .iter()
            .filter_map(|c| {
                let kind = match c.type_.as_str() {
                    "Provisioned" => ConditionType::Provisioned,
                    "Healthy" => ConditionType::Healthy,
                    "Ready" => ConditionType::Ready,
                    _ => return None,
                };
                let status = match c.status {
                    ConditionStatus::True => CoreConditionStatus::True,
                    ConditionStatus::False => CoreConditionStatus::False,
                    ConditionStatus::Unknown => CoreConditionStatus::Unknown,
                };
                let last_transition_time = c
                    .last_transition_time
                    .parse::<Timestamp>()
                    .map_or(0, |t| u64::try_from(t.as_second()).unwrap_or(0));
                Some(CoreCondition {
                    kind,
                    status,
                    reason: c.reason.clone(),
                    message: c.message.clone().unwrap_or_default(),
                    last_transition_time,
                })
            })
            .collect(),
        observed_generation: status.observed_generation,
        spec_hash: status.spec_hash.clone(),
        plugin: status.plugin.clone(),
        plugin_version: status.plugin_version.clone(),
        attempts: status.attempts,
        failed_spec_hash: status.failed_spec_hash.clone(),
        flaps: status.flaps,
    }
}

/// Unix seconds as the RFC 3339 time a condition records.
pub fn rfc3339(unix: u64) -> String {
    Timestamp::from_second(i64::try_from(unix).unwrap_or(i64::MAX))
        .unwrap_or(Timestamp::MAX)
        .to_string()
}

/// `message` cut on a character boundary to what a condition may hold.
fn bounded(message: &str) -> String {
    if message.len() <= CONDITION_MESSAGE_MAX {
        return message.to_owned();
    }
    let mut end = CONDITION_MESSAGE_MAX - '…'.len_utf8();
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &message[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_round_trips_through_the_resource() {
        let mut core = CoreStatus {
            phase: Phase::Running,
            provider_id: Some("vm-9001".into()),
            ip: Some("203.0.113.4".into()),
            port: Some(3128),
            observed_generation: 3,
            spec_hash: Some("abcd".into()),
            plugin: Some("proxmox".into()),
            plugin_version: Some("0.1.0".into()),
            attempts: 2,
            failed_spec_hash: None,
            flaps: 1,
            conditions: Vec::new(),
        };
        core.set_condition(
            ConditionType::Provisioned,
            CoreConditionStatus::True,
            "Running",
            "ok",
            1_700_000_000,
        );
        core.set_condition(
            ConditionType::Ready,
            CoreConditionStatus::False,
            "Unhealthy",
            "probe",
            1_700_000_100,
        );
        let crd = status_to_crd(&core);
        assert_eq!(crd.conditions[0].last_transition_time, "2023-11-14T22:13:20Z");
        assert_eq!(crd.conditions[1].type_, "Ready");
        assert_eq!(crd.conditions[1].status, ConditionStatus::False);
        assert_eq!(crd.conditions[1].observed_generation, Some(3));
        assert_eq!(status_from_crd(&crd), core);
    }

    #[test]
    fn a_message_longer_than_a_condition_holds_is_cut_on_a_character() {
        let long = "é".repeat(CONDITION_MESSAGE_MAX);
        let cut = bounded(&long);
        assert!(cut.len() <= CONDITION_MESSAGE_MAX);
        assert!(cut.ends_with('…'));
        assert_eq!(bounded("short"), "short");
    }

    #[test]
    fn foreign_condition_types_are_left_out() {
        let crd = ProxyStatus {
            conditions: vec![Condition {
                type_: "SomethingElse".into(),
                status: ConditionStatus::True,
                observed_generation: None,
                reason: "X".into(),
                message: None,
                last_transition_time: "2023-11-14T22:13:20Z".into(),
            }],
            ..ProxyStatus::default()
        };
        assert!(status_from_crd(&crd).conditions.is_empty());
    }
}
