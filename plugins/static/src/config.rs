//! The entry config: the list of proxy endpoints that already exist.

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

/// Key of the lookup table holding how many endpoints are configured.
const COUNT_KEY: &str = "count";

/// Key of the ID of the endpoint at an index.
fn at_key(index: usize) -> String {
    format!("at/{index}")
}

/// Key under which a configured endpoint's ID is found.
fn id_key(id: &str) -> String {
    format!("id/{id}")
}

impl StaticConfig {
    /// The entry's lookup table: how many endpoints there are, the ID of
    /// the one at each index, and each ID, so that a create or a get
    /// reads the few endpoints it needs rather than the whole list.
    pub fn lookup_table(&self) -> Vec<(String, String)> {
        let mut table = Vec::with_capacity(1 + 2 * self.endpoints.len());
        table.push((COUNT_KEY.to_owned(), self.endpoints.len().to_string()));
        for (index, endpoint) in self.endpoints.iter().enumerate() {
            let id = endpoint.id();
            table.push((id_key(&id), String::new()));
            table.push((at_key(index), id));
        }
        table
    }
}

/// The endpoints as a create or a get reads them: one value of the
/// entry's lookup table at a time (see [`StaticConfig::lookup_table`]),
/// so that a call costs the same for ten endpoints or ten thousand.
pub struct Table<F> {
    lookup: F,
}

impl<F> fmt::Debug for Table<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Table").finish_non_exhaustive()
    }
}

impl<F: Fn(&str) -> Option<String>> Table<F> {
    /// Endpoints read through `lookup`, a key of the lookup table to its
    /// value.
    pub fn new(lookup: F) -> Self {
        Self { lookup }
    }

    fn missing(key: &str) -> ProviderError {
        ProviderError::Permanent(format!(
            "the entry's lookup table has no `{key}`: the operator did not keep the table \
             validate-config answered; reload the entry"
        ))
    }
}

impl<F: Fn(&str) -> Option<String>> Configured for Table<F> {
    fn count(&self) -> usize {
        (self.lookup)(COUNT_KEY).and_then(|count| count.parse().ok()).unwrap_or(0)
    }

    fn id_at(&self, index: usize) -> Result<String> {
        let key = at_key(index);
        (self.lookup)(&key).ok_or_else(|| Self::missing(&key))
    }

    fn endpoint(&self, id: &str) -> Option<Endpoint> {
        let endpoint = Endpoint::try_from(id.to_owned()).ok()?;
        (self.lookup)(&id_key(&endpoint.id())).map(|_| endpoint)
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

    /// The endpoints a config's lookup table serves.
    fn table(json: &str) -> Table<impl Fn(&str) -> Option<String>> {
        let table: HashMap<String, String> =
            StaticConfig::parse(json).expect("valid").lookup_table().into_iter().collect();
        Table::new(move |key: &str| table.get(key).cloned())
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
    fn a_call_reads_endpoints_from_the_table_as_the_full_parse_does() {
        let json =
            r#"{"endpoints": ["203.0.113.10:3128", "Proxy.Example:80", "[2001:DB8::1]:8080"]}"#;
        let full = StaticConfig::parse(json).expect("valid");
        let read = table(json);
        assert_eq!(read.count(), full.count());
        for index in 0..full.count() {
            assert_eq!(read.id_at(index).expect("an ID"), full.id_at(index).expect("an ID"));
        }
        for id in ["203.0.113.10:3128", "proxy.example:80", "[2001:db8::1]:8080", "10.0.0.1:1"] {
            assert_eq!(read.endpoint(id), full.endpoint(id), "{id}");
        }
        assert!(read.endpoint("Proxy.Example:80").is_some(), "an ID in another spelling");
        assert!(matches!(read.id_at(3), Err(ProviderError::Permanent(_))), "past the end");
    }

    #[test]
    fn the_lookup_table_stays_within_what_the_host_keeps() {
        // The host keeps four times the config's size (plus 64 KiB).
        let endpoints: Vec<String> = (0..10_000)
            .map(|i| format!("10.{}.{}.{}:3128", i / 65536, i / 256 % 256, i % 256))
            .collect();
        let json = serde_json::json!({ "endpoints": endpoints }).to_string();
        let table = StaticConfig::parse(&json).expect("valid").lookup_table();
        let bytes: usize = table.iter().map(|(key, value)| key.len() + value.len()).sum();
        assert!(bytes < 4 * json.len(), "{bytes} bytes of table for {} of config", json.len());
    }

    #[test]
    fn an_empty_table_is_no_endpoints() {
        let none = Table::new(|_: &str| None);
        assert_eq!(none.count(), 0);
        assert_eq!(none.endpoint("203.0.113.10:3128"), None);
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
