//! The durable key-value store plugins keep their bookkeeping in.
//!
//! Every write is a compare-and-swap on a version, so two writers (two
//! concurrent calls, two operator replicas) can never both believe they
//! took the same key. Backends: [`MemoryKv`] here (tests, harness), an
//! embedded database in standalone mode, an object per entry in Kubernetes.

use std::collections::BTreeMap;
use std::sync::Mutex;

use async_trait::async_trait;

/// Longest key a store accepts, in bytes.
pub const MAX_KEY_BYTES: usize = 512;
/// Largest value a store accepts, in bytes.
pub const MAX_VALUE_BYTES: usize = 64 * 1024;

/// A stored value with its version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvEntry {
    /// The key.
    pub key: String,
    /// The value.
    pub value: Vec<u8>,
    /// Changes on every write; never 0 for a present key.
    pub version: u64,
}

/// What a compare-and-swap did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CasOutcome {
    /// Written; the new version (0 when the key was deleted).
    Applied(u64),
    /// The current state did not match; what is there now.
    Conflict(Option<KvEntry>),
}

/// Why a store call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    /// The store could not be reached; worth retrying.
    #[error("key-value store unavailable: {0}")]
    Unavailable(String),
    /// Key or value breaks the store's limits.
    #[error("invalid key-value request: {0}")]
    Invalid(String),
}

/// A store partitioned by scope (the provider entry name): a plugin only
/// ever reaches its own entry's scope.
#[async_trait]
pub trait KvStore: Send + Sync + std::fmt::Debug {
    /// Reads a key.
    async fn get(&self, scope: &str, key: &str) -> Result<Option<KvEntry>, KvError>;

    /// Writes `value` (deletes when `None`) only when the key's version is
    /// `expected` (`None`: the key must be absent).
    async fn compare_and_swap(
        &self,
        scope: &str,
        key: &str,
        expected: Option<u64>,
        value: Option<Vec<u8>>,
    ) -> Result<CasOutcome, KvError>;

    /// Every entry whose key starts with `prefix`, ordered by key.
    async fn list(&self, scope: &str, prefix: &str) -> Result<Vec<KvEntry>, KvError>;
}

/// Backends that keep a key's version beside its value store them as one
/// byte string: the version, 8 bytes little-endian, then the value.
pub fn encode_versioned(version: u64, value: &[u8]) -> Vec<u8> {
    let mut stored = Vec::with_capacity(8 + value.len());
    stored.extend_from_slice(&version.to_le_bytes());
    stored.extend_from_slice(value);
    stored
}

/// The entry stored as [`encode_versioned`] wrote it.
pub fn decode_versioned(key: &str, stored: &[u8]) -> KvEntry {
    let (version, value) = stored.split_at(8.min(stored.len()));
    let mut raw = [0u8; 8];
    raw[..version.len()].copy_from_slice(version);
    KvEntry { key: key.to_owned(), value: value.to_vec(), version: u64::from_le_bytes(raw) }
}

/// Checks a request against the limits every backend enforces.
pub fn validate_request(key: &str, value: Option<&[u8]>) -> Result<(), KvError> {
    if key.is_empty() {
        return Err(KvError::Invalid("key must not be empty".into()));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(KvError::Invalid(format!(
            "key is {} bytes; the limit is {MAX_KEY_BYTES}",
            key.len()
        )));
    }
    if let Some(value) = value
        && value.len() > MAX_VALUE_BYTES
    {
        return Err(KvError::Invalid(format!(
            "value of {key:?} is {} bytes; the limit is {MAX_VALUE_BYTES}",
            value.len()
        )));
    }
    Ok(())
}

/// An in-memory store, for tests and the plugin test harness.
#[derive(Debug, Default)]
pub struct MemoryKv {
    inner: Mutex<MemoryInner>,
}

#[derive(Debug, Default)]
struct MemoryInner {
    /// Keyed by (scope, key); holds (value, version).
    entries: BTreeMap<(String, String), (Vec<u8>, u64)>,
    /// Versions come from one counter so a deleted and re-created key never
    /// repeats a version a stale writer might still hold.
    last_version: u64,
}

impl MemoryKv {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MemoryInner> {
        // A panic while holding the lock cannot leave the map half-written
        // (every update is a single insert or remove), so poison is harmless.
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[async_trait]
impl KvStore for MemoryKv {
    async fn get(&self, scope: &str, key: &str) -> Result<Option<KvEntry>, KvError> {
        validate_request(key, None)?;
        let inner = self.lock();
        Ok(inner.entries.get(&(scope.to_owned(), key.to_owned())).map(|(value, version)| KvEntry {
            key: key.to_owned(),
            value: value.clone(),
            version: *version,
        }))
    }

    async fn compare_and_swap(
        &self,
        scope: &str,
        key: &str,
        expected: Option<u64>,
        value: Option<Vec<u8>>,
    ) -> Result<CasOutcome, KvError> {
        validate_request(key, value.as_deref())?;
        let mut inner = self.lock();
        let map_key = (scope.to_owned(), key.to_owned());
        let current = inner.entries.get(&map_key).map(|(_, version)| *version);
        if current != expected {
            let now = inner.entries.get(&map_key).map(|(value, version)| KvEntry {
                key: key.to_owned(),
                value: value.clone(),
                version: *version,
            });
            return Ok(CasOutcome::Conflict(now));
        }
        match value {
            Some(value) => {
                inner.last_version += 1;
                let version = inner.last_version;
                inner.entries.insert(map_key, (value, version));
                Ok(CasOutcome::Applied(version))
            }
            None => {
                inner.entries.remove(&map_key);
                Ok(CasOutcome::Applied(0))
            }
        }
    }

    async fn list(&self, scope: &str, prefix: &str) -> Result<Vec<KvEntry>, KvError> {
        let inner = self.lock();
        Ok(inner
            .entries
            .range((scope.to_owned(), prefix.to_owned())..)
            .take_while(|((s, k), _)| s == scope && k.starts_with(prefix))
            .map(|((_, key), (value, version))| KvEntry {
                key: key.clone(),
                value: value.clone(),
                version: *version,
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versioned_values_round_trip() {
        let stored = encode_versioned(42, b"uid-1");
        assert_eq!(
            decode_versioned("k", &stored),
            KvEntry { key: "k".into(), value: b"uid-1".to_vec(), version: 42 }
        );
        assert_eq!(decode_versioned("k", &encode_versioned(7, b"")).version, 7);
    }

    #[tokio::test]
    async fn create_only_succeeds_once() {
        let kv = MemoryKv::new();
        let first = kv.compare_and_swap("e", "k", None, Some(b"a".to_vec())).await.unwrap();
        let CasOutcome::Applied(version) = first else { panic!("first create must apply") };
        let second = kv.compare_and_swap("e", "k", None, Some(b"b".to_vec())).await.unwrap();
        assert_eq!(
            second,
            CasOutcome::Conflict(Some(KvEntry { key: "k".into(), value: b"a".to_vec(), version }))
        );
    }

    #[tokio::test]
    async fn stale_version_conflicts_after_delete_and_recreate() {
        let kv = MemoryKv::new();
        let CasOutcome::Applied(v1) =
            kv.compare_and_swap("e", "k", None, Some(vec![1])).await.unwrap()
        else {
            panic!("create must apply")
        };
        kv.compare_and_swap("e", "k", Some(v1), None).await.unwrap();
        kv.compare_and_swap("e", "k", None, Some(vec![2])).await.unwrap();
        let stale = kv.compare_and_swap("e", "k", Some(v1), Some(vec![3])).await.unwrap();
        assert!(matches!(stale, CasOutcome::Conflict(Some(_))), "a stale version must not win");
    }

    #[tokio::test]
    async fn scopes_are_isolated_and_list_is_prefix_ordered() {
        let kv = MemoryKv::new();
        for key in ["b/2", "b/1", "a/1", "c"] {
            kv.compare_and_swap("one", key, None, Some(vec![])).await.unwrap();
        }
        kv.compare_and_swap("other", "b/3", None, Some(vec![])).await.unwrap();
        let keys: Vec<_> = kv.list("one", "b/").await.unwrap().into_iter().map(|e| e.key).collect();
        assert_eq!(keys, ["b/1", "b/2"]);
        assert_eq!(kv.get("other", "b/1").await.unwrap(), None);
    }

    #[tokio::test]
    async fn oversized_values_are_refused_with_the_limit() {
        let kv = MemoryKv::new();
        let err = kv
            .compare_and_swap("e", "k", None, Some(vec![0; MAX_VALUE_BYTES + 1]))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("limit is 65536"), "{err}");
    }
}
