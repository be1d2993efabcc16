//! The entry config: which hosts and pools, which base images, and how
//! domains are shaped and attached to the network. SSH keys and host keys
//! are not part of it: they belong to the entry's `grants.libvirt`.

use std::collections::BTreeMap;

use proxyfleet_sdk::{ProviderError, Result};
use serde::{Deserialize, Serialize};

/// JSON schema of [`Config`], reported by `describe`: derived from the
/// struct, so the two cannot drift.
pub fn config_schema() -> String {
    serde_json::to_string(&schemars::schema_for!(Config)).unwrap_or_default()
}

/// Longest domain name the plugin derives: short enough for volume names
/// built from it and for hostnames.
pub const NAME_MAX: usize = 40;

/// The parsed entry config.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schemars(title = "kvm provider entry")]
pub struct Config {
    /// Hypervisors proxies may run on; each must be granted under
    /// grants.libvirt. A Proxy's placement `host` picks one, otherwise the
    /// Proxy UID does.
    #[schemars(length(min = 1))]
    pub hosts: Vec<HostConfig>,
    /// Storage pool on every host without its own.
    #[serde(default = "default_pool")]
    pub pool: String,
    /// Proxy image key to a base image, downloaded once per host and pool
    /// through the HTTP capability.
    #[schemars(extend("minProperties" = 1))]
    pub images: BTreeMap<String, Image>,
    /// Where the domain's one NIC attaches: a libvirt network or a host
    /// bridge.
    #[serde(default)]
    pub interface: Interface,
    /// Where `get` reads addresses, in order of preference.
    #[serde(default = "default_sources")]
    pub address_sources: Vec<AddressSourceName>,
    /// libvirt domain type: kvm, or qemu for software emulation.
    #[serde(default = "default_domain_type")]
    pub domain_type: String,
    /// The guest architecture.
    #[serde(default = "default_arch")]
    pub arch: String,
    /// CPU mode, e.g. host-passthrough; libvirt's default when absent.
    #[serde(default)]
    pub cpu_mode: Option<String>,
    /// Prefix of domain and volume names.
    #[serde(default = "default_prefix")]
    pub name_prefix: String,
}

/// One hypervisor.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HostConfig {
    /// The host as granted.
    pub name: String,
    /// Storage pool for base images, overlays and seeds on this host; the
    /// entry's `pool` when absent.
    #[serde(default)]
    pub pool: Option<String>,
}

/// A base image.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Image {
    /// http(s) URL of the image; its host must be granted under
    /// grants.http.
    pub url: String,
    /// Hex SHA-256 of the image file, checked while it streams.
    pub sha256: String,
    /// The image file's format.
    #[serde(default)]
    pub format: ImageFormat,
}

/// Disk image formats a base may have.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum ImageFormat {
    /// qcow2.
    #[default]
    Qcow2,
    /// A raw disk image.
    Raw,
}

impl ImageFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Qcow2 => "qcow2",
            Self::Raw => "raw",
        }
    }
}

/// Where a domain's NIC attaches.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Interface {
    /// A libvirt network (DHCP leases can tell the address).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    /// A host bridge.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bridge: Option<String>,
    /// VLAN tag to the bridge that carries it untagged, for Proxies with a
    /// network VLAN tag on Linux bridges.
    #[serde(default)]
    pub vlan_bridges: BTreeMap<String, String>,
    /// The bridge is an Open vSwitch bridge: a Proxy's VLAN tag is set on
    /// its port.
    #[serde(default)]
    pub openvswitch: bool,
    /// NIC model.
    #[serde(default = "default_model")]
    pub model: String,
}

impl Default for Interface {
    fn default() -> Self {
        Self {
            network: Some("default".to_owned()),
            bridge: None,
            vlan_bridges: BTreeMap::new(),
            openvswitch: false,
            model: default_model(),
        }
    }
}

/// The NIC a domain gets, once a Proxy's VLAN tag is applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attachment {
    Network(String),
    Bridge { bridge: String, openvswitch: bool, vlan: Option<u16> },
}

impl Interface {
    /// The attachment for a Proxy with `vlan`: a VLAN needs a bridge that
    /// carries it (`vlanBridges`) or an Open vSwitch bridge that tags.
    pub fn attachment(&self, vlan: Option<u16>) -> Result<Attachment> {
        match (&self.network, &self.bridge, vlan) {
            (Some(network), _, None) => Ok(Attachment::Network(network.clone())),
            (Some(network), _, Some(tag)) => Err(ProviderError::InvalidSpec(format!(
                "network.vlanTag: {tag} cannot be served: the entry attaches proxies to the \
                 libvirt network `{network}`; use a network per VLAN in another entry, or a \
                 bridge with config key `interface.vlanBridges`"
            ))),
            (None, Some(bridge), None) => Ok(Attachment::Bridge {
                bridge: bridge.clone(),
                openvswitch: self.openvswitch,
                vlan: None,
            }),
            (None, Some(bridge), Some(tag)) => {
                if let Some(carrier) = self.vlan_bridges.get(&tag.to_string()) {
                    Ok(Attachment::Bridge {
                        bridge: carrier.clone(),
                        openvswitch: self.openvswitch,
                        vlan: None,
                    })
                } else if self.openvswitch {
                    Ok(Attachment::Bridge {
                        bridge: bridge.clone(),
                        openvswitch: true,
                        vlan: Some(tag),
                    })
                } else {
                    Err(ProviderError::InvalidSpec(format!(
                        "network.vlanTag: {tag} cannot be served: bridge `{bridge}` is a Linux \
                         bridge and config key `interface.vlanBridges` names no bridge for VLAN \
                         {tag}"
                    )))
                }
            }
            (None, None, _) => Err(invalid("interface", "name a `network` or a `bridge`")),
        }
    }
}

/// Where addresses are read from (config spelling).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum AddressSourceName {
    /// The QEMU guest agent.
    Agent,
    /// The libvirt network's DHCP leases.
    Lease,
    /// The host's ARP table.
    Arp,
}

fn default_pool() -> String {
    "default".to_owned()
}

fn default_sources() -> Vec<AddressSourceName> {
    vec![AddressSourceName::Agent, AddressSourceName::Lease, AddressSourceName::Arp]
}

fn default_domain_type() -> String {
    "kvm".to_owned()
}

fn default_arch() -> String {
    "x86_64".to_owned()
}

fn default_prefix() -> String {
    "pf".to_owned()
}

fn default_model() -> String {
    "virtio".to_owned()
}

fn invalid(key: &str, what: &str) -> ProviderError {
    ProviderError::InvalidConfig(format!("config key `{key}`: {what}"))
}

/// A name libvirt and file systems take as it is: `[A-Za-z0-9._-]`, not
/// starting with `.` or `-`.
pub fn is_plain_name(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 128
        && !text.starts_with(['.', '-'])
        && text.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

impl Config {
    /// Parses and checks an entry config; errors name the key.
    pub fn parse(json: &str) -> Result<Self> {
        let config: Self = proxyfleet_sdk::parse_config(json)?;
        if config.hosts.is_empty() {
            return Err(invalid("hosts", "list at least one host"));
        }
        let mut seen = std::collections::BTreeSet::new();
        for (index, host) in config.hosts.iter().enumerate() {
            if host.name.trim().is_empty() || host.name.contains(['/', ' ']) {
                return Err(invalid(&format!("hosts[{index}].name"), "is not a host name"));
            }
            if !seen.insert(host.name.to_ascii_lowercase()) {
                return Err(invalid(&format!("hosts[{index}].name"), "is listed twice"));
            }
            if host.pool.as_deref().is_some_and(|pool| !is_plain_name(pool)) {
                return Err(invalid(&format!("hosts[{index}].pool"), "is not a pool name"));
            }
        }
        if !is_plain_name(&config.pool) {
            return Err(invalid("pool", "is not a pool name"));
        }
        if config.images.is_empty() {
            return Err(invalid("images", "map at least one image key to a base image"));
        }
        for (key, image) in &config.images {
            if !is_plain_name(key) {
                return Err(invalid(
                    &format!("images.{key}"),
                    "image keys become file names: use letters, digits, '.', '_' and '-'",
                ));
            }
            let scheme_ok = image.url.starts_with("https://") || image.url.starts_with("http://");
            if !scheme_ok || image.url.contains(char::is_whitespace) {
                return Err(invalid(&format!("images.{key}.url"), "must be an http(s) URL"));
            }
            if image.sha256.len() != 64 || !image.sha256.chars().all(|c| c.is_ascii_hexdigit()) {
                return Err(invalid(
                    &format!("images.{key}.sha256"),
                    "must be 64 hex digits (the output of `sha256sum`)",
                ));
            }
        }
        let interface = &config.interface;
        match (&interface.network, &interface.bridge) {
            (Some(_), Some(_)) => {
                return Err(invalid("interface", "name a `network` or a `bridge`, not both"));
            }
            (None, None) => return Err(invalid("interface", "name a `network` or a `bridge`")),
            (Some(network), None) => {
                if !is_plain_name(network) {
                    return Err(invalid("interface.network", "is not a network name"));
                }
                if !interface.vlan_bridges.is_empty() || interface.openvswitch {
                    return Err(invalid(
                        "interface.vlanBridges",
                        "VLAN settings need a `bridge`, not a libvirt network",
                    ));
                }
            }
            (None, Some(bridge)) => {
                if !is_plain_name(bridge) {
                    return Err(invalid("interface.bridge", "is not a bridge name"));
                }
            }
        }
        for (tag, bridge) in &interface.vlan_bridges {
            if !tag.parse::<u16>().is_ok_and(|t| (1..=4094).contains(&t)) {
                return Err(invalid(
                    &format!("interface.vlanBridges.{tag}"),
                    "keys are VLAN tags from 1 to 4094",
                ));
            }
            if !is_plain_name(bridge) {
                return Err(invalid(
                    &format!("interface.vlanBridges.{tag}"),
                    "is not a bridge name",
                ));
            }
        }
        if !is_plain_name(&interface.model) {
            return Err(invalid("interface.model", "is not a NIC model"));
        }
        if config.address_sources.is_empty() {
            return Err(invalid("addressSources", "list at least one of agent, lease, arp"));
        }
        for (key, value) in [("domainType", &config.domain_type), ("arch", &config.arch)] {
            if !is_plain_name(value) {
                return Err(invalid(key, "is not a libvirt name"));
            }
        }
        if config.cpu_mode.as_deref().is_some_and(|mode| !is_plain_name(mode)) {
            return Err(invalid("cpuMode", "is not a CPU mode such as host-passthrough"));
        }
        if !config.name_prefix.starts_with(|c: char| c.is_ascii_lowercase())
            || config.name_prefix.len() > 16
            || !config.name_prefix.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        {
            return Err(invalid(
                "namePrefix",
                "use 1-16 lowercase letters and digits, starting with a letter",
            ));
        }
        Ok(config)
    }

    /// The configured host named `name` (case-insensitive).
    pub fn host(&self, name: &str) -> Option<&HostConfig> {
        self.hosts.iter().find(|host| host.name.eq_ignore_ascii_case(name))
    }

    /// The storage pool on `host`.
    pub fn pool_of<'a>(&'a self, host: &'a HostConfig) -> &'a str {
        host.pool.as_deref().unwrap_or(&self.pool)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    fn config(extra: &str) -> String {
        format!(
            r#"{{"hosts":[{{"name":"kvm1.lan"}}],"images":{{"debian":{{"url":"https://img.example/d.qcow2","sha256":"{SHA}"}}}}{extra}}}"#
        )
    }

    fn error(json: &str) -> String {
        Config::parse(json).expect_err("an error").message().to_owned()
    }

    #[test]
    fn defaults_fill_a_minimal_config() {
        let config = Config::parse(&config("")).expect("valid");
        assert_eq!(config.pool, "default");
        assert_eq!(config.interface.network.as_deref(), Some("default"));
        assert_eq!(config.images["debian"].format, ImageFormat::Qcow2);
        assert_eq!(config.domain_type, "kvm");
        assert_eq!(config.address_sources.len(), 3);
        assert_eq!(config.pool_of(&config.hosts[0]), "default");
    }

    #[test]
    fn errors_name_the_key() {
        assert!(error(&config(r#","pool":"a/b""#)).contains("`pool`"));
        let bad_sha = config("").replace(SHA, "abc");
        assert!(error(&bad_sha).contains("`images.debian.sha256`"));
        let bad_url = config("").replace("https://img.example/d.qcow2", "ftp://x/y");
        assert!(error(&bad_url).contains("`images.debian.url`"));
        assert!(
            error(&config(r#","interface":{"network":"n","bridge":"b"}"#)).contains("not both")
        );
        assert!(
            error(&config(r#","interface":{"bridge":"br0","vlanBridges":{"5000":"x"}}"#))
                .contains("`interface.vlanBridges.5000`")
        );
        assert!(error(&config(r#","namePrefix":"PF""#)).contains("`namePrefix`"));
        assert!(error(&config(r#","extra":1"#)).contains("unknown field"));
        let twice = config("")
            .replace(r#"[{"name":"kvm1.lan"}]"#, r#"[{"name":"kvm1.lan"},{"name":"KVM1.lan"}]"#);
        assert!(error(&twice).contains("`hosts[1].name`"));
    }

    #[test]
    fn a_vlan_needs_a_bridge_that_carries_it() {
        let network = Interface::default();
        assert_eq!(network.attachment(None).expect("valid"), Attachment::Network("default".into()));
        assert!(
            network
                .attachment(Some(42))
                .expect_err("an error")
                .message()
                .contains("network.vlanTag")
        );

        let linux = Interface {
            network: None,
            bridge: Some("br0".into()),
            vlan_bridges: [("42".to_owned(), "br42".to_owned())].into(),
            ..Interface::default()
        };
        assert_eq!(
            linux.attachment(Some(42)).expect("valid"),
            Attachment::Bridge { bridge: "br42".into(), openvswitch: false, vlan: None }
        );
        let err = linux.attachment(Some(7)).expect_err("an error");
        assert!(matches!(err, ProviderError::InvalidSpec(_)), "{err:?}");
        assert!(err.message().contains("VLAN 7"), "{err:?}");

        let ovs = Interface { openvswitch: true, ..linux };
        assert_eq!(
            ovs.attachment(Some(7)).expect("valid"),
            Attachment::Bridge { bridge: "br0".into(), openvswitch: true, vlan: Some(7) }
        );
    }

    /// The schema is the struct's: derived, so a key added to one is in
    /// the other, and its defaults are what the parser fills in.
    #[test]
    fn the_schema_is_derived_from_the_config_struct() {
        let schema: serde_json::Value =
            serde_json::from_str(&config_schema()).expect("schema parses");
        assert_eq!(schema["title"], "kvm provider entry");
        assert_eq!(schema["properties"]["images"]["minProperties"], 1);
        let defaults = Config::parse(&config("")).expect("valid");
        assert_eq!(schema["properties"]["interface"]["default"]["network"], "default");
        assert_eq!(schema["properties"]["pool"]["default"], defaults.pool);
        assert_eq!(
            schema["properties"]["addressSources"]["default"],
            serde_json::json!(["agent", "lease", "arp"])
        );
    }

    #[test]
    fn the_config_schema_says_what_validate_config_accepts() {
        let valid = serde_json::from_str(&config("")).expect("JSON");
        proxyfleet_sdk_testkit::assert_config_schema::<crate::Kvm>(&valid);
    }
}
