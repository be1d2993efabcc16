//! The entry config. Credentials are not part of it: the operator injects
//! them into requests to the endpoint from the entry's grant.

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
    /// The API's base URL: scheme, host and port, e.g. https://api.example;
    /// the entry's grants must name it.
    pub endpoint: String,
    /// Prefix of instance names.
    #[serde(default = "default_prefix")]
    pub name_prefix: String,
}

fn default_prefix() -> String {
    "pf".to_owned()
}

impl Config {
    /// Parses and checks an entry config; errors name the key.
    pub fn parse(json: &str) -> Result<Self> {
        let config: Self = proxyfleet_sdk::parse_config(json)?;
        let rest = config
            .endpoint
            .strip_prefix("https://")
            .or_else(|| config.endpoint.strip_prefix("http://"));
        let Some(authority) = rest.map(|rest| rest.trim_end_matches('/')) else {
            return Err(invalid("endpoint", "must start with https:// or http://"));
        };
        if authority.is_empty() || authority.contains(['/', '?', '#', '@']) {
            return Err(invalid(
                "endpoint",
                "give scheme, host and port only, e.g. https://api.example",
            ));
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

    /// The endpoint without a trailing slash.
    pub fn base(&self) -> &str {
        self.endpoint.trim_end_matches('/')
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
        assert!(message(r#"{"endpoint":"ftp://x"}"#).contains("`endpoint`"));
        assert!(message(r#"{"endpoint":"https://x/api"}"#).contains("`endpoint`"));
        assert!(message(r#"{"endpoint":"https://x","namePrefix":"9"}"#).contains("`namePrefix`"));
        assert!(message(r#"{"endpoint":"https://x","endpiont":"y"}"#).contains("endpiont"));
    }
}
