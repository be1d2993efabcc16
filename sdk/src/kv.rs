//! The entry's durable key-value store, for allocation bookkeeping (which
//! endpoint, VMID or address is taken by which Proxy).
//!
//! Every write is a compare-and-swap on the key's version, so two concurrent
//! calls can never both believe they took the same thing: the loser gets
//! [`CasOutcome::Conflict`] with what is there now.

#[cfg(target_arch = "wasm32")]
use crate::bindings::proxyfleet::provider::kv as wit;

pub use crate::bindings::proxyfleet::provider::kv::{CasOutcome, KvEntry};
pub use crate::kv_error::KvError;

/// The entry stored under `key`, if any.
pub fn get(key: &str) -> Result<Option<KvEntry>, KvError> {
    #[cfg(target_arch = "wasm32")]
    return wit::get(key).map_err(KvError::from);
    #[cfg(not(target_arch = "wasm32"))]
    return crate::native::host(|host| host.kv_get(key));
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
    #[cfg(target_arch = "wasm32")]
    return wit::compare_and_swap(key, expected, value).map_err(KvError::from);
    #[cfg(not(target_arch = "wasm32"))]
    return crate::native::host(|host| host.kv_compare_and_swap(key, expected, value));
}

/// Every entry whose key starts with `prefix`, ordered by key.
pub fn list(prefix: &str) -> Result<Vec<KvEntry>, KvError> {
    #[cfg(target_arch = "wasm32")]
    return wit::list(prefix).map_err(KvError::from);
    #[cfg(not(target_arch = "wasm32"))]
    return crate::native::host(|host| host.kv_list(prefix));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ProviderError;

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
