//! The entry config: which project and zones, which images or instance
//! templates, and how instances are shaped. The service-account key is not
//! part of it: the host holds it and injects the access token.

use std::collections::BTreeMap;

use proxyfleet_sdk::{ProviderError, Result};
use serde::{Deserialize, Serialize};

use crate::names::{is_label_key, is_label_value, is_resource_id};

/// JSON schema of [`Config`], reported by `describe`: derived from the
/// struct, so the two cannot drift.
pub fn config_schema() -> String {
    serde_json::to_string(&schemars::schema_for!(Config)).unwrap_or_default()
}

/// The parsed entry config.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schemars(title = "gcp provider entry")]
pub struct Config {
    /// Compute Engine API endpoint (scheme, host, port); must match a grant.
    #[serde(default = "default_endpoint")]
    pub endpoint: String,
    /// Project ID the instances live in.
    pub project: String,
    /// Zones instances may go to; a create tries them in an order fixed by
    /// the Proxy UID and moves on when a zone has no capacity. A Proxy's
    /// placement `zone` picks one.
    #[schemars(length(min = 1))]
    pub zones: Vec<String>,
    /// Proxy image key to a source image: projects/P/global/images/NAME or
    /// projects/P/global/images/family/FAMILY.
    #[serde(default)]
    pub images: BTreeMap<String, String>,
    /// Proxy image key to an instance template:
    /// projects/P/global/instanceTemplates/NAME.
    #[serde(default)]
    pub instance_templates: BTreeMap<String, String>,
    /// Machine type for every instance; derived from the Proxy's cores and
    /// memory when absent.
    #[serde(default)]
    pub machine_type: Option<String>,
    /// Boot disk type.
    #[serde(default = "default_disk_type")]
    pub disk_type: String,
    /// VPC network.
    #[serde(default = "default_network")]
    pub network: String,
    /// Subnetwork, e.g. regions/R/subnetworks/S.
    #[serde(default)]
    pub subnetwork: Option<String>,
    /// Give instances an ephemeral external address.
    #[serde(default = "default_true")]
    pub external_address: bool,
    /// Which address `get` reports.
    #[serde(default)]
    pub address: AddressKind,
    /// Network tags, e.g. for firewall rules.
    #[serde(default = "default_tags")]
    pub network_tags: Vec<String>,
    /// Extra labels on every instance.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// E-mail of the service account the instances run as (none when
    /// absent).
    #[serde(default)]
    pub service_account: Option<String>,
    /// Prefix of instance names.
    #[serde(default = "default_prefix")]
    pub name_prefix: String,
    /// How often a zone operation is polled, in milliseconds.
    #[serde(default = "default_poll_ms")]
    #[schemars(range(min = 50, max = 60_000))]
    pub operation_poll_ms: u64,
}

/// Which address of an instance is the proxy's.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum AddressKind {
    /// The ephemeral external (NAT) address.
    #[default]
    External,
    /// The address in the VPC.
    Internal,
}

/// Where an instance's boot disk comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A source image (or image family) for the boot disk.
    Image(String),
    /// An instance template that defines the disks (and maybe more).
    Template(String),
}

fn default_endpoint() -> String {
    "https://compute.googleapis.com".to_owned()
}

fn default_disk_type() -> String {
    "pd-balanced".to_owned()
}

fn default_network() -> String {
    "global/networks/default".to_owned()
}

fn default_true() -> bool {
    true
}

fn default_tags() -> Vec<String> {
    vec!["proxyfleet-proxy".to_owned()]
}

fn default_prefix() -> String {
    "pf".to_owned()
}

fn default_poll_ms() -> u64 {
    1000
}

fn invalid(key: &str, what: &str) -> ProviderError {
    ProviderError::InvalidConfig(format!("config key `{key}`: {what}"))
}

/// A relative resource path: segments of `[A-Za-z0-9._-]`, no scheme.
fn is_resource_path(text: &str) -> bool {
    !text.is_empty()
        && text.split('/').all(|segment| {
            !segment.is_empty()
                && segment
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        })
}

impl Config {
    /// Parses and checks an entry config; errors name the key.
    pub fn parse(json: &str) -> Result<Self> {
        let config: Self = proxyfleet_sdk::parse_config(json)?;
        let endpoint = config.endpoint.trim_end_matches('/');
        let Some(authority) = endpoint.strip_prefix("https://") else {
            return Err(invalid("endpoint", "must start with https://"));
        };
        if authority.is_empty() || authority.contains(['/', '?', '#', '@']) {
            return Err(invalid(
                "endpoint",
                "give scheme, host and port only, e.g. https://compute.googleapis.com",
            ));
        }
        // Project IDs are 6-30 characters; the check stays lenient on length
        // for older, domain-scoped projects but refuses what cannot be one.
        if !is_resource_id(&config.project) {
            return Err(invalid("project", "is not a project ID (lowercase letters, digits, '-')"));
        }
        if config.zones.is_empty() {
            return Err(invalid("zones", "list at least one zone"));
        }
        for (index, zone) in config.zones.iter().enumerate() {
            if !is_resource_id(zone) || zone.matches('-').count() < 2 {
                return Err(invalid(
                    &format!("zones[{index}]"),
                    "is not a zone such as europe-west1-b",
                ));
            }
        }
        if config.images.is_empty() && config.instance_templates.is_empty() {
            return Err(invalid(
                "images",
                "map at least one image key to a source image (or use `instanceTemplates`)",
            ));
        }
        for (key, image) in &config.images {
            if !image.contains("/global/images/") || !is_resource_path(image) {
                return Err(invalid(
                    &format!("images.{key}"),
                    "use projects/P/global/images/NAME or projects/P/global/images/family/FAMILY",
                ));
            }
            if config.instance_templates.contains_key(key) {
                return Err(invalid(
                    &format!("instanceTemplates.{key}"),
                    "the key is also in `images`; an image key names one source",
                ));
            }
        }
        for (key, template) in &config.instance_templates {
            if !template.contains("global/instanceTemplates/") || !is_resource_path(template) {
                return Err(invalid(
                    &format!("instanceTemplates.{key}"),
                    "use projects/P/global/instanceTemplates/NAME",
                ));
            }
        }
        if let Some(machine_type) = &config.machine_type
            && !is_resource_id(machine_type)
        {
            return Err(invalid("machineType", "is not a machine type such as e2-small"));
        }
        if !is_resource_id(&config.disk_type) {
            return Err(invalid("diskType", "is not a disk type such as pd-balanced"));
        }
        if !is_resource_path(&config.network) {
            return Err(invalid(
                "network",
                "use global/networks/NAME or projects/P/global/networks/NAME",
            ));
        }
        if let Some(subnetwork) = &config.subnetwork
            && !is_resource_path(subnetwork)
        {
            return Err(invalid("subnetwork", "use regions/R/subnetworks/NAME"));
        }
        for (index, tag) in config.network_tags.iter().enumerate() {
            if !is_resource_id(tag) {
                return Err(invalid(&format!("networkTags[{index}]"), "is not a network tag"));
            }
        }
        for (key, value) in &config.labels {
            if !is_label_key(key) || !is_label_value(value) {
                return Err(invalid(
                    &format!("labels.{key}"),
                    "keys and values are up to 63 of [a-z0-9_-], keys starting with a letter",
                ));
            }
            if key.starts_with("proxyfleet") {
                return Err(invalid(
                    &format!("labels.{key}"),
                    "proxyfleet labels are the plugin's own",
                ));
            }
        }
        if config.address == AddressKind::External && !config.external_address {
            return Err(invalid(
                "address",
                "is `external` but `externalAddress` is false; use `internal` or give instances an external address",
            ));
        }
        if config.name_prefix.is_empty()
            || config.name_prefix.len() > 20
            || !is_resource_id(&config.name_prefix)
        {
            return Err(invalid(
                "namePrefix",
                "use 1 to 20 lowercase letters, digits and '-', starting with a letter",
            ));
        }
        if !(50..=60_000).contains(&config.operation_poll_ms) {
            return Err(invalid("operationPollMs", "must be 50 to 60000"));
        }
        Ok(Self { endpoint: endpoint.to_owned(), ..config })
    }

    /// Where a Proxy's `image` comes from.
    pub fn source_for(&self, image: &str) -> Result<Source> {
        if let Some(path) = self.images.get(image) {
            return Ok(Source::Image(path.clone()));
        }
        if let Some(path) = self.instance_templates.get(image) {
            return Ok(Source::Template(path.clone()));
        }
        Err(ProviderError::InvalidSpec(format!(
            "image: `{image}` is neither in the entry's config key `images` nor in `instanceTemplates`"
        )))
    }
}

/// Predefined E2 shapes: (name, vCPUs, memory MiB).
const E2_SHAPES: &[(&str, u32, u64)] = &[
    ("e2-standard-2", 2, 8192),
    ("e2-standard-4", 4, 16_384),
    ("e2-standard-8", 8, 32_768),
    ("e2-standard-16", 16, 65_536),
    ("e2-standard-32", 32, 131_072),
    ("e2-highcpu-2", 2, 2048),
    ("e2-highcpu-4", 4, 4096),
    ("e2-highcpu-8", 8, 8192),
    ("e2-highmem-2", 2, 16_384),
    ("e2-highmem-4", 4, 32_768),
    ("e2-highmem-8", 8, 65_536),
];

/// The machine type for `cores` and `memory_mib`: a predefined E2 shape
/// when one matches exactly, else an E2 custom type rounded up to what E2
/// allows (an even vCPU count from 2 to 32, memory in 256 MiB steps of 0.5
/// to 8 GiB per vCPU).
pub fn machine_type_for(cores: u32, memory_mib: u64) -> Result<String> {
    if let Some((name, _, _)) = E2_SHAPES.iter().find(|(_, c, m)| *c == cores && *m == memory_mib) {
        return Ok((*name).to_owned());
    }
    if cores == 0 || cores > 32 {
        return Err(ProviderError::InvalidSpec(format!(
            "cores: {cores} is outside 1 to 32 (E2 custom machine types); set config key `machineType` for larger shapes"
        )));
    }
    let cpus = u64::from(cores.max(2).next_multiple_of(2));
    let memory = memory_mib.next_multiple_of(256).max(512 * cpus);
    if memory > 8192 * cpus {
        return Err(ProviderError::InvalidSpec(format!(
            "memoryMiB: {memory_mib} is over 8 GiB per vCPU for {cpus} vCPUs (E2 custom machine types); add cores or set config key `machineType`"
        )));
    }
    Ok(format!("e2-custom-{cpus}-{memory}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = r#"{"project":"proxyfleet-test","zones":["europe-west1-b"],"images":{"debian-12":"projects/debian-cloud/global/images/family/debian-12"}}"#;

    fn error(json: &str) -> String {
        match Config::parse(json) {
            Err(ProviderError::InvalidConfig(message)) => message,
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
    }

    #[test]
    fn defaults_fill_the_optional_keys() {
        let config = Config::parse(VALID).expect("valid");
        assert_eq!(config.endpoint, "https://compute.googleapis.com");
        assert_eq!(config.disk_type, "pd-balanced");
        assert_eq!(config.network, "global/networks/default");
        assert!(config.external_address);
        assert_eq!(config.address, AddressKind::External);
        assert_eq!(config.network_tags, ["proxyfleet-proxy"]);
        assert_eq!(config.operation_poll_ms, 1000);
        assert_eq!(
            config.source_for("debian-12"),
            Ok(Source::Image("projects/debian-cloud/global/images/family/debian-12".into()))
        );
        assert!(
            matches!(config.source_for("alpine"), Err(ProviderError::InvalidSpec(m)) if m.contains("images"))
        );
    }

    #[test]
    fn errors_name_the_key() {
        let with =
            |key: &str, value: &str| VALID.replacen('{', &format!("{{\"{key}\":{value},"), 1);
        assert!(error(&with("endpoint", r#""http://x""#)).starts_with("config key `endpoint`"));
        assert!(
            error(&VALID.replace("proxyfleet-test", "Proxyfleet"))
                .starts_with("config key `project`")
        );
        assert!(
            error(&VALID.replace("[\"europe-west1-b\"]", "[]")).starts_with("config key `zones`")
        );
        assert!(
            error(&VALID.replace("europe-west1-b", "europe")).starts_with("config key `zones[0]`")
        );
        assert!(
            error(&VALID.replace("/global/images/family", "/images"))
                .starts_with("config key `images.debian-12`")
        );
        assert!(error(&with("labels", r#"{"Team":"a"}"#)).starts_with("config key `labels.Team`"));
        assert!(error(&with("labels", r#"{"proxyfleet-uid":"a"}"#)).contains("plugin's own"));
        assert!(error(&with("externalAddress", "false")).starts_with("config key `address`"));
        assert!(error(&with("operationPollMs", "1")).starts_with("config key `operationPollMs`"));
        assert!(error(&with("keyFile", r#""/k.json""#)).contains("unknown field `keyFile`"));
    }

    #[test]
    fn machine_types_follow_e2_rules() {
        assert_eq!(machine_type_for(2, 8192).as_deref(), Ok("e2-standard-2"));
        assert_eq!(machine_type_for(1, 512).as_deref(), Ok("e2-custom-2-1024"));
        assert_eq!(machine_type_for(3, 3000).as_deref(), Ok("e2-custom-4-3072"));
        assert_eq!(machine_type_for(2, 2000).as_deref(), Ok("e2-custom-2-2048"));
        assert!(
            matches!(machine_type_for(2, 20_000), Err(ProviderError::InvalidSpec(m)) if m.starts_with("memoryMiB"))
        );
        assert!(
            matches!(machine_type_for(0, 1024), Err(ProviderError::InvalidSpec(m)) if m.starts_with("cores"))
        );
    }

    /// The schema is the struct's: derived, so a key added to one is in
    /// the other, and its defaults are what the parser fills in.
    #[test]
    fn the_schema_is_derived_from_the_config_struct() {
        let schema: serde_json::Value =
            serde_json::from_str(&config_schema()).expect("schema parses");
        assert_eq!(schema["title"], "gcp provider entry");
        assert_eq!(schema["required"], serde_json::json!(["project", "zones"]));
        assert_eq!(schema["properties"]["zones"]["minItems"], 1);
        assert_eq!(schema["properties"]["operationPollMs"]["minimum"], 50);
        let defaults = Config::parse(VALID).expect("valid");
        assert_eq!(schema["properties"]["endpoint"]["default"], defaults.endpoint);
        assert_eq!(schema["properties"]["namePrefix"]["default"], defaults.name_prefix);
    }
}
