//! The error a provider returns, classified the way the host acts on it.

use crate::bindings::proxyfleet::provider::types as wit;

/// Result of a provider operation.
///
/// ```
/// use proxyfleet_sdk::{ProviderError, Result};
///
/// fn vmid(text: &str) -> Result<u32> {
///     text.parse().map_err(|_| ProviderError::Permanent(format!("not a VMID: {text}")))
/// }
/// assert_eq!(vmid("4711"), Ok(4711));
/// assert!(matches!(vmid("pve"), Err(ProviderError::Permanent(_))));
/// ```
pub type Result<T, E = ProviderError> = std::result::Result<T, E>;

/// Errors a provider returns. The variant decides what the host does (retry
/// soon, give up, mark the instance gone, report a config problem); the
/// message is for people and must not contain secrets.
///
/// ```
/// use proxyfleet_sdk::ProviderError;
///
/// let error = ProviderError::NotFound("vm 101".into());
/// assert_eq!(error.to_string(), "not found: vm 101");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProviderError {
    /// The instance does not exist (any more).
    #[error("not found: {0}")]
    NotFound(String),
    /// Worth retrying soon: timeouts, 5xx, dropped connections.
    #[error("transient: {0}")]
    Transient(String),
    /// Retrying the same request will not help.
    #[error("permanent: {0}")]
    Permanent(String),
    /// The backend refused for lack of quota or capacity.
    #[error("quota exceeded: {0}")]
    QuotaExceeded(String),
    /// Another party holds the object or a lock on it.
    #[error("conflict: {0}")]
    Conflict(String),
    /// Credentials missing, rejected, or a grant does not allow the call.
    #[error("unauthorized: {0}")]
    Unauthorized(String),
    /// The entry's config is wrong; the message names the key.
    #[error("invalid config: {0}")]
    InvalidConfig(String),
    /// The Proxy spec cannot be served; the message names the field.
    #[error("invalid spec: {0}")]
    InvalidSpec(String),
}

impl ProviderError {
    /// The message without the class prefix that `Display` adds.
    ///
    /// ```
    /// use proxyfleet_sdk::ProviderError;
    ///
    /// let error = ProviderError::Conflict("vm 101 is locked".into());
    /// assert_eq!(error.message(), "vm 101 is locked");
    /// assert_eq!(error.to_string(), "conflict: vm 101 is locked");
    /// ```
    pub fn message(&self) -> &str {
        match self {
            Self::NotFound(message)
            | Self::Transient(message)
            | Self::Permanent(message)
            | Self::QuotaExceeded(message)
            | Self::Conflict(message)
            | Self::Unauthorized(message)
            | Self::InvalidConfig(message)
            | Self::InvalidSpec(message) => message,
        }
    }
}

impl From<ProviderError> for wit::ProviderError {
    fn from(error: ProviderError) -> Self {
        match error {
            ProviderError::NotFound(message) => Self::NotFound(message),
            ProviderError::Transient(message) => Self::Transient(message),
            ProviderError::Permanent(message) => Self::Permanent(message),
            ProviderError::QuotaExceeded(message) => Self::QuotaExceeded(message),
            ProviderError::Conflict(message) => Self::Conflict(message),
            ProviderError::Unauthorized(message) => Self::Unauthorized(message),
            ProviderError::InvalidConfig(message) => Self::InvalidConfig(message),
            ProviderError::InvalidSpec(message) => Self::InvalidSpec(message),
        }
    }
}

impl From<wit::ProviderError> for ProviderError {
    fn from(error: wit::ProviderError) -> Self {
        match error {
            wit::ProviderError::NotFound(message) => Self::NotFound(message),
            wit::ProviderError::Transient(message) => Self::Transient(message),
            wit::ProviderError::Permanent(message) => Self::Permanent(message),
            wit::ProviderError::QuotaExceeded(message) => Self::QuotaExceeded(message),
            wit::ProviderError::Conflict(message) => Self::Conflict(message),
            wit::ProviderError::Unauthorized(message) => Self::Unauthorized(message),
            wit::ProviderError::InvalidConfig(message) => Self::InvalidConfig(message),
            wit::ProviderError::InvalidSpec(message) => Self::InvalidSpec(message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_both_ways_without_losing_the_class() {
        let errors = [
            ProviderError::NotFound("a".into()),
            ProviderError::Transient("b".into()),
            ProviderError::Permanent("c".into()),
            ProviderError::QuotaExceeded("d".into()),
            ProviderError::Conflict("e".into()),
            ProviderError::Unauthorized("f".into()),
            ProviderError::InvalidConfig("g".into()),
            ProviderError::InvalidSpec("h".into()),
        ];
        for error in errors {
            let round_trip = ProviderError::from(wit::ProviderError::from(error.clone()));
            assert_eq!(round_trip, error);
        }
    }

    #[test]
    fn message_strips_the_class() {
        let error = ProviderError::Conflict("vm 101 is locked".into());
        assert_eq!(error.message(), "vm 101 is locked");
        assert_eq!(error.to_string(), "conflict: vm 101 is locked");
    }
}
