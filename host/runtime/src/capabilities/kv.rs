//! `proxyfleet:provider/kv`: the entry-scoped store, backed by whatever
//! [`proxyfleet_core::kv::KvStore`] the host was given, under the entry's
//! quota.
//!
//! The quota is kept here, above every backend, so that each backend (the
//! embedded database, ConfigMaps, memory) is held to the same numbers:
//! keys, value size and total bytes per entry, and writes per call (on the
//! ConfigMap backend each write is an API-server write). Writes of one
//! entry are serialised, so the usage a write is checked against cannot
//! change under it: only the leader runs plugin calls, so one process
//! writes an entry's scope.

use std::sync::Arc;
use std::time::{Duration, Instant};

use proxyfleet_core::kv::{CasOutcome, KvEntry, KvError, KvStore};
use wasmtime::component::HasData;

use super::CallScope;
use crate::bindings::kv as wit;
use crate::limits::Limits;

/// The numbers an entry's store is held to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KvQuota {
    /// Keys the entry may hold.
    pub(crate) keys: usize,
    /// Largest value, in bytes.
    pub(crate) value_bytes: usize,
    /// Keys and values together, in bytes.
    pub(crate) total_bytes: u64,
    /// Writes (and deletes) one call may make.
    pub(crate) writes_per_call: u32,
}

impl KvQuota {
    pub(crate) fn from_limits(limits: &Limits) -> Self {
        Self {
            keys: limits.kv_keys,
            value_bytes: limits.kv_value_bytes,
            total_bytes: limits.kv_total_bytes,
            writes_per_call: limits.kv_writes_per_call,
        }
    }

    /// Whether writing `value` at `key` over `usage`, where `existing` is
    /// what the key holds now, stays inside, or at least does not grow a
    /// store that is over (one filled before a limit was lowered can still
    /// be updated and shrunk).
    fn admits(
        &self,
        usage: Usage,
        existing: Option<&KvEntry>,
        key: &str,
        value: &[u8],
    ) -> Result<(), KvError> {
        if value.len() > self.value_bytes {
            return Err(KvError::Invalid(format!(
                "the value of {key:?} is {} bytes; the entry's limit is {} \
                 (limits.kvValueKiB)",
                value.len(),
                self.value_bytes
            )));
        }
        if existing.is_none() && usage.keys >= self.keys {
            return Err(KvError::Invalid(format!(
                "the entry holds {} keys, its limit (limits.kvKeys); delete keys it no longer \
                 needs",
                self.keys
            )));
        }
        let total =
            usage.bytes - existing.map_or(0, Usage::size) + (key.len() + value.len()) as u64;
        if total > self.total_bytes && total > usage.bytes {
            return Err(KvError::Invalid(format!(
                "writing {key:?} would make the entry's store {total} bytes; its limit is {} \
                 (limits.kvTotalKiB)",
                self.total_bytes
            )));
        }
        Ok(())
    }
}

/// What an entry's store holds, as its quota counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Usage {
    keys: usize,
    /// Keys and values together.
    bytes: u64,
}

impl Usage {
    fn of(entries: &[KvEntry]) -> Self {
        Self { keys: entries.len(), bytes: entries.iter().map(Self::size).sum() }
    }

    fn size(entry: &KvEntry) -> u64 {
        (entry.key.len() + entry.value.len()) as u64
    }

    /// The usage once `key`, which held `existing`, holds `value`.
    fn after(self, existing: Option<&KvEntry>, key: &str, value: Option<&[u8]>) -> Self {
        let removed = existing.map_or(0, Self::size);
        let added = value.map_or(0, |value| (key.len() + value.len()) as u64);
        let keys = self.keys - usize::from(existing.is_some()) + usize::from(value.is_some());
        Self { keys, bytes: self.bytes - removed + added }
    }
}

/// How long a counted usage is trusted: a write from outside this process
/// (a plugin revision being swapped out still finishing a call) is counted
/// within this time.
const RECOUNT_AFTER: Duration = Duration::from_secs(30);

/// The store of one entry: its backend scope, its quota, and the lock its
/// writes take, which guards the usage counted so far.
#[derive(Debug)]
pub(crate) struct EntryKv {
    store: Arc<dyn KvStore>,
    quota: KvQuota,
    writing: tokio::sync::Mutex<Option<(Usage, Instant)>>,
}

impl EntryKv {
    pub(crate) fn new(store: Arc<dyn KvStore>, quota: KvQuota) -> Self {
        Self { store, quota, writing: tokio::sync::Mutex::new(None) }
    }

    /// A write or delete under the quota. The usage is counted from a
    /// listing once and then kept up to date write by write, so a write
    /// costs one read of its own key, not a read of the whole store.
    async fn compare_and_swap(
        &self,
        scope: &str,
        key: &str,
        expected: Option<u64>,
        value: Option<Vec<u8>>,
    ) -> Result<CasOutcome, KvError> {
        let mut counted = self.writing.lock().await;
        let (usage, counted_at) = match *counted {
            Some((usage, at)) if at.elapsed() < RECOUNT_AFTER => (usage, at),
            _ => (Usage::of(&self.store.list(scope, "").await?), Instant::now()),
        };
        let existing = self.store.get(scope, key).await?;
        if let Some(value) = &value {
            self.quota.admits(usage, existing.as_ref(), key, value)?;
        }
        let written = usage.after(existing.as_ref(), key, value.as_deref());
        let outcome = self.store.compare_and_swap(scope, key, expected, value).await;
        *counted = match &outcome {
            Ok(CasOutcome::Applied(_)) => Some((written, counted_at)),
            Ok(CasOutcome::Conflict(_)) => Some((usage, counted_at)),
            // Whether it was written is unknown: count again next time.
            Err(_) => None,
        };
        outcome
    }
}

/// The store import as one call sees it: the entry's store, and the writes
/// this call made against `limits.kvWritesPerCall`.
pub(crate) struct KvView<'a> {
    pub(crate) scope: &'a CallScope,
    pub(crate) writes: &'a mut u32,
}

/// The store import's share of a store's data, for the linker.
pub(crate) struct KvImport;

impl HasData for KvImport {
    type Data<'a> = KvView<'a>;
}

impl wit::Host for KvView<'_> {
    async fn get(&mut self, key: String) -> Result<Option<wit::KvEntry>, wit::KvError> {
        let scope = self.scope;
        scope.kv.store.get(&scope.entry, &key).await.map(|e| e.map(to_wit)).map_err(err_to_wit)
    }

    async fn compare_and_swap(
        &mut self,
        key: String,
        expected: Option<u64>,
        value: Option<Vec<u8>>,
    ) -> Result<wit::CasOutcome, wit::KvError> {
        let limit = self.scope.kv.quota.writes_per_call;
        if *self.writes >= limit {
            return Err(wit::KvError::Invalid(format!(
                "this call already made {limit} writes, the entry's limit \
                 (limits.kvWritesPerCall)"
            )));
        }
        *self.writes += 1;
        let scope = self.scope;
        match scope.kv.compare_and_swap(&scope.entry, &key, expected, value).await {
            Ok(CasOutcome::Applied(version)) => Ok(wit::CasOutcome::Applied(version)),
            Ok(CasOutcome::Conflict(now)) => Ok(wit::CasOutcome::Conflict(now.map(to_wit))),
            Err(err) => Err(err_to_wit(err)),
        }
    }

    async fn list(&mut self, prefix: String) -> Result<Vec<wit::KvEntry>, wit::KvError> {
        let scope = self.scope;
        scope
            .kv
            .store
            .list(&scope.entry, &prefix)
            .await
            .map(|entries| entries.into_iter().map(to_wit).collect())
            .map_err(err_to_wit)
    }
}

fn to_wit(entry: KvEntry) -> wit::KvEntry {
    wit::KvEntry { key: entry.key, value: entry.value, version: entry.version }
}

fn err_to_wit(err: KvError) -> wit::KvError {
    match err {
        KvError::Unavailable(message) => wit::KvError::Unavailable(message),
        KvError::Invalid(message) => wit::KvError::Invalid(message),
    }
}

#[cfg(test)]
mod tests {
    use proxyfleet_core::kv::MemoryKv;

    use super::*;

    fn quota() -> KvQuota {
        KvQuota { keys: 2, value_bytes: 8, total_bytes: 18, writes_per_call: 10 }
    }

    #[tokio::test]
    async fn keys_value_size_and_total_are_held_to_the_quota() {
        let kv = EntryKv::new(Arc::new(MemoryKv::new()), quota());
        let write = |key: &'static str, value: &'static [u8]| {
            let kv = &kv;
            async move { kv.compare_and_swap("e", key, None, Some(value.to_vec())).await }
        };
        let err = write("a", b"123456789").await.unwrap_err();
        assert!(matches!(&err, KvError::Invalid(m) if m.contains("limits.kvValueKiB")), "{err}");
        write("a", b"12345678").await.unwrap();
        let err = write("bb", b"12345678").await.unwrap_err();
        assert!(matches!(&err, KvError::Invalid(m) if m.contains("limits.kvTotalKiB")), "{err}");
        write("b", b"1").await.unwrap();
        let err = write("c", b"").await.unwrap_err();
        assert!(matches!(&err, KvError::Invalid(m) if m.contains("limits.kvKeys")), "{err}");
        // Replacing a key counts it once; deletes pass the quota.
        let version = kv.store.get("e", "b").await.unwrap().unwrap().version;
        kv.compare_and_swap("e", "b", Some(version), Some(b"123".to_vec())).await.unwrap();
        let version = kv.store.get("e", "a").await.unwrap().unwrap().version;
        kv.compare_and_swap("e", "a", Some(version), None).await.unwrap();
        write("c", b"").await.unwrap();
    }

    #[tokio::test]
    async fn a_store_over_a_lowered_quota_can_still_shrink() {
        let store: Arc<dyn KvStore> = Arc::new(MemoryKv::new());
        let roomy = EntryKv::new(Arc::clone(&store), KvQuota { total_bytes: 100, ..quota() });
        roomy.compare_and_swap("e", "a", None, Some(b"12345678".to_vec())).await.unwrap();
        roomy.compare_and_swap("e", "b", None, Some(b"12345678".to_vec())).await.unwrap();
        let tight = EntryKv::new(store, KvQuota { keys: 1, total_bytes: 10, ..quota() });
        let version = tight.store.get("e", "a").await.unwrap().unwrap().version;
        tight.compare_and_swap("e", "a", Some(version), Some(b"1".to_vec())).await.unwrap();
        let version = tight.store.get("e", "b").await.unwrap().unwrap().version;
        let err = tight
            .compare_and_swap("e", "b", Some(version), Some(b"123456789".to_vec()))
            .await
            .unwrap_err();
        assert!(matches!(&err, KvError::Invalid(m) if m.contains("limits.kvValueKiB")), "{err}");
        let err = tight.compare_and_swap("e", "c", None, Some(Vec::new())).await.unwrap_err();
        assert!(matches!(&err, KvError::Invalid(m) if m.contains("limits.kvKeys")), "{err}");
    }

    /// Counts the listings a store answers.
    #[derive(Debug, Default)]
    struct Listed {
        inner: MemoryKv,
        lists: std::sync::atomic::AtomicUsize,
    }

    #[async_trait::async_trait]
    impl KvStore for Listed {
        async fn get(&self, scope: &str, key: &str) -> Result<Option<KvEntry>, KvError> {
            self.inner.get(scope, key).await
        }

        async fn compare_and_swap(
            &self,
            scope: &str,
            key: &str,
            expected: Option<u64>,
            value: Option<Vec<u8>>,
        ) -> Result<CasOutcome, KvError> {
            self.inner.compare_and_swap(scope, key, expected, value).await
        }

        async fn list(&self, scope: &str, prefix: &str) -> Result<Vec<KvEntry>, KvError> {
            self.lists.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.inner.list(scope, prefix).await
        }
    }

    /// Regression: every write listed the entry's whole store to check the
    /// quota, so a write cost as much as the store was large.
    #[tokio::test]
    async fn regression_writes_count_usage_without_listing_the_store() {
        let store = Arc::new(Listed::default());
        let kv = EntryKv::new(
            Arc::clone(&store) as Arc<dyn KvStore>,
            KvQuota { keys: 3, value_bytes: 8, total_bytes: 1000, writes_per_call: 10 },
        );
        for key in ["a", "b", "c"] {
            kv.compare_and_swap("e", key, None, Some(b"1".to_vec())).await.unwrap();
        }
        assert_eq!(store.lists.load(std::sync::atomic::Ordering::Relaxed), 1, "counted once");
        // The count follows conflicts, deletes and replacements.
        let conflict = kv.compare_and_swap("e", "a", None, Some(b"2".to_vec())).await.unwrap();
        assert!(matches!(conflict, CasOutcome::Conflict(Some(_))));
        let err = kv.compare_and_swap("e", "d", None, Some(b"1".to_vec())).await.unwrap_err();
        assert!(matches!(&err, KvError::Invalid(m) if m.contains("limits.kvKeys")), "{err}");
        let version = store.get("e", "a").await.unwrap().unwrap().version;
        kv.compare_and_swap("e", "a", Some(version), None).await.unwrap();
        kv.compare_and_swap("e", "d", None, Some(b"1".to_vec())).await.unwrap();
        assert_eq!(store.lists.load(std::sync::atomic::Ordering::Relaxed), 1);
        let counted = kv.writing.lock().await.map(|(usage, _)| usage);
        assert_eq!(counted, Some(Usage::of(&store.list("e", "").await.unwrap())));
    }
}
