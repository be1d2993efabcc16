//! The config schema a plugin reports, held against its own
//! `validate_config`: the schema is what the operator's users read (and
//! what editors complete), so it must say what the plugin accepts.

use proxyfleet_sdk::{Provider, ProviderError};
use serde_json::{Map, Value};

/// The key no schema may allow.
const UNKNOWN_KEY: &str = "proxyfleetTestkitUnknownKey";

/// Checks `P`'s `describe().config_schema` against `P::validate_config`,
/// starting from `valid`, a config the plugin accepts:
///
/// - the schema is a JSON object schema that refuses other keys
///   (`additionalProperties: false`), and the plugin refuses an unknown
///   key naming it;
/// - every `required` key is required: without it the config is refused
///   naming it;
/// - every property's `default`, written out for a key `valid` leaves
///   out, is accepted: what the schema says the plugin assumes, it
///   accepts when said.
///
/// # Panics
///
/// Listing every way the two disagree.
pub fn assert_config_schema<P: Provider>(valid: &Value) {
    let problems = config_schema_problems::<P>(valid);
    assert!(
        problems.is_empty(),
        "the config schema disagrees with validate_config:\n  {}",
        problems.join("\n  ")
    );
}

fn config_schema_problems<P: Provider>(valid: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    let Some(valid) = valid.as_object() else {
        return vec!["the valid config given is not a JSON object".to_owned()];
    };
    if let Err(error) = validate::<P>(valid) {
        return vec![format!("the valid config given is refused: {error}")];
    }
    let schema: Value = match serde_json::from_str(&P::describe().config_schema) {
        Ok(schema) => schema,
        Err(error) => return vec![format!("the schema is not JSON: {error}")],
    };
    if schema["type"] != "object" {
        problems.push(format!("the schema's type is {}, not \"object\"", schema["type"]));
    }
    if schema["additionalProperties"] != Value::Bool(false) {
        problems.push("the schema allows keys it does not name (additionalProperties)".to_owned());
    }
    let mut unknown = valid.clone();
    unknown.insert(UNKNOWN_KEY.to_owned(), Value::Bool(true));
    match validate::<P>(&unknown) {
        Err(ProviderError::InvalidConfig(message)) if message.contains(UNKNOWN_KEY) => {}
        Err(error) => {
            problems.push(format!("an unknown key is refused without naming it: {error}"))
        }
        Ok(()) => problems.push("an unknown key is accepted".to_owned()),
    }
    for key in schema["required"].as_array().into_iter().flatten().filter_map(Value::as_str) {
        let mut without = valid.clone();
        without.remove(key);
        match validate::<P>(&without) {
            Err(ProviderError::InvalidConfig(message)) if message.contains(key) => {}
            Err(error) => {
                problems
                    .push(format!("without required `{key}`: refused without naming it: {error}"));
            }
            Ok(()) => problems.push(format!("required `{key}` may be left out")),
        }
    }
    let properties = schema["properties"].as_object().cloned().unwrap_or_default();
    for (key, property) in &properties {
        let Some(default) = property.get("default").filter(|_| !valid.contains_key(key)) else {
            continue;
        };
        let mut with_default = valid.clone();
        with_default.insert(key.clone(), default.clone());
        if let Err(error) = validate::<P>(&with_default) {
            problems.push(format!("`{key}` at its default {default} is refused: {error}"));
        }
    }
    problems
}

fn validate<P: Provider>(config: &Map<String, Value>) -> Result<(), ProviderError> {
    P::validate_config(&Value::Object(config.clone()).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proxyfleet_sdk::{CallContext, Capabilities, Health, Instance, PluginInfo, ProxySpec};

    /// Accepts `{"name": "...", "size": n}`, `size` optional and at most
    /// 10; its schema claims a default of 20 for `size`, calls a `zone`
    /// required, and forgets `additionalProperties`.
    struct Drifted;

    impl Provider for Drifted {
        fn describe() -> PluginInfo {
            let schema = r#"{"type":"object","required":["name","zone"],"properties":{
                "name":{"type":"string"},"size":{"type":"integer","default":20}}}"#;
            PluginInfo::new("drifted", "0", schema, Capabilities::default())
        }
        fn validate_config(config: &str) -> proxyfleet_sdk::Result<()> {
            #[derive(serde::Deserialize)]
            #[serde(deny_unknown_fields)]
            struct Config {
                #[serde(rename = "name")]
                _name: String,
                #[serde(default)]
                size: u32,
            }
            let config: Config = proxyfleet_sdk::parse_config(config)?;
            if config.size > 10 {
                return Err(ProviderError::InvalidConfig("`size`: at most 10".into()));
            }
            Ok(())
        }
        fn create(_: &CallContext, _: &ProxySpec) -> proxyfleet_sdk::Result<Instance> {
            Err(ProviderError::Permanent("unused".into()))
        }
        fn get(_: &CallContext, _: &str) -> proxyfleet_sdk::Result<Instance> {
            Err(ProviderError::Permanent("unused".into()))
        }
        fn delete(_: &CallContext, _: &str) -> proxyfleet_sdk::Result<()> {
            Ok(())
        }
        fn list(_: &CallContext) -> proxyfleet_sdk::Result<Vec<Instance>> {
            Ok(Vec::new())
        }
        fn check(_: &CallContext) -> Health {
            Health::healthy()
        }
    }

    #[test]
    fn finds_a_schema_that_drifted_from_the_parser() {
        let problems = config_schema_problems::<Drifted>(&serde_json::json!({"name": "a"}));
        assert_eq!(
            problems,
            [
                "the schema allows keys it does not name (additionalProperties)",
                "required `zone` may be left out",
                "`size` at its default 20 is refused: invalid config: `size`: at most 10",
            ],
        );
    }

    #[test]
    fn a_valid_config_that_is_refused_is_reported_alone() {
        let problems =
            config_schema_problems::<Drifted>(&serde_json::json!({"name": "a", "size": 30}));
        assert_eq!(problems.len(), 1);
        assert!(problems[0].starts_with("the valid config given is refused"), "{problems:?}");
    }
}
