//! Which Proxy holds which endpoint, kept in the entry's key-value store.
//!
//! Layout: one key per assigned endpoint, `endpoint/<host:port>`, whose value
//! is the JSON [`Assignment`]. A free endpoint has no key. Taking one is a
//! compare-and-swap that expects the key to be absent, so of two concurrent
//! creates exactly one gets any given endpoint; the other sees a conflict and
//! moves on. The logic runs over the [`Store`] trait so that it can be tested
//! natively against an in-memory map.

use proxyfleet_sdk::kv::{CasOutcome, KvEntry, KvError};
use proxyfleet_sdk::{Instance, InstanceState, OwnershipMark, ProviderError, ProxySpec, Result};
use serde::{Deserialize, Serialize};

use crate::config::{Endpoint, StaticConfig};

/// Key prefix of assignments.
pub const PREFIX: &str = "endpoint/";

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
            uid: spec.uid.clone(),
            namespace: spec.namespace.clone(),
            name: spec.name.clone(),
            created_at,
        }
    }

    fn mark(&self) -> OwnershipMark {
        OwnershipMark {
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

/// Hands `spec` an endpoint: the one it already holds (a retried create), or
/// the first configured endpoint nobody holds.
pub fn assign(
    store: &impl Store,
    config: &StaticConfig,
    spec: &ProxySpec,
    now: u64,
) -> Result<Instance> {
    let held = store.list(PREFIX)?;
    if let Some(instance) = held
        .iter()
        .find(|entry| Assignment::decode(&entry.value).is_some_and(|held| held.uid == spec.uid))
        .map(|entry| instance(config, entry))
    {
        return Ok(instance);
    }

    let wanted = Assignment::for_spec(spec, now);
    let value = serde_json::to_vec(&wanted).map_err(|error| {
        ProviderError::Permanent(format!("cannot encode the assignment: {error}"))
    })?;
    let free = config
        .endpoints
        .iter()
        .filter(|endpoint| !held.iter().any(|entry| entry.key == key(&endpoint.id())));
    for endpoint in free {
        let endpoint_key = key(&endpoint.id());
        match store.compare_and_swap(&endpoint_key, None, Some(&value))? {
            CasOutcome::Applied(version) => {
                let entry = KvEntry { key: endpoint_key, value, version };
                return Ok(instance(config, &entry));
            }
            // Taken since the listing: by a concurrent retry of this very
            // create (adopt it), or by another Proxy (try the next one).
            CasOutcome::Conflict(Some(current))
                if Assignment::decode(&current.value).is_some_and(|held| held.uid == spec.uid) =>
            {
                return Ok(instance(config, &current));
            }
            CasOutcome::Conflict(_) => {}
        }
    }
    Err(ProviderError::QuotaExceeded(match config.endpoints.len() {
        0 => "no endpoints are configured".to_owned(),
        count => format!("all {count} endpoints are assigned"),
    }))
}

/// The instance for endpoint `id`; NotFound when nobody holds it.
pub fn lookup(store: &impl Store, config: &StaticConfig, id: &str) -> Result<Instance> {
    match store.get(&key(id))? {
        Some(entry) => Ok(instance(config, &entry)),
        None => Err(ProviderError::NotFound(format!("endpoint {id} is not assigned"))),
    }
}

/// Frees endpoint `id`; Ok when it is already free.
pub fn release(store: &impl Store, id: &str) -> Result<()> {
    let endpoint_key = key(id);
    for _ in 0..RELEASE_ATTEMPTS {
        let Some(entry) = store.get(&endpoint_key)? else {
            return Ok(());
        };
        match store.compare_and_swap(&endpoint_key, Some(entry.version), None)? {
            CasOutcome::Applied(_) | CasOutcome::Conflict(None) => return Ok(()),
            // Rewritten between our read and delete: read it again.
            CasOutcome::Conflict(Some(_)) => {}
        }
    }
    Err(ProviderError::Conflict(format!(
        "endpoint {id} kept changing while being released ({RELEASE_ATTEMPTS} attempts)"
    )))
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
fn instance(config: &StaticConfig, entry: &KvEntry) -> Instance {
    let id = entry.key.strip_prefix(PREFIX).unwrap_or(&entry.key);
    let configured = config.endpoints.iter().find(|endpoint| endpoint.id() == id);
    let assignment = Assignment::decode(&entry.value);
    let state = match (configured, &assignment) {
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

    /// Runs `during` right after the first `list`, i.e. between a create's
    /// look at what is free and its compare-and-swap: the interleaving that
    /// makes two creates race for the same endpoint.
    struct Interleaved<'a, F: FnOnce()> {
        inner: &'a MemoryStore,
        during: RefCell<Option<F>>,
    }

    impl<F: FnOnce()> Store for Interleaved<'_, F> {
        fn get(&self, key: &str) -> std::result::Result<Option<KvEntry>, KvError> {
            self.inner.get(key)
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
            let listed = self.inner.list(prefix);
            if let Some(during) = self.during.borrow_mut().take() {
                during();
            }
            listed
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
        }
    }

    fn three() -> StaticConfig {
        config(&["203.0.113.10:3128", "[2001:db8::1]:8080", "proxy.example:3129"])
    }

    #[test]
    fn assigns_endpoints_in_order_with_marks() {
        let store = MemoryStore::default();
        let config = three();
        let first = assign(&store, &config, &spec("a"), 100).expect("assigned");
        assert_eq!(first.provider_id, "203.0.113.10:3128");
        assert_eq!(first.state, InstanceState::Running);
        assert_eq!(first.addresses, vec!["203.0.113.10".to_owned()]);
        assert_eq!(first.port, Some(3128));
        assert_eq!(first.created_at, Some(100));
        assert_eq!(
            first.mark,
            Some(OwnershipMark {
                uid: "a".into(),
                namespace: "egress".into(),
                name: "proxy-a".into(),
                created_at: 100
            })
        );
        let second = assign(&store, &config, &spec("b"), 101).expect("assigned");
        assert_eq!(second.provider_id, "[2001:db8::1]:8080");
        assert_eq!(second.addresses, vec!["2001:db8::1".to_owned()]);
        assert_eq!(second.port, Some(8080));
        assert_eq!(store.keys(), vec!["endpoint/203.0.113.10:3128", "endpoint/[2001:db8::1]:8080"]);
        let stored = store.get("endpoint/203.0.113.10:3128").expect("ok").expect("present");
        let value: serde_json::Value = serde_json::from_slice(&stored.value).expect("JSON");
        assert_eq!(
            value,
            serde_json::json!({"uid": "a", "namespace": "egress", "name": "proxy-a", "createdAt": 100})
        );
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
        assert_eq!(store.keys().len(), 2);
    }

    #[test]
    fn interleaved_creates_never_share_an_endpoint() {
        let store = MemoryStore::default();
        let config = three();
        let rival: RefCell<Option<Instance>> = RefCell::new(None);
        let racing = Interleaved {
            inner: &store,
            during: RefCell::new(Some(|| {
                let won = assign(&store, &config, &spec("rival"), 100).expect("rival assigned");
                *rival.borrow_mut() = Some(won);
            })),
        };
        // `ours` saw every endpoint free, but the rival took the first one
        // before our compare-and-swap.
        let ours = assign(&racing, &config, &spec("ours"), 100).expect("assigned");
        let rival = rival.into_inner().expect("rival ran");
        assert_eq!(rival.provider_id, "203.0.113.10:3128");
        assert_eq!(ours.provider_id, "[2001:db8::1]:8080");
        assert_eq!(ours.mark.map(|mark| mark.uid), Some("ours".to_owned()));
    }

    #[test]
    fn interleaved_retry_of_the_same_create_adopts() {
        let store = MemoryStore::default();
        let config = three();
        let earlier = RefCell::new(None);
        let racing = Interleaved {
            inner: &store,
            during: RefCell::new(Some(|| {
                *earlier.borrow_mut() = Some(assign(&store, &config, &spec("a"), 100).expect("ok"));
            })),
        };
        let retry = assign(&racing, &config, &spec("a"), 200).expect("adopted");
        assert_eq!(Some(retry), earlier.into_inner());
        assert_eq!(store.keys().len(), 1);
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
            assign(&store, &StaticConfig { endpoints: Vec::new() }, &spec("c"), 1),
            Err(ProviderError::QuotaExceeded(_))
        ));
    }

    #[test]
    fn released_endpoints_are_reused() {
        let store = MemoryStore::default();
        let config = config(&["10.0.0.1:3128"]);
        let held = assign(&store, &config, &spec("a"), 1).expect("assigned");
        release(&store, &held.provider_id).expect("released");
        release(&store, &held.provider_id).expect("releasing twice is fine");
        let next = assign(&store, &config, &spec("b"), 2).expect("assigned");
        assert_eq!(next.provider_id, held.provider_id);
        assert_eq!(next.mark.map(|mark| mark.uid), Some("b".to_owned()));
    }

    #[test]
    fn release_retries_when_the_entry_changes_under_it() {
        struct RewrittenOnce<'a> {
            inner: &'a MemoryStore,
            rewrites_left: Cell<u32>,
        }
        impl Store for RewrittenOnce<'_> {
            fn get(&self, key: &str) -> std::result::Result<Option<KvEntry>, KvError> {
                let entry = self.inner.get(key);
                if self.rewrites_left.get() > 0 {
                    self.rewrites_left.set(self.rewrites_left.get() - 1);
                    let current = self.inner.get(key)?.expect("present");
                    self.inner.compare_and_swap(
                        key,
                        Some(current.version),
                        Some(&current.value),
                    )?;
                }
                entry
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
                self.inner.list(prefix)
            }
        }

        let store = MemoryStore::default();
        let config = config(&["10.0.0.1:3128"]);
        assign(&store, &config, &spec("a"), 1).expect("assigned");
        let flaky = RewrittenOnce { inner: &store, rewrites_left: Cell::new(2) };
        release(&flaky, "10.0.0.1:3128").expect("released on the third try");
        assert!(store.keys().is_empty());

        assign(&store, &config, &spec("a"), 1).expect("assigned");
        let hopeless = RewrittenOnce { inner: &store, rewrites_left: Cell::new(u32::MAX) };
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

        let shrunk = config_from(&config, 1);
        let failed = lookup(&store, &shrunk, &held.provider_id).expect("still assigned");
        assert_eq!(failed.state, InstanceState::Failed);
        assert_eq!(failed.addresses, vec!["203.0.113.10".to_owned()]);
        assert_eq!(failed.port, Some(3128));
        assert_eq!(failed.mark, held.mark);
    }

    fn config_from(config: &StaticConfig, skip: usize) -> StaticConfig {
        StaticConfig { endpoints: config.endpoints[skip..].to_vec() }
    }

    #[test]
    fn listing_and_stranded_endpoints() {
        let store = MemoryStore::default();
        let config = three();
        assign(&store, &config, &spec("a"), 1).expect("assigned");
        assign(&store, &config, &spec("b"), 2).expect("assigned");
        let listed = all(&store, &config).expect("listed");
        let uids: Vec<_> = listed
            .iter()
            .filter_map(|instance| instance.mark.as_ref().map(|mark| mark.uid.as_str()))
            .collect();
        assert_eq!(uids, vec!["a", "b"]);
        assert!(stranded(&store, &config).expect("ok").is_empty());
        assert_eq!(
            stranded(&store, &config_from(&config, 1)).expect("ok"),
            vec![("203.0.113.10:3128".to_owned(), "egress/proxy-a".to_owned())]
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
        assert_eq!(held.provider_id, "[2001:db8::1]:8080");
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
