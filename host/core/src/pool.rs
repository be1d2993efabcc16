//! ProxyPool planning: how many Proxies a pool should have on which
//! provider entry, which to add and which to remove. Pure: the Kubernetes
//! controller and the standalone driver both apply the plan.
//!
//! - Replicas are spread over the pool's entries by weight (largest
//!   remainder), so `3` over weights `2:1` is `2` and `1`.
//! - Members on an entry the pool no longer names are removed; an entry over
//!   its share loses not-ready members first, then the newest.
//! - With `maxAge`, the oldest ready member past it is removed, one at a
//!   time, only while the pool is complete, nothing else is being removed,
//!   and the ready count stays at or above `minAvailable` without it. Its
//!   replacement is created by the next plan.

use std::collections::BTreeMap;
use std::time::Duration;

/// What a pool asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSpec {
    /// Proxies wanted.
    pub replicas: u32,
    /// Provider entries and their weights; at least one, weights ≥ 1.
    pub entries: Vec<(String, u32)>,
    /// Members older than this are recycled.
    pub max_age: Option<Duration>,
    /// Ready members recycling must leave.
    pub min_available: u32,
}

/// A Proxy of the pool as it is now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolMember {
    /// Proxy name.
    pub name: String,
    /// Its provider entry.
    pub provider: String,
    /// Unix seconds it was created.
    pub created_at: u64,
    /// Whether it is Ready.
    pub ready: bool,
    /// Whether it is being deleted.
    pub deleting: bool,
}

/// What to change.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolPlan {
    /// New Proxies to create, by provider entry.
    pub create: Vec<String>,
    /// Members to delete, by name.
    pub delete: Vec<String>,
    /// Ready members (not being deleted).
    pub ready: u32,
    /// Members not being deleted.
    pub total: u32,
    /// When nothing else is to be done: the Unix second the oldest ready
    /// member reaches `maxAge`, the one moment the plan changes with no
    /// change to the members. `None` when only a change to them can.
    pub next_rotation: Option<u64>,
}

/// Splits `replicas` over weighted entries by the largest remainder.
pub fn spread(replicas: u32, entries: &[(String, u32)]) -> BTreeMap<String, u32> {
    let total_weight: u64 = entries.iter().map(|(_, w)| u64::from(*w)).sum();
    let mut shares: BTreeMap<String, u32> = BTreeMap::new();
    if total_weight == 0 {
        return shares;
    }
    let mut remainders = Vec::with_capacity(entries.len());
    let mut given = 0u32;
    for (index, (entry, weight)) in entries.iter().enumerate() {
        let exact = u64::from(replicas) * u64::from(*weight);
        let share = u32::try_from(exact / total_weight).unwrap_or(u32::MAX);
        given += share;
        *shares.entry(entry.clone()).or_default() += share;
        remainders.push((exact % total_weight, index));
    }
    // Largest remainder first; ties go to the entry listed first.
    remainders.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    for (_, index) in remainders.into_iter().take((replicas - given) as usize) {
        *shares.entry(entries[index].0.clone()).or_default() += 1;
    }
    shares
}

/// Parses a `maxAge` such as `90s`, `15m`, `24h` or `7d` (the pattern the
/// ProxyPool schema enforces).
pub fn parse_max_age(text: &str) -> Option<Duration> {
    let text = text.trim();
    let unit_at = text.find(|c: char| !c.is_ascii_digit())?;
    let value: u64 = text[..unit_at].parse().ok()?;
    let seconds = match &text[unit_at..] {
        "s" => value,
        "m" => value.checked_mul(60)?,
        "h" => value.checked_mul(3600)?,
        "d" => value.checked_mul(86_400)?,
        _ => return None,
    };
    (seconds > 0).then(|| Duration::from_secs(seconds))
}

/// Plans the next step for a pool. `now` is Unix seconds.
pub fn plan(spec: &PoolSpec, members: &[PoolMember], now: u64) -> PoolPlan {
    let active: Vec<&PoolMember> = members.iter().filter(|m| !m.deleting).collect();
    let mut plan = PoolPlan {
        ready: active.iter().filter(|m| m.ready).count() as u32,
        total: active.len() as u32,
        ..PoolPlan::default()
    };
    let targets = spread(spec.replicas, &spec.entries);
    let mut by_entry: BTreeMap<&str, Vec<&PoolMember>> = BTreeMap::new();
    for member in &active {
        by_entry.entry(member.provider.as_str()).or_default().push(member);
    }
    for (entry, mut group) in by_entry.clone() {
        let target = targets.get(entry).copied().unwrap_or(0) as usize;
        if group.len() > target {
            // Not ready first, then newest first.
            group.sort_by(|a, b| a.ready.cmp(&b.ready).then(b.created_at.cmp(&a.created_at)));
            plan.delete.extend(group[..group.len() - target].iter().map(|m| m.name.clone()));
        }
    }
    for (entry, target) in &targets {
        let have = by_entry.get(entry.as_str()).map_or(0, Vec::len);
        for _ in have..*target as usize {
            plan.create.push(entry.clone());
        }
    }
    let complete = plan.create.is_empty() && plan.delete.is_empty();
    let removing = members.iter().any(|m| m.deleting);
    if let Some(max_age) = spec.max_age
        && complete
        && !removing
        && plan.ready > spec.min_available
    {
        let oldest_ready = active.iter().filter(|m| m.ready).min_by_key(|m| m.created_at);
        if let Some(member) = oldest_ready {
            let expires = member.created_at.saturating_add(max_age.as_secs());
            if expires <= now {
                plan.delete.push(member.name.clone());
            } else {
                plan.next_rotation = Some(expires);
            }
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(list: &[(&str, u32)]) -> Vec<(String, u32)> {
        list.iter().map(|(e, w)| ((*e).to_owned(), *w)).collect()
    }

    fn member(name: &str, provider: &str, created_at: u64, ready: bool) -> PoolMember {
        PoolMember {
            name: name.into(),
            provider: provider.into(),
            created_at,
            ready,
            deleting: false,
        }
    }

    fn pool(replicas: u32, list: &[(&str, u32)]) -> PoolSpec {
        PoolSpec { replicas, entries: entries(list), max_age: None, min_available: 0 }
    }

    #[test]
    fn spread_follows_weights_and_sums_to_replicas() {
        assert_eq!(
            spread(3, &entries(&[("a", 2), ("b", 1)])),
            BTreeMap::from([("a".into(), 2), ("b".into(), 1)])
        );
        let shares = spread(10, &entries(&[("a", 1), ("b", 1), ("c", 1)]));
        assert_eq!(shares.values().sum::<u32>(), 10);
        assert_eq!(shares["a"], 4, "the remainder goes to the first listed");
        assert_eq!(spread(0, &entries(&[("a", 1)]))["a"], 0);
    }

    #[test]
    fn max_age_takes_one_unit_suffix() {
        assert_eq!(parse_max_age("90s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_max_age("24h"), Some(Duration::from_secs(86_400)));
        assert_eq!(parse_max_age("7d"), Some(Duration::from_secs(604_800)));
        for bad in ["", "h", "0h", "5w", "1h30m", "-1h"] {
            assert_eq!(parse_max_age(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn an_empty_pool_is_filled_per_entry() {
        let plan = plan(&pool(3, &[("a", 2), ("b", 1)]), &[], 0);
        assert_eq!(plan.create, ["a", "a", "b"]);
        assert!(plan.delete.is_empty());
    }

    #[test]
    fn scaling_down_removes_not_ready_then_newest() {
        let members = [
            member("old-ready", "a", 1, true),
            member("new-ready", "a", 3, true),
            member("not-ready", "a", 2, false),
        ];
        let plan = plan(&pool(1, &[("a", 1)]), &members, 10);
        assert_eq!(plan.delete, ["not-ready", "new-ready"]);
        assert_eq!((plan.ready, plan.total), (2, 3));
    }

    #[test]
    fn members_on_a_dropped_entry_are_moved() {
        let members = [member("x", "gone", 1, true)];
        let plan = plan(&pool(1, &[("a", 1)]), &members, 10);
        assert_eq!(
            (plan.create.as_slice(), plan.delete.as_slice()),
            (&["a".to_owned()][..], &["x".to_owned()][..])
        );
    }

    #[test]
    fn members_being_deleted_do_not_count() {
        let mut leaving = member("leaving", "a", 1, true);
        leaving.deleting = true;
        let plan = plan(&pool(1, &[("a", 1)]), &[leaving], 10);
        assert_eq!(plan.create, ["a"]);
        assert_eq!(plan.total, 0);
    }

    #[test]
    fn recycling_takes_the_oldest_expired_one_at_a_time_above_min_available() {
        let spec = PoolSpec {
            max_age: Some(Duration::from_secs(100)),
            min_available: 1,
            ..pool(3, &[("a", 1)])
        };
        let members =
            [member("m1", "a", 0, true), member("m2", "a", 50, true), member("m3", "a", 500, true)];
        assert_eq!(plan(&spec, &members, 200).delete, ["m1"]);

        let mut during = members.clone();
        during[0].deleting = true;
        let next = plan(&spec, &during, 200);
        assert_eq!(next.create, ["a"], "the replacement comes first");
        assert!(next.delete.is_empty(), "one recycle at a time");
    }

    #[test]
    fn recycling_never_goes_below_min_available() {
        let spec = PoolSpec {
            max_age: Some(Duration::from_secs(100)),
            min_available: 2,
            ..pool(2, &[("a", 1)])
        };
        let members = [member("m1", "a", 0, true), member("m2", "a", 0, true)];
        assert!(plan(&spec, &members, 1000).delete.is_empty());
        let spec = PoolSpec { min_available: 1, ..spec };
        assert_eq!(plan(&spec, &members, 1000).delete.len(), 1);
    }

    #[test]
    fn a_settled_pool_names_the_moment_its_oldest_member_expires() {
        let spec = PoolSpec {
            max_age: Some(Duration::from_secs(100)),
            min_available: 1,
            ..pool(2, &[("a", 1)])
        };
        let members = [member("m1", "a", 40, true), member("m2", "a", 10, true)];
        let settled = plan(&spec, &members, 50);
        assert!(settled.create.is_empty() && settled.delete.is_empty());
        assert_eq!(settled.next_rotation, Some(110), "m2, the oldest, expires first");
        assert_eq!(plan(&spec, &members, 110).delete, ["m2"]);

        let unready = [member("m1", "a", 40, true), member("m2", "a", 10, false)];
        assert_eq!(plan(&spec, &unready, 50).next_rotation, None, "at min_available");
        assert_eq!(plan(&pool(2, &[("a", 1)]), &members, 50).next_rotation, None, "no maxAge");
    }
}
