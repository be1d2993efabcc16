//! The providers file: which entries exist, which plugin serves each, what
//! it may reach and how much it may use.
//!
//! Parsed in two steps: serde into `Raw*` structs that reject unknown keys,
//! then validation into typed config whose errors name the entry and key.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use ipnet::IpNet;
use proxyfleet_oci::{KeyPolicy, PluginReference, RawRegistry, RawVerify, Registries};
use serde::Deserialize;

use crate::capabilities::address;
pub use proxyfleet_core::revisions::Pin;

pub use crate::capabilities::http::config::{
    Credential, HeaderCredential, HttpGrant, SecretSource,
};
use crate::capabilities::http::config::{RawHttpGrant, validate_http_grant};
pub use crate::capabilities::libvirt::config::{
    DEFAULT_LIBVIRT_SOCKET, DEFAULT_LIBVIRT_URI, LibvirtGrant,
};
use crate::capabilities::libvirt::config::{RawLibvirtGrant, validate_libvirt_grants};
use crate::error::ConfigError;
pub use crate::limits::{
    Limits, MAX_HTTP_IN_FLIGHT, MAX_HTTP_REQUEST_MIB, MAX_HTTP_RESPONSE_MIB, MAX_MEMORY_MIB,
};
use crate::limits::{RawLimits, validate_limits};

/// Every provider entry, validated.
#[derive(Debug, Clone)]
pub struct ProvidersConfig {
    /// Entries in file order; names are unique.
    pub entries: Vec<EntryConfig>,
    /// How the registries that `oci://` plugins live in are reached.
    pub registries: Registries,
    /// Each entry as the file writes it, without its name, by name: the
    /// spec of the ClusterProxyProvider that shows it in a cluster.
    pub written: BTreeMap<String, serde_json::Value>,
}

/// One provider entry.
#[derive(Debug, Clone, PartialEq)]
pub struct EntryConfig {
    /// DNS-1123 label, unique in the file.
    pub name: String,
    /// Name of the plugin file (without `.wasm`) in the plugin directory,
    /// or an `oci://` reference.
    pub plugin: String,
    /// The reference, when `plugin` is an `oci://` one.
    pub oci: Option<PluginReference>,
    /// The config handed to the plugin, as JSON.
    pub config: serde_json::Value,
    /// What the plugin may reach.
    pub grants: Grants,
    /// What the plugin may use.
    pub limits: Limits,
    /// The only build of the plugin this entry accepts, if any.
    pub pin: Option<Pin>,
    /// Public keys the entry's `oci://` builds must be signed with (one of
    /// them), besides any its registry's item names.
    pub verify: Option<KeyPolicy>,
    /// The ranges the proxies of this entry live in: an address the
    /// plugin reports outside them is dropped. Empty: private networks and
    /// public addresses are taken, other special-purpose ones dropped (see
    /// [`crate::capabilities::address::refused_proxy_address`]).
    pub proxy_addresses: Vec<IpNet>,
}

/// Capabilities granted to an entry. Everything not named is refused.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Grants {
    /// HTTP destinations the plugin may reach.
    pub http: Vec<HttpGrant>,
    /// Extra CA certificates (PEM) trusted for this entry's HTTPS requests.
    pub ca_file: Option<PathBuf>,
    /// Hypervisors the plugin may drive through libvirt over SSH.
    pub libvirt: Vec<LibvirtGrant>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawFile {
    providers: Vec<RawEntry>,
    #[serde(default)]
    registries: Vec<RawRegistry>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawEntry {
    name: String,
    plugin: String,
    /// The plugin's own config: its `validate-config` judges it.
    #[serde(default)]
    #[schemars(with = "Option<serde_json::Value>")]
    config: Option<yaml_serde::Value>,
    #[serde(default)]
    grants: RawGrants,
    #[serde(default)]
    limits: RawLimits,
    pin: Option<RawPin>,
    verify: Option<RawVerify>,
    #[serde(default, rename = "proxyAddresses")]
    proxy_addresses: Vec<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawPin {
    version: Option<String>,
    digest: Option<String>,
}

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawGrants {
    #[serde(default)]
    http: Vec<RawHttpGrant>,
    ca_file: Option<PathBuf>,
    #[serde(default)]
    libvirt: Vec<RawLibvirtGrant>,
}

impl EntryConfig {
    /// Settings that are valid but work against each other, each a
    /// sentence naming the fields and the fix: the operator logs them at
    /// start.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        let limits = &self.limits;
        // A call of an HTTP plugin holds a request open most of its time:
        // calls beyond the open requests allowed mostly wait.
        if !self.grants.http.is_empty() && limits.http_in_flight < limits.concurrency {
            let (calls, requests) = (limits.concurrency, limits.http_in_flight);
            warnings.push(format!(
                "limits.concurrency ({calls}) is above limits.httpInFlight ({requests}): calls \
                 beyond {requests} wait for a request slot and Proxies come up slower; raise \
                 httpInFlight to at least concurrency"
            ));
        }
        warnings
    }
}

impl ProvidersConfig {
    /// Reads and validates a providers file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        Self::parse(&text).map_err(|err| err.in_file(path))
    }

    /// Parses and validates providers YAML.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let raw: RawFile = yaml_serde::from_str(text)
            .map_err(|err| ConfigError::Syntax { file: None, message: err.to_string() })?;
        let mut seen = BTreeSet::new();
        let mut entries = Vec::with_capacity(raw.providers.len());
        for (index, raw_entry) in raw.providers.into_iter().enumerate() {
            let entry = validate_entry(index, raw_entry)?;
            if !seen.insert(entry.name.clone()) {
                return Err(ConfigError::invalid(
                    format!("providers[{index}]"),
                    "name",
                    format!(
                        "{:?} is used by an earlier entry; entry names must be unique",
                        entry.name
                    ),
                ));
            }
            entries.push(entry);
        }
        let registries = Registries::validate(raw.registries).map_err(|err| {
            ConfigError::invalid(format!("registries[{}]", err.index), err.field, err.reason)
        })?;
        Ok(Self { entries, registries, written: written_entries(text) })
    }

    /// Parses and validates one entry given as JSON without its name (the
    /// spec of a resource that declares an entry), as entry `name`.
    /// Unknown keys are refused, as in the file; errors name the key.
    pub fn parse_entry(name: &str, spec: &serde_json::Value) -> Result<EntryConfig, ConfigError> {
        let at = format!("provider entry {name:?}");
        check_dns_label(name).map_err(|why| ConfigError::invalid(&at, "metadata.name", why))?;
        let serde_json::Value::Object(fields) = spec else {
            return Err(ConfigError::invalid(&at, "spec", "must be an object"));
        };
        if fields.contains_key("name") {
            return Err(ConfigError::invalid(
                &at,
                "spec.name",
                "the entry is named by the resource's own name; remove `name` from the spec",
            ));
        }
        let mut fields = fields.clone();
        fields.insert("name".to_owned(), serde_json::Value::String(name.to_owned()));
        let raw: RawEntry = serde_json::from_value(serde_json::Value::Object(fields))
            .map_err(|err| ConfigError::Syntax { file: None, message: format!("{at}: {err}") })?;
        validate_entry(0, raw)
    }

    /// The JSON Schema (draft-07, every subschema inline) of a providers
    /// file as written, made from the types [`ProvidersConfig::parse`]
    /// reads it with: the chart checks its `providers` value with it, so
    /// `helm install` refuses a misspelt key before a pod starts
    /// (`proxyfleet providers schema` prints it).
    pub fn file_schema() -> serde_json::Value {
        let generator = schemars::generate::SchemaSettings::draft07()
            .with(|settings| settings.inline_subschemas = true)
            .into_generator();
        let mut schema = generator.into_root_schema_for::<RawFile>();
        if let Some(object) = schema.as_object_mut() {
            // The chart embeds it as one property of its own schema.
            object.remove("$schema");
            object.remove("title");
        }
        schema.to_value()
    }
}

fn validate_entry(index: usize, raw: RawEntry) -> Result<EntryConfig, ConfigError> {
    let at = format!("providers[{index}]");
    check_dns_label(&raw.name).map_err(|why| ConfigError::invalid(&at, "name", why))?;
    let at = format!("provider entry {:?}", raw.name);
    let oci = if raw.plugin.starts_with(proxyfleet_oci::SCHEME) {
        let reference = PluginReference::parse(&raw.plugin)
            .map_err(|err| ConfigError::invalid(&at, "plugin", err.to_string()))?;
        Some(reference)
    } else {
        check_dns_label(&raw.plugin).map_err(|why| {
            ConfigError::invalid(
                &at,
                "plugin",
                format!(
                    "{why}; name a file of the plugin directory without `.wasm`, or a \
                     registry build as oci://REGISTRY/REPOSITORY:TAG"
                ),
            )
        })?;
        None
    };
    let config = match raw.config {
        None => serde_json::Value::Object(Default::default()),
        Some(yaml) => serde_json::to_value(yaml).map_err(|err| {
            ConfigError::invalid(&at, "config", format!("cannot be expressed as JSON: {err}"))
        })?,
    };
    let mut http = Vec::with_capacity(raw.grants.http.len());
    for (i, grant) in raw.grants.http.into_iter().enumerate() {
        http.push(validate_http_grant(&at, i, grant)?);
    }
    let libvirt = validate_libvirt_grants(&at, raw.grants.libvirt)?;
    let grants = Grants { http, ca_file: raw.grants.ca_file, libvirt };
    let limits = validate_limits(&at, raw.limits)?;
    let pin = raw.pin.map(|pin| validate_pin(&at, pin)).transpose()?;
    let verify = match (raw.verify, &oci) {
        (None, _) => None,
        (Some(_), None) => {
            return Err(ConfigError::invalid(
                &at,
                "verify",
                "checks the signatures of registry builds, and this entry's plugin is a file \
                 of the plugin directory (trusted as the directory is): name an \
                 oci:// reference, or remove `verify`",
            ));
        }
        (Some(raw), Some(_)) => Some(
            KeyPolicy::validate(format!("providers[{index}].verify"), raw)
                .map_err(|reason| ConfigError::invalid(&at, "verify", reason))?,
        ),
    };
    let proxy_addresses = address::parse_ranges(&at, "proxyAddresses", &raw.proxy_addresses)?;
    Ok(EntryConfig {
        name: raw.name,
        plugin: raw.plugin,
        oci,
        config,
        grants,
        limits,
        pin,
        verify,
        proxy_addresses,
    })
}

fn validate_pin(at: &str, raw: RawPin) -> Result<Pin, ConfigError> {
    match (raw.version, raw.digest) {
        (Some(version), None) if !version.trim().is_empty() => Ok(Pin::Version(version)),
        (Some(_), None) => Err(ConfigError::invalid(at, "pin.version", "must not be empty")),
        (None, Some(digest)) => {
            let hex = digest.strip_prefix("sha256:").unwrap_or(&digest);
            if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                Ok(Pin::Digest(hex.to_ascii_lowercase()))
            } else {
                Err(ConfigError::invalid(
                    at,
                    "pin.digest",
                    format!(
                        "{digest:?} is not a sha256 digest: use \"sha256:\" and 64 hex digits, \
                         as `proxyfleet plugin inspect` prints it"
                    ),
                ))
            }
        }
        _ => Err(ConfigError::invalid(
            at,
            "pin",
            "name exactly one of `version` (what the plugin's describe reports) or `digest` \
             (sha256 of the file)",
        )),
    }
}

/// Each entry of providers YAML that parsed, as JSON without its name and
/// without keys left empty (`config:` with nothing after it), by name.
fn written_entries(text: &str) -> BTreeMap<String, serde_json::Value> {
    let document = yaml_serde::from_str::<yaml_serde::Value>(text)
        .ok()
        .and_then(|yaml| serde_json::to_value(yaml).ok());
    let Some(serde_json::Value::Array(entries)) = document
        .and_then(|mut document| document.get_mut("providers").map(serde_json::Value::take))
    else {
        return BTreeMap::new();
    };
    entries
        .into_iter()
        .filter_map(|entry| {
            let serde_json::Value::Object(mut fields) = entry else { return None };
            let Some(serde_json::Value::String(name)) = fields.remove("name") else {
                return None;
            };
            fields.retain(|_, value| !value.is_null());
            Some((name, serde_json::Value::Object(fields)))
        })
        .collect()
}

/// RFC 1123 label: what Kubernetes accepts as a name, so entries can be
/// named in resources and metrics without escaping.
fn check_dns_label(name: &str) -> Result<(), String> {
    let valid = !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if valid {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a DNS-1123 label: use 1 to 63 lowercase letters, digits and '-', \
             starting and ending with a letter or digit"
        ))
    }
}

#[cfg(test)]
mod tests {
    /// The chart validates its `providers` value with this schema, kept
    /// in its values.schema.json; written from the parser's own types, the
    /// two cannot drift apart unnoticed.
    #[test]
    fn the_charts_values_schema_holds_the_providers_file_schema() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../deploy/helm/proxyfleet/values.schema.json");
        let text = std::fs::read_to_string(&path).unwrap();
        let chart: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert!(
            chart["properties"]["providers"] == ProvidersConfig::file_schema(),
            "{}: properties.providers is stale; replace it with the output of `proxyfleet \
             providers schema`",
            path.display()
        );
    }

    #[test]
    fn the_file_schema_refuses_unknown_keys_and_names_the_required_ones() {
        let schema = ProvidersConfig::file_schema();
        assert_eq!(schema["additionalProperties"], false);
        assert_eq!(schema["required"], serde_json::json!(["providers"]));
        let entry = &schema["properties"]["providers"]["items"];
        assert_eq!(entry["additionalProperties"], false);
        assert_eq!(entry["required"], serde_json::json!(["name", "plugin"]));
        let grant = &entry["properties"]["grants"]["properties"]["http"]["items"];
        assert_eq!(grant["additionalProperties"], false, "{grant}");
        assert!(grant["properties"]["allowAddresses"].is_object(), "{grant}");
        let limits = &entry["properties"]["limits"]["properties"];
        assert!(limits["memoryMiB"].is_object() && limits["httpInFlight"].is_object(), "{limits}");
        assert!(!schema.to_string().contains("$ref"), "every subschema inline");
    }

    use std::time::Duration;

    use super::*;

    fn parse_err(yaml: &str) -> String {
        ProvidersConfig::parse(yaml).unwrap_err().to_string()
    }

    /// A cluster shows each file entry as a ClusterProxyProvider whose spec
    /// is the entry as written: it must parse back to the same entry.
    #[test]
    fn each_entry_as_written_parses_back_to_the_same_entry() {
        let config = ProvidersConfig::parse(
            "providers:\n  - name: a\n    plugin: static\n    config:\n  - name: b\n    \
             plugin: x\n    config: { endpoints: ['10.0.0.1:3128'] }\n    limits: { concurrency: \
             2 }\n    proxyAddresses: [10.0.0.0/8]\n    grants:\n      http:\n        - url: \
             https://pve.example:8006\n          credential: { header: Authorization, \
             valueTemplate: 'PVEAPIToken={secret}', secretFile: /run/s }\n",
        )
        .unwrap();
        assert_eq!(config.written.len(), 2);
        for entry in &config.entries {
            let written = &config.written[&entry.name];
            assert!(written.get("name").is_none(), "{written}");
            assert_eq!(&ProvidersConfig::parse_entry(&entry.name, written).unwrap(), entry);
        }
        assert_eq!(config.written["a"], serde_json::json!({ "plugin": "static" }));
    }

    #[test]
    fn full_entry_parses_into_typed_config() {
        let config = ProvidersConfig::parse(
            r#"
providers:
  - name: pve-lab
    plugin: proxmox
    config: { node: pve1, vmidRange: [9000, 9099] }
    grants:
      caFile: /etc/proxyfleet/pve-ca.pem
      http:
        - url: https://pve.lan:8006
          allowAddresses: [10.0.0.0/8, 127.0.0.1]
          credential:
            header: Authorization
            valueTemplate: "PVEAPIToken={secret}"
            secretFile: /run/secrets/pve
    limits: { timeout: 90s, memoryMiB: 128, concurrency: 2 }
"#,
        )
        .unwrap();
        let entry = &config.entries[0];
        assert_eq!(entry.config["vmidRange"][1], 9099);
        let grant = &entry.grants.http[0];
        assert_eq!(grant.destination.to_string(), "https://pve.lan:8006");
        assert_eq!(grant.allow_addresses.len(), 2);
        let Some(Credential::Header(credential)) = &grant.credential else {
            panic!("a header credential: {:?}", grant.credential)
        };
        assert_eq!(credential.header, "authorization");
        assert_eq!(entry.limits.call_timeout, Duration::from_secs(90));
        assert_eq!(entry.limits.memory_bytes, 128 << 20);
        assert_eq!(entry.limits.concurrency, 2);
    }

    #[test]
    fn a_plugin_may_be_an_oci_reference_reached_as_its_registries_item_says() {
        let config = ProvidersConfig::parse(
            "registries:\n  - { host: ghcr.io, username: bot, passwordFile: /run/secrets/ghcr }\n\
             providers:\n  - { name: gce, plugin: 'oci://ghcr.io/org/gcp:1.2' }\n  \
             - { name: lab, plugin: static }\n",
        )
        .unwrap();
        let reference = config.entries[0].oci.as_ref().expect("an oci reference");
        assert_eq!((reference.registry(), reference.tag()), ("ghcr.io", Some("1.2")));
        assert_eq!(config.entries[0].plugin, "oci://ghcr.io/org/gcp:1.2");
        assert!(config.entries[1].oci.is_none());
        assert_eq!(config.registries.for_host("ghcr.io").host(), "ghcr.io");
    }

    #[test]
    fn oci_references_and_registries_items_name_the_key_and_the_fix() {
        let err = parse_err("providers:\n  - { name: a, plugin: 'oci://org/gcp:1' }\n");
        assert!(err.contains("provider entry \"a\": plugin:"), "{err}");
        assert!(err.contains("spell the registry out"), "{err}");
        let err = parse_err("providers:\n  - { name: a, plugin: 'oci://r.io/gcp' }\n");
        assert!(err.contains("add :TAG"), "{err}");
        let err = parse_err("providers:\n  - { name: a, plugin: gcp.wasm }\n");
        assert!(err.contains("or a registry build as oci://"), "{err}");
        let err =
            parse_err("registries:\n  - { host: 10.0.0.5:5000, plainHttp: true }\nproviders: []\n");
        assert!(err.contains("registries[0]: plainHttp:"), "{err}");
        let err = parse_err("registries:\n  - { host: r.io, password: x }\nproviders: []\n");
        assert!(err.contains("unknown field `password`"), "{err}");
    }

    #[test]
    fn unknown_keys_are_rejected_with_their_name() {
        let err = parse_err("providers:\n  - name: a\n    plugin: static\n    limit: {}\n");
        assert!(err.contains("unknown field `limit`"), "{err}");
        let err =
            parse_err("providers:\n  - name: a\n    plugin: static\n    limits: { memoryMb: 3 }\n");
        assert!(err.contains("memoryMb"), "{err}");
    }

    #[test]
    fn errors_name_the_entry_and_the_key() {
        let err = parse_err(
            "providers:\n  - name: lab\n    plugin: static\n    limits: { timeout: soon }\n",
        );
        assert!(err.contains("\"lab\"") && err.contains("limits.timeout"), "{err}");
        let err = parse_err(
            "providers:\n  - name: lab\n    plugin: static\n    grants: { http: [ { url: 'ftp://x' } ] }\n",
        );
        assert!(err.contains("grants.http[0].url") && err.contains("https://"), "{err}");
        let err = parse_err("providers:\n  - name: Lab\n    plugin: static\n");
        assert!(err.contains("providers[0]") && err.contains("DNS-1123"), "{err}");
    }

    #[test]
    fn duplicate_names_are_refused() {
        let err = parse_err(
            "providers:\n  - { name: a, plugin: static }\n  - { name: a, plugin: static }\n",
        );
        assert!(err.contains("providers[1]") && err.contains("unique"), "{err}");
    }

    /// The attack: a grant naming `127.1` (or `2130706433`, `0x7f.0.0.1`,
    /// `0177.0.0.1`) reached loopback without `allowAddresses`.
    #[test]
    fn non_canonical_ip_literal_grants_are_refused() {
        for host in ["127.1", "2130706433", "0x7f.0.0.1", "0177.0.0.1"] {
            let err = parse_err(&format!(
                "providers:\n  - name: a\n    plugin: x\n    grants: {{ http: [ {{ url: 'http://{host}:8080' }} ] }}\n"
            ));
            assert!(err.contains("grants.http[0].url"), "{err}");
            assert!(err.contains("write 127.0.0.1"), "{err}");
        }
    }

    #[test]
    fn wildcard_and_path_grants_are_refused() {
        let err = parse_err(
            "providers:\n  - name: a\n    plugin: x\n    grants: { http: [ { url: 'https://*.lan' } ] }\n",
        );
        assert!(err.contains("wildcards"), "{err}");
        let err = parse_err(
            "providers:\n  - name: a\n    plugin: x\n    grants: { http: [ { url: 'https://h/api' } ] }\n",
        );
        assert!(err.contains("drop the path"), "{err}");
    }

    #[test]
    fn mutations_stay_within_concurrency() {
        let config = ProvidersConfig::parse(
            "providers:\n  - name: a\n    plugin: x\n    limits: { concurrency: 1 }\n",
        )
        .unwrap();
        assert_eq!(config.entries[0].limits.mutations, 1, "the default shrinks to fit");
        let err = parse_err(
            "providers:\n  - name: a\n    plugin: x\n    limits: { concurrency: 2, mutations: 3 }\n",
        );
        assert!(
            err.contains("limits.mutations") && err.contains("1 to limits.concurrency (2)"),
            "{err}"
        );
    }

    #[test]
    fn pins_name_a_version_or_a_digest() {
        let digest = "AB".repeat(32);
        let config = ProvidersConfig::parse(&format!(
            "providers:\n  - {{ name: a, plugin: x, pin: {{ version: 1.2.3 }} }}\n  \
             - {{ name: b, plugin: x, pin: {{ digest: 'sha256:{digest}' }} }}\n  \
             - {{ name: c, plugin: x }}\n"
        ))
        .unwrap();
        assert_eq!(config.entries[0].pin, Some(Pin::Version("1.2.3".into())));
        let pin = config.entries[1].pin.clone().unwrap();
        assert_eq!(pin, Pin::Digest(digest.to_ascii_lowercase()));
        assert!(pin.admits("9.9.9", &digest.to_ascii_lowercase()));
        assert!(!pin.admits("9.9.9", &"cd".repeat(32)));
        assert!(config.entries[0].pin.as_ref().unwrap().admits("1.2.3", "any"));
        assert!(!config.entries[0].pin.as_ref().unwrap().admits("1.2.4", "any"));
        assert_eq!(config.entries[2].pin, None);
    }

    #[test]
    fn malformed_pins_are_refused() {
        let err = parse_err(
            "providers:\n  - { name: a, plugin: x, pin: { version: 1.0.0, digest: 'sha256:00' } }\n",
        );
        assert!(err.contains("pin") && err.contains("exactly one"), "{err}");
        let err = parse_err("providers:\n  - { name: a, plugin: x, pin: {} }\n");
        assert!(err.contains("exactly one"), "{err}");
        let err =
            parse_err("providers:\n  - { name: a, plugin: x, pin: { digest: 'sha256:abc' } }\n");
        assert!(err.contains("pin.digest") && err.contains("64 hex digits"), "{err}");
        let err = parse_err("providers:\n  - { name: a, plugin: x, pin: { tag: latest } }\n");
        assert!(err.contains("unknown field `tag`"), "{err}");
    }

    #[test]
    fn libvirt_grants_parse_with_defaults() {
        let config = ProvidersConfig::parse(
            "providers:\n  - name: a\n    plugin: kvm\n    grants:\n      libvirt:\n        \
             - { host: KVM1.lan, user: pf, keyFile: /k, knownHostsFile: /kh, pools: [default] }\n        \
             - { host: kvm2.lan, port: 2222, user: pf, keyFile: /k, knownHostsFile: /kh, \
             pools: [a, b], socket: /run/l.sock, uri: 'test:///default', callTimeout: 5s }\n",
        )
        .unwrap();
        let grants = &config.entries[0].grants.libvirt;
        assert_eq!(grants[0].host, "kvm1.lan");
        assert_eq!((grants[0].port, grants[0].uri.as_str()), (22, DEFAULT_LIBVIRT_URI));
        assert_eq!(grants[0].socket, DEFAULT_LIBVIRT_SOCKET);
        assert_eq!(grants[1].call_timeout, Duration::from_secs(5));
        assert_eq!(grants[1].pools, ["a", "b"]);
        assert_eq!(grants[1].storage_uri, "test:///default", "storageUri defaults to uri");
    }

    #[test]
    fn a_libvirt_grant_may_send_storage_calls_to_another_driver() {
        let base = "providers:\n  - name: a\n    plugin: kvm\n    grants: { libvirt: [ \
                    { host: h, user: u, keyFile: /k, knownHostsFile: /kh, pools: [p], uri: 'test:///default', ";
        let config =
            ProvidersConfig::parse(&format!("{base}storageUri: 'storage:///system' }} ] }}\n"))
                .unwrap();
        let grant = &config.entries[0].grants.libvirt[0];
        assert_eq!(
            (grant.uri.as_str(), grant.storage_uri.as_str()),
            ("test:///default", "storage:///system")
        );
        let err = parse_err(&format!("{base}storageUri: 'storage+ssh://x/system' }} ] }}\n"));
        assert!(err.contains("grants.libvirt[0].storageUri"), "{err}");
    }

    #[test]
    fn libvirt_grants_need_known_hosts_and_name_their_field() {
        let base = "providers:\n  - name: a\n    plugin: kvm\n    grants: { libvirt: [ ";
        let err = parse_err(&format!("{base}{{ host: h, user: u, keyFile: /k }} ] }}\n"));
        assert!(
            err.contains("grants.libvirt[0].knownHostsFile") && err.contains("required"),
            "{err}"
        );
        let err = parse_err(&format!(
            "{base}{{ host: h, user: u, keyFile: /k, knownHostsFile: /kh, pools: [p], sokcet: /s }} ] }}\n"
        ));
        assert!(err.contains("unknown field `sokcet`"), "{err}");
        let err = parse_err(&format!(
            "{base}{{ host: h, user: u, keyFile: /k, knownHostsFile: /kh, pools: [p], uri: 'qemu+ssh://x/system' }} ] }}\n"
        ));
        assert!(err.contains("grants.libvirt[0].uri"), "{err}");
        let err = parse_err(&format!(
            "{base}{{ host: h, user: u, keyFile: /k, knownHostsFile: /kh, pools: [p] }}, \
             {{ host: H, user: u, keyFile: /k, knownHostsFile: /kh, pools: [p] }} ] }}\n"
        ));
        assert!(err.contains("grants.libvirt[1].host") && err.contains("twice"), "{err}");
    }

    #[test]
    fn libvirt_grants_name_their_storage_pools() {
        let base = "providers:\n  - name: a\n    plugin: kvm\n    grants: { libvirt: [ \
                    { host: h, user: u, keyFile: /k, knownHostsFile: /kh";
        let err = parse_err(&format!("{base} }} ] }}\n"));
        assert!(err.contains("grants.libvirt[0].pools") && err.contains("required"), "{err}");
        let err = parse_err(&format!("{base}, pools: [] }} ] }}\n"));
        assert!(err.contains("grants.libvirt[0].pools") && err.contains("required"), "{err}");
        let err = parse_err(&format!("{base}, pools: [default, '../etc'] }} ] }}\n"));
        assert!(err.contains("grants.libvirt[0].pools[1]"), "{err}");
        let err = parse_err(&format!("{base}, pools: [a, a] }} ] }}\n"));
        assert!(err.contains("grants.libvirt[0].pools[1]") && err.contains("twice"), "{err}");
        let err = parse_err(&format!("{base}, pools: [a], bridges: ['br0 up'] }} ] }}\n"));
        assert!(err.contains("grants.libvirt[0].bridges[0]"), "{err}");
        let config = ProvidersConfig::parse(&format!(
            "{base}, pools: [a], networks: [default], bridges: [br0] }} ] }}\n"
        ))
        .unwrap();
        let grant = &config.entries[0].grants.libvirt[0];
        assert_eq!(
            (grant.networks.as_slice(), grant.bridges.as_slice()),
            (&["default".to_owned()][..], &["br0".to_owned()][..])
        );
    }

    #[test]
    fn google_service_account_credentials_parse() {
        let config = ProvidersConfig::parse(
            "providers:\n  - name: gcp\n    plugin: gcp\n    grants:\n      http:\n        \
             - url: https://compute.googleapis.com\n          credential:\n            \
             kind: google-service-account\n            keyFile: /etc/proxyfleet/gcp-key.json\n            \
             scopes: [https://www.googleapis.com/auth/compute]\n",
        )
        .unwrap();
        let Some(Credential::GoogleServiceAccount(account)) =
            &config.entries[0].grants.http[0].credential
        else {
            panic!("a service-account credential")
        };
        assert_eq!(account.key, SecretSource::File("/etc/proxyfleet/gcp-key.json".into()));
        assert_eq!(account.scopes, ["https://www.googleapis.com/auth/compute"]);
    }

    #[test]
    fn a_credential_may_name_a_key_of_a_secret_instead_of_a_file() {
        let parse = |credential: &str| {
            ProvidersConfig::parse(&format!(
                "providers:\n  - name: pve\n    plugin: proxmox\n    grants:\n      http:\n        \
                 - url: https://pve.lan:8006\n          credential: {credential}\n"
            ))
        };
        let config =
            parse("{ header: Authorization, secretRef: { name: pve-token, key: token } }").unwrap();
        let Some(Credential::Header(header)) = &config.entries[0].grants.http[0].credential else {
            panic!("a header credential")
        };
        let at = proxyfleet_core::secret_store::SecretKeyRef {
            namespace: None,
            name: "pve-token".into(),
            key: "token".into(),
        };
        assert_eq!(header.secret, SecretSource::Ref(at));
        let account = parse(
            "{ kind: google-service-account, secretRef: { name: gcp, key: key.json }, \
             scopes: ['https://www.googleapis.com/auth/compute'] }",
        )
        .unwrap();
        let Some(Credential::GoogleServiceAccount(google)) =
            &account.entries[0].grants.http[0].credential
        else {
            panic!("a service-account credential")
        };
        assert!(matches!(&google.key, SecretSource::Ref(at) if at.key == "key.json"));
        // Each mistake names its key and the fix.
        for (credential, key, why) in [
            (
                "{ header: A, secretFile: /t, secretRef: { name: a, key: b } }",
                "credential.secretRef",
                "not both",
            ),
            ("{ header: A }", "credential.secretFile", "or give `secretRef`"),
            (
                "{ header: A, secretRef: { name: Pve_Token, key: t } }",
                "secretRef.name",
                "Secret name",
            ),
            ("{ header: A, secretRef: { name: pve, key: 'a/b' } }", "secretRef.key", "Secret key"),
            ("{ header: A, secretRef: { name: pve } }", "key", "missing field"),
            (
                "{ header: A, secretRef: { name: pve, key: t, namespace: x } }",
                "namespace",
                "unknown field",
            ),
            (
                "{ kind: google-metadata, secretRef: { name: a, key: b } }",
                "secretRef",
                "does not apply",
            ),
        ] {
            let err = parse(credential).unwrap_err().to_string();
            assert!(err.contains(key) && err.contains(why), "{credential}: {err}");
            // Regression: a message's continued line once kept its indent.
            assert!(!err.contains("  "), "{credential}: {err}");
        }
    }

    #[test]
    fn google_metadata_credentials_parse_with_their_defaults() {
        let parse = |credential: &str| {
            let config = ProvidersConfig::parse(&format!(
                "providers:\n  - name: gcp\n    plugin: gcp\n    grants: {{ http: [ {{ url: \
                 'https://compute.googleapis.com', credential: {credential} }} ] }}\n"
            ))
            .unwrap();
            match config.entries[0].grants.http[0].credential.clone() {
                Some(Credential::GoogleMetadata(google)) => google,
                other => panic!("a metadata credential: {other:?}"),
            }
        };
        let defaults = parse("{ kind: google-metadata }");
        assert_eq!(defaults.metadata_host, "metadata.google.internal");
        assert_eq!(defaults.service_account, "default");
        assert!(defaults.scopes.is_empty(), "the account's own scopes");
        let set = parse(
            "{ kind: google-metadata, metadataHost: '127.0.0.1:8080', serviceAccount: \
             fleet@proj.iam.gserviceaccount.com, scopes: [https://www.googleapis.com/auth/compute] }",
        );
        assert_eq!(set.metadata_host, "127.0.0.1:8080");
        assert_eq!(set.service_account, "fleet@proj.iam.gserviceaccount.com");
        assert_eq!(set.scopes, ["https://www.googleapis.com/auth/compute"]);
    }

    #[test]
    fn credential_keys_must_fit_their_kind() {
        let grant = |credential: &str| {
            parse_err(&format!(
                "providers:\n  - name: a\n    plugin: x\n    grants: {{ http: [ {{ url: 'https://h', credential: {credential} }} ] }}\n"
            ))
        };
        let err = grant(
            "{ kind: google-service-account, scopes: [https://www.googleapis.com/auth/compute] }",
        );
        assert!(
            err.contains("grants.http[0].credential.keyFile") && err.contains("required"),
            "{err}"
        );
        let err = grant("{ kind: google-service-account, keyFile: /k.json }");
        assert!(err.contains("credential.scopes") && err.contains("at least one"), "{err}");
        let err = grant("{ kind: google-service-account, keyFile: /k.json, scopes: [compute] }");
        assert!(err.contains("credential.scopes[0]"), "{err}");
        let err = grant(
            "{ kind: google-service-account, keyFile: /k.json, scopes: [https://x/y], secretFile: /s }",
        );
        assert!(err.contains("credential.secretFile") && err.contains("does not apply"), "{err}");
        let err = grant("{ header: Authorization, secretFile: /s, keyFile: /k.json }");
        assert!(err.contains("credential.keyFile") && err.contains("kind `header`"), "{err}");
        let err = grant("{ kind: aws-sigv4, keyFile: /k.json }");
        assert!(err.contains("credential.kind") && err.contains("google-service-account"), "{err}");
        let err = grant("{ kind: google-service-account, keyfile: /k.json }");
        assert!(err.contains("unknown field `keyfile`"), "{err}");
        let err = grant("{ secretFile: /s }");
        assert!(err.contains("credential.header") && err.contains("required"), "{err}");
        let err = grant("{ kind: google-metadata, keyFile: /k.json }");
        assert!(err.contains("credential.keyFile") && err.contains("google-metadata"), "{err}");
        for host in ["http://metadata.google.internal", "metadata/computeMetadata", "", "a@b"] {
            let err = grant(&format!("{{ kind: google-metadata, metadataHost: '{host}' }}"));
            assert!(
                err.contains("credential.metadataHost") && err.contains("host[:port]"),
                "{err}"
            );
        }
        for account in ["fleet", "../token", "a b@c.d"] {
            let err = grant(&format!("{{ kind: google-metadata, serviceAccount: '{account}' }}"));
            assert!(err.contains("credential.serviceAccount") && err.contains("default"), "{err}");
        }
        let err = grant("{ kind: google-metadata, scopes: ['https://a,https://b'] }");
        assert!(err.contains("credential.scopes[0]"), "{err}");
        let err = grant("{ header: Authorization, secretFile: /s, metadataHost: h }");
        assert!(err.contains("credential.metadataHost") && err.contains("kind `header`"), "{err}");
    }

    #[test]
    fn memory_cap_above_the_pool_is_refused() {
        let err =
            parse_err("providers:\n  - name: a\n    plugin: x\n    limits: { memoryMiB: 4096 }\n");
        assert!(err.contains("limits.memoryMiB") && err.contains("1 to 1024"), "{err}");
        let err = parse_err(
            "providers:\n  - name: a\n    plugin: x\n    limits: { httpRequestMiB: 0 }\n",
        );
        assert!(err.contains("limits.httpRequestMiB") && err.contains("1 to 1024"), "{err}");
        let err = parse_err(
            "providers:\n  - name: a\n    plugin: x\n    limits: { httpInFlight: 2, httpInFlightPerCall: 3 }\n",
        );
        assert!(
            err.contains("limits.httpInFlightPerCall")
                && err.contains("1 to limits.httpInFlight (2)"),
            "{err}"
        );
        let config = ProvidersConfig::parse(
            "providers:\n  - name: a\n    plugin: x\n    limits: { httpInFlight: 2 }\n",
        )
        .unwrap();
        assert_eq!(
            config.entries[0].limits.http_in_flight_per_call, 2,
            "the default shrinks to fit"
        );
    }

    #[test]
    fn more_calls_than_open_requests_warns_an_http_entry_only() {
        let entry = |grants: &str, limits: &str| {
            ProvidersConfig::parse(&format!(
                "providers:\n  - name: a\n    plugin: x\n    grants: {grants}\n    limits: {limits}\n"
            ))
            .unwrap()
            .entries
            .remove(0)
        };
        let http = "{ http: [ { url: 'https://h:443' } ] }";
        let warnings = entry(http, "{ concurrency: 64, mutations: 64 }").warnings();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].contains("limits.concurrency (64)")
                && warnings[0].contains("limits.httpInFlight (32)")
                && warnings[0].contains("raise httpInFlight"),
            "{warnings:?}"
        );
        let matched = "{ concurrency: 64, mutations: 64, httpInFlight: 64 }";
        assert!(entry(http, matched).warnings().is_empty());
        assert!(entry("{}", "{ concurrency: 64, mutations: 64 }").warnings().is_empty());
    }
}
