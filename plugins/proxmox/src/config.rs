//! The entry config: where the cluster is, which templates to clone, where
//! proxies go and which VMIDs they may take. The API token is not part of
//! it: the host injects it from the grant's credential.

use std::collections::BTreeMap;

use proxyfleet_sdk::{ProviderError, Result};
use serde::{Deserialize, Serialize};

/// JSON schema of [`Config`], reported by `describe`: derived from the
/// struct, so the two cannot drift.
pub fn config_schema() -> String {
    serde_json::to_string(&schemars::schema_for!(Config)).unwrap_or_default()
}

/// The parsed entry config.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schemars(title = "proxmox provider entry")]
pub struct Config {
    /// API base URL without path, e.g. https://pve.lan:8006; must match a
    /// grant.
    pub url: String,
    /// Nodes proxies are placed on; a Proxy's placement `node` picks one of
    /// them.
    #[schemars(length(min = 1))]
    pub nodes: Vec<String>,
    /// Proxy image key to the VMID of the template VM to clone.
    // schemars bounds arrays, not maps: the bounds are spelled out.
    #[schemars(extend(
        "minProperties" = 1,
        "additionalProperties" = {"type": "integer", "minimum": 100, "maximum": 999_999_999}
    ))]
    pub templates: BTreeMap<String, u32>,
    /// Storage (content type iso) for the cloud-init seed images, on every
    /// node.
    pub iso_storage: String,
    /// Storage for the cloned disks; the template's storage when absent.
    #[serde(default)]
    pub target_storage: Option<String>,
    /// Resource pool new VMs join.
    #[serde(default)]
    pub pool: Option<String>,
    /// Bridge of net0.
    #[serde(default = "default_bridge")]
    pub bridge: String,
    /// The template's boot disk, grown to the Proxy's diskGiB.
    #[serde(default = "default_boot_disk")]
    pub boot_disk: String,
    /// VMIDs proxies may take, inclusive.
    #[serde(default)]
    pub vmid_range: VmidRange,
    /// How often a running PVE task is polled, in milliseconds.
    #[serde(default = "default_task_poll_ms")]
    #[schemars(range(min = 50, max = 60_000))]
    pub task_poll_ms: u64,
}

/// Inclusive VMID range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VmidRange {
    /// The first VMID proxies may take.
    #[schemars(range(min = 100))]
    pub first: u32,
    /// The last VMID proxies may take.
    #[schemars(range(max = 999_999_999))]
    pub last: u32,
}

impl Default for VmidRange {
    fn default() -> Self {
        Self { first: 100_000, last: 199_999 }
    }
}

fn default_bridge() -> String {
    "vmbr0".to_owned()
}

fn default_boot_disk() -> String {
    "scsi0".to_owned()
}

fn default_task_poll_ms() -> u64 {
    1000
}

fn invalid(key: &str, what: &str) -> ProviderError {
    ProviderError::InvalidConfig(format!("config key `{key}`: {what}"))
}

/// PVE storage and node names: letters, digits, `-`, `_`, `.`, starting
/// with a letter (`pve-storage-id`, `pve-node`).
fn is_pve_id(text: &str) -> bool {
    text.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && text.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

impl Config {
    /// Parses and checks an entry config; errors name the key.
    pub fn parse(json: &str) -> Result<Self> {
        let config: Self = proxyfleet_sdk::parse_config(json)?;
        let url = config.url.trim_end_matches('/');
        let Some(authority) = url.strip_prefix("https://") else {
            return Err(invalid("url", "must start with https:// (PVE serves its API over TLS)"));
        };
        if authority.is_empty() || authority.contains(['/', '?', '#', '@']) {
            return Err(invalid(
                "url",
                "give scheme, host and port only, e.g. https://pve.lan:8006 (the plugin adds /api2/json)",
            ));
        }
        if config.nodes.is_empty() {
            return Err(invalid("nodes", "list at least one node"));
        }
        for (index, node) in config.nodes.iter().enumerate() {
            if !is_pve_id(node) {
                return Err(invalid(&format!("nodes[{index}]"), "is not a PVE node name"));
            }
        }
        if config.templates.is_empty() {
            return Err(invalid("templates", "map at least one image key to a template VMID"));
        }
        for (image, vmid) in &config.templates {
            if !(100..=999_999_999).contains(vmid) {
                return Err(invalid(&format!("templates.{image}"), "VMIDs are 100 to 999999999"));
            }
        }
        if !is_pve_id(&config.iso_storage) {
            return Err(invalid("isoStorage", "is not a PVE storage ID"));
        }
        if let Some(storage) = &config.target_storage
            && !is_pve_id(storage)
        {
            return Err(invalid("targetStorage", "is not a PVE storage ID"));
        }
        if config.bridge.is_empty()
            || !config
                .bridge
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(invalid("bridge", "is not a bridge name such as vmbr0"));
        }
        if !config.boot_disk.starts_with(['s', 'v', 'i'])
            || !config.boot_disk.ends_with(|c: char| c.is_ascii_digit())
        {
            return Err(invalid("bootDisk", "name a disk such as scsi0, virtio0 or sata0"));
        }
        let range = config.vmid_range;
        if range.first < 100 || range.last > 999_999_999 || range.first > range.last {
            return Err(invalid("vmidRange", "needs 100 <= first <= last <= 999999999"));
        }
        if !(50..=60_000).contains(&config.task_poll_ms) {
            return Err(invalid("taskPollMs", "must be 50 to 60000"));
        }
        Ok(Self { url: url.to_owned(), ..config })
    }

    /// The template VMID for a Proxy's `image`.
    pub fn template_for(&self, image: &str) -> Result<u32> {
        self.templates.get(image).copied().ok_or_else(|| {
            ProviderError::InvalidSpec(format!(
                "image: no template is configured for `{image}`; add it to the entry's config key `templates`"
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = r#"{"url":"https://pve.lan:8006/","nodes":["pve1"],"templates":{"debian-12":9000},"isoStorage":"local"}"#;

    fn error(json: &str) -> String {
        match Config::parse(json) {
            Err(ProviderError::InvalidConfig(message)) => message,
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
    }

    #[test]
    fn defaults_fill_the_optional_keys() {
        let config = Config::parse(VALID).expect("valid");
        assert_eq!(config.url, "https://pve.lan:8006");
        assert_eq!((config.bridge.as_str(), config.boot_disk.as_str()), ("vmbr0", "scsi0"));
        assert_eq!(config.vmid_range, VmidRange { first: 100_000, last: 199_999 });
        assert_eq!(config.task_poll_ms, 1000);
        assert_eq!(config.template_for("debian-12"), Ok(9000));
        assert!(
            matches!(config.template_for("alpine"), Err(ProviderError::InvalidSpec(m)) if m.contains("templates"))
        );
    }

    #[test]
    fn errors_name_the_key() {
        let with =
            |key: &str, value: &str| VALID.replacen('{', &format!("{{\"{key}\":{value},"), 1);
        assert!(error(&VALID.replace("https://", "http://")).starts_with("config key `url`"));
        assert!(error(&VALID.replace(":8006/", ":8006/api2/json")).starts_with("config key `url`"));
        assert!(error(&VALID.replace("[\"pve1\"]", "[]")).starts_with("config key `nodes`"));
        assert!(
            error(&VALID.replace("[\"pve1\"]", "[\"pve 1\"]")).starts_with("config key `nodes[0]`")
        );
        assert!(error(&VALID.replace("9000", "7")).starts_with("config key `templates.debian-12`"));
        assert!(
            error(&with("vmidRange", r#"{"first":500,"last":400}"#))
                .starts_with("config key `vmidRange`")
        );
        assert!(error(&with("taskPollMs", "5")).starts_with("config key `taskPollMs`"));
        assert!(error(&with("token", r#""secret""#)).contains("unknown field `token`"));
    }

    /// The schema is the struct's: derived, so a key added to one is in
    /// the other, and its defaults are what the parser fills in.
    #[test]
    fn the_schema_is_derived_from_the_config_struct() {
        let schema: serde_json::Value =
            serde_json::from_str(&config_schema()).expect("schema parses");
        assert_eq!(schema["title"], "proxmox provider entry");
        assert_eq!(schema["properties"]["templates"]["minProperties"], 1);
        assert_eq!(schema["properties"]["templates"]["additionalProperties"]["minimum"], 100);
        let defaults = Config::parse(VALID).expect("valid");
        assert_eq!(schema["properties"]["bridge"]["default"], defaults.bridge);
        assert_eq!(
            schema["properties"]["vmidRange"]["default"]["first"],
            defaults.vmid_range.first
        );
    }

    #[test]
    fn the_config_schema_says_what_validate_config_accepts() {
        let valid = serde_json::from_str(VALID).expect("JSON");
        proxyfleet_sdk_testkit::assert_config_schema::<crate::Proxmox>(&valid);
    }
}
