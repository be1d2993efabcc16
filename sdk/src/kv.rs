//! The entry's durable key-value store, for allocation bookkeeping (which
//! endpoint, VMID or address is taken by which Proxy).
//!
//! Every write is a compare-and-swap on the key's version, so two concurrent
//! calls can never both believe they took the same thing: the loser gets
//! [`CasOutcome::Conflict`] with what is there now.

use crate::ProviderError;
use crate::bindings::proxyfleet::provider::kv as wit;

pub use wit::{CasOutcome, KvEntry};

/// Why the store could not serve a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KvError {
    /// The store could not be reached; worth retrying.
    #[error("key-value store unavailable: {0}")]
    Unavailable(String),
    /// The key or value breaks the store's limits.
    #[error("key-value store refused the request: {0}")]
    Invalid(String),
}

impl From<wit::KvError> for KvError {
    fn from(error: wit::KvError) -> Self {
        match error {
            wit::KvError::Unavailable(message) => Self::Unavailable(message),
            wit::KvError::Invalid(message) => Self::Invalid(message),
        }
    }
}

/// An unreachable store is worth retrying; a refused key or value comes from
/// what the entry asks the plugin to store (an endpoint name too long, say),
/// so it is the entry's config that needs fixing.
impl From<KvError> for ProviderError {
    fn from(error: KvError) -> Self {
        match error {
            KvError::Unavailable(_) => ProviderError::Transient(error.to_string()),
            KvError::Invalid(_) => ProviderError::InvalidConfig(error.to_string()),
        }
    }
}

/// The entry stored under `key`, if any.
pub fn get(key: &str) -> Result<Option<KvEntry>, KvError> {
    wit::get(key).map_err(KvError::from)
}

/// Writes `value` under `key` (or deletes the key when `value` is `None`),
/// only when the key's current version is `expected` (`None`: the key must
/// be absent).
///
/// [`CasOutcome::Applied`] carries the new version (0 after a delete);
/// [`CasOutcome::Conflict`] carries the entry as it is now.
pub fn compare_and_swap(
    key: &str,
    expected: Option<u64>,
    value: Option<&[u8]>,
) -> Result<CasOutcome, KvError> {
    wit::compare_and_swap(key, expected, value).map_err(KvError::from)
}

/// Every entry whose key starts with `prefix`, ordered by key.
pub fn list(prefix: &str) -> Result<Vec<KvEntry>, KvError> {
    wit::list(prefix).map_err(KvError::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unavailable_is_transient_and_invalid_is_config() {
        let transient = ProviderError::from(KvError::Unavailable("timed out".into()));
        assert_eq!(
            transient,
            ProviderError::Transient("key-value store unavailable: timed out".into())
        );
        let invalid = ProviderError::from(KvError::Invalid("key too long".into()));
        assert!(matches!(invalid, ProviderError::InvalidConfig(_)));
    }
}
