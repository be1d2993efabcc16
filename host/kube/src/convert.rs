//! Between the resources and the core model: the reconciler works on
//! `proxyfleet_core::proxy` types, the API server stores these.

use k8s_openapi::jiff::Timestamp;
use proxyfleet_core::credential::ProxyCredential;
use proxyfleet_core::proxy::{
    Condition, ConditionStatus, ConditionType, Phase, ProxyDesired, ProxyStatus as CoreStatus,
};

use crate::crd::{ProxyCondition, ProxyPhase, ProxySpec, ProxyStatus};

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
            .map(|c| ProxyCondition {
                type_: format!("{:?}", c.kind),
                status: format!("{:?}", c.status),
                reason: c.reason.clone(),
                message: Some(c.message.clone()).filter(|m| !m.is_empty()),
                last_transition_time: Timestamp::from_second(
                    i64::try_from(c.last_transition_time).unwrap_or(i64::MAX),
                )
                .map(|t| t.to_string())
                .unwrap_or_default(),
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
                let status = match c.status.as_str() {
                    "True" => ConditionStatus::True,
                    "False" => ConditionStatus::False,
                    _ => ConditionStatus::Unknown,
                };
                let last_transition_time = c
                    .last_transition_time
                    .parse::<Timestamp>()
                    .map_or(0, |t| u64::try_from(t.as_second()).unwrap_or(0));
                Some(Condition {
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
            ConditionStatus::True,
            "Running",
            "ok",
            1_700_000_000,
        );
        core.set_condition(
            ConditionType::Ready,
            ConditionStatus::False,
            "Unhealthy",
            "probe",
            1_700_000_100,
        );
        let crd = status_to_crd(&core);
        assert_eq!(crd.conditions[0].last_transition_time, "2023-11-14T22:13:20Z");
        assert_eq!(crd.conditions[1].type_, "Ready");
        assert_eq!(status_from_crd(&crd), core);
    }

    #[test]
    fn foreign_condition_types_are_left_out() {
        let crd = ProxyStatus {
            conditions: vec![ProxyCondition {
                type_: "SomethingElse".into(),
                status: "True".into(),
                reason: "X".into(),
                message: None,
                last_transition_time: "2023-11-14T22:13:20Z".into(),
            }],
            ..ProxyStatus::default()
        };
        assert!(status_from_crd(&crd).conditions.is_empty());
    }
}
