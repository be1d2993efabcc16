//! What a proxy instance is, independent of any backend.

use serde::{Deserialize, Serialize};

/// Who owns an instance. Written into the backend at create and read back,
/// so orphan collection can tell our instances from anyone else's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OwnershipMark {
    /// The installation that created the instance; empty when the backend
    /// holds a mark written before marks carried one (never collected).
    #[serde(default)]
    pub installation: String,
    /// UID of the owning Proxy.
    pub uid: String,
    /// Namespace of the owning Proxy.
    pub namespace: String,
    /// Name of the owning Proxy.
    pub name: String,
    /// Seconds since the Unix epoch.
    pub created_at: u64,
}

/// Life-cycle state of an instance as the backend reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InstanceState {
    /// Being created or booting; not serving yet.
    Provisioning,
    /// Up.
    Running,
    /// Exists but is not running.
    Stopped,
    /// The backend says it is broken.
    Failed,
    /// On its way out.
    Deleting,
}

/// What the host asks a provider to bring into existence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProxySpec {
    /// Name of the owning Proxy.
    pub name: String,
    /// Namespace of the owning Proxy.
    pub namespace: String,
    /// UID of the owning Proxy: providers derive instance names or IDs from
    /// it so a retried create finds what an earlier attempt left.
    pub uid: String,
    /// Virtual CPUs.
    pub cores: u32,
    /// Memory in MiB.
    pub memory_mib: u64,
    /// Boot disk size in GiB.
    pub disk_gib: u64,
    /// Provider-specific image key.
    pub image: String,
    /// Placement hints (node, zone, host).
    pub placement: Vec<(String, String)>,
    /// 802.1Q VLAN tag.
    pub vlan_tag: Option<u16>,
    /// Port the proxy listens on.
    pub port: u16,
    /// cloud-init user-data, passed through unchanged.
    pub user_data: Vec<u8>,
    /// Labels for the instance.
    pub labels: Vec<(String, String)>,
    /// The credential the proxy must ask its clients for; the provider
    /// configures the proxy it starts with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_auth: Option<crate::credential::ProxyCredential>,
}

/// An instance as the backend reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Instance {
    /// The provider's own identifier, stable for the instance's life.
    pub provider_id: String,
    /// The instance's name in the backend.
    pub name: String,
    /// Life-cycle state.
    pub state: InstanceState,
    /// IP addresses, most preferred first; empty while none is known.
    pub addresses: Vec<String>,
    /// The proxy port when the backend decides it; `None` means the spec's.
    pub port: Option<u16>,
    /// Seconds since the Unix epoch, when the backend knows.
    pub created_at: Option<u64>,
    /// The ownership mark read back from the backend; `None` when the
    /// instance carries no readable mark of ours.
    pub mark: Option<OwnershipMark>,
}

/// Why a provider is not healthy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HealthReason {
    /// Credentials could not be read or were refused.
    CredentialsUnavailable,
    /// The backend's certificate did not verify.
    CertificateInvalid,
    /// A storage the config names does not exist.
    StorageNotFound,
    /// A template or image the config names does not exist.
    TemplateNotFound,
    /// The backend did not answer in time.
    Timeout,
    /// The backend cannot be reached.
    Unreachable,
    /// The credentials lack a permission.
    Unauthorized,
    /// The entry's config is wrong.
    Misconfigured,
    /// Anything else; the message says what.
    Other,
}

/// One finding of a provider check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthIssue {
    /// The class of the finding.
    pub reason: HealthReason,
    /// What was found, for people.
    pub message: String,
}

/// The result of a provider check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    /// Whether the provider can serve calls.
    pub healthy: bool,
    /// Why not, or warnings when healthy.
    pub issues: Vec<HealthIssue>,
}

impl Health {
    /// A healthy result with no findings.
    pub fn ok() -> Self {
        Self { healthy: true, issues: Vec::new() }
    }

    /// An unhealthy result with one finding.
    pub fn unhealthy(reason: HealthReason, message: impl Into<String>) -> Self {
        Self { healthy: false, issues: vec![HealthIssue { reason, message: message.into() }] }
    }
}

/// An HTTP destination: scheme, host and port.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct HttpDestination {
    /// "https" or "http".
    pub scheme: String,
    /// Host name or IP literal, lower case.
    pub host: String,
    /// `None` means the scheme's default port.
    pub port: Option<u16>,
}

impl HttpDestination {
    /// The port, with the scheme's default filled in.
    pub fn effective_port(&self) -> u16 {
        self.port.unwrap_or(if self.scheme == "http" { 80 } else { 443 })
    }
}

impl std::fmt::Display for HttpDestination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let host =
            if self.host.contains(':') { format!("[{}]", self.host) } else { self.host.clone() };
        write!(f, "{}://{}:{}", self.scheme, host, self.effective_port())
    }
}

/// Capabilities a plugin asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capabilities {
    /// HTTP destinations.
    pub http: Vec<HttpDestination>,
}

/// What a plugin says about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PluginInfo {
    /// Plugin name, e.g. `proxmox`.
    pub name: String,
    /// Plugin version.
    pub version: String,
    /// Contract version it was built against, e.g. `0.1.0`.
    pub contract_version: String,
    /// JSON schema of the entry config.
    pub config_schema: String,
    /// Capabilities it asks for.
    pub capabilities: Capabilities,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destinations_display_with_default_ports_and_bracketed_v6() {
        let https = HttpDestination { scheme: "https".into(), host: "pve.lan".into(), port: None };
        assert_eq!(https.to_string(), "https://pve.lan:443");
        let v6 = HttpDestination { scheme: "http".into(), host: "::1".into(), port: Some(8080) };
        assert_eq!(v6.to_string(), "http://[::1]:8080");
    }
}
