//! Running Proxies that report one endpoint. Only a faulty provider hands
//! one proxy to two Proxies (a list-then-write race in its store, say),
//! but the catalog is the one place that sees every Proxy: the Proxy made
//! first keeps the endpoint, the others are held out of every pick and say
//! why in their phase reason, and the operator's log and the fleet's
//! activity name both.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use proxyfleet_core::proxy::Phase;

use super::Member;

/// A member whose endpoint another member holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Duplicate {
    /// `namespace/name` of the member that holds the endpoint.
    pub(super) holder: String,
    /// The endpoint, as a URL without credential.
    pub(super) endpoint: String,
}

impl Duplicate {
    /// The phase reason the duplicate shows.
    pub(super) fn reason(&self) -> String {
        format!(
            "DuplicateEndpoint: {} is also Proxy {}'s, which was made first; the provider \
             handed one proxy to two Proxies",
            self.endpoint, self.holder
        )
    }
}

/// Every Running member whose endpoint (address and port) a Running member
/// made before it also has, by ID. Made first: the earlier creation time
/// (one not known counts as latest), then the smaller ID.
pub(super) fn find(members: &BTreeMap<String, Member>) -> HashMap<String, Duplicate> {
    let mut holders: HashMap<(IpAddr, u16), &Member> = HashMap::new();
    let running = || {
        members.values().filter(|member| member.phase == Phase::Running).filter_map(|member| {
            member.endpoint.as_ref().map(|endpoint| ((endpoint.ip, endpoint.port), member))
        })
    };
    let first = |member: &Member| (member.created_at.unwrap_or(u64::MAX), member.id.clone());
    for (key, member) in running() {
        let holder = holders.entry(key).or_insert(member);
        if first(member) < first(holder) {
            *holder = member;
        }
    }
    running()
        .filter_map(|(key, member)| {
            let holder = holders[&key];
            (holder.id != member.id).then(|| {
                let endpoint =
                    member.endpoint.as_ref().map(super::Endpoint::url).unwrap_or_default();
                (member.id.clone(), Duplicate { holder: holder.qualified_name(), endpoint })
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::Endpoint;

    fn member(id: &str, created_at: Option<u64>, port: u16, phase: Phase) -> Member {
        Member {
            id: id.to_owned(),
            namespace: "crawl".to_owned(),
            name: format!("p-{id}"),
            pool: None,
            provider: "lab".to_owned(),
            labels: BTreeMap::new(),
            phase,
            endpoint: Some(Endpoint::new("192.0.2.7".parse().unwrap(), port)),
            created_at,
            conditions: Vec::new(),
        }
    }

    #[test]
    fn the_proxy_made_first_keeps_the_endpoint_and_the_others_are_named() {
        let members: BTreeMap<String, Member> = [
            member("a", Some(20), 3128, Phase::Running),
            member("b", Some(10), 3128, Phase::Running),
            member("c", None, 3128, Phase::Running),
            member("d", Some(5), 3128, Phase::Provisioning),
            member("e", Some(1), 8080, Phase::Running),
        ]
        .into_iter()
        .map(|m| (m.id.clone(), m))
        .collect();
        let found = find(&members);
        let mut ids: Vec<&str> = found.keys().map(String::as_str).collect();
        ids.sort_unstable();
        assert_eq!(ids, ["a", "c"], "b was made first; d is not running; e has its own port");
        assert_eq!(found["a"].holder, "crawl/p-b");
        assert_eq!(
            found["c"].reason(),
            "DuplicateEndpoint: http://192.0.2.7:3128 is also Proxy crawl/p-b's, which was made \
             first; the provider handed one proxy to two Proxies"
        );
    }
}
