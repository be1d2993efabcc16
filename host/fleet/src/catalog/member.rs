//! A Proxy as a mode publishes it.

use std::collections::BTreeMap;

use crate::endpoint::Endpoint;
use proxyfleet_core::proxy::{Condition, ConditionStatus, ConditionType, Phase};

/// One Proxy, as a mode publishes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The Proxy's UID: stable, unique, and safe in a URL path.
    pub id: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The ProxyPool it belongs to (`namespace/name`).
    pub pool: Option<String>,
    /// Provider entry.
    pub provider: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Phase.
    pub phase: Phase,
    /// Where it listens, once known.
    pub endpoint: Option<Endpoint>,
    /// Unix seconds the Proxy was made, when the mode knows it.
    pub created_at: Option<u64>,
    /// The reconciler's conditions, as last recorded.
    pub conditions: Vec<Condition>,
}

impl Member {
    /// `namespace/name`, as the gateway's metrics and errors name it.
    pub fn qualified_name(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Why the Proxy is in its phase, when something holds it back: the
    /// first of `Provisioned` and `Ready` that does not hold, as
    /// `Reason: message`.
    pub fn phase_reason(&self) -> Option<String> {
        [ConditionType::Provisioned, ConditionType::Ready].into_iter().find_map(|kind| {
            self.conditions
                .iter()
                .find(|c| c.kind == kind && c.status != ConditionStatus::True)
                .map(|c| match c.message.is_empty() {
                    true => c.reason.clone(),
                    false => format!("{}: {}", c.reason, c.message),
                })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn condition(
        kind: ConditionType,
        status: ConditionStatus,
        reason: &str,
        message: &str,
    ) -> Condition {
        Condition {
            kind,
            status,
            reason: reason.into(),
            message: message.into(),
            last_transition_time: 0,
        }
    }

    #[test]
    fn the_phase_reason_is_the_first_condition_that_holds_the_proxy_back() {
        let mut member = super::super::tests::MemberBuilder::new(1).build();
        assert_eq!(member.phase_reason(), None, "no conditions, nothing to say");
        member.conditions = vec![
            condition(ConditionType::Ready, ConditionStatus::False, "Unhealthy", ""),
            condition(ConditionType::Provisioned, ConditionStatus::False, "CreateFailed", "quota"),
        ];
        assert_eq!(member.phase_reason().as_deref(), Some("CreateFailed: quota"));
        member.conditions[1].status = ConditionStatus::True;
        assert_eq!(member.phase_reason().as_deref(), Some("Unhealthy"));
        member.conditions[0].status = ConditionStatus::True;
        assert_eq!(member.phase_reason(), None);
    }
}
