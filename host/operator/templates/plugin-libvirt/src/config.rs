//! The entry config. The SSH key and host keys are not part of it: they
//! belong to the entry's `grants.libvirt`.

use std::collections::BTreeMap;

use proxyfleet_sdk::{ProviderError, Result};
use serde::Deserialize;

/// JSON schema of [`Config`], reported by `describe`: derived from the
/// struct, so the two cannot drift.
pub fn config_schema() -> String {
    serde_json::to_string(&schemars::schema_for!(Config)).unwrap_or_default()
}

/// The entry config.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schemars(title = "{{name}} provider entry")]
pub struct Config {
    /// The hypervisor, as the entry's grants.libvirt names it.
    pub host: String,
    /// Storage pool for the proxies' disks and seeds; it holds the base
    /// volumes.
    #[serde(default = "default_pool")]
    pub pool: String,
    /// Proxy image key to the base volume in the pool that a proxy's disk
    /// is an overlay of.
    #[schemars(extend("minProperties" = 1))]
    pub images: BTreeMap<String, String>,
    /// libvirt network the domain's NIC attaches to.
    #[serde(default = "default_network")]
    pub network: String,
    /// libvirt domain type: kvm, or qemu for software emulation.
    #[serde(default = "default_domain_type")]
    pub domain_type: String,
    /// Prefix of domain and volume names.
    #[serde(default = "default_prefix")]
    pub name_prefix: String,
}

fn default_pool() -> String {
    "default".to_owned()
}

fn default_network() -> String {
    "default".to_owned()
}

fn default_domain_type() -> String {
    "kvm".to_owned()
}

fn default_prefix() -> String {
    "pf".to_owned()
}

impl Config {
    /// Parses and checks an entry config; errors name the key.
    pub fn parse(json: &str) -> Result<Self> {
        let config: Self = proxyfleet_sdk::parse_config(json)?;
        if config.host.is_empty() {
            return Err(invalid(
                "host",
                "name the hypervisor as the entry's grants do",
            ));
        }
        if config.images.is_empty() {
            return Err(invalid(
                "images",
                "map at least one image key to a base volume",
            ));
        }
        for (key, volume) in &config.images {
            if volume.is_empty() || volume.contains('/') {
                return Err(invalid(
                    &format!("images.{key}"),
                    "give a volume name in the pool",
                ));
            }
        }
        if config.name_prefix.is_empty()
            || !config
                .name_prefix
                .starts_with(|c: char| c.is_ascii_lowercase())
        {
            return Err(invalid("namePrefix", "start it with a lowercase letter"));
        }
        Ok(config)
    }
}

fn invalid(key: &str, what: &str) -> ProviderError {
    ProviderError::InvalidConfig(format!("config key `{key}`: {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_key() {
        let message = |json: &str| Config::parse(json).expect_err("refused").to_string();
        assert!(message(r#"{"host":"","images":{"d":"b.qcow2"}}"#).contains("`host`"));
        assert!(message(r#"{"host":"h","images":{}}"#).contains("`images`"));
        assert!(message(r#"{"host":"h","images":{"d":"a/b"}}"#).contains("`images.d`"));
        assert!(message(r#"{"host":"h","images":{"d":"b"},"hots":1}"#).contains("hots"));
    }
}
