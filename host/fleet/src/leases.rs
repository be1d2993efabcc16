//! Discovery leases: which proxies crawlers hold and until when, shared by
//! every replica through a durable store, so a restart, a change of leader
//! or a request to another replica ends no lease and no sticky session.
//!
//! The store is the truth; each process keeps a table that follows it.
//! The store holds one record per leased proxy with every lease on it, and
//! each grant is a compare-and-swap of that record that checks the rules
//! against what the store holds: two replicas can never both hand out one
//! proxy exclusively, nor one exclusively and one shared. A grant, renewal
//! or release is answered only once the store holds it; a store that cannot
//! be written answers 503 and changes nothing. Gateway sessions are kept in
//! the table first and written after the next health round, off the
//! request's path.
//!
//! After every health round each process reads the store again: leases
//! granted elsewhere hold here from then on (a lease this table does not
//! know yet is looked up in the store before a renewal or release is
//! refused), and expired leases leave the store.
//!
//! The store is the plugins' key-value store under a scope no provider
//! entry can have (entry names are DNS labels; this one has a dot): a redb
//! table in standalone mode, the ConfigMap
//! `proxyfleet-kv-discovery.leases` in a cluster.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use proxyfleet_core::kv::{CasOutcome, KvError, KvStore};
use serde::{Deserialize, Serialize};

/// The store scope the leases live under.
pub const SCOPE: &str = "discovery.leases";

/// Attempts to change one proxy's record before giving up for now; only
/// other writers of the same record make an attempt fail.
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

    /// The lease as its proxy's record keeps it.
    pub(crate) fn held(&self) -> Held {
        Held { exclusive: self.exclusive, expires_at: self.expires_at }
    }
}

/// One lease in a stored record. Only the Unix expiry is kept: an
/// `Instant` means nothing to another process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct Held {
    pub(crate) exclusive: bool,
    pub(crate) expires_at: u64,
}

/// What the store keeps for one proxy: its URL and every lease on it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Record {
    url: String,
    leases: BTreeMap<String, Held>,
}

impl Record {
    fn decode(bytes: &[u8]) -> Option<Self> {
        serde_json::from_slice(bytes).ok()
    }

    /// `None` once no lease is left: the key goes.
    fn encode(&self) -> Option<Vec<u8>> {
        (!self.leases.is_empty())
            .then(|| serde_json::to_vec(self).expect("a lease record serialises"))
    }

    /// Whether lease `id` may hold the proxy as `held` asks, beside the
    /// other live leases: an exclusive lease only alone, a shared one only
    /// where no exclusive lease is.
    fn admits(&self, id: &str, held: Held) -> bool {
        let mut others = self.leases.iter().filter(|(other, _)| *other != id);
        match held.exclusive {
            true => others.next().is_none(),
            false => others.all(|(_, other)| !other.exclusive),
        }
    }
}

/// The live leases, by ID and by proxy.
#[derive(Debug, Default)]
pub(crate) struct Leases {
    by_id: HashMap<String, Lease>,
    /// Proxy ID → IDs of the leases on it.
    by_proxy: HashMap<String, Vec<String>>,
    /// Leases of this table the store may not hold yet: gateway sessions
    /// to write after the round, grants whose write is under way. A
    /// refresh from the store keeps them as they are here.
    local: HashSet<String>,
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

    /// Live leases whose ID starts with `prefix`, counted in place.
    pub(crate) fn count_prefixed(&self, prefix: &str, now: Instant) -> usize {
        self.by_id
            .iter()
            .filter(|(id, lease)| id.starts_with(prefix) && lease.expires > now)
            .count()
    }

    /// How many live leases hold proxy `id`.
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

    /// Adds (or replaces) lease `id`.
    pub(crate) fn insert(&mut self, id: String, lease: Lease) {
        self.remove(&id);
        self.by_proxy.entry(lease.proxy_id.clone()).or_default().push(id.clone());
        self.by_id.insert(id, lease);
    }

    /// Adds lease `id` as one the store may not hold yet.
    pub(crate) fn insert_local(&mut self, id: String, lease: Lease) {
        self.insert(id.clone(), lease);
        self.local.insert(id);
    }

    /// The store holds lease `id` as this table does now.
    pub(crate) fn written(&mut self, id: &str) {
        self.local.remove(id);
    }

    /// Whether the store may not hold lease `id` yet.
    pub(crate) fn is_unwritten(&self, id: &str) -> bool {
        self.local.contains(id)
    }

    /// The lease `id`, if it is still live.
    pub(crate) fn live(&self, id: &str, now: Instant) -> Option<&Lease> {
        self.by_id.get(id).filter(|lease| lease.expires > now)
    }

    pub(crate) fn remove(&mut self, id: &str) -> Option<Lease> {
        self.local.remove(id);
        let lease = self.by_id.remove(id)?;
        if let Some(ids) = self.by_proxy.get_mut(&lease.proxy_id) {
            ids.retain(|held| held != id);
            if ids.is_empty() {
                self.by_proxy.remove(&lease.proxy_id);
            }
        }
        Some(lease)
    }

    /// Drops expired leases; their stored copies go at the next refresh.
    pub(crate) fn expire(&mut self, now: Instant) {
        let expired: Vec<String> = self
            .by_id
            .iter()
            .filter(|(_, lease)| lease.expires <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for id in expired {
            self.remove(&id);
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

    /// Leases the store may not hold yet, with what they should be.
    pub(crate) fn unwritten(&self) -> Vec<(String, Lease)> {
        self.local.iter().filter_map(|id| Some((id.clone(), self.by_id.get(id)?.clone()))).collect()
    }

    /// Replaces the table with the leases read from the store, keeping
    /// those the store may not hold yet as they are here; whether a viewer
    /// sees another table.
    pub(crate) fn refresh(&mut self, stored: Vec<(String, Lease)>) -> bool {
        let before = self.views();
        let local: Vec<(String, Lease)> = self.unwritten();
        let granted = self.granted;
        *self = Self { granted, ..Self::default() };
        for (id, lease) in stored {
            self.insert(id, lease);
        }
        for (id, lease) in local {
            self.insert_local(id, lease);
        }
        self.views() != before
    }
}

/// The durable store the tables follow.
#[derive(Debug, Clone)]
pub(crate) struct LeaseStore(Arc<dyn KvStore>);

/// What the store held at a load.
#[derive(Debug, Default)]
pub(crate) struct Loaded {
    /// Live leases.
    pub(crate) live: Vec<(String, Lease)>,
    /// Records to tidy: proxy ID → leases to drop besides the expired
    /// ones (a session moved to another proxy leaves its old copy). A
    /// record that cannot be read is dropped whole.
    pub(crate) tidy: BTreeMap<String, Vec<String>>,
}

impl LeaseStore {
    pub(crate) fn new(store: Arc<dyn KvStore>) -> Self {
        Self(store)
    }

    /// Puts lease `id` on proxy `proxy` (or moves its end) when the
    /// proxy's record admits it; `Ok(false)` when another lease holds the
    /// proxy in a way that rules it out.
    pub(crate) async fn claim(
        &self,
        proxy: &str,
        id: &str,
        url: &str,
        held: Held,
        now_unix: u64,
    ) -> Result<bool, KvError> {
        self.modify(proxy, now_unix, |record| {
            if !record.admits(id, held) {
                return false;
            }
            if record.url != url {
                url.clone_into(&mut record.url);
            }
            record.leases.insert(id.to_owned(), held);
            true
        })
        .await
    }

    /// Moves the end of live lease `id` on `proxy`; `Ok(false)` when the
    /// store holds no such live lease.
    pub(crate) async fn extend(
        &self,
        proxy: &str,
        id: &str,
        expires_at: u64,
        now_unix: u64,
    ) -> Result<bool, KvError> {
        self.modify(proxy, now_unix, |record| match record.leases.get_mut(id) {
            Some(held) => {
                held.expires_at = expires_at;
                true
            }
            None => false,
        })
        .await
    }

    /// Removes live lease `id` from `proxy`; `Ok(false)` when the store
    /// holds no such live lease.
    pub(crate) async fn end(&self, proxy: &str, id: &str, now_unix: u64) -> Result<bool, KvError> {
        self.modify(proxy, now_unix, |record| record.leases.remove(id).is_some()).await
    }

    /// Drops the expired leases of `proxy`'s record and those `drop`
    /// names; an unreadable record goes whole.
    pub(crate) async fn tidy(
        &self,
        proxy: &str,
        drop: &[String],
        now_unix: u64,
    ) -> Result<(), KvError> {
        self.modify(proxy, now_unix, |record| {
            record.leases.retain(|id, _| !drop.contains(id));
            true
        })
        .await
        .map(|_| ())
    }

    /// Reads `proxy`'s record, lets `change` edit it (expired leases are
    /// gone first) and writes it back when it changed, unless `change`
    /// refuses (returns false). A write that loses a race starts over from
    /// what won, so the rules are always checked against the store.
    async fn modify(
        &self,
        proxy: &str,
        now_unix: u64,
        change: impl Fn(&mut Record) -> bool,
    ) -> Result<bool, KvError> {
        let mut current = self.0.get(SCOPE, proxy).await?;
        for _ in 0..MAX_ATTEMPTS {
            let stored = current.as_ref().map(|entry| entry.value.as_slice());
            let mut record = stored.and_then(Record::decode).unwrap_or_default();
            record.leases.retain(|_, held| held.expires_at > now_unix);
            if !change(&mut record) {
                return Ok(false);
            }
            let want = record.encode();
            if want.as_deref() == stored {
                return Ok(true);
            }
            let expected = current.as_ref().map(|entry| entry.version);
            match self.0.compare_and_swap(SCOPE, proxy, expected, want).await? {
                CasOutcome::Applied(_) => return Ok(true),
                CasOutcome::Conflict(now) => current = now,
            }
        }
        Err(KvError::Unavailable(format!(
            "the leases of proxy {proxy:?} changed under every one of {MAX_ATTEMPTS} writes"
        )))
    }

    /// Reads every stored lease; `now_unix` and `now` are the same moment
    /// on the wall clock and on this process's clock. A lease found on two
    /// proxies (a session that moved) counts where it ends last.
    pub(crate) async fn load(&self, now_unix: u64, now: Instant) -> Result<Loaded, KvError> {
        let mut loaded = Loaded::default();
        // Lease ID → (proxy, url, held) of its copy that counts.
        let mut live: BTreeMap<String, (String, String, Held)> = BTreeMap::new();
        for entry in self.0.list(SCOPE, "").await? {
            let Some(record) = Record::decode(&entry.value) else {
                tracing::warn!(proxy = %entry.key, "stored discovery leases cannot be read and are dropped");
                loaded.tidy.entry(entry.key).or_default();
                continue;
            };
            for (id, held) in record.leases {
                if held.expires_at <= now_unix {
                    loaded.tidy.entry(entry.key.clone()).or_default();
                    continue;
                }
                let copy = (entry.key.clone(), record.url.clone(), held);
                let Some(before) = live.get(&id) else {
                    live.insert(id, copy);
                    continue;
                };
                // The copy that ends last counts; on a tie, the lower proxy
                // ID, so every replica keeps the same one.
                let newer = (held.expires_at, std::cmp::Reverse(&entry.key))
                    > (before.2.expires_at, std::cmp::Reverse(&before.0));
                let loser = if newer {
                    live.insert(id.clone(), copy).map(|c| c.0)
                } else {
                    Some(entry.key.clone())
                };
                if let Some(loser) = loser {
                    loaded.tidy.entry(loser).or_default().push(id);
                }
            }
        }
        loaded.live = live
            .into_iter()
            .map(|(id, (proxy_id, url, held))| {
                let left = Duration::from_secs(held.expires_at - now_unix);
                let lease = Lease {
                    proxy_id,
                    url,
                    exclusive: held.exclusive,
                    expires: now + left,
                    expires_at: held.expires_at,
                };
                (id, lease)
            })
            .collect();
        Ok(loaded)
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

    fn held(exclusive: bool, expires_at: u64) -> Held {
        Held { exclusive, expires_at }
    }

    const URL: &str = "http://127.0.0.1:3128";

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
    }

    #[test]
    fn a_refresh_takes_the_stores_leases_and_keeps_unwritten_ones() {
        let now = Instant::now();
        let mut leases = Leases::default();
        leases.insert("gone".into(), lease("p", false, Duration::from_secs(10), now));
        leases.insert_local("session-s".into(), lease("q", false, Duration::from_secs(10), now));
        // The store still has the session on its old proxy.
        let stored = vec![
            ("elsewhere".to_owned(), lease("p", true, Duration::from_secs(10), now)),
            ("session-s".to_owned(), lease("p", false, Duration::from_secs(5), now)),
        ];
        assert!(leases.refresh(stored.clone()), "the table moved");
        let ids: Vec<String> = leases.views().into_iter().map(|v| v.id).collect();
        assert_eq!(ids, ["elsewhere", "session-s"]);
        assert_eq!(leases.view("session-s").unwrap().proxy_id, "q", "the table's own copy");
        assert_eq!(leases.unwritten().len(), 1);
        leases.written("session-s");
        assert!(leases.unwritten().is_empty());
        // The session is written now: the next load has it where it is,
        // which viewers need not hear of; a renewal elsewhere they do.
        let session = |ttl| ("session-s".to_owned(), lease("q", false, ttl, now));
        let same = vec![stored[0].clone(), session(Duration::from_secs(10))];
        assert!(!leases.refresh(same), "the same leases: no change for the viewers");
        let renewed = vec![stored[0].clone(), session(Duration::from_secs(20))];
        assert!(leases.refresh(renewed), "a renewal by another replica moved an end");
    }

    #[tokio::test]
    async fn a_claim_checks_the_rules_against_the_stored_record() {
        let kv = Arc::new(MemoryKv::default());
        let store = LeaseStore::new(Arc::clone(&kv) as _);
        assert!(store.claim("p", "shared-1", URL, held(false, 1_010), 1_000).await.unwrap());
        assert!(store.claim("p", "shared-2", URL, held(false, 1_010), 1_000).await.unwrap());
        assert!(
            !store.claim("p", "mine", URL, held(true, 1_010), 1_000).await.unwrap(),
            "no exclusive lease beside shared ones"
        );
        assert!(store.end("p", "shared-1", 1_000).await.unwrap());
        assert!(store.end("p", "shared-2", 1_000).await.unwrap());
        assert!(kv.get(SCOPE, "p").await.unwrap().is_none(), "an empty record goes");
        assert!(store.claim("p", "mine", URL, held(true, 1_010), 1_000).await.unwrap());
        assert!(!store.claim("p", "theirs", URL, held(false, 1_010), 1_000).await.unwrap());
        assert!(!store.claim("p", "theirs", URL, held(true, 1_010), 1_000).await.unwrap());
        // Its own lease again (a renewed session) is admitted.
        assert!(store.claim("p", "mine", URL, held(true, 1_020), 1_000).await.unwrap());
        // Expired, it no longer rules anything out.
        assert!(store.claim("p", "theirs", URL, held(true, 1_100), 1_050).await.unwrap());
        assert!(!store.extend("p", "mine", 1_200, 1_050).await.unwrap(), "expired is gone");
        assert!(store.extend("p", "theirs", 1_200, 1_050).await.unwrap());
        assert!(!store.end("p", "mine", 1_050).await.unwrap());
        let loaded = store.load(1_050, Instant::now()).await.unwrap();
        assert_eq!(loaded.live.len(), 1);
        assert_eq!(loaded.live[0].0, "theirs");
        assert_eq!(loaded.live[0].1.expires_at, 1_200);
    }

    /// Two replicas each granting an exclusive lease on the one proxy,
    /// each from a table that did not know the other's: only one wins.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn of_concurrent_exclusive_claims_on_one_proxy_one_wins() {
        let kv = Arc::new(MemoryKv::default());
        let claims = (0..16).map(|n| {
            let store = LeaseStore::new(Arc::clone(&kv) as _);
            tokio::spawn(async move {
                store.claim("p", &format!("lease-{n}"), URL, held(true, 2_000), 1_000).await
            })
        });
        let mut won = 0;
        for claim in claims {
            if claim.await.unwrap().unwrap() {
                won += 1;
            }
        }
        assert_eq!(won, 1);
    }

    #[tokio::test]
    async fn a_load_sets_aside_expired_unreadable_and_moved_leases() {
        let kv = Arc::new(MemoryKv::default());
        let store = LeaseStore::new(Arc::clone(&kv) as _);
        let now = Instant::now();
        store.claim("p", "old", URL, held(false, 1_005), 1_000).await.unwrap();
        store.claim("p", "session-s", URL, held(false, 1_100), 1_000).await.unwrap();
        store.claim("q", "session-s", URL, held(false, 1_200), 1_000).await.unwrap();
        kv.compare_and_swap(SCOPE, "junk", None, Some(b"{\"proxyId\":1}".to_vec())).await.unwrap();
        let loaded = store.load(1_005, now).await.unwrap();
        assert_eq!(loaded.live.len(), 1);
        assert_eq!(loaded.live[0].0, "session-s");
        assert_eq!(loaded.live[0].1.proxy_id, "q", "the copy that ends last");
        assert!(loaded.live[0].1.expires > now + Duration::from_secs(194));
        let tidy: Vec<(&str, &[String])> =
            loaded.tidy.iter().map(|(proxy, ids)| (proxy.as_str(), ids.as_slice())).collect();
        assert_eq!(tidy, [("junk", &[][..]), ("p", &["session-s".to_owned()][..])]);
        for (proxy, drop) in &loaded.tidy {
            store.tidy(proxy, drop, 1_005).await.unwrap();
        }
        let keys: Vec<String> =
            kv.list(SCOPE, "").await.unwrap().into_iter().map(|e| e.key).collect();
        assert_eq!(keys, ["q"]);
    }
}
