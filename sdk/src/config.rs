//! Parsing an entry's JSON config into the provider's own type, with errors
//! that name the offending key.

use serde::de::DeserializeOwned;

use crate::ProviderError;

/// Parses the entry config `json` into `T`.
///
/// On failure returns [`ProviderError::InvalidConfig`] whose message names
/// the key path (`endpoints[3]`, `auth.token`) and what was wrong with it,
/// so that a person can fix the entry without reading the plugin's source.
/// String values quoted in serde's messages (`invalid type: string "…"`) are
/// left out, since a misplaced value may be a credential.
///
/// ```
/// use proxyfleet_sdk::{ProviderError, parse_config};
///
/// #[derive(serde::Deserialize)]
/// #[serde(deny_unknown_fields)]
/// struct Config {
///     endpoint: String,
///     port: u16,
/// }
///
/// let config: Config = parse_config(r#"{"endpoint":"pve.example","port":8006}"#)?;
/// assert_eq!((config.endpoint.as_str(), config.port), ("pve.example", 8006));
///
/// let error = parse_config::<Config>(r#"{"endpoint":"pve.example","port":"8006"}"#);
/// assert!(matches!(error, Err(ProviderError::InvalidConfig(m)) if m.starts_with("config key `port`")));
/// # Ok::<(), ProviderError>(())
/// ```
pub fn parse_config<T: DeserializeOwned>(json: &str) -> Result<T, ProviderError> {
    let deserializer = &mut serde_json::Deserializer::from_str(json);
    let parsed: T = serde_path_to_error::deserialize(&mut *deserializer).map_err(|error| {
        let path = error.path().to_string();
        invalid_config(&path, error.inner())
    })?;
    // Trailing characters after the document are an error too.
    deserializer.end().map_err(|error| invalid_config(".", &error))?;
    Ok(parsed)
}

fn invalid_config(path: &str, error: &serde_json::Error) -> ProviderError {
    let what = describe(error);
    // serde_path_to_error renders the root as ".".
    if path == "." || path.is_empty() {
        ProviderError::InvalidConfig(format!("config: {what}"))
    } else {
        ProviderError::InvalidConfig(format!("config key `{path}`: {what}"))
    }
}

/// serde_json's message, with the position only for syntax errors: for a
/// wrong value the key path already says where, and a column number into a
/// one-line JSON document helps nobody.
fn describe(error: &serde_json::Error) -> String {
    use serde_json::error::Category;
    let message = error.to_string();
    match error.classify() {
        Category::Data => {
            let without_position = match message.rfind(" at line ") {
                Some(position) => &message[..position],
                None => &message,
            };
            redact_quoted_strings(without_position)
        }
        Category::Io | Category::Syntax | Category::Eof => message,
    }
}

/// Replaces every `string "…"` (serde's rendering of an unexpected string
/// value, Debug-escaped) with `a string`.
fn redact_quoted_strings(message: &str) -> String {
    const MARKER: &str = "string \"";
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(start) = rest.find(MARKER) {
        out.push_str(&rest[..start]);
        out.push_str("a string");
        let quoted = &rest[start + MARKER.len()..];
        // Debug escaping turns a quote inside the value into `\"`, so the
        // first quote not preceded by a backslash closes it.
        let mut escaped = false;
        let mut end = quoted.len();
        for (index, character) in quoted.char_indices() {
            match character {
                '\\' if !escaped => escaped = true,
                '"' if !escaped => {
                    end = index + 1;
                    break;
                }
                _ => escaped = false,
            }
        }
        rest = &quoted[end..];
    }
    out.push_str(rest);
    out
}

/// The entry's config as JSON, from the host: `config::json`.
pub(crate) fn json() -> String {
    #[cfg(target_arch = "wasm32")]
    return crate::bindings::proxyfleet::provider::config::json();
    #[cfg(not(target_arch = "wasm32"))]
    return crate::native::host(|host| host.config_json());
}

/// One value of the entry's lookup table, from the host: `config::lookup`.
pub(crate) fn lookup(key: &str) -> Option<String> {
    #[cfg(target_arch = "wasm32")]
    return crate::bindings::proxyfleet::provider::config::lookup(key);
    #[cfg(not(target_arch = "wasm32"))]
    return crate::native::host(|host| host.config_lookup(key));
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Config {
        endpoints: Vec<Port>,
        #[serde(default)]
        auth: Option<Auth>,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Auth {
        token: String,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(try_from = "String")]
    struct Port(u16);

    impl TryFrom<String> for Port {
        type Error = String;
        fn try_from(value: String) -> Result<Self, String> {
            value.parse().map(Port).map_err(|_| "expected a port number".to_owned())
        }
    }

    fn message(result: Result<Config, ProviderError>) -> String {
        match result {
            Err(ProviderError::InvalidConfig(message)) => message,
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
    }

    #[test]
    fn parses_valid_config() {
        let config: Config = parse_config(r#"{"endpoints":["80"],"auth":{"token":"t"}}"#)
            .expect("valid config parses");
        assert_eq!(config.endpoints, vec![Port(80)]);
        assert_eq!(config.auth, Some(Auth { token: "t".into() }));
    }

    #[test]
    fn names_the_element_that_failed() {
        let text = message(parse_config(r#"{"endpoints":["80","81","82","x"]}"#));
        assert_eq!(text, "config key `endpoints[3]`: expected a port number");
    }

    #[test]
    fn names_nested_unknown_keys() {
        let text = message(parse_config(r#"{"endpoints":[],"auth":{"tokn":"secret"}}"#));
        assert!(text.starts_with("config key `auth.tokn`: unknown field `tokn`"), "{text}");
        assert!(!text.contains("secret"), "{text}");
    }

    #[test]
    fn leaves_string_values_out() {
        let text = message(parse_config(r#"{"endpoints":[],"auth":"hunter\"2"}"#));
        assert_eq!(text, "config key `auth`: invalid type: a string, expected struct Auth");
    }

    #[test]
    fn reports_missing_fields_at_the_root() {
        let text = message(parse_config("{}"));
        assert_eq!(text, "config: missing field `endpoints`");
    }

    #[test]
    fn reports_syntax_errors_with_position() {
        let text = message(parse_config(r#"{"endpoints": [}"#));
        assert!(text.contains("line 1"), "{text}");
    }

    #[test]
    fn rejects_trailing_characters() {
        let text = message(parse_config(r#"{"endpoints":[]} x"#));
        assert!(text.starts_with("config: trailing characters"), "{text}");
    }
}
