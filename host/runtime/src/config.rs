//! The providers file: which entries exist, which plugin serves each, what
//! it may reach and how much it may use.
//!
//! Parsed in two steps: serde into `Raw*` structs that reject unknown keys,
//! then validation into typed config whose errors name the entry and key.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::HeaderName;
use ipnet::IpNet;
use proxyfleet_core::HttpDestination;
use serde::Deserialize;

use crate::error::ConfigError;

/// Largest memory cap an entry may ask for; the engine's pool is sized for it.
pub const MAX_MEMORY_MIB: u64 = 1024;

/// Every provider entry, validated.
#[derive(Debug, Clone)]
pub struct ProvidersConfig {
    /// Entries in file order; names are unique.
    pub entries: Vec<EntryConfig>,
}

/// One provider entry.
#[derive(Debug, Clone)]
pub struct EntryConfig {
    /// DNS-1123 label, unique in the file.
    pub name: String,
    /// Name of the plugin file (without `.wasm`) in the plugin directory.
    pub plugin: String,
    /// The config handed to the plugin, as JSON.
    pub config: serde_json::Value,
    /// What the plugin may reach.
    pub grants: Grants,
    /// What the plugin may use.
    pub limits: Limits,
    /// The only build of the plugin this entry accepts, if any.
    pub pin: Option<Pin>,
}

/// Restricts an entry to one build of its plugin: a file that is another
/// build is not activated for the entry, at load or on a swap.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Pin {
    /// The version the plugin's `describe` reports, compared exactly.
    Version(String),
    /// The sha256 of the component file, 64 lower-case hex digits.
    Digest(String),
}

impl Pin {
    /// Whether a build with this version and file digest satisfies the pin.
    pub fn admits(&self, version: &str, digest: &str) -> bool {
        match self {
            Self::Version(pinned) => pinned == version,
            Self::Digest(pinned) => pinned.eq_ignore_ascii_case(digest),
        }
    }
}

impl std::fmt::Display for Pin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Version(version) => write!(f, "version {version}"),
            Self::Digest(digest) => write!(f, "digest sha256:{digest}"),
        }
    }
}

/// Capabilities granted to an entry. Everything not named is refused.
#[derive(Debug, Clone, Default)]
pub struct Grants {
    /// HTTP destinations the plugin may reach.
    pub http: Vec<HttpGrant>,
    /// Extra CA certificates (PEM) trusted for this entry's HTTPS requests.
    pub ca_file: Option<PathBuf>,
}

/// One HTTP destination and what comes with it.
#[derive(Debug, Clone)]
pub struct HttpGrant {
    /// Scheme, host and port the plugin may send to.
    pub destination: HttpDestination,
    /// Address ranges that would otherwise be refused (loopback, private,
    /// link-local, metadata) that this destination may resolve to.
    pub allow_addresses: Vec<IpNet>,
    /// A credential the host adds to every request to this destination.
    pub credential: Option<Credential>,
}

/// A header the host injects, built from a secret file read on every request.
#[derive(Debug, Clone)]
pub struct Credential {
    /// Header name, e.g. `authorization`.
    pub header: HeaderName,
    /// Header value with `{secret}` where the file's content goes.
    pub value_template: String,
    /// File holding the secret; trailing newlines are dropped.
    pub secret_file: PathBuf,
}

/// Resource limits of an entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Wall-clock budget of one provider call.
    pub call_timeout: Duration,
    /// Linear memory a plugin instance may grow to, in bytes.
    pub memory_bytes: usize,
    /// Provider calls of this entry that may run at once.
    pub concurrency: usize,
    /// Of those, creates and deletes that may run at once: backends lock
    /// shared resources (a Proxmox storage, a quota) on these, and a storm
    /// of them only produces lock timeouts.
    pub mutations: usize,
    /// Largest HTTP response body the plugin may receive, in bytes.
    pub http_response_bytes: u64,
    /// Budget to connect to an HTTP destination.
    pub http_connect_timeout: Duration,
    /// Budget from sending a request to its response headers.
    pub http_first_byte_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            call_timeout: Duration::from_secs(60),
            memory_bytes: 64 << 20,
            concurrency: 8,
            mutations: 2,
            http_response_bytes: 16 << 20,
            http_connect_timeout: Duration::from_secs(10),
            http_first_byte_timeout: Duration::from_secs(30),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    providers: Vec<RawEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEntry {
    name: String,
    plugin: String,
    #[serde(default)]
    config: Option<serde_yaml::Value>,
    #[serde(default)]
    grants: RawGrants,
    #[serde(default)]
    limits: RawLimits,
    pin: Option<RawPin>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPin {
    version: Option<String>,
    digest: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawGrants {
    #[serde(default)]
    http: Vec<RawHttpGrant>,
    ca_file: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawHttpGrant {
    url: String,
    #[serde(default)]
    allow_addresses: Vec<String>,
    credential: Option<RawCredential>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawCredential {
    header: String,
    value_template: Option<String>,
    secret_file: PathBuf,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawLimits {
    timeout: Option<String>,
    #[serde(rename = "memoryMiB")]
    memory_mib: Option<u64>,
    concurrency: Option<usize>,
    mutations: Option<usize>,
    #[serde(rename = "httpResponseMiB")]
    http_response_mib: Option<u64>,
    http_connect_timeout: Option<String>,
    http_first_byte_timeout: Option<String>,
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
        let raw: RawFile = serde_yaml::from_str(text)
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
        Ok(Self { entries })
    }
}

fn validate_entry(index: usize, raw: RawEntry) -> Result<EntryConfig, ConfigError> {
    let at = format!("providers[{index}]");
    check_dns_label(&raw.name).map_err(|why| ConfigError::invalid(&at, "name", why))?;
    let at = format!("provider entry {:?}", raw.name);
    check_dns_label(&raw.plugin).map_err(|why| ConfigError::invalid(&at, "plugin", why))?;
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
    let grants = Grants { http, ca_file: raw.grants.ca_file };
    let limits = validate_limits(&at, raw.limits)?;
    let pin = raw.pin.map(|pin| validate_pin(&at, pin)).transpose()?;
    Ok(EntryConfig { name: raw.name, plugin: raw.plugin, config, grants, limits, pin })
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

fn validate_http_grant(at: &str, i: usize, raw: RawHttpGrant) -> Result<HttpGrant, ConfigError> {
    let key = |field: &str| format!("grants.http[{i}].{field}");
    let uri: http::Uri = raw.url.parse().map_err(|err| {
        ConfigError::invalid(at, key("url"), format!("{:?} is not a URL: {err}", raw.url))
    })?;
    let scheme = match uri.scheme_str() {
        Some(s @ ("http" | "https")) => s.to_owned(),
        _ => {
            return Err(ConfigError::invalid(
                at,
                key("url"),
                format!("{:?} must start with https:// or http://", raw.url),
            ));
        }
    };
    let host = uri.host().unwrap_or_default().trim_matches(['[', ']']).to_ascii_lowercase();
    if host.is_empty() || host.contains('*') {
        return Err(ConfigError::invalid(
            at,
            key("url"),
            format!("{:?} must name one host; wildcards are not accepted", raw.url),
        ));
    }
    if uri.path_and_query().is_some_and(|p| p.as_str() != "/" && !p.as_str().is_empty()) {
        return Err(ConfigError::invalid(
            at,
            key("url"),
            format!("{:?}: a grant is scheme, host and port only; drop the path", raw.url),
        ));
    }
    let destination = HttpDestination { scheme, host, port: uri.port_u16() };
    let mut allow_addresses = Vec::with_capacity(raw.allow_addresses.len());
    for (j, text) in raw.allow_addresses.iter().enumerate() {
        let net = text
            .parse::<IpNet>()
            .or_else(|_| text.parse::<std::net::IpAddr>().map(IpNet::from))
            .map_err(|_| {
                ConfigError::invalid(
                    at,
                    key(&format!("allowAddresses[{j}]")),
                    format!("{text:?} is neither an IP address nor a CIDR range like 10.0.0.0/8"),
                )
            })?;
        allow_addresses.push(net);
    }
    let credential = raw
        .credential
        .map(|c| {
            let header = HeaderName::try_from(c.header.as_str()).map_err(|_| {
                ConfigError::invalid(
                    at,
                    key("credential.header"),
                    format!("{:?} is not a valid header name", c.header),
                )
            })?;
            let value_template = c.value_template.unwrap_or_else(|| "{secret}".to_owned());
            if !value_template.contains("{secret}") {
                return Err(ConfigError::invalid(
                    at,
                    key("credential.valueTemplate"),
                    "must contain {secret} where the secret file's content goes",
                ));
            }
            Ok(Credential { header, value_template, secret_file: c.secret_file })
        })
        .transpose()?;
    Ok(HttpGrant { destination, allow_addresses, credential })
}

fn validate_limits(at: &str, raw: RawLimits) -> Result<Limits, ConfigError> {
    let defaults = Limits::default();
    let duration = |field: &str, text: Option<String>, default: Duration| match text {
        None => Ok(default),
        Some(text) => match humantime::parse_duration(&text) {
            Ok(d) if !d.is_zero() => Ok(d),
            _ => Err(ConfigError::invalid(
                at,
                format!("limits.{field}"),
                format!("{text:?} is not a positive duration such as \"30s\" or \"2m\""),
            )),
        },
    };
    let memory_mib = raw.memory_mib.unwrap_or((defaults.memory_bytes >> 20) as u64);
    if !(1..=MAX_MEMORY_MIB).contains(&memory_mib) {
        return Err(ConfigError::invalid(
            at,
            "limits.memoryMiB",
            format!("{memory_mib} is out of range; use 1 to {MAX_MEMORY_MIB}"),
        ));
    }
    let concurrency = raw.concurrency.unwrap_or(defaults.concurrency);
    if !(1..=1024).contains(&concurrency) {
        return Err(ConfigError::invalid(
            at,
            "limits.concurrency",
            format!("{concurrency} is out of range; use 1 to 1024"),
        ));
    }
    let mutations = raw.mutations.unwrap_or(defaults.mutations.min(concurrency));
    if !(1..=concurrency).contains(&mutations) {
        return Err(ConfigError::invalid(
            at,
            "limits.mutations",
            format!("{mutations} is out of range; use 1 to limits.concurrency ({concurrency})"),
        ));
    }
    let http_response_mib = raw.http_response_mib.unwrap_or(defaults.http_response_bytes >> 20);
    if !(1..=1024).contains(&http_response_mib) {
        return Err(ConfigError::invalid(
            at,
            "limits.httpResponseMiB",
            format!("{http_response_mib} is out of range; use 1 to 1024"),
        ));
    }
    Ok(Limits {
        call_timeout: duration("timeout", raw.timeout, defaults.call_timeout)?,
        memory_bytes: usize::try_from(memory_mib << 20).unwrap_or(usize::MAX),
        concurrency,
        mutations,
        http_response_bytes: http_response_mib << 20,
        http_connect_timeout: duration(
            "httpConnectTimeout",
            raw.http_connect_timeout,
            defaults.http_connect_timeout,
        )?,
        http_first_byte_timeout: duration(
            "httpFirstByteTimeout",
            raw.http_first_byte_timeout,
            defaults.http_first_byte_timeout,
        )?,
    })
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
    use super::*;

    fn parse_err(yaml: &str) -> String {
        ProvidersConfig::parse(yaml).unwrap_err().to_string()
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
        assert_eq!(grant.credential.as_ref().unwrap().header, "authorization");
        assert_eq!(entry.limits.call_timeout, Duration::from_secs(90));
        assert_eq!(entry.limits.memory_bytes, 128 << 20);
        assert_eq!(entry.limits.concurrency, 2);
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
    fn memory_cap_above_the_pool_is_refused() {
        let err =
            parse_err("providers:\n  - name: a\n    plugin: x\n    limits: { memoryMiB: 4096 }\n");
        assert!(err.contains("limits.memoryMiB") && err.contains("1 to 1024"), "{err}");
    }
}
