//! The catalog's tests, and the member builder the health engine's tests share.

use std::net::IpAddr;

use proxyfleet_core::kv::{CasOutcome, KvEntry, KvError};

use super::*;

/// A builder of members for tests.
pub(crate) struct MemberBuilder(Member);

impl MemberBuilder {
    pub(crate) fn new(n: u8) -> Self {
        Self(Member {
            id: format!("uid-{n}"),
            namespace: "default".into(),
            name: format!("proxy-{n}"),
            pool: None,
            provider: "lab".into(),
            labels: BTreeMap::new(),
            phase: Phase::Running,
            endpoint: Some(Endpoint::new(IpAddr::from([127, 0, 0, n]), 3128)),
            created_at: None,
            conditions: Vec::new(),
        })
    }
    pub(crate) fn pool(mut self, pool: &str) -> Self {
        self.0.pool = Some(pool.into());
        self
    }
    pub(crate) fn label(mut self, k: &str, v: &str) -> Self {
        self.0.labels.insert(k.into(), v.into());
        self
    }
    pub(crate) fn phase(mut self, phase: Phase) -> Self {
        self.0.phase = phase;
        self
    }
    pub(crate) fn endpoint(mut self, addr: std::net::SocketAddr) -> Self {
        self.0.endpoint = Some(Endpoint::new(addr.ip(), addr.port()));
        self
    }
    pub(crate) fn no_endpoint(mut self) -> Self {
        self.0.endpoint = None;
        self
    }
    pub(crate) fn build(self) -> Member {
        self.0
    }
}

fn pass() -> Result<ProbePass, ProbeFailure> {
    Ok(ProbePass { latency: Duration::from_millis(3), exit_ip: Some("198.51.100.7".into()) })
}

fn fail() -> Result<ProbePass, ProbeFailure> {
    Err(ProbeFailure("connection refused".into()))
}

/// A catalog whose members all passed `rounds` probes.
pub(crate) fn fleet_with(members: Vec<Member>, settings: FleetSettings) -> Fleet {
    let fleet = Fleet::new(settings, Arc::new(Metrics::new()));
    fleet.publish(members);
    let results = fleet.probe_targets().into_iter().map(|(id, e)| (id, e, pass())).collect();
    fleet.record_probes(results, 1, 1);
    fleet
}

#[test]
fn verdicts_need_n_passes_and_m_failures_in_a_row() {
    let fleet = Fleet::new(FleetSettings::default(), Arc::new(Metrics::new()));
    fleet.publish(vec![MemberBuilder::new(1).build()]);
    let (id, endpoint) = fleet.probe_targets().remove(0);
    let round = |result| fleet.record_probes(vec![(id.clone(), endpoint.clone(), result)], 2, 3);
    round(pass());
    assert_eq!(fleet.health(&id).unwrap().verdict, Verdict::Unknown);
    round(pass());
    assert_eq!(fleet.health(&id).unwrap().verdict, Verdict::Healthy);
    assert_eq!(fleet.take_verdict_changes().len(), 1);
    round(fail());
    round(fail());
    assert_eq!(fleet.health(&id).unwrap().verdict, Verdict::Healthy);
    assert!(fleet.take_verdict_changes().is_empty());
    round(fail());
    let record = fleet.health(&id).unwrap();
    assert_eq!(record.verdict, Verdict::Unhealthy);
    assert_eq!((record.passes, record.failures), (2, 3));
    assert_eq!(record.exit_ip.as_deref(), Some("198.51.100.7"));
    assert!(record.message().contains("connection refused"), "{}", record.message());
    assert!(fleet.next(&Selector::default(), None).is_err());
}

#[test]
fn a_proxy_whose_address_goes_away_is_forgotten_at_once() {
    let fleet = fleet_with(vec![MemberBuilder::new(1).build()], FleetSettings::default());
    fleet.take_verdict_changes();
    fleet.publish(vec![MemberBuilder::new(1).no_endpoint().phase(Phase::Provisioning).build()]);
    assert_eq!(fleet.health("uid-1"), None);
    assert_eq!(fleet.take_verdict_changes(), vec![("uid-1".to_owned(), None)]);
    assert!(fleet.next(&Selector::default(), None).is_err());
    // A result of the old endpoint that lands late is not recorded.
    let old = Endpoint::new(IpAddr::from([127, 0, 0, 1]), 3128);
    fleet.record_probes(vec![("uid-1".into(), old, pass())], 1, 1);
    assert_eq!(fleet.health("uid-1"), None);
}

/// `update` is `publish` for what changed: the members it leaves alone
/// keep their counters and stay handed out; one whose endpoint moved
/// starts over; one removed is gone, from the catalog and its counters.
#[test]
fn an_update_changes_only_the_members_it_names() {
    let members = (1..=3).map(|n| MemberBuilder::new(n).build()).collect();
    let fleet = fleet_with(members, FleetSettings::default());
    fleet.take_verdict_changes();
    let moved: std::net::SocketAddr = "127.0.0.9:8080".parse().unwrap();
    fleet.update(
        vec![MemberBuilder::new(1).build(), MemberBuilder::new(2).endpoint(moved).build()],
        vec!["uid-3".into(), "uid-unknown".into()],
    );
    assert_eq!(fleet.health("uid-1").map(|h| h.verdict), Some(Verdict::Healthy));
    assert_eq!(fleet.health("uid-2"), None, "a moved endpoint's counters are dropped");
    assert_eq!(fleet.health("uid-3"), None);
    assert_eq!(fleet.take_verdict_changes(), vec![("uid-2".to_owned(), None)]);
    let listed: Vec<String> =
        fleet.list(&Selector::default(), None).into_iter().map(|v| v.id).collect();
    assert_eq!(listed, ["uid-1", "uid-2"]);
    let targets: Vec<_> = fleet.probe_targets().into_iter().map(|(_, e)| e.port).collect();
    assert_eq!(targets, [3128, 8080]);
    for _ in 0..3 {
        assert_eq!(fleet.next(&Selector::default(), None).unwrap().0, "uid-1");
    }
}

#[test]
fn round_robin_visits_every_healthy_member_of_the_pool() {
    let members = vec![
        MemberBuilder::new(1).pool("default/a").build(),
        MemberBuilder::new(2).pool("default/a").build(),
        MemberBuilder::new(3).pool("default/b").build(),
        MemberBuilder::new(4).pool("default/a").phase(Phase::Provisioning).build(),
    ];
    let fleet = fleet_with(members, FleetSettings::default());
    let pool_a = Selector { pool: Some("default/a".into()), ..Selector::default() };
    let picks: HashSet<String> = (0..4).map(|_| fleet.next(&pool_a, None).unwrap().0).collect();
    assert_eq!(picks, HashSet::from(["uid-1".to_owned(), "uid-2".to_owned()]));
    let everyone: HashSet<String> =
        (0..6).map(|_| fleet.next(&Selector::default(), None).unwrap().0).collect();
    assert_eq!(everyone.len(), 3);
}

#[test]
fn least_recently_used_hands_out_the_longest_idle() {
    let members = (1..=3).map(|n| MemberBuilder::new(n).build()).collect();
    let fleet = fleet_with(members, FleetSettings::default());
    let lru = Some(Strategy::LeastRecentlyUsed);
    let first: Vec<String> =
        (0..3).map(|_| fleet.next(&Selector::default(), lru).unwrap().0).collect();
    assert_eq!(first.iter().collect::<HashSet<_>>().len(), 3);
    assert_eq!(fleet.next(&Selector::default(), lru).unwrap().0, first[0]);
}

#[test]
fn labels_and_providers_filter() {
    let members = vec![
        MemberBuilder::new(1).label("tier", "gold").build(),
        MemberBuilder::new(2).label("tier", "bronze").build(),
    ];
    let fleet = fleet_with(members, FleetSettings::default());
    let gold = Selector { labels: vec![("tier".into(), "gold".into())], ..Selector::default() };
    for _ in 0..3 {
        assert_eq!(fleet.next(&gold, Some(Strategy::Random)).unwrap().0, "uid-1");
    }
    let other = Selector { provider: Some("gcp".into()), ..Selector::default() };
    let err = fleet.next(&other, None).unwrap_err().to_string();
    assert!(err.contains("provider gcp"), "{err}");
    assert_eq!(fleet.list(&gold, Some(true)).len(), 1);
    assert_eq!(fleet.list(&Selector::default(), Some(false)).len(), 0);
}

#[tokio::test]
async fn exclusive_leases_keep_others_off_until_released() {
    let members = (1..=2).map(|n| MemberBuilder::new(n).build()).collect();
    let fleet = fleet_with(members, FleetSettings::default());
    let any = Selector::default();
    let a = fleet.lease(&any, None, true, None).await.unwrap();
    let b = fleet.lease(&any, None, true, None).await.unwrap();
    assert_ne!(a.proxy_id, b.proxy_id);
    assert!(matches!(
        fleet.lease(&any, None, true, None).await,
        Err(CatalogError::NoneAvailable(_))
    ));
    assert!(fleet.next(&any, None).is_err());
    fleet.release(&a.id).await.unwrap();
    assert_eq!(fleet.next(&any, None).unwrap().0, a.proxy_id);
    assert!(matches!(fleet.release(&a.id).await, Err(CatalogError::NoLease(_))));
}

#[tokio::test]
async fn shared_leases_block_only_exclusive_ones() {
    let fleet = fleet_with(vec![MemberBuilder::new(1).build()], FleetSettings::default());
    let any = Selector::default();
    let shared = fleet.lease(&any, None, false, None).await.unwrap();
    assert!(fleet.lease(&any, None, false, None).await.is_ok());
    assert!(fleet.next(&any, None).is_ok());
    assert!(fleet.lease(&any, None, true, None).await.is_err());
    assert_eq!(fleet.get(&shared.proxy_id).unwrap().leases, 2);
}

#[tokio::test]
async fn lease_ttls_are_checked_and_renewals_extend() {
    let fleet = fleet_with(vec![MemberBuilder::new(1).build()], FleetSettings::default());
    let any = Selector::default();
    let err = fleet.lease(&any, None, true, Some(Duration::ZERO)).await.unwrap_err();
    assert!(err.to_string().starts_with("ttlSeconds: "), "{err}");
    let lease = fleet.lease(&any, None, true, Some(Duration::from_secs(10))).await.unwrap();
    let renewed = fleet.renew(&lease.id, Some(Duration::from_secs(100))).await.unwrap();
    assert!(renewed.expires_at >= lease.expires_at + 89);
    assert!(fleet.renew("nope", None).await.is_err());
}

/// A store that refuses every call while it is down.
#[derive(Debug, Default)]
struct Flaky {
    inner: proxyfleet_core::kv::MemoryKv,
    down: AtomicBool,
}

impl Flaky {
    fn check(&self) -> std::result::Result<(), KvError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(KvError::Unavailable("connection refused".into()));
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl KvStore for Flaky {
    async fn get(&self, scope: &str, key: &str) -> std::result::Result<Option<KvEntry>, KvError> {
        self.check()?;
        self.inner.get(scope, key).await
    }

    async fn compare_and_swap(
        &self,
        scope: &str,
        key: &str,
        expected: Option<u64>,
        value: Option<Vec<u8>>,
    ) -> std::result::Result<CasOutcome, KvError> {
        self.check()?;
        self.inner.compare_and_swap(scope, key, expected, value).await
    }

    async fn list(&self, scope: &str, prefix: &str) -> std::result::Result<Vec<KvEntry>, KvError> {
        self.check()?;
        self.inner.list(scope, prefix).await
    }
}

fn stored_fleet(store: &Arc<Flaky>) -> Fleet {
    let members = (1..=2).map(|n| MemberBuilder::new(n).build()).collect();
    let fleet = fleet_with(members, FleetSettings::default());
    fleet.with_lease_store(Arc::clone(store) as _)
}

async fn stored_ids(store: &dyn KvStore) -> Vec<String> {
    store.list(crate::leases::SCOPE, "").await.unwrap().into_iter().map(|e| e.key).collect()
}

/// The demo's crawler got the same proxy twice from round robin: a
/// member's conditions changed between its two requests, the view was
/// rebuilt and its cursor started over at 0.
#[test]
fn regression_round_robin_goes_on_across_a_rebuild_of_the_view() {
    let members: Vec<Member> = (1..=2).map(|n| MemberBuilder::new(n).build()).collect();
    let fleet = fleet_with(members.clone(), FleetSettings::default());
    let any = Selector::default();
    let first = fleet.next(&any, Some(Strategy::RoundRobin)).unwrap().0;
    let mut changed = members[0].clone();
    changed.conditions = vec![proxyfleet_core::proxy::Condition {
        kind: proxyfleet_core::proxy::ConditionType::Provisioned,
        status: proxyfleet_core::proxy::ConditionStatus::True,
        reason: "Created".into(),
        message: String::new(),
        last_transition_time: 1,
    }];
    fleet.update(vec![changed], Vec::new());
    let second = fleet.next(&any, Some(Strategy::RoundRobin)).unwrap().0;
    assert_ne!(first, second, "the next turn, not the first proxy again");
}

#[tokio::test]
async fn regression_a_restart_keeps_discovery_leases() {
    let store = Arc::new(Flaky::default());
    let any = Selector::default();
    let before = stored_fleet(&store);
    let held = before.lease(&any, None, true, None).await.unwrap();
    drop(before);

    // The next process (or leader) over the same store.
    let after = stored_fleet(&store);
    assert_eq!(after.restore_leases().await.unwrap(), 1);
    assert_eq!(after.leases(), std::slice::from_ref(&held));
    let renewed = after.renew(&held.id, Some(Duration::from_secs(600))).await.unwrap();
    assert!(renewed.expires_at >= held.expires_at);
    let other = after.lease(&any, None, true, None).await.unwrap();
    assert_ne!(other.proxy_id, held.proxy_id, "the restored lease still excludes others");
    assert!(matches!(
        after.lease(&any, None, true, None).await,
        Err(CatalogError::NoneAvailable(_))
    ));
    after.release(&held.id).await.unwrap();
    assert_eq!(stored_ids(store.as_ref()).await, [other.proxy_id], "one record per leased proxy");
}

/// Issue 46, item 1: every replica serves the discovery API. Two catalogs
/// over one store, each granting from a table that does not know the
/// other's latest grants: the store's records decide, so no proxy is
/// handed out exclusively twice, and a lease granted by one replica is
/// renewed and released through the other.
#[tokio::test]
async fn two_replicas_over_one_store_never_lease_a_proxy_exclusively_twice() {
    let store = Arc::new(Flaky::default());
    let any = Selector::default();
    let (a, b) = (stored_fleet(&store), stored_fleet(&store));
    let from_a = a.lease(&any, None, true, None).await.unwrap();
    // b has not refreshed: its table shows both proxies free.
    let from_b = b.lease(&any, None, true, None).await.unwrap();
    assert_ne!(from_a.proxy_id, from_b.proxy_id, "b passed over the proxy a holds");
    assert!(matches!(a.lease(&any, None, false, None).await, Err(CatalogError::NoneAvailable(_))));
    assert!(matches!(b.lease(&any, None, false, None).await, Err(CatalogError::NoneAvailable(_))));
    // A lease b's table does not know is found in the store.
    let renewed = b.renew(&from_a.id, Some(Duration::from_secs(900))).await.unwrap();
    assert_eq!(renewed.proxy_id, from_a.proxy_id);
    b.release(&from_a.id).await.unwrap();
    assert!(matches!(a.renew(&from_a.id, None).await, Err(CatalogError::NoLease(_))));
    a.sync_leases().await;
    assert_eq!(
        a.leases(),
        std::slice::from_ref(&from_b),
        "a's table follows the store after a round"
    );
    // Shared leases coexist across replicas; an exclusive one then does not.
    let shared = a.lease(&any, None, false, None).await.unwrap();
    assert_eq!(shared.proxy_id, from_a.proxy_id);
    assert!(matches!(b.lease(&any, None, true, None).await, Err(CatalogError::NoneAvailable(_))));
}

#[tokio::test]
async fn a_lease_the_store_cannot_hold_is_not_granted() {
    let store = Arc::new(Flaky::default());
    let fleet = stored_fleet(&store);
    let any = Selector::default();
    store.down.store(true, Ordering::SeqCst);
    let err = fleet.lease(&any, None, true, None).await.unwrap_err();
    assert!(matches!(err, CatalogError::StoreUnavailable(_)), "{err}");
    assert!(err.to_string().contains("retry"), "{err}");
    assert!(fleet.leases().is_empty());
    store.down.store(false, Ordering::SeqCst);
    fleet.sync_leases().await;
    assert!(stored_ids(store.as_ref()).await.is_empty());
    // Both proxies are still free for exclusive leases.
    fleet.lease(&any, None, true, None).await.unwrap();
    fleet.lease(&any, None, true, None).await.unwrap();
}

#[tokio::test]
async fn a_release_the_store_cannot_take_leaves_the_lease_held() {
    let store = Arc::new(Flaky::default());
    let fleet = stored_fleet(&store);
    let held = fleet.lease(&Selector::default(), None, true, None).await.unwrap();
    store.down.store(true, Ordering::SeqCst);
    let err = fleet.release(&held.id).await.unwrap_err();
    assert!(matches!(err, CatalogError::StoreUnavailable(_)), "{err}");
    assert_eq!(fleet.leases(), std::slice::from_ref(&held), "still held, as the store says");
    store.down.store(false, Ordering::SeqCst);
    fleet.release(&held.id).await.unwrap();
    assert!(stored_ids(store.as_ref()).await.is_empty());
    // A restart now does not bring the released lease back.
    let after = stored_fleet(&store);
    assert_eq!(after.restore_leases().await.unwrap(), 0);
}

#[tokio::test]
async fn expired_leases_leave_the_store() {
    let store = Arc::new(Flaky::default());
    let fleet = stored_fleet(&store);
    let held =
        fleet.lease(&Selector::default(), None, true, Some(Duration::from_secs(1))).await.unwrap();
    assert_eq!(stored_ids(store.as_ref()).await.len(), 1);
    // The store keeps Unix seconds: wait until the wall clock passes the end.
    while unix_now() <= held.expires_at {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    fleet.sync_leases().await;
    assert!(stored_ids(store.as_ref()).await.is_empty());
    assert!(fleet.leases().is_empty());
}

#[test]
fn reports_quarantine_and_pool_members_are_replaced_once() {
    let settings = FleetSettings { replace_after: 2, ..FleetSettings::default() };
    let members =
        vec![MemberBuilder::new(1).pool("default/a").build(), MemberBuilder::new(2).build()];
    let fleet = fleet_with(members, settings);
    let first = fleet.report("uid-1", ReportKind::Ban, "403 from target").unwrap();
    assert!(!first.replacing);
    assert_eq!(fleet.next(&Selector::default(), None).unwrap().0, "uid-2");
    assert!(!fleet.get("uid-1").unwrap().available);
    assert!(fleet.report("uid-1", ReportKind::Failure, "").unwrap().replacing);
    assert!(!fleet.report("uid-1", ReportKind::Ban, "").unwrap().replacing);
    let replace = fleet.take_replacements();
    assert_eq!(replace.iter().map(|m| m.id.as_str()).collect::<Vec<_>>(), ["uid-1"]);
    // Not in a pool: quarantined, never replaced.
    for _ in 0..3 {
        assert!(!fleet.report("uid-2", ReportKind::Ban, "").unwrap().replacing);
    }
    assert!(fleet.take_replacements().is_empty());
    assert!(matches!(fleet.report("uid-9", ReportKind::Ban, ""), Err(CatalogError::NoProxy(_))));
}

#[test]
fn strategies_parse_and_name_the_choices() {
    assert_eq!(Strategy::parse("s", "random").unwrap(), Strategy::Random);
    let err = Strategy::parse("--discovery-strategy", "fastest").unwrap_err().to_string();
    assert!(err.contains("round-robin, least-recently-used or random"), "{err}");
}

#[test]
fn ipv6_urls_are_bracketed() {
    let endpoint = Endpoint::new("2001:db8::2".parse().unwrap(), 8080);
    assert_eq!(endpoint.url(), "http://[2001:db8::2]:8080");
}

#[test]
fn a_site_ban_keeps_the_proxy_from_that_site_only() {
    let fleet = fleet_with(vec![MemberBuilder::new(1).build()], FleetSettings::default());
    let outcome = fleet.ban_site("uid-1", "Shop.Example:443", ReportKind::Ban, "403").unwrap();
    assert_eq!(outcome.site.as_deref(), Some("shop.example"));
    assert!(!outcome.replacing);
    let for_site = |site: &str| Selector { site: Some(site.into()), ..Selector::default() };
    assert!(matches!(
        fleet.next(&for_site("shop.example"), None),
        Err(CatalogError::NoneAvailable(message)) if message.contains("site shop.example")
    ));
    assert_eq!(fleet.next(&for_site("news.example"), None).unwrap().0, "uid-1");
    assert_eq!(fleet.next(&Selector::default(), None).unwrap().0, "uid-1");
    let view = fleet.get("uid-1").unwrap();
    assert!(view.available, "a site ban is not a quarantine");
    assert_eq!(view.banned_sites.len(), 1);
    assert_eq!(view.reports, 0, "a site ban does not count towards replacement");
    assert!(matches!(
        fleet.ban_site("uid-9", "a.example", ReportKind::Ban, ""),
        Err(CatalogError::NoProxy(_))
    ));
    assert!(matches!(
        fleet.ban_site("uid-1", "not a host", ReportKind::Ban, ""),
        Err(CatalogError::Invalid { field, .. }) if field == "host"
    ));
}

#[test]
fn an_unknown_pool_is_named_and_a_pool_with_none_available_is_not_unknown() {
    let fleet = fleet_with(
        vec![
            MemberBuilder::new(1).pool("default/a").build(),
            MemberBuilder::new(2).pool("default/b").phase(Phase::Provisioning).build(),
        ],
        FleetSettings::default(),
    );
    let pool = |name: &str| Selector { pool: Some(name.into()), ..Selector::default() };
    assert_eq!(
        fleet.next(&pool("default/nope"), None),
        Err(CatalogError::UnknownPool("default/nope".into()))
    );
    assert!(matches!(fleet.next(&pool("default/b"), None), Err(CatalogError::NoneAvailable(_))));
}

#[tokio::test]
async fn a_session_keeps_its_proxy_while_available_and_moves_when_not() {
    let kv = Arc::new(proxyfleet_core::kv::MemoryKv::default());
    let fleet = Fleet::new(FleetSettings::default(), Arc::new(Metrics::new()))
        .with_lease_store(Arc::clone(&kv) as _);
    fleet.publish((1..=3).map(|n| MemberBuilder::new(n).build()).collect());
    let results = fleet.probe_targets().into_iter().map(|(id, e)| (id, e, pass())).collect();
    fleet.record_probes(results, 1, 1);
    let all = Selector::default();
    let session = Session { key: "s1", ttl: Duration::from_secs(60) };
    let first = fleet.route(&all, None, Some(session), &[]).unwrap();
    for _ in 0..5 {
        assert_eq!(fleet.route(&all, None, Some(session), &[]).unwrap(), first);
    }
    // Stored like a lease after the round, in its proxy's record, so a
    // restart or another replica keeps it; not counted as a lease grant.
    assert!(kv.get(crate::leases::SCOPE, &first.id).await.unwrap().is_none(), "not on the path");
    fleet.sync_leases().await;
    let stored = kv.get(crate::leases::SCOPE, &first.id).await.unwrap().expect("stored");
    assert!(String::from_utf8_lossy(&stored.value).contains("session-s1"));
    // Round-robin without a session moves on.
    let a = fleet.route(&all, None, None, &[]).unwrap();
    let b = fleet.route(&all, None, None, &[]).unwrap();
    assert_ne!(a.id, b.id);
    // Its proxy quarantined: the session moves, and stays on the new one.
    fleet.report(&first.id, ReportKind::Ban, "").unwrap();
    let moved = fleet.route(&all, None, Some(session), &[]).unwrap();
    assert_ne!(moved.id, first.id);
    assert_eq!(fleet.route(&all, None, Some(session), &[]).unwrap(), moved);
    assert_eq!(fleet.get(&moved.id).unwrap().leases, 1);
    assert_eq!(fleet.get(&first.id).unwrap().leases, 0, "the old proxy no longer holds it");
    // A proxy the request failed on is skipped, and the session follows.
    let elsewhere =
        fleet.route(&all, None, Some(session), std::slice::from_ref(&moved.id)).unwrap();
    assert!(elsewhere.id != moved.id && elsewhere.id != first.id);
    // After a round the store holds the session on its new proxy only.
    fleet.sync_leases().await;
    let stored = kv.list(crate::leases::SCOPE, "").await.unwrap();
    let keys: Vec<&str> = stored.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(keys, [elsewhere.id.as_str()], "the moved session's old copy went");
    // Another replica over the store sends the session the same way.
    let other = Fleet::new(FleetSettings::default(), Arc::new(Metrics::new()))
        .with_lease_store(Arc::clone(&kv) as _);
    other.publish((1..=3).map(|n| MemberBuilder::new(n).build()).collect());
    let results = other.probe_targets().into_iter().map(|(id, e)| (id, e, pass())).collect();
    other.record_probes(results, 1, 1);
    other.restore_leases().await.unwrap();
    assert_eq!(other.route(&all, None, Some(session), &[]).unwrap().id, elsewhere.id);
    // Released through the lease API, the session starts afresh.
    fleet.release("session-s1").await.unwrap();
    assert!(kv.list(crate::leases::SCOPE, "").await.unwrap().is_empty());
    assert!(fleet.leases().is_empty());
    fleet.route(&all, None, Some(session), &[]).unwrap();
    assert_eq!(fleet.leases().len(), 1, "a new session after the release");
}

/// Issue 47, item 4: two Running Proxies with one address and port were
/// both handed out without a word. The one made first keeps the endpoint;
/// the other is held out of every pick, says why, and the activity names
/// both; once the endpoints differ it is handed out again.
#[test]
fn issue_47_item_4_two_proxies_with_one_endpoint_are_named_and_only_the_first_is_handed_out() {
    let shared: std::net::SocketAddr = "127.0.0.1:3128".parse().unwrap();
    let mut first = MemberBuilder::new(1).endpoint(shared).build();
    first.created_at = Some(100);
    let mut later = MemberBuilder::new(2).endpoint(shared).build();
    later.created_at = Some(200);
    let fleet = fleet_with(vec![later.clone(), first.clone()], FleetSettings::default());
    for _ in 0..4 {
        assert_eq!(fleet.next(&Selector::default(), None).unwrap().0, "uid-1");
    }
    let held = fleet.get("uid-2").unwrap();
    assert!(!held.available, "{held:?}");
    let reason = held.phase_reason.unwrap_or_default();
    assert!(
        reason.starts_with(
            "DuplicateEndpoint: http://127.0.0.1:3128 is also Proxy default/proxy-1's"
        ),
        "{reason}"
    );
    assert!(fleet.get("uid-1").unwrap().available);
    let activity = fleet.activity(Some("uid-2"), 10);
    assert!(activity.iter().any(|a| a.what.starts_with("DuplicateEndpoint")), "{activity:?}");

    // The provider fixes it: each has its own endpoint, both are handed out.
    let own: std::net::SocketAddr = "127.0.0.2:3128".parse().unwrap();
    later.endpoint = Some(Endpoint::new(own.ip(), own.port()));
    fleet.update(vec![later], Vec::new());
    let results = fleet.probe_targets().into_iter().map(|(id, e)| (id, e, pass())).collect();
    fleet.record_probes(results, 1, 1);
    let handed: HashSet<String> =
        (0..4).map(|_| fleet.next(&Selector::default(), None).unwrap().0).collect();
    assert_eq!(handed.len(), 2, "{handed:?}");
    assert_eq!(fleet.get("uid-2").unwrap().phase_reason, None);
}
