//! Discovery leases: which proxies crawlers hold and until when, kept in a
//! durable store so a restart or a change of leader ends no sticky session.
//!
//! The table in memory answers every pick; the store follows it. A grant,
//! renewal or release is answered only once the store holds it; when a
//! write fails the crawler gets a 503, the lease is marked unsynced, and
//! the next sweep brings the store in step with the table. A new process
//! (or a new leader) restores the table from the store before its catalog
//! turns ready.
//!
//! The store is the plugins' key-value store under a scope no provider
//! entry can have (entry names are DNS labels; this one has a dot): a redb
//! table in standalone mode, the ConfigMap
//! `proxyfleet-kv-discovery.leases` in a cluster.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use proxyfleet_core::kv::{CasOutcome, KvError, KvStore};
use serde::{Deserialize, Serialize};

/// The store scope the leases live under.
pub const SCOPE: &str = "discovery.leases";

/// Attempts to bring one stored lease in step before giving up for now;
/// only a second writer of the same lease makes an attempt fail.
const MAX_ATTEMPTS: u32 = 8;

/// A lease as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseView {
    /// Lease ID.
    pub id: String,
    /// The leased proxy's ID.
    pub proxy_id: String,
    /// Its URL.
    pub url: String,
    /// No one else gets the proxy while the lease lives.
    pub exclusive: bool,
    /// Unix seconds the lease ends without a renewal.
    pub expires_at: u64,
}

/// One lease in the table.
#[derive(Debug, Clone)]
pub(crate) struct Lease {
    pub(crate) proxy_id: String,
    pub(crate) url: String,
    pub(crate) exclusive: bool,
    /// When it ends, on this process's clock.
    pub(crate) expires: Instant,
    /// When it ends, in Unix seconds: what the API shows and the store keeps.
    pub(crate) expires_at: u64,
}

impl Lease {
    fn view(&self, id: &str) -> LeaseView {
        LeaseView {
            id: id.to_owned(),
            proxy_id: self.proxy_id.clone(),
            url: self.url.clone(),
            exclusive: self.exclusive,
            expires_at: self.expires_at,
        }
    }
}

/// A lease as the store keeps it. Only the Unix expiry is kept: an
/// `Instant` means nothing to another process.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Stored {
    proxy_id: String,
    url: String,
    exclusive: bool,
    expires_at: u64,
}

/// The live leases, by ID and by proxy.
#[derive(Debug, Default)]
pub(crate) struct Leases {
    by_id: HashMap<String, Lease>,
    /// Proxy ID → IDs of the leases on it.
    by_proxy: HashMap<String, Vec<String>>,
    /// Leases whose stored copy may differ from the table: a write failed,
    /// or the lease expired here and is still stored.
    unsynced: HashSet<String>,
    /// Grants since the metrics last took the count.
    granted: u64,
}

impl Leases {
    /// Live leases on proxy `id`: (any, exclusive).
    pub(crate) fn held(&self, id: &str, now: Instant) -> (bool, bool) {
        let mut any = false;
        for lease in self.live_on(id, now) {
            any = true;
            if lease.exclusive {
                return (true, true);
            }
        }
        (any, false)
    }

    /// How many live leases hold proxy `id`.
    /// Live leases whose ID starts with `prefix`, counted in place.
    pub(crate) fn count_prefixed(&self, prefix: &str, now: Instant) -> usize {
        self.by_id
            .iter()
            .filter(|(id, lease)| id.starts_with(prefix) && lease.expires > now)
            .count()
    }

    pub(crate) fn count(&self, id: &str, now: Instant) -> usize {
        self.live_on(id, now).count()
    }

    fn live_on<'a>(&'a self, id: &str, now: Instant) -> impl Iterator<Item = &'a Lease> {
        self.by_proxy
            .get(id)
            .into_iter()
            .flatten()
            .filter_map(|lease| self.by_id.get(lease))
            .filter(move |lease| lease.expires > now)
    }

    pub(crate) fn insert(&mut self, id: String, lease: Lease) {
        self.by_proxy.entry(lease.proxy_id.clone()).or_default().push(id.clone());
        self.by_id.insert(id, lease);
    }

    /// The lease `id`, if it is still live.
    pub(crate) fn live_mut(&mut self, id: &str, now: Instant) -> Option<&mut Lease> {
        self.by_id.get_mut(id).filter(|lease| lease.expires > now)
    }

    pub(crate) fn remove(&mut self, id: &str) -> Option<Lease> {
        let lease = self.by_id.remove(id)?;
        if let Some(ids) = self.by_proxy.get_mut(&lease.proxy_id) {
            ids.retain(|held| held != id);
            if ids.is_empty() {
                self.by_proxy.remove(&lease.proxy_id);
            }
        }
        Some(lease)
    }

    /// Drops expired leases; their stored copies go at the next sync.
    pub(crate) fn expire(&mut self, now: Instant) {
        let expired: Vec<String> = self
            .by_id
            .iter()
            .filter(|(_, lease)| lease.expires <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for id in expired {
            self.remove(&id);
            self.unsynced.insert(id);
        }
    }

    /// Every lease in the table, ordered by ID.
    pub(crate) fn views(&self) -> Vec<LeaseView> {
        let mut views: Vec<LeaseView> =
            self.by_id.iter().map(|(id, lease)| lease.view(id)).collect();
        views.sort_by(|a, b| a.id.cmp(&b.id));
        views
    }

    pub(crate) fn view(&self, id: &str) -> Option<LeaseView> {
        self.by_id.get(id).map(|lease| lease.view(id))
    }

    pub(crate) fn len(&self) -> usize {
        self.by_id.len()
    }

    pub(crate) fn count_grant(&mut self) {
        self.granted += 1;
    }

    pub(crate) fn take_granted(&mut self) -> u64 {
        std::mem::take(&mut self.granted)
    }

    pub(crate) fn mark_unsynced(&mut self, id: &str) {
        self.unsynced.insert(id.to_owned());
    }

    pub(crate) fn take_unsynced(&mut self) -> Vec<String> {
        self.unsynced.drain().collect()
    }

    /// What the store should hold for lease `id`: its record, or nothing.
    pub(crate) fn stored(&self, id: &str) -> Option<Vec<u8>> {
        self.by_id.get(id).map(|lease| {
            let stored = Stored {
                proxy_id: lease.proxy_id.clone(),
                url: lease.url.clone(),
                exclusive: lease.exclusive,
                expires_at: lease.expires_at,
            };
            serde_json::to_vec(&stored).expect("a lease record serialises")
        })
    }

    /// Replaces the table with leases read back from the store.
    pub(crate) fn restore(&mut self, restored: Vec<(String, Lease)>) {
        let granted = self.granted;
        *self = Self { granted, ..Self::default() };
        for (id, lease) in restored {
            self.insert(id, lease);
        }
    }
}

/// The durable store the table follows.
#[derive(Debug, Clone)]
pub(crate) struct LeaseStore(Arc<dyn KvStore>);

/// What the store held at a restore.
#[derive(Debug, Default)]
pub(crate) struct Restored {
    /// Live leases.
    pub(crate) live: Vec<(String, Lease)>,
    /// Stored leases to delete: expired while no one served, or unreadable.
    pub(crate) stale: Vec<String>,
}

impl LeaseStore {
    pub(crate) fn new(store: Arc<dyn KvStore>) -> Self {
        Self(store)
    }

    /// Brings the stored copy of lease `id` in step with `desired`, which
    /// is read again on every attempt: whichever of two concurrent syncs
    /// of one lease ends last, the store ends holding the table's latest.
    pub(crate) async fn sync(
        &self,
        id: &str,
        desired: impl Fn() -> Option<Vec<u8>>,
    ) -> Result<(), KvError> {
        for _ in 0..MAX_ATTEMPTS {
            let current = self.0.get(SCOPE, id).await?;
            let want = desired();
            if current.as_ref().map(|entry| &entry.value) == want.as_ref() {
                return Ok(());
            }
            let expected = current.map(|entry| entry.version);
            if let CasOutcome::Applied(_) =
                self.0.compare_and_swap(SCOPE, id, expected, want).await?
            {
                return Ok(());
            }
        }
        Err(KvError::Unavailable(format!(
            "lease {id:?} changed under every one of {MAX_ATTEMPTS} writes"
        )))
    }

    /// Reads every stored lease; `now_unix` and `now` are the same moment
    /// on the wall clock and on this process's clock.
    pub(crate) async fn load(&self, now_unix: u64, now: Instant) -> Result<Restored, KvError> {
        let mut restored = Restored::default();
        for entry in self.0.list(SCOPE, "").await? {
            match serde_json::from_slice::<Stored>(&entry.value) {
                Ok(stored) if stored.expires_at > now_unix => {
                    let left = Duration::from_secs(stored.expires_at - now_unix);
                    let lease = Lease {
                        proxy_id: stored.proxy_id,
                        url: stored.url,
                        exclusive: stored.exclusive,
                        expires: now + left,
                        expires_at: stored.expires_at,
                    };
                    restored.live.push((entry.key, lease));
                }
                Ok(_) => restored.stale.push(entry.key),
                Err(err) => {
                    tracing::warn!(lease = %entry.key, "a stored discovery lease cannot be read and is dropped: {err}");
                    restored.stale.push(entry.key);
                }
            }
        }
        Ok(restored)
    }
}

#[cfg(test)]
mod tests {
    use proxyfleet_core::kv::MemoryKv;

    use super::*;

    fn lease(proxy: &str, exclusive: bool, ttl: Duration, now: Instant) -> Lease {
        Lease {
            proxy_id: proxy.into(),
            url: "http://127.0.0.1:3128".into(),
            exclusive,
            expires: now + ttl,
            expires_at: 1_000 + ttl.as_secs(),
        }
    }

    #[test]
    fn held_counts_only_live_leases_and_sees_exclusive_ones() {
        let now = Instant::now();
        let mut leases = Leases::default();
        leases.insert("a".into(), lease("p", false, Duration::from_secs(10), now));
        assert_eq!(leases.held("p", now), (true, false));
        leases.insert("b".into(), lease("p", true, Duration::from_secs(10), now));
        assert_eq!(leases.held("p", now), (true, true));
        assert_eq!(leases.count("p", now), 2);
        assert_eq!(leases.held("p", now + Duration::from_secs(11)), (false, false));
        leases.expire(now + Duration::from_secs(11));
        assert_eq!(leases.len(), 0);
        let mut unsynced = leases.take_unsynced();
        unsynced.sort();
        assert_eq!(unsynced, ["a", "b"], "expired leases are still stored");
    }

    #[tokio::test]
    async fn a_sync_writes_updates_and_deletes_the_stored_copy() {
        let kv = Arc::new(MemoryKv::default());
        let store = LeaseStore::new(Arc::clone(&kv) as _);
        let now = Instant::now();
        let mut leases = Leases::default();
        leases.insert("a".into(), lease("p", true, Duration::from_secs(10), now));
        store.sync("a", || leases.stored("a")).await.unwrap();
        let loaded = store.load(1_000, now).await.unwrap();
        assert_eq!(loaded.live.len(), 1);
        assert_eq!(loaded.live[0].1.expires_at, 1_010);
        assert!(loaded.live[0].1.expires > now + Duration::from_secs(9));
        leases.remove("a");
        store.sync("a", || leases.stored("a")).await.unwrap();
        assert!(kv.get(SCOPE, "a").await.unwrap().is_none());
        // Deleting what is not there is done, not an error.
        store.sync("a", || leases.stored("a")).await.unwrap();
    }

    #[tokio::test]
    async fn a_load_sets_aside_expired_and_unreadable_leases() {
        let kv = Arc::new(MemoryKv::default());
        let store = LeaseStore::new(Arc::clone(&kv) as _);
        let now = Instant::now();
        let mut leases = Leases::default();
        leases.insert("old".into(), lease("p", false, Duration::from_secs(5), now));
        store.sync("old", || leases.stored("old")).await.unwrap();
        kv.compare_and_swap(SCOPE, "junk", None, Some(b"{\"proxy\":1}".to_vec())).await.unwrap();
        let loaded = store.load(1_005, now).await.unwrap();
        assert!(loaded.live.is_empty());
        let mut stale = loaded.stale;
        stale.sort();
        assert_eq!(stale, ["junk", "old"]);
    }
}
