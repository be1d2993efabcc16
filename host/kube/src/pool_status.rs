//! What a ProxyPool reports: its member counts and the `Ready` and
//! `Available` conditions derived from them and from what the pass ran
//! into. Pure, so every case is a unit test.

use crate::convert::rfc3339;
use crate::crd::{Condition, ConditionStatus, ProxyPoolSpec};

/// What stopped a pass from bringing the members in line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// The spec cannot be planned; the message names the field.
    InvalidSpec(String),
    /// The API server refused to create, change or delete a member (a
    /// ResourceQuota, an admission webhook); its message.
    MemberChangeRefused(String),
}

/// The members one pass counted, and what stopped it, if anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Findings {
    /// Members not being deleted.
    pub total: u32,
    /// Of those, Ready.
    pub ready: u32,
    /// Why the members could not be brought in line.
    pub problem: Option<Problem>,
}

/// The pool's conditions for `findings`, at `generation`. A condition
/// whose status did not change keeps its transition time from `previous`.
pub fn conditions(
    spec: &ProxyPoolSpec,
    generation: i64,
    findings: &Findings,
    previous: &[Condition],
    now: u64,
) -> Vec<Condition> {
    let Findings { total, ready, problem } = findings;
    let (total, ready, wanted) = (*total, *ready, spec.replicas);
    let counted = format!("{ready} of {wanted} members ready");
    let (ready_status, ready_reason, ready_message) = match problem {
        Some(Problem::InvalidSpec(message)) => (false, "InvalidSpec", message.clone()),
        Some(Problem::MemberChangeRefused(message)) => (
            false,
            "MemberChangeRefused",
            format!("the API server refused a member change: {message}"),
        ),
        None if total != wanted => {
            (false, "Scaling", format!("{total} members, {wanted} wanted; {counted}"))
        }
        None if ready < wanted => (false, "MembersNotReady", counted.clone()),
        None => (true, "AllReady", counted.clone()),
    };
    // A pool that wants members is not available without one, whatever
    // `minAvailable` says.
    let needed = spec.min_available.max(u32::from(wanted > 0));
    let (available_status, available_reason, available_message) = if ready >= needed {
        (true, "MinimumAvailable", format!("{ready} ready, at least {needed} needed"))
    } else {
        (false, "BelowMinimumAvailable", format!("{ready} ready, at least {needed} needed"))
    };
    [
        ("Ready", ready_status, ready_reason, ready_message),
        ("Available", available_status, available_reason, available_message),
    ]
    .into_iter()
    .map(|(type_, holds, reason, message)| {
        let status = if holds { ConditionStatus::True } else { ConditionStatus::False };
        let last_transition_time = previous
            .iter()
            .find(|c| c.type_ == type_ && c.status == status)
            .map_or_else(|| rfc3339(now), |c| c.last_transition_time.clone());
        Condition {
            type_: type_.to_owned(),
            status,
            observed_generation: Some(generation),
            last_transition_time,
            reason: reason.to_owned(),
            message: Some(message),
        }
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::ProxySpec;

    fn spec(replicas: u32, min_available: u32) -> ProxyPoolSpec {
        ProxyPoolSpec {
            replicas,
            template: crate::crd::ProxyTemplate {
                metadata: None,
                spec: yaml_serde::from_str::<ProxySpec>("provider: lab\n").unwrap(),
            },
            providers: Vec::new(),
            max_age: None,
            min_available,
        }
    }

    fn found(total: u32, ready: u32) -> Findings {
        Findings { total, ready, problem: None }
    }

    fn get<'a>(conditions: &'a [Condition], type_: &str) -> &'a Condition {
        conditions.iter().find(|c| c.type_ == type_).unwrap()
    }

    #[test]
    fn a_pool_with_every_member_ready_is_ready_and_available() {
        let conditions = conditions(&spec(3, 0), 4, &found(3, 3), &[], 1_700_000_000);
        let ready = get(&conditions, "Ready");
        assert_eq!((ready.status, ready.reason.as_str()), (ConditionStatus::True, "AllReady"));
        assert_eq!(ready.observed_generation, Some(4));
        assert_eq!(ready.last_transition_time, "2023-11-14T22:13:20Z");
        assert_eq!(get(&conditions, "Available").status, ConditionStatus::True);
    }

    #[test]
    fn a_pool_short_of_members_is_scaling_and_says_by_how_many() {
        let conditions = conditions(&spec(3, 0), 1, &found(1, 1), &[], 0);
        let ready = get(&conditions, "Ready");
        assert_eq!((ready.status, ready.reason.as_str()), (ConditionStatus::False, "Scaling"));
        assert_eq!(ready.message.as_deref(), Some("1 members, 3 wanted; 1 of 3 members ready"));
    }

    #[test]
    fn members_not_ready_keep_the_pool_not_ready_and_below_min_available_unavailable() {
        let conditions = conditions(&spec(3, 2), 1, &found(3, 1), &[], 0);
        assert_eq!(get(&conditions, "Ready").reason, "MembersNotReady");
        let available = get(&conditions, "Available");
        assert_eq!(available.status, ConditionStatus::False);
        assert_eq!(available.message.as_deref(), Some("1 ready, at least 2 needed"));
    }

    #[test]
    fn a_pool_that_wants_members_needs_one_ready_to_be_available_and_an_empty_one_is_both() {
        let none_ready = conditions(&spec(2, 0), 1, &found(2, 0), &[], 0);
        assert_eq!(get(&none_ready, "Available").status, ConditionStatus::False);
        let empty = conditions(&spec(0, 0), 1, &found(0, 0), &[], 0);
        assert_eq!(get(&empty, "Ready").status, ConditionStatus::True);
        assert_eq!(get(&empty, "Available").status, ConditionStatus::True);
    }

    #[test]
    fn a_problem_makes_the_pool_not_ready_with_its_reason_and_keeps_availability_counted() {
        let invalid = Findings {
            problem: Some(Problem::InvalidSpec("spec.maxAge: \"1y\" is not a duration".into())),
            ..found(2, 2)
        };
        let reported = conditions(&spec(2, 0), 1, &invalid, &[], 0);
        let ready = get(&reported, "Ready");
        assert_eq!((ready.status, ready.reason.as_str()), (ConditionStatus::False, "InvalidSpec"));
        assert!(ready.message.as_deref().unwrap().starts_with("spec.maxAge"));
        assert_eq!(get(&reported, "Available").status, ConditionStatus::True);

        let refused = Findings {
            problem: Some(Problem::MemberChangeRefused("exceeded quota: proxies".into())),
            ..found(1, 1)
        };
        let ready = conditions(&spec(2, 0), 1, &refused, &[], 0).remove(0);
        assert_eq!(ready.reason, "MemberChangeRefused");
        assert!(ready.message.unwrap().ends_with("exceeded quota: proxies"));
    }

    #[test]
    fn the_transition_time_moves_only_when_the_status_does() {
        let before = conditions(&spec(2, 0), 1, &found(2, 1), &[], 100);
        let still = conditions(&spec(2, 0), 2, &found(2, 1), &before, 200);
        assert_eq!(get(&still, "Ready").last_transition_time, rfc3339(100));
        let changed = conditions(&spec(2, 0), 2, &found(2, 2), &still, 300);
        assert_eq!(get(&changed, "Ready").last_transition_time, rfc3339(300));
        assert_eq!(get(&changed, "Available").last_transition_time, rfc3339(100));
    }
}
