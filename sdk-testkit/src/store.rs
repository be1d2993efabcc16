//! The entry's key-value store, in memory, with the operator's semantics:
//! one version counter for the whole store (a deleted and re-created key
//! never repeats a version a stale writer might hold), compare-and-swap on
//! every write, and the same key and value limits.

use std::cell::RefCell;
use std::collections::BTreeMap;

use proxyfleet_sdk::kv::{CasOutcome, KvEntry, KvError};

/// Longest key the operator stores, in bytes.
pub const MAX_KEY_BYTES: usize = 512;
/// Largest value the operator stores, in bytes.
pub const MAX_VALUE_BYTES: usize = 64 * 1024;

/// An in-memory key-value store. Tests arrange state with [`MemoryKv::put`]
/// and look at what the plugin left with [`MemoryKv::entries`].
#[derive(Debug, Default)]
pub struct MemoryKv {
    inner: RefCell<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Key to (value, version).
    entries: BTreeMap<String, (Vec<u8>, u64)>,
    last_version: u64,
    /// When set, every call fails with this error.
    failing: Option<KvError>,
}

impl MemoryKv {
    /// The entry under `key`.
    pub fn get(&self, key: &str) -> Result<Option<KvEntry>, KvError> {
        let inner = self.inner.borrow();
        if let Some(error) = &inner.failing {
            return Err(error.clone());
        }
        Ok(inner.entries.get(key).map(|(value, version)| entry(key, value, *version)))
    }

    /// Writes (or, for `None`, deletes) `key` when its version is
    /// `expected` (`None`: the key must be absent).
    pub fn compare_and_swap(
        &self,
        key: &str,
        expected: Option<u64>,
        value: Option<&[u8]>,
    ) -> Result<CasOutcome, KvError> {
        let mut inner = self.inner.borrow_mut();
        if let Some(error) = &inner.failing {
            return Err(error.clone());
        }
        validate(key, value)?;
        let current = inner.entries.get(key).map(|(value, version)| entry(key, value, *version));
        if current.as_ref().map(|entry| entry.version) != expected {
            return Ok(CasOutcome::Conflict(current));
        }
        match value {
            Some(value) => {
                inner.last_version += 1;
                let version = inner.last_version;
                inner.entries.insert(key.to_owned(), (value.to_vec(), version));
                Ok(CasOutcome::Applied(version))
            }
            None => {
                inner.entries.remove(key);
                Ok(CasOutcome::Applied(0))
            }
        }
    }

    /// Every entry whose key starts with `prefix`, ordered by key.
    pub fn list(&self, prefix: &str) -> Result<Vec<KvEntry>, KvError> {
        let inner = self.inner.borrow();
        if let Some(error) = &inner.failing {
            return Err(error.clone());
        }
        Ok(inner
            .entries
            .range(prefix.to_owned()..)
            .take_while(|(key, _)| key.starts_with(prefix))
            .map(|(key, (value, version))| entry(key, value, *version))
            .collect())
    }

    /// Writes `value` under `key` whatever is there, as state a test
    /// arranges before calling the plugin; returns the new version.
    ///
    /// # Panics
    ///
    /// When the key or value breaks the operator's limits.
    pub fn put(&self, key: &str, value: impl AsRef<[u8]>) -> u64 {
        let value = value.as_ref();
        if let Err(error) = validate(key, Some(value)) {
            panic!("MemoryKv::put({key:?}): {error}");
        }
        let mut inner = self.inner.borrow_mut();
        inner.last_version += 1;
        let version = inner.last_version;
        inner.entries.insert(key.to_owned(), (value.to_vec(), version));
        version
    }

    /// Every entry, ordered by key.
    pub fn entries(&self) -> Vec<KvEntry> {
        let inner = self.inner.borrow();
        inner.entries.iter().map(|(key, (value, version))| entry(key, value, *version)).collect()
    }

    /// Makes every following call fail with `error` (`None`: work again),
    /// to test how the plugin takes an unreachable store.
    pub fn fail_with(&self, error: Option<KvError>) {
        self.inner.borrow_mut().failing = error;
    }
}

fn entry(key: &str, value: &[u8], version: u64) -> KvEntry {
    KvEntry { key: key.to_owned(), value: value.to_vec(), version }
}

/// The operator's limits, with its wording.
fn validate(key: &str, value: Option<&[u8]>) -> Result<(), KvError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_only_at_the_expected_version() {
        let kv = MemoryKv::default();
        let CasOutcome::Applied(first) =
            kv.compare_and_swap("a", None, Some(b"1")).expect("the store answers")
        else {
            panic!("the first write to an absent key applies")
        };
        // A second writer that believed the key absent loses, and sees it.
        match kv.compare_and_swap("a", None, Some(b"2")).expect("the store answers") {
            CasOutcome::Conflict(Some(now)) => assert_eq!(now.value, b"1"),
            other => panic!("expected a conflict, got {other:?}"),
        }
        assert!(matches!(
            kv.compare_and_swap("a", Some(first), None).expect("the store answers"),
            CasOutcome::Applied(0)
        ));
        assert_eq!(kv.get("a").expect("the store answers"), None);
    }

    #[test]
    fn versions_never_repeat_after_a_delete() {
        let kv = MemoryKv::default();
        let first = kv.put("a", "1");
        kv.compare_and_swap("a", Some(first), None).expect("the store answers");
        let CasOutcome::Applied(again) =
            kv.compare_and_swap("a", None, Some(b"1")).expect("the store answers")
        else {
            panic!("re-creating applies")
        };
        assert!(again > first, "a stale writer holding version {first} must not win");
    }

    #[test]
    fn lists_by_prefix_in_key_order() {
        let kv = MemoryKv::default();
        for key in ["b/2", "a/1", "b/1", "bb"] {
            kv.put(key, key);
        }
        let keys: Vec<String> =
            kv.list("b/").expect("the store answers").into_iter().map(|e| e.key).collect();
        assert_eq!(keys, ["b/1", "b/2"]);
    }

    #[test]
    fn refuses_what_the_operator_refuses() {
        let kv = MemoryKv::default();
        assert!(matches!(kv.compare_and_swap("", None, Some(b"x")), Err(KvError::Invalid(_))));
        let long = "k".repeat(MAX_KEY_BYTES + 1);
        assert!(matches!(kv.compare_and_swap(&long, None, Some(b"x")), Err(KvError::Invalid(_))));
        let big = vec![0; MAX_VALUE_BYTES + 1];
        assert!(matches!(kv.compare_and_swap("k", None, Some(&big)), Err(KvError::Invalid(_))));
    }

    #[test]
    fn a_failing_store_fails_every_call() {
        let kv = MemoryKv::default();
        kv.fail_with(Some(KvError::Unavailable("down".into())));
        assert!(kv.get("a").is_err() && kv.list("").is_err());
        kv.fail_with(None);
        assert_eq!(kv.get("a"), Ok(None));
    }
}
