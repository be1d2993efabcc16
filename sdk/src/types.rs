//! The contract's records, re-exported from the generated bindings, with a
//! few constructors that keep provider code short.

use std::time::Duration;

use serde::de::DeserializeOwned;

use crate::bindings::proxyfleet::provider::types as wit;

pub use wit::{
    CallContext, Capabilities, Health, HealthIssue, HealthReason, HttpDestination, Instance,
    InstanceState, Network, OwnershipMark, PluginInfo, ProxyAuth, ProxySpec,
};

/// The version of the plugin contract (`wit/provider.wit`) this SDK is built
/// against, read from the WIT's package line at build time;
/// [`PluginInfo::new`] reports it, and the host refuses a plugin of another
/// breaking version.
pub const CONTRACT_VERSION: &str = env!("PROXYFLEET_CONTRACT_VERSION");

impl CallContext {
    /// Parses the entry's JSON config into `T`; see [`crate::parse_config`].
    /// Errors are [`crate::ProviderError::InvalidConfig`] naming the key.
    pub fn config<T: DeserializeOwned>(&self) -> crate::Result<T> {
        crate::parse_config(&self.config)
    }

    /// Time left before the host stops the call.
    pub fn deadline(&self) -> Duration {
        Duration::from_millis(self.deadline_ms)
    }
}

impl PluginInfo {
    /// Describes a plugin built against this SDK's [`CONTRACT_VERSION`].
    /// `config_schema` is the JSON schema of the entry config.
    pub fn new(
        name: impl Into<String>,
        version: impl Into<String>,
        config_schema: impl Into<String>,
        capabilities: Capabilities,
    ) -> Self {
        Self {
            name: name.into(),
            version: version.into(),
            contract_version: CONTRACT_VERSION.to_owned(),
            config_schema: config_schema.into(),
            capabilities,
        }
    }
}

/// No capabilities: the plugin makes no HTTP requests.
impl Default for Capabilities {
    fn default() -> Self {
        Self { http: Vec::new() }
    }
}

impl HttpDestination {
    /// An `https` destination; `port` none means 443.
    pub fn https(host: impl Into<String>, port: Option<u16>) -> Self {
        Self { scheme: "https".to_owned(), host: host.into(), port }
    }

    /// An `http` destination; `port` none means 80.
    pub fn http(host: impl Into<String>, port: Option<u16>) -> Self {
        Self { scheme: "http".to_owned(), host: host.into(), port }
    }
}

impl Health {
    /// Healthy, with no issues.
    pub fn healthy() -> Self {
        Self { healthy: true, issues: Vec::new() }
    }

    /// Not healthy, for `reason`.
    pub fn unhealthy(reason: HealthReason, message: impl Into<String>) -> Self {
        Self { healthy: false, issues: vec![HealthIssue { reason, message: message.into() }] }
    }

    /// Adds an issue without changing `healthy`: on a healthy result it is a
    /// warning.
    #[must_use]
    pub fn with_issue(mut self, reason: HealthReason, message: impl Into<String>) -> Self {
        self.issues.push(HealthIssue { reason, message: message.into() });
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contract_version_matches_the_wit_package() {
        let wit = include_str!("../wit/provider.wit");
        let expected = format!("package proxyfleet:provider@{CONTRACT_VERSION};");
        assert!(
            wit.lines().any(|line| line.trim() == expected),
            "sdk/wit/provider.wit does not declare `{expected}`"
        );
    }

    #[test]
    fn health_constructors() {
        assert!(Health::healthy().healthy);
        assert!(Health::healthy().issues.is_empty());
        let health = Health::unhealthy(HealthReason::Unreachable, "down")
            .with_issue(HealthReason::Other, "also slow");
        assert!(!health.healthy);
        assert_eq!(health.issues.len(), 2);
        assert_eq!(health.issues[0].reason, HealthReason::Unreachable);
    }

    #[test]
    fn context_parses_config() {
        let ctx =
            CallContext { entry: "e".into(), config: r#"{"a": 1}"#.into(), deadline_ms: 1500 };
        let value: serde_json::Value = ctx.config().expect("valid JSON");
        assert_eq!(value["a"], 1);
        assert_eq!(ctx.deadline(), Duration::from_millis(1500));
    }
}
