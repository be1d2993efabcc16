//! Which Proxy holds which endpoint, kept in the entry's key-value store.
//!
//! Layout:
//! - `endpoint/<host:port>`: the JSON [`Assignment`] of an assigned
//!   endpoint; a free endpoint has no key. Taking one is a compare-and-swap
//!   that expects the key to be absent, so of two concurrent creates exactly
//!   one gets any given endpoint; the other sees a conflict and moves on.
//! - `holder/<uid>`: the endpoint a Proxy holds or is taking. A create
//!   names the endpoint here before it takes it, so the one endpoint a Proxy
//!   can hold is the one its holder key names: a retried create reads two
//!   keys, not every assignment.
//!
//! A create tries endpoints in an order drawn from the Proxy's UID, so
//! concurrent creates rarely want the same endpoint, and its work does not
//! grow with the entry: with a share `f` of the endpoints held it reads
//! about `1 / (1 - f)` keys. Only a create that finds every endpoint held
//! reads them all.
//!
//! The logic runs over the [`Store`] trait so that it can be tested
//! natively against an in-memory map.

use proxyfleet_sdk::kv::{CasOutcome, KvEntry, KvError};
use proxyfleet_sdk::{Instance, InstanceState, OwnershipMark, ProviderError, ProxySpec, Result};
use serde::{Deserialize, Serialize};

use crate::config::{Configured, Endpoint, StaticConfig};

/// Key prefix of assignments.
pub const PREFIX: &str = "endpoint/";

/// Key prefix of the endpoint each Proxy holds, by UID.
pub const HOLDER_PREFIX: &str = "holder/";

/// How often `release` re-reads and retries when the assignment changes
/// under it.
const RELEASE_ATTEMPTS: usize = 5;

/// The key-value calls the assignment logic needs.
pub trait Store {
    /// The entry under `key`, if any.
    fn get(&self, key: &str) -> std::result::Result<Option<KvEntry>, KvError>;
    /// Writes or deletes `key` when its version is `expected`.
    fn compare_and_swap(
        &self,
        key: &str,
        expected: Option<u64>,
        value: Option<&[u8]>,
    ) -> std::result::Result<CasOutcome, KvError>;
    /// Every entry under `prefix`, ordered by key.
    fn list(&self, prefix: &str) -> std::result::Result<Vec<KvEntry>, KvError>;
}

/// The entry's store in the host.
#[derive(Debug, Clone, Copy, Default)]
pub struct HostStore;

impl Store for HostStore {
    fn get(&self, key: &str) -> std::result::Result<Option<KvEntry>, KvError> {
        proxyfleet_sdk::kv::get(key)
    }

    fn compare_and_swap(
        &self,
        key: &str,
        expected: Option<u64>,
        value: Option<&[u8]>,
    ) -> std::result::Result<CasOutcome, KvError> {
        proxyfleet_sdk::kv::compare_and_swap(key, expected, value)
    }

    fn list(&self, prefix: &str) -> std::result::Result<Vec<KvEntry>, KvError> {
        proxyfleet_sdk::kv::list(prefix)
    }
}

/// The value stored for an assigned endpoint: who holds it since when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Assignment {
    /// The installation that assigned it; empty in records written before
    /// marks carried one.
    #[serde(default)]
    pub installation: String,
    /// UID of the Proxy holding the endpoint.
    pub uid: String,
    /// The Proxy's namespace.
    pub namespace: String,
    /// The Proxy's name.
    pub name: String,
    /// Seconds since the Unix epoch.
    pub created_at: u64,
}

impl Assignment {
    fn for_spec(spec: &ProxySpec, created_at: u64) -> Self {
        Self {
            installation: spec.installation.clone(),
            uid: spec.uid.clone(),
            namespace: spec.namespace.clone(),
            name: spec.name.clone(),
            created_at,
        }
    }

    fn mark(&self) -> OwnershipMark {
        OwnershipMark {
            installation: self.installation.clone(),
            uid: self.uid.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            created_at: self.created_at,
        }
    }

    fn decode(value: &[u8]) -> Option<Self> {
        serde_json::from_slice(value).ok()
    }
}

fn key(id: &str) -> String {
    format!("{PREFIX}{id}")
}

fn holder_key(uid: &str) -> String {
    format!("{HOLDER_PREFIX}{uid}")
}

/// Whether the assignment `entry` is held by Proxy `uid`.
fn holds(entry: &KvEntry, uid: &str) -> bool {
    Assignment::decode(&entry.value).is_some_and(|held| held.uid == uid)
}

/// The assignment of the endpoint `holder` names, when `uid` holds it.
fn held_by(store: &impl Store, holder: &KvEntry, uid: &str) -> Result<Option<KvEntry>> {
    let Ok(id) = std::str::from_utf8(&holder.value) else { return Ok(None) };
    Ok(store.get(&key(id))?.filter(|entry| holds(entry, uid)))
}

/// Hands `spec` an endpoint: the one it already holds (a retried create), or
/// a free one, tried in the order [`probe_order`] draws from its UID.
pub fn assign(
    store: &impl Store,
    config: &impl Configured,
    spec: &ProxySpec,
    now: u64,
) -> Result<Instance> {
    let holder_key = holder_key(&spec.uid);
    let mut holder = store.get(&holder_key)?;
    if let Some(named) = &holder
        && let Some(held) = held_by(store, named, &spec.uid)?
    {
        return Ok(instance(config, &held));
    }
    let count = config.count();
    if count == 0 {
        return Err(ProviderError::QuotaExceeded("no endpoints are configured".to_owned()));
    }
    let wanted = Assignment::for_spec(spec, now);
    let value = serde_json::to_vec(&wanted).map_err(|error| {
        ProviderError::Permanent(format!("cannot encode the assignment: {error}"))
    })?;
    for index in probe_order(&spec.uid, count) {
        let id = config.id_at(index)?;
        let endpoint_key = key(&id);
        if store.get(&endpoint_key)?.is_some() {
            continue;
        }
        // Named before taken: whatever this Proxy holds, its holder key
        // names it.
        let expected = holder.as_ref().map(|entry| entry.version);
        match store.compare_and_swap(&holder_key, expected, Some(id.as_bytes()))? {
            CasOutcome::Applied(version) => {
                holder = Some(KvEntry { key: holder_key.clone(), value: id.into_bytes(), version });
            }
            // A concurrent retry of this very create moved the holder key:
            // adopt what it took, or let the retry settle it.
            CasOutcome::Conflict(current) => {
                if let Some(current) = current
                    && let Some(held) = held_by(store, &current, &spec.uid)?
                {
                    return Ok(instance(config, &held));
                }
                return Err(ProviderError::Conflict(format!(
                    "another create of {}/{} is taking an endpoint at the same time",
                    spec.namespace, spec.name
                )));
            }
        }
        match store.compare_and_swap(&endpoint_key, None, Some(&value))? {
            CasOutcome::Applied(version) => {
                let entry = KvEntry { key: endpoint_key, value, version };
                return Ok(instance(config, &entry));
            }
            // Taken since we looked: by a concurrent retry of this very
            // create (adopt it), or by another Proxy (try the next one).
            CasOutcome::Conflict(Some(current)) if holds(&current, &spec.uid) => {
                return Ok(instance(config, &current));
            }
            CasOutcome::Conflict(_) => {}
        }
    }
    Err(ProviderError::QuotaExceeded(format!("all {count} endpoints are assigned")))
}

/// The order in which a create for `uid` tries the `count` endpoints:
/// every index once, from a start and with a stride (coprime to `count`)
/// both drawn from the UID by FNV-1a. A cryptographic hash would buy
/// nothing here: the order only spreads creates apart.
pub fn probe_order(uid: &str, count: usize) -> impl Iterator<Item = usize> {
    let hash = uid.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    let count = count as u64;
    let start = hash % count.max(1);
    let mut stride = if count > 1 { 1 + (hash >> 32) % (count - 1) } else { 1 };
    while gcd(stride, count) != 1 {
        stride += 1;
    }
    (0..count).map(move |step| ((start + step * stride) % count) as usize)
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The instance for endpoint `id`; NotFound when nobody holds it.
pub fn lookup(store: &impl Store, config: &impl Configured, id: &str) -> Result<Instance> {
    match store.get(&key(id))? {
        Some(entry) => Ok(instance(config, &entry)),
        None => Err(ProviderError::NotFound(format!("endpoint {id} is not assigned"))),
    }
}

/// Frees endpoint `id`, then its holder's key; Ok when it is already free.
pub fn release(store: &impl Store, id: &str) -> Result<()> {
    let endpoint_key = key(id);
    for _ in 0..RELEASE_ATTEMPTS {
        let Some(entry) = store.get(&endpoint_key)? else {
            return Ok(());
        };
        match store.compare_and_swap(&endpoint_key, Some(entry.version), None)? {
            CasOutcome::Applied(_) => {
                if let Some(held) = Assignment::decode(&entry.value) {
                    forget_holder(store, &held.uid, id)?;
                }
                return Ok(());
            }
            CasOutcome::Conflict(None) => return Ok(()),
            // Rewritten between our read and delete: read it again.
            CasOutcome::Conflict(Some(_)) => {}
        }
    }
    Err(ProviderError::Conflict(format!(
        "endpoint {id} kept changing while being released ({RELEASE_ATTEMPTS} attempts)"
    )))
}

/// Removes `uid`'s holder key if it still names endpoint `id`; one that
/// names another endpoint belongs to a create under way and stays.
fn forget_holder(store: &impl Store, uid: &str, id: &str) -> Result<()> {
    let holder_key = holder_key(uid);
    if let Some(holder) = store.get(&holder_key)?
        && holder.value == id.as_bytes()
    {
        // A conflict means it moved on to another endpoint: it stays.
        store.compare_and_swap(&holder_key, Some(holder.version), None)?;
    }
    Ok(())
}

/// Every assigned endpoint as an instance.
pub fn all(store: &impl Store, config: &StaticConfig) -> Result<Vec<Instance>> {
    Ok(store.list(PREFIX)?.iter().map(|entry| instance(config, entry)).collect())
}

/// Assignments whose endpoint is no longer configured, as `(id, holder)`.
pub fn stranded(store: &impl Store, config: &StaticConfig) -> Result<Vec<(String, String)>> {
    Ok(store
        .list(PREFIX)?
        .iter()
        .filter_map(|entry| {
            let id = entry.key.strip_prefix(PREFIX)?;
            if config.contains(id) {
                return None;
            }
            let holder = Assignment::decode(&entry.value).map_or_else(
                || "an unreadable assignment".to_owned(),
                |held| format!("{}/{}", held.namespace, held.name),
            );
            Some((id.to_owned(), holder))
        })
        .collect())
}

/// The instance an assignment entry describes. An endpoint that is no longer
/// configured is `failed`: its Proxy should be moved to another. An entry
/// that does not decode (written by something else) carries no mark, so the
/// host will not take it for one of its own.
fn instance(config: &impl Configured, entry: &KvEntry) -> Instance {
    let id = entry.key.strip_prefix(PREFIX).unwrap_or(&entry.key);
    let configured = config.endpoint(id);
    let assignment = Assignment::decode(&entry.value);
    let state = match (&configured, &assignment) {
        (Some(_), Some(_)) => InstanceState::Running,
        _ => InstanceState::Failed,
    };
    let (address, port) = match configured {
        Some(endpoint) => (endpoint.host().to_owned(), Some(endpoint.port())),
        None => split_id(id),
    };
    Instance {
        provider_id: id.to_owned(),
        name: id.to_owned(),
        state,
        addresses: vec![address],
        port,
        created_at: assignment.as_ref().map(|held| held.created_at),
        mark: assignment.as_ref().map(Assignment::mark),
    }
}

/// Host and port of an ID that is no longer in the config, best effort.
fn split_id(id: &str) -> (String, Option<u16>) {
    match Endpoint::try_from(id.to_owned()) {
        Ok(endpoint) => (endpoint.host().to_owned(), Some(endpoint.port())),
        Err(_) => (id.to_owned(), None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proxyfleet_sdk::Network;
    use std::cell::{Cell, RefCell};
    use std::collections::BTreeMap;

    /// The host store's semantics over a map: versions grow with every
    /// write, 0 after a delete.
    #[derive(Default)]
    struct MemoryStore {
        entries: RefCell<BTreeMap<String, (Vec<u8>, u64)>>,
        next_version: Cell<u64>,
    }

    impl MemoryStore {
        fn keys(&self) -> Vec<String> {
            self.entries.borrow().keys().cloned().collect()
        }
    }

    impl Store for MemoryStore {
        fn get(&self, key: &str) -> std::result::Result<Option<KvEntry>, KvError> {
            Ok(self.entries.borrow().get(key).map(|(value, version)| KvEntry {
                key: key.to_owned(),
                value: value.clone(),
                version: *version,
            }))
        }

        fn compare_and_swap(
            &self,
            key: &str,
            expected: Option<u64>,
            value: Option<&[u8]>,
        ) -> std::result::Result<CasOutcome, KvError> {
            let current = self.get(key)?;
            if current.as_ref().map(|entry| entry.version) != expected {
                return Ok(CasOutcome::Conflict(current));
            }
            let mut entries = self.entries.borrow_mut();
            match value {
                Some(value) => {
                    self.next_version.set(self.next_version.get() + 1);
                    let version = self.next_version.get();
                    entries.insert(key.to_owned(), (value.to_vec(), version));
                    Ok(CasOutcome::Applied(version))
                }
                None => {
                    entries.remove(key);
                    Ok(CasOutcome::Applied(0))
                }
            }
        }

        fn list(&self, prefix: &str) -> std::result::Result<Vec<KvEntry>, KvError> {
            Ok(self
                .entries
                .borrow()
                .range(prefix.to_owned()..)
                .take_while(|(key, _)| key.starts_with(prefix))
                .map(|(key, (value, version))| KvEntry {
                    key: key.clone(),
                    value: value.clone(),
                    version: *version,
                })
                .collect())
        }
    }

    /// A [`MemoryStore`] whose reads call `after_get` with their key once
    /// they have read, and which counts its listings: the hook for
    /// interleavings (another create between a look and a
    /// compare-and-swap), rewrites and counts.
    struct Hooked<'a, H: Fn(&str)> {
        inner: &'a MemoryStore,
        after_get: H,
        lists: Cell<usize>,
    }

    impl<'a, H: Fn(&str)> Hooked<'a, H> {
        fn new(inner: &'a MemoryStore, after_get: H) -> Self {
            Self { inner, after_get, lists: Cell::new(0) }
        }
    }

    impl<H: Fn(&str)> Store for Hooked<'_, H> {
        fn get(&self, key: &str) -> std::result::Result<Option<KvEntry>, KvError> {
            let read = self.inner.get(key);
            (self.after_get)(key);
            read
        }

        fn compare_and_swap(
            &self,
            key: &str,
            expected: Option<u64>,
            value: Option<&[u8]>,
        ) -> std::result::Result<CasOutcome, KvError> {
            self.inner.compare_and_swap(key, expected, value)
        }

        fn list(&self, prefix: &str) -> std::result::Result<Vec<KvEntry>, KvError> {
            self.lists.set(self.lists.get() + 1);
            self.inner.list(prefix)
        }
    }

    /// Runs `during` once, right after the first read of an endpoint's key.
    fn after_first_endpoint_read(during: &RefCell<Option<impl FnOnce()>>) -> impl Fn(&str) + '_ {
        move |key| {
            if key.starts_with(PREFIX)
                && let Some(during) = during.borrow_mut().take()
            {
                during();
            }
        }
    }

    /// A store that is down.
    struct Unavailable;

    impl Store for Unavailable {
        fn get(&self, _: &str) -> std::result::Result<Option<KvEntry>, KvError> {
            Err(KvError::Unavailable("down".into()))
        }
        fn compare_and_swap(
            &self,
            _: &str,
            _: Option<u64>,
            _: Option<&[u8]>,
        ) -> std::result::Result<CasOutcome, KvError> {
            Err(KvError::Unavailable("down".into()))
        }
        fn list(&self, _: &str) -> std::result::Result<Vec<KvEntry>, KvError> {
            Err(KvError::Unavailable("down".into()))
        }
    }

    fn config(endpoints: &[&str]) -> StaticConfig {
        let json = serde_json::json!({ "endpoints": endpoints }).to_string();
        StaticConfig::parse(&json).expect("valid config")
    }

    fn spec(uid: &str) -> ProxySpec {
        ProxySpec {
            installation: "prod".into(),
            name: format!("proxy-{uid}"),
            namespace: "egress".into(),
            uid: uid.into(),
            cores: 1,
            memory_mib: 512,
            disk_gib: 4,
            image: String::new(),
            placement: Vec::new(),
            network: Network { vlan_tag: None },
            port: 3128,
            user_data: Vec::new(),
            labels: Vec::new(),
            proxy_auth: None,
        }
    }

    fn three() -> StaticConfig {
        config(&["203.0.113.10:3128", "[2001:db8::1]:8080", "proxy.example:3129"])
    }

    /// The endpoint a create for `uid` tries first.
    fn first_choice(config: &StaticConfig, uid: &str) -> String {
        config.endpoints[probe_order(uid, config.endpoints.len()).next().expect("an endpoint")].id()
    }

    #[test]
    fn assigns_the_first_free_endpoint_of_the_uids_order_with_marks() {
        let store = MemoryStore::default();
        let config = three();
        let first = assign(&store, &config, &spec("a"), 100).expect("assigned");
        assert_eq!(first.provider_id, first_choice(&config, "a"));
        assert_eq!(first.state, InstanceState::Running);
        let endpoint = config.find(&first.provider_id).expect("configured");
        assert_eq!(first.addresses, vec![endpoint.host().to_owned()]);
        assert_eq!(first.port, Some(endpoint.port()));
        assert_eq!(first.created_at, Some(100));
        assert_eq!(
            first.mark,
            Some(OwnershipMark {
                installation: "prod".into(),
                uid: "a".into(),
                namespace: "egress".into(),
                name: "proxy-a".into(),
                created_at: 100
            })
        );
        let stored = store.get(&key(&first.provider_id)).expect("ok").expect("present");
        let value: serde_json::Value = serde_json::from_slice(&stored.value).expect("JSON");
        assert_eq!(
            value,
            serde_json::json!({"installation": "prod", "uid": "a", "namespace": "egress", "name": "proxy-a", "createdAt": 100})
        );
        let holder = store.get("holder/a").expect("ok").expect("the holder key");
        assert_eq!(holder.value, first.provider_id.as_bytes());

        let second = assign(&store, &config, &spec("b"), 101).expect("assigned");
        assert_ne!(second.provider_id, first.provider_id);
        let third = assign(&store, &config, &spec("c"), 101).expect("assigned");
        let mut ids = [&first, &second, &third].map(|instance| instance.provider_id.clone());
        ids.sort();
        assert_eq!(ids, ["203.0.113.10:3128", "[2001:db8::1]:8080", "proxy.example:3129"]);
    }

    #[test]
    fn probe_orders_visit_every_endpoint_once_and_differ_by_uid() {
        for count in [1, 2, 3, 4, 6, 10, 97, 1000] {
            for uid in ["a", "b", "0b5e8f8c-8d5e-4c33-a6a3-0f1e2d3c4b5a"] {
                let mut order: Vec<usize> = probe_order(uid, count).collect();
                order.sort_unstable();
                assert_eq!(order, (0..count).collect::<Vec<_>>(), "{uid} over {count}");
            }
        }
        let firsts: std::collections::BTreeSet<usize> = (0..50)
            .map(|i| probe_order(&format!("uid-{i}"), 1000).next().expect("an index"))
            .collect();
        assert!(firsts.len() > 40, "UIDs start apart: {firsts:?}");
    }

    #[test]
    fn a_create_reads_a_few_keys_however_many_endpoints_there_are() {
        let endpoints: Vec<String> =
            (0..1000).map(|i| format!("10.1.{}.{}:3128", i / 250, i % 250)).collect();
        // Read as a create reads it: through the entry's lookup table.
        let json = serde_json::json!({ "endpoints": endpoints }).to_string();
        let table: std::collections::HashMap<String, String> =
            StaticConfig::parse(&json).expect("valid").lookup_table().into_iter().collect();
        let config = crate::config::Table::new(|key: &str| table.get(key).cloned());
        let inner = MemoryStore::default();
        let reads = Cell::new(0);
        let store = Hooked::new(&inner, |_| reads.set(reads.get() + 1));
        for i in 0..500 {
            assign(&store, &config, &spec(&format!("uid-{i}")), 1).expect("assigned");
        }
        let before = reads.get();
        assign(&store, &config, &spec("one-more"), 1).expect("assigned");
        let read = reads.get() - before;
        assert!(read < 20, "a create at half full read {read} keys");
        let before = reads.get();
        assign(&store, &config, &spec("uid-7"), 2).expect("adopted");
        assert_eq!(reads.get() - before, 2, "a retry reads its holder and endpoint");
        assert_eq!(store.lists.get(), 0, "no create lists the assignments");
    }

    #[test]
    fn a_retried_create_gets_the_same_endpoint() {
        let store = MemoryStore::default();
        let config = three();
        let first = assign(&store, &config, &spec("b"), 100).expect("assigned");
        let _other = assign(&store, &config, &spec("c"), 100).expect("assigned");
        let retry = assign(&store, &config, &spec("b"), 200).expect("adopted");
        assert_eq!(retry, first);
        assert_eq!(retry.created_at, Some(100), "the first attempt's time is kept");
        assert_eq!(store.list(PREFIX).expect("the test store answers").len(), 2);
    }

    #[test]
    fn a_create_cut_off_after_naming_its_endpoint_takes_it_on_retry() {
        let store = MemoryStore::default();
        let config = three();
        // The holder key names an endpoint the create never took.
        let named = first_choice(&config, "a");
        store
            .compare_and_swap("holder/a", None, Some(named.as_bytes()))
            .expect("the test store answers");
        let taken = assign(&store, &config, &spec("a"), 1).expect("assigned");
        assert_eq!(taken.provider_id, named);
        assert_eq!(
            store.list(PREFIX).expect("the test store answers").len(),
            1,
            "one endpoint held"
        );
    }

    #[test]
    fn interleaved_creates_never_share_an_endpoint() {
        let store = MemoryStore::default();
        let config = three();
        // Our first choice is the rival's too: the rival takes it between
        // our look and our compare-and-swap.
        let ours_first = first_choice(&config, "ours");
        let rival_uid = (0..)
            .map(|i| format!("rival-{i}"))
            .find(|uid| first_choice(&config, uid) == ours_first)
            .expect("a rival UID with the same first choice");
        let rival: RefCell<Option<Instance>> = RefCell::new(None);
        let during = RefCell::new(Some(|| {
            let won = assign(&store, &config, &spec(&rival_uid), 100).expect("rival assigned");
            *rival.borrow_mut() = Some(won);
        }));
        let racing = Hooked::new(&store, after_first_endpoint_read(&during));
        let ours = assign(&racing, &config, &spec("ours"), 100).expect("assigned");
        let rival = rival.take().expect("rival ran");
        assert_eq!(rival.provider_id, ours_first);
        assert_ne!(ours.provider_id, ours_first);
        assert_eq!(ours.mark.map(|mark| mark.uid), Some("ours".to_owned()));
        assert_eq!(store.list(PREFIX).expect("the test store answers").len(), 2);
    }

    #[test]
    fn interleaved_retry_of_the_same_create_adopts() {
        let store = MemoryStore::default();
        let config = three();
        let earlier = RefCell::new(None);
        let during = RefCell::new(Some(|| {
            *earlier.borrow_mut() = Some(assign(&store, &config, &spec("a"), 100).expect("ok"));
        }));
        let racing = Hooked::new(&store, after_first_endpoint_read(&during));
        let retry = assign(&racing, &config, &spec("a"), 200).expect("adopted");
        assert_eq!(Some(retry), earlier.take());
        assert_eq!(store.list(PREFIX).expect("the test store answers").len(), 1);
    }

    #[test]
    fn full_configs_exceed_quota() {
        let store = MemoryStore::default();
        let config = config(&["10.0.0.1:3128", "10.0.0.2:3128"]);
        assign(&store, &config, &spec("a"), 1).expect("assigned");
        assign(&store, &config, &spec("b"), 1).expect("assigned");
        assert_eq!(
            assign(&store, &config, &spec("c"), 1),
            Err(ProviderError::QuotaExceeded("all 2 endpoints are assigned".into()))
        );
        assert!(matches!(
            assign(&store, &self::config(&[]), &spec("c"), 1),
            Err(ProviderError::QuotaExceeded(_))
        ));
    }

    #[test]
    fn released_endpoints_are_reused() {
        let store = MemoryStore::default();
        let config = config(&["10.0.0.1:3128"]);
        let held = assign(&store, &config, &spec("a"), 1).expect("assigned");
        release(&store, &held.provider_id).expect("released");
        assert!(store.keys().is_empty(), "the holder key goes with the endpoint");
        release(&store, &held.provider_id).expect("releasing twice is fine");
        let next = assign(&store, &config, &spec("b"), 2).expect("assigned");
        assert_eq!(next.provider_id, held.provider_id);
        assert_eq!(next.mark.map(|mark| mark.uid), Some("b".to_owned()));
    }

    #[test]
    fn release_retries_when_the_entry_changes_under_it() {
        /// Rewrites each key it reads, `rewrites_left` times, so that a
        /// compare-and-swap on what was read conflicts.
        fn rewriting(store: &MemoryStore, rewrites_left: u32) -> Hooked<'_, impl Fn(&str) + '_> {
            let rewrites_left = Cell::new(rewrites_left);
            Hooked::new(store, move |key| {
                if rewrites_left.get() > 0 {
                    rewrites_left.set(rewrites_left.get() - 1);
                    let current = store.get(key).expect("read").expect("present");
                    store
                        .compare_and_swap(key, Some(current.version), Some(&current.value))
                        .expect("rewritten");
                }
            })
        }

        let store = MemoryStore::default();
        let config = config(&["10.0.0.1:3128"]);
        assign(&store, &config, &spec("a"), 1).expect("assigned");
        let flaky = rewriting(&store, 2);
        release(&flaky, "10.0.0.1:3128").expect("released on the third try");
        assert!(store.keys().is_empty());

        assign(&store, &config, &spec("a"), 1).expect("assigned");
        let hopeless = rewriting(&store, u32::MAX);
        assert!(matches!(release(&hopeless, "10.0.0.1:3128"), Err(ProviderError::Conflict(_))));
    }

    #[test]
    fn lookup_reports_missing_and_removed_endpoints() {
        let store = MemoryStore::default();
        let config = three();
        assert!(matches!(
            lookup(&store, &config, "203.0.113.10:3128"),
            Err(ProviderError::NotFound(_))
        ));
        let held = assign(&store, &config, &spec("a"), 1).expect("assigned");
        assert_eq!(lookup(&store, &config, &held.provider_id), Ok(held.clone()));

        let shrunk = config_without(&config, &held.provider_id);
        let failed = lookup(&store, &shrunk, &held.provider_id).expect("still assigned");
        assert_eq!(failed.state, InstanceState::Failed);
        assert_eq!(failed.addresses, held.addresses, "read back from the ID");
        assert_eq!(failed.port, held.port);
        assert_eq!(failed.mark, held.mark);
    }

    fn config_without(config: &StaticConfig, id: &str) -> StaticConfig {
        let ids: Vec<String> =
            config.endpoints.iter().map(Endpoint::id).filter(|other| other != id).collect();
        self::config(&ids.iter().map(String::as_str).collect::<Vec<_>>())
    }

    #[test]
    fn listing_and_stranded_endpoints() {
        let store = MemoryStore::default();
        let config = three();
        assign(&store, &config, &spec("a"), 1).expect("assigned");
        assign(&store, &config, &spec("b"), 2).expect("assigned");
        let listed = all(&store, &config).expect("listed");
        let mut uids: Vec<_> = listed
            .iter()
            .filter_map(|instance| instance.mark.as_ref().map(|mark| mark.uid.as_str()))
            .collect();
        uids.sort_unstable();
        assert_eq!(uids, vec!["a", "b"]);
        assert!(stranded(&store, &config).expect("ok").is_empty());
        let of_a =
            store.get("holder/a").expect("the test store answers").expect("a holder key").value;
        let of_a = String::from_utf8(of_a).expect("an endpoint ID");
        assert_eq!(
            stranded(&store, &config_without(&config, &of_a)).expect("ok"),
            vec![(of_a, "egress/proxy-a".to_owned())]
        );
    }

    #[test]
    fn foreign_entries_occupy_but_carry_no_mark() {
        let store = MemoryStore::default();
        let config = three();
        store
            .compare_and_swap("endpoint/203.0.113.10:3128", None, Some(b"not json"))
            .expect("written");
        let held = assign(&store, &config, &spec("a"), 1).expect("assigned");
        assert_ne!(held.provider_id, "203.0.113.10:3128");
        let foreign = lookup(&store, &config, "203.0.113.10:3128").expect("present");
        assert_eq!(foreign.mark, None);
        assert_eq!(foreign.state, InstanceState::Failed);
    }

    #[test]
    fn store_errors_are_classified() {
        let config = three();
        assert!(matches!(
            assign(&Unavailable, &config, &spec("a"), 1),
            Err(ProviderError::Transient(_))
        ));
        assert!(matches!(release(&Unavailable, "x:1"), Err(ProviderError::Transient(_))));
    }
}
