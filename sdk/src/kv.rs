//! The entry's durable key-value store, for allocation bookkeeping (which
//! endpoint, VMID or address is taken by which Proxy).
//!
//! Every write is a compare-and-swap on the key's version, so two concurrent
//! calls can never both believe they took the same thing: the loser gets
//! [`CasOutcome::Conflict`] with what is there now.
//!
//! ```
//! use proxyfleet_sdk::kv::{self, CasOutcome};
//!
//! # proxyfleet_sdk::native::doc_host::run(|| -> Result<(), proxyfleet_sdk::kv::KvError> {
//! // Claim VMID 4711 for a Proxy: of two claims, only the first is applied.
//! let first = kv::compare_and_swap("vmid/4711", None, Some("uid-a".as_bytes()))?;
//! assert!(matches!(first, CasOutcome::Applied(_)));
//! let second = kv::compare_and_swap("vmid/4711", None, Some("uid-b".as_bytes()))?;
//! assert!(matches!(second, CasOutcome::Conflict(Some(holder)) if holder.value == b"uid-a"));
//! # Ok(())
//! # }).expect("the example runs");
//! ```

#[cfg(target_arch = "wasm32")]
use crate::bindings::proxyfleet::provider::kv as wit;

pub use crate::bindings::proxyfleet::provider::kv::{CasOutcome, KvEntry};
pub use crate::kv_error::KvError;

/// The entry stored under `key`, if any.
///
/// ```
/// use proxyfleet_sdk::kv;
///
/// # proxyfleet_sdk::native::doc_host::run(|| -> Result<(), proxyfleet_sdk::kv::KvError> {
/// assert_eq!(kv::get("proxy/uid-a")?, None);
/// kv::compare_and_swap("proxy/uid-a", None, Some("10.0.0.7".as_bytes()))?;
/// let entry = kv::get("proxy/uid-a")?.expect("written above");
/// assert_eq!(entry.value, b"10.0.0.7");
/// # Ok(())
/// # }).expect("the example runs");
/// ```
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
///
/// ```
/// use proxyfleet_sdk::kv::{self, CasOutcome};
///
/// # proxyfleet_sdk::native::doc_host::run(|| -> Result<(), proxyfleet_sdk::kv::KvError> {
/// // Take an address, then give it back only if nobody changed it since.
/// kv::compare_and_swap("proxy/uid-a", None, Some("10.0.0.7".as_bytes()))?;
/// let entry = kv::get("proxy/uid-a")?.expect("written above");
/// let outcome = kv::compare_and_swap(&entry.key, Some(entry.version), None)?;
/// assert_eq!(outcome, CasOutcome::Applied(0));
/// // The same version no longer matches: the key is gone.
/// let again = kv::compare_and_swap(&entry.key, Some(entry.version), None)?;
/// assert_eq!(again, CasOutcome::Conflict(None));
/// # Ok(())
/// # }).expect("the example runs");
/// ```
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
///
/// ```
/// use proxyfleet_sdk::kv;
///
/// # proxyfleet_sdk::native::doc_host::run(|| -> Result<(), proxyfleet_sdk::kv::KvError> {
/// # for (key, value) in [("vmid/4712", "uid-b"), ("vmid/4711", "uid-a"), ("lock/pve1", "x")] {
/// #     kv::compare_and_swap(key, None, Some(value.as_bytes()))?;
/// # }
/// // The store holds vmid/4711, vmid/4712 and lock/pve1.
/// let taken: Vec<String> = kv::list("vmid/")?.into_iter().map(|entry| entry.key).collect();
/// assert_eq!(taken, ["vmid/4711", "vmid/4712"]);
/// # Ok(())
/// # }).expect("the example runs");
/// ```
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
