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
///
/// ```
/// use proxyfleet_sdk::{CONTRACT_VERSION, Capabilities, PluginInfo};
///
/// let info = PluginInfo::new("fixed", "1.0.0", "{}", Capabilities::default());
/// assert_eq!(info.contract_version, CONTRACT_VERSION);
/// assert_eq!(CONTRACT_VERSION.split('.').count(), 3, "major.minor.patch");
/// ```
pub const CONTRACT_VERSION: &str = env!("PROXYFLEET_CONTRACT_VERSION");

impl CallContext {
    /// Parses the entry's JSON config into `T`; see [`crate::parse_config`].
    /// Errors are [`crate::ProviderError::InvalidConfig`] naming the key.
    /// Each use fetches the config from the host and parses it whole: for
    /// a long list, read single values with [`CallContext::lookup`].
    ///
    /// ```
    /// use proxyfleet_sdk::CallContext;
    ///
    /// #[derive(serde::Deserialize)]
    /// struct Config {
    ///     node: String,
    /// }
    ///
    /// # proxyfleet_sdk::native::doc_host::configured(r#"{"node":"pve1"}"#, &[], || {
    /// let ctx = CallContext { entry: "pve-lab".into(), deadline_ms: 30_000 };
    /// let config: Config = ctx.config()?;
    /// assert_eq!(config.node, "pve1");
    /// # Ok::<(), proxyfleet_sdk::ProviderError>(())
    /// # }).expect("the example runs");
    /// ```
    pub fn config<T: DeserializeOwned>(&self) -> crate::Result<T> {
        crate::parse_config(&self.config_json())
    }

    /// The entry's config as JSON, as [`crate::Provider::validate_config`]
    /// accepted it.
    ///
    /// ```
    /// use proxyfleet_sdk::CallContext;
    ///
    /// # proxyfleet_sdk::native::doc_host::configured(r#"{"node":"pve1"}"#, &[], || {
    /// let ctx = CallContext { entry: "pve-lab".into(), deadline_ms: 30_000 };
    /// assert_eq!(ctx.config_json(), r#"{"node":"pve1"}"#);
    /// # });
    /// ```
    pub fn config_json(&self) -> String {
        crate::config::json()
    }

    /// The value that [`crate::Provider::lookup_table`] answered under
    /// `key` for this entry; `None` when it answered none. One lookup
    /// copies one value, however large the config.
    ///
    /// ```
    /// use proxyfleet_sdk::CallContext;
    ///
    /// let config = r#"{"endpoints":["203.0.113.10:3128"]}"#;
    /// # proxyfleet_sdk::native::doc_host::configured(config, &[("at/0", "203.0.113.10:3128")], || {
    /// let ctx = CallContext { entry: "static-lab".into(), deadline_ms: 30_000 };
    /// assert_eq!(ctx.lookup("at/0").as_deref(), Some("203.0.113.10:3128"));
    /// assert_eq!(ctx.lookup("at/1"), None);
    /// # });
    /// ```
    pub fn lookup(&self, key: &str) -> Option<String> {
        crate::config::lookup(key)
    }

    /// Time left before the host stops the call.
    ///
    /// ```
    /// use std::time::Duration;
    /// use proxyfleet_sdk::CallContext;
    ///
    /// let ctx = CallContext { entry: "pve-lab".into(), deadline_ms: 1500 };
    /// assert_eq!(ctx.deadline(), Duration::from_millis(1500));
    /// ```
    pub fn deadline(&self) -> Duration {
        Duration::from_millis(self.deadline_ms)
    }
}

impl PluginInfo {
    /// Describes a plugin built against this SDK's [`CONTRACT_VERSION`].
    /// `config_schema` is the JSON schema of the entry config.
    ///
    /// ```
    /// use proxyfleet_sdk::{Capabilities, HttpDestination, PluginInfo};
    ///
    /// let info = PluginInfo::new(
    ///     "proxmox",
    ///     "0.3.0",
    ///     r#"{"type":"object","required":["endpoint"]}"#,
    ///     Capabilities { http: vec![HttpDestination::https("pve.example", Some(8006))] },
    /// );
    /// assert_eq!(info.name, "proxmox");
    /// assert_eq!(info.contract_version, proxyfleet_sdk::CONTRACT_VERSION);
    /// ```
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
    ///
    /// ```
    /// use proxyfleet_sdk::HttpDestination;
    ///
    /// let api = HttpDestination::https("compute.googleapis.com", None);
    /// assert_eq!((api.scheme.as_str(), api.port), ("https", None));
    /// ```
    pub fn https(host: impl Into<String>, port: Option<u16>) -> Self {
        Self { scheme: "https".to_owned(), host: host.into(), port }
    }

    /// An `http` destination; `port` none means 80.
    ///
    /// ```
    /// use proxyfleet_sdk::HttpDestination;
    ///
    /// let metadata = HttpDestination::http("169.254.169.254", Some(80));
    /// assert_eq!(metadata.scheme, "http");
    /// assert_eq!(metadata.host, "169.254.169.254");
    /// ```
    pub fn http(host: impl Into<String>, port: Option<u16>) -> Self {
        Self { scheme: "http".to_owned(), host: host.into(), port }
    }
}

impl Health {
    /// Healthy, with no issues.
    ///
    /// ```
    /// let health = proxyfleet_sdk::Health::healthy();
    /// assert!(health.healthy);
    /// assert!(health.issues.is_empty());
    /// ```
    pub fn healthy() -> Self {
        Self { healthy: true, issues: Vec::new() }
    }

    /// Not healthy, for `reason`.
    ///
    /// ```
    /// use proxyfleet_sdk::{Health, HealthReason};
    ///
    /// let health = Health::unhealthy(HealthReason::StorageNotFound, "pool `vmdata` not found");
    /// assert!(!health.healthy);
    /// assert_eq!(health.issues[0].reason, HealthReason::StorageNotFound);
    /// ```
    pub fn unhealthy(reason: HealthReason, message: impl Into<String>) -> Self {
        Self { healthy: false, issues: vec![HealthIssue { reason, message: message.into() }] }
    }

    /// Adds an issue without changing `healthy`: on a healthy result it is a
    /// warning.
    ///
    /// ```
    /// use proxyfleet_sdk::{Health, HealthReason};
    ///
    /// let health = Health::healthy()
    ///     .with_issue(HealthReason::TemplateNotFound, "template `debian-12` missing on pve2");
    /// assert!(health.healthy, "a warning only");
    /// assert_eq!(health.issues.len(), 1);
    /// ```
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
        let ctx = CallContext { entry: "e".into(), deadline_ms: 1500 };
        let value: serde_json::Value =
            crate::native::doc_host::configured(r#"{"a": 1}"#, &[], || ctx.config())
                .expect("valid JSON");
        assert_eq!(value["a"], 1);
        assert_eq!(ctx.deadline(), Duration::from_millis(1500));
    }
}
