//! The entry config: the list of proxy endpoints that already exist.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};

use proxyfleet_sdk::{ProviderError, Result};
use serde::Deserialize;

/// JSON schema of [`StaticConfig`], reported by `describe`: derived from
/// the struct that parses the config, so the two cannot drift.
pub fn config_schema() -> String {
    serde_json::to_string(&schemars::schema_for!(StaticConfig)).unwrap_or_default()
}

/// The static provider's entry config:
/// `{"endpoints": ["203.0.113.10:3128", ...]}`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "static provider entry")]
pub struct StaticConfig {
    /// Existing proxies to hand out, one Proxy each: host:port, with IPv6
    /// addresses in brackets.
    #[schemars(
        with = "Vec<String>",
        inner(length(min = 1)),
        extend("examples" = [["203.0.113.10:3128", "[2001:db8::1]:8080", "proxy-1.example.net:3128"]])
    )]
    pub endpoints: Vec<Endpoint>,
    /// Where each endpoint is in `endpoints`, made by [`StaticConfig::parse`]:
    /// a lookup by ID costs the same for ten endpoints or ten thousand.
    #[serde(skip)]
    index: HashMap<Endpoint, usize>,
}

impl StaticConfig {
    /// Parses and checks an entry config; errors name the key, e.g.
    /// `endpoints[3]`.
    pub fn parse(json: &str) -> Result<Self> {
        let mut config: Self = proxyfleet_sdk::parse_config(json)?;
        config.index.reserve(config.endpoints.len());
        for (index, endpoint) in config.endpoints.iter().enumerate() {
            if let Some(first) = config.index.insert(endpoint.clone(), index) {
                return Err(ProviderError::InvalidConfig(format!(
                    "config key `endpoints[{index}]`: {endpoint} repeats endpoints[{first}]"
                )));
            }
        }
        Ok(config)
    }

    /// The configured endpoint whose ID (`host:port`) is `id`.
    pub fn find(&self, id: &str) -> Option<&Endpoint> {
        let endpoint = Endpoint::try_from(id.to_owned()).ok()?;
        self.index.get(&endpoint).map(|&index| &self.endpoints[index])
    }

    /// Whether `id` (an endpoint in its `host:port` form) is configured.
    pub fn contains(&self, id: &str) -> bool {
        self.find(id).is_some()
    }
}

/// What assignment needs of an entry's endpoints: how many, the ID of the
/// one at an index, and the configured endpoint with an ID.
pub trait Configured {
    /// How many endpoints are configured.
    fn count(&self) -> usize;
    /// The ID of the endpoint at `index` (below [`Configured::count`]).
    fn id_at(&self, index: usize) -> Result<String>;
    /// The configured endpoint whose ID (`host:port`) is `id`.
    fn endpoint(&self, id: &str) -> Option<Endpoint>;
}

impl Configured for StaticConfig {
    fn count(&self) -> usize {
        self.endpoints.len()
    }

    fn id_at(&self, index: usize) -> Result<String> {
        Ok(self.endpoints[index].id())
    }

    fn endpoint(&self, id: &str) -> Option<Endpoint> {
        self.find(id).cloned()
    }
}

/// The endpoints as one create or get reads them: the config's strings,
/// borrowed from it and parsed one at a time when needed. The config was
/// checked whole ([`StaticConfig::parse`]) when the entry was admitted, so
/// a call costs one scan of the JSON, not a parse of every endpoint and an
/// index of them all: an entry of 10,000 endpoints makes every call pay
/// for 10,000 otherwise.
#[derive(Debug)]
pub struct Endpoints<'a> {
    raw: Vec<Cow<'a, str>>,
}

/// The config's shape as [`Endpoints`] reads it.
#[derive(Deserialize)]
struct RawEndpoints<'a> {
    #[serde(borrow)]
    endpoints: Vec<Cow<'a, str>>,
}

impl<'a> Endpoints<'a> {
    /// Reads the endpoint strings of a config `parse` accepted.
    pub fn read(json: &'a str) -> Result<Self> {
        let raw: RawEndpoints<'a> = serde_json::from_str(json)
            .map_err(|error| ProviderError::InvalidConfig(format!("config: {error}")))?;
        Ok(Self { raw: raw.endpoints })
    }

    fn parse_at(&self, index: usize) -> Result<Endpoint> {
        Endpoint::try_from(self.raw[index].to_string()).map_err(|message| {
            ProviderError::InvalidConfig(format!("config key `endpoints[{index}]`: {message}"))
        })
    }
}

impl Configured for Endpoints<'_> {
    fn count(&self) -> usize {
        self.raw.len()
    }

    fn id_at(&self, index: usize) -> Result<String> {
        self.parse_at(index).map(|endpoint| endpoint.id())
    }

    fn endpoint(&self, id: &str) -> Option<Endpoint> {
        // An endpoint written as its ID is found by comparing text; only an
        // ID written otherwise (`Proxy.Example:80`), or not configured at
        // all, costs a parse of every endpoint.
        if let Some(index) = self.raw.iter().position(|raw| raw.trim() == id) {
            return self.parse_at(index).ok();
        }
        let wanted = Endpoint::try_from(id.to_owned()).ok()?;
        (0..self.raw.len()).filter_map(|index| self.parse_at(index).ok()).find(|e| *e == wanted)
    }
}

/// The one endpoint a get asks about, found in the config's text where it
/// is written as its ID (`"203.0.113.10:3128"`): a search of the text,
/// without the parse that [`Endpoints::read`] makes of every endpoint's
/// string. The config's only string values are the endpoints (it has one
/// key, and validate-config refused anything else), so the quoted ID found
/// in it is one of them. An endpoint written otherwise is not found here;
/// the caller reads the endpoints then.
#[derive(Debug)]
pub struct WrittenAsId(Endpoint);

impl WrittenAsId {
    /// Endpoint `id`, when `json` holds it as its ID.
    pub fn find(json: &str, id: &str) -> Option<Self> {
        let endpoint = Endpoint::try_from(id.to_owned()).ok()?;
        if endpoint.id() != id || !json.contains(&format!("\"{id}\"")) {
            return None;
        }
        Some(Self(endpoint))
    }
}

impl Configured for WrittenAsId {
    fn count(&self) -> usize {
        1
    }

    fn id_at(&self, _index: usize) -> Result<String> {
        Ok(self.0.id())
    }

    fn endpoint(&self, id: &str) -> Option<Endpoint> {
        (self.0.id() == id).then(|| self.0.clone())
    }
}

/// One proxy endpoint, `host:port`. Its canonical text ([`Endpoint::id`]) is
/// the instance's provider ID and the key of its assignment, so equal
/// endpoints written differently (`[2001:DB8::1]:80` and `[2001:db8::1]:80`,
/// `Proxy.example:80` and `proxy.example:80`) are the same endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize)]
#[serde(try_from = "String")]
pub struct Endpoint {
    /// An IP address (without brackets) or a DNS name, lowercase.
    host: String,
    port: u16,
}

impl Endpoint {
    /// The address a client connects to: the IP or host name.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The proxy port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Canonical `host:port`, IPv6 in brackets.
    pub fn id(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

impl TryFrom<String> for Endpoint {
    type Error = String;

    fn try_from(text: String) -> std::result::Result<Self, String> {
        let text = text.trim();
        if text.is_empty() {
            return Err("an endpoint must not be empty".to_owned());
        }
        if let Ok(address) = text.parse::<SocketAddr>() {
            return nonzero_port(address.ip().to_string(), address.port(), text);
        }
        let (host, port) = text
            .rsplit_once(':')
            .ok_or_else(|| format!("`{text}` is not host:port (IPv6 addresses go in brackets)"))?;
        let port: u16 =
            port.parse().map_err(|_| format!("`{text}` has an invalid port `{port}`"))?;
        if host.parse::<IpAddr>().is_ok() || host.starts_with('[') {
            return Err(format!("`{text}` is not a valid socket address"));
        }
        if !is_dns_name(host) {
            return Err(format!(
                "`{text}` does not start with an IP address or a DNS name (IPv6 addresses go in brackets)"
            ));
        }
        nonzero_port(host.to_ascii_lowercase(), port, text)
    }
}

fn nonzero_port(host: String, port: u16, text: &str) -> std::result::Result<Endpoint, String> {
    if port == 0 {
        return Err(format!("`{text}` has port 0"));
    }
    Ok(Endpoint { host, port })
}

/// Letters, digits and `-` in dot-separated labels of 1-63 characters that
/// neither start nor end with `-`; at most 253 characters, optional final dot
/// not allowed (it would make two spellings of one endpoint).
fn is_dns_name(host: &str) -> bool {
    host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(text: &str) -> std::result::Result<Endpoint, String> {
        Endpoint::try_from(text.to_owned())
    }

    #[test]
    fn a_get_finds_an_endpoint_written_as_its_id_without_reading_the_rest() {
        let json = r#"{"endpoints": ["203.0.113.10:3128", " 203.0.113.11:3128", "Proxy.Example:80", "[2001:db8::1]:80"]}"#;
        let found = WrittenAsId::find(json, "203.0.113.10:3128").expect("written as its ID");
        assert_eq!(found.endpoint("203.0.113.10:3128"), endpoint("203.0.113.10:3128").ok());
        assert_eq!(found.endpoint("203.0.113.11:3128"), None);
        assert!(WrittenAsId::find(json, "[2001:db8::1]:80").is_some());
        // Written otherwise, or a part of another: left to the full read.
        assert!(WrittenAsId::find(json, "203.0.113.11:3128").is_none(), "spaces around it");
        assert!(WrittenAsId::find(json, "proxy.example:80").is_none(), "other case");
        assert!(WrittenAsId::find(json, "13.10:3128").is_none(), "a tail of another");
        assert!(WrittenAsId::find(json, "203.0.113.99:3128").is_none(), "not configured");
        // Each of those, read in full, is found or refused as before.
        let read = Endpoints::read(json).expect("the config reads");
        assert!(read.endpoint("203.0.113.11:3128").is_some());
        assert!(read.endpoint("proxy.example:80").is_some());
        assert!(read.endpoint("203.0.113.99:3128").is_none());
    }

    fn config_error(json: &str) -> String {
        match StaticConfig::parse(json) {
            Err(ProviderError::InvalidConfig(message)) => message,
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
    }

    #[test]
    fn accepts_addresses_and_names() {
        let v4 = endpoint("203.0.113.10:3128").expect("valid");
        assert_eq!(
            (v4.host(), v4.port(), v4.id().as_str()),
            ("203.0.113.10", 3128, "203.0.113.10:3128")
        );
        let v6 = endpoint("[2001:DB8::1]:8080").expect("valid");
        assert_eq!((v6.host(), v6.id().as_str()), ("2001:db8::1", "[2001:db8::1]:8080"));
        let name = endpoint(" Proxy-1.Example.net:3128 ").expect("valid");
        assert_eq!(name.id(), "proxy-1.example.net:3128");
    }

    #[test]
    fn rejects_what_is_not_host_port() {
        for text in [
            "",
            "   ",
            "203.0.113.10",
            "2001:db8::1:8080",
            "[2001:db8::1]",
            "203.0.113.10:70000",
            "203.0.113.10:0",
            "host:http",
            "-bad.example:80",
            "under_score.example:80",
            "a..b:80",
            ":80",
            "http://proxy:3128",
        ] {
            assert!(endpoint(text).is_err(), "`{text}` accepted");
        }
    }

    #[test]
    fn config_errors_name_the_key() {
        let message = config_error(r#"{"endpoints": ["a:1", "b:2", "c:3", "nope"]}"#);
        assert!(
            message.starts_with("config key `endpoints[3]`: `nope` is not host:port"),
            "{message}"
        );
        let message = config_error(r#"{"endpoints": ["a:1", ""]}"#);
        assert_eq!(message, "config key `endpoints[1]`: an endpoint must not be empty");
        let message = config_error(r#"{"endpoints": ["a:1", 5]}"#);
        assert!(message.starts_with("config key `endpoints[1]`: invalid type"), "{message}");
        let message = config_error(r#"{"endpoints": [], "extra": true}"#);
        assert!(message.starts_with("config key `extra`: unknown field `extra`"), "{message}");
        let message = config_error("{}");
        assert_eq!(message, "config: missing field `endpoints`");
    }

    #[test]
    fn duplicates_are_refused() {
        let message = config_error(r#"{"endpoints": ["A.example:1", "b:2", "a.example:1"]}"#);
        assert_eq!(message, "config key `endpoints[2]`: a.example:1 repeats endpoints[0]");
    }

    #[test]
    fn empty_lists_are_valid_config() {
        let config = StaticConfig::parse(r#"{"endpoints": []}"#).expect("valid");
        assert!(config.endpoints.is_empty());
    }

    #[test]
    fn a_call_reads_endpoints_as_the_full_parse_does() {
        let json =
            r#"{"endpoints": ["203.0.113.10:3128", "Proxy.Example:80", "[2001:DB8::1]:8080"]}"#;
        let full = StaticConfig::parse(json).expect("valid");
        let read = Endpoints::read(json).expect("readable");
        assert_eq!(read.count(), full.count());
        for index in 0..full.count() {
            assert_eq!(read.id_at(index).expect("an ID"), full.id_at(index).expect("an ID"));
        }
        for id in ["203.0.113.10:3128", "proxy.example:80", "[2001:db8::1]:8080", "10.0.0.1:1"] {
            assert_eq!(read.endpoint(id), full.endpoint(id), "{id}");
        }
        assert!(read.endpoint("proxy.example:80").is_some(), "found though written otherwise");
    }

    /// The schema is the struct's: its keys, its refusal of others, and
    /// the field's documentation.
    #[test]
    fn the_schema_is_derived_from_the_config_struct() {
        let schema: serde_json::Value =
            serde_json::from_str(&config_schema()).expect("schema parses");
        assert_eq!(schema["title"], "static provider entry");
        assert_eq!(schema["required"], serde_json::json!(["endpoints"]));
        assert_eq!(schema["additionalProperties"], false);
        let properties: Vec<&String> =
            schema["properties"].as_object().expect("properties").keys().collect();
        assert_eq!(properties, ["endpoints"], "the index is not config");
        let endpoints = &schema["properties"]["endpoints"];
        assert_eq!(endpoints["type"], "array");
        assert_eq!(endpoints["items"]["type"], "string");
        assert_eq!(endpoints["items"]["minLength"], 1);
        assert!(endpoints["description"].as_str().expect("documented").contains("host:port"));
    }
}
