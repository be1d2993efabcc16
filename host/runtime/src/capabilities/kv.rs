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

use proxyfleet_core::kv::{CasOutcome, KvEntry, KvError, KvStore};

use crate::bindings::kv as wit;
use crate::config::Limits;
use crate::state::PluginState;

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

    /// Whether writing `value` at `key` over `usage` stays inside, or at
    /// least does not grow a store that is over (one filled before a limit
    /// was lowered can still be updated and shrunk).
    fn admits(&self, usage: &[KvEntry], key: &str, value: &[u8]) -> Result<(), KvError> {
        if value.len() > self.value_bytes {
            return Err(KvError::Invalid(format!(
                "the value of {key:?} is {} bytes; the entry's limit is {} \
                 (limits.kvValueKiB)",
                value.len(),
                self.value_bytes
            )));
        }
        let existing = usage.iter().find(|entry| entry.key == key);
        if existing.is_none() && usage.len() >= self.keys {
            return Err(KvError::Invalid(format!(
                "the entry holds {} keys, its limit (limits.kvKeys); delete keys it no longer \
                 needs",
                self.keys
            )));
        }
        let size = |entry: &KvEntry| (entry.key.len() + entry.value.len()) as u64;
        let before = usage.iter().map(size).sum::<u64>();
        let total = before - existing.map_or(0, size) + (key.len() + value.len()) as u64;
        if total > self.total_bytes && total > before {
            return Err(KvError::Invalid(format!(
                "writing {key:?} would make the entry's store {total} bytes; its limit is {} \
                 (limits.kvTotalKiB)",
                self.total_bytes
            )));
        }
        Ok(())
    }
}

/// The store of one entry: its backend scope, its quota, and the lock its
/// writes take.
#[derive(Debug)]
pub(crate) struct EntryKv {
    store: Arc<dyn KvStore>,
    quota: KvQuota,
    writing: tokio::sync::Mutex<()>,
}

impl EntryKv {
    pub(crate) fn new(store: Arc<dyn KvStore>, quota: KvQuota) -> Self {
        Self { store, quota, writing: tokio::sync::Mutex::new(()) }
    }

    async fn compare_and_swap(
        &self,
        scope: &str,
        key: &str,
        expected: Option<u64>,
        value: Option<Vec<u8>>,
    ) -> Result<CasOutcome, KvError> {
        let _one_writer = self.writing.lock().await;
        if let Some(value) = &value {
            let usage = self.store.list(scope, "").await?;
            self.quota.admits(&usage, key, value)?;
        }
        self.store.compare_and_swap(scope, key, expected, value).await
    }
}

impl wit::Host for PluginState {
    async fn get(&mut self, key: String) -> Result<Option<wit::KvEntry>, wit::KvError> {
        let scope = &self.scope;
        scope.kv.store.get(&scope.entry, &key).await.map(|e| e.map(to_wit)).map_err(err_to_wit)
    }

    async fn compare_and_swap(
        &mut self,
        key: String,
        expected: Option<u64>,
        value: Option<Vec<u8>>,
    ) -> Result<wit::CasOutcome, wit::KvError> {
        let limit = self.scope.kv.quota.writes_per_call;
        if self.kv_writes >= limit {
            return Err(wit::KvError::Invalid(format!(
                "this call already made {limit} writes, the entry's limit \
                 (limits.kvWritesPerCall)"
            )));
        }
        self.kv_writes += 1;
        let scope = &self.scope;
        match scope.kv.compare_and_swap(&scope.entry, &key, expected, value).await {
            Ok(CasOutcome::Applied(version)) => Ok(wit::CasOutcome::Applied(version)),
            Ok(CasOutcome::Conflict(now)) => Ok(wit::CasOutcome::Conflict(now.map(to_wit))),
            Err(err) => Err(err_to_wit(err)),
        }
    }

    async fn list(&mut self, prefix: String) -> Result<Vec<wit::KvEntry>, wit::KvError> {
        let scope = &self.scope;
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
}
