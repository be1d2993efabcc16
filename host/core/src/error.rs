//! Error classes of provider calls.

use std::fmt;

/// What kind of failure a provider call ended in. The reconciler decides
/// its next step from the class alone; the message is for people.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ErrorClass {
    /// The instance does not exist (any more).
    NotFound,
    /// Worth retrying soon.
    Transient,
    /// Retrying the same request will not help.
    Permanent,
    /// The backend refused for lack of quota or capacity.
    QuotaExceeded,
    /// Another party holds the object or a lock on it.
    Conflict,
    /// Credentials missing or rejected, or a grant does not allow the call.
    Unauthorized,
    /// The provider entry's config is wrong.
    InvalidConfig,
    /// The Proxy spec cannot be served by this provider.
    InvalidSpec,
    /// The plugin trapped (panic, memory cap, a bug): the host discarded the
    /// instance. Retried like a transient error but counted apart.
    PluginFault,
    /// The call ran past its deadline and was stopped by the host.
    Timeout,
    /// The provider entry has no usable plugin (failed to load, unknown entry).
    Unavailable,
}

impl ErrorClass {
    /// Whether retrying the same call later may succeed without a change to
    /// the spec or the provider config.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            Self::Transient
                | Self::QuotaExceeded
                | Self::Conflict
                | Self::PluginFault
                | Self::Timeout
                | Self::Unavailable
        )
    }

    /// The kebab-case name used in logs, metrics and condition reasons.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotFound => "not-found",
            Self::Transient => "transient",
            Self::Permanent => "permanent",
            Self::QuotaExceeded => "quota-exceeded",
            Self::Conflict => "conflict",
            Self::Unauthorized => "unauthorized",
            Self::InvalidConfig => "invalid-config",
            Self::InvalidSpec => "invalid-spec",
            Self::PluginFault => "plugin-fault",
            Self::Timeout => "timeout",
            Self::Unavailable => "unavailable",
        }
    }
}

impl fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failed provider call: a class to act on and a message for people.
///
/// Invariant: the message never holds a secret. Plugins never see secrets,
/// and the runtime redacts what it adds itself.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{class}: {message}")]
pub struct ProviderError {
    /// What kind of failure this is.
    pub class: ErrorClass,
    /// What went wrong, naming the field, key or resource involved.
    pub message: String,
}

/// Results of provider calls.
pub type Result<T, E = ProviderError> = std::result::Result<T, E>;

macro_rules! constructors {
    ($($name:ident => $class:ident),* $(,)?) => {
        impl ProviderError {
            /// An error of the given class.
            pub fn new(class: ErrorClass, message: impl Into<String>) -> Self {
                Self { class, message: message.into() }
            }
            $(
                #[doc = concat!("An error of class [`ErrorClass::", stringify!($class), "`].")]
                pub fn $name(message: impl Into<String>) -> Self {
                    Self::new(ErrorClass::$class, message)
                }
            )*
        }
    };
}

constructors! {
    not_found => NotFound,
    transient => Transient,
    permanent => Permanent,
    quota_exceeded => QuotaExceeded,
    conflict => Conflict,
    unauthorized => Unauthorized,
    invalid_config => InvalidConfig,
    invalid_spec => InvalidSpec,
    plugin_fault => PluginFault,
    timeout => Timeout,
    unavailable => Unavailable,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_starts_with_the_class_name() {
        let err = ProviderError::quota_exceeded("all 3 endpoints are assigned");
        assert_eq!(err.to_string(), "quota-exceeded: all 3 endpoints are assigned");
    }

    #[test]
    fn only_classes_that_need_a_change_are_final() {
        let final_classes = [
            ErrorClass::NotFound,
            ErrorClass::Permanent,
            ErrorClass::Unauthorized,
            ErrorClass::InvalidConfig,
            ErrorClass::InvalidSpec,
        ];
        for class in final_classes {
            assert!(!class.is_retryable(), "{class} must not be retried as is");
        }
        assert!(ErrorClass::PluginFault.is_retryable());
        assert!(ErrorClass::Timeout.is_retryable());
    }
}
