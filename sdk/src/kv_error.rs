//! Why the key-value store could not serve a request: the [`crate::kv`]
//! module's error, in a module of its own because the native host, which
//! `kv` calls off wasm, names it too.

use crate::ProviderError;
use crate::bindings::proxyfleet::provider::kv as wit;

/// Why the store could not serve a request.
///
/// It converts into a [`ProviderError`] with `?`: an unreachable store is
/// transient, a refused key or value the entry's config to fix.
///
/// ```
/// use proxyfleet_sdk::ProviderError;
/// use proxyfleet_sdk::kv::KvError;
///
/// let error = ProviderError::from(KvError::Unavailable("timed out".into()));
/// assert_eq!(error, ProviderError::Transient("key-value store unavailable: timed out".into()));
/// let error = ProviderError::from(KvError::Invalid("key too long".into()));
/// assert!(matches!(error, ProviderError::InvalidConfig(_)));
/// ```
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
