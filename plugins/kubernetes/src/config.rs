//! The entry config: which API server and namespace, what the proxy
//! container runs, and where its pods may be scheduled. The credential is
//! not part of it: the host injects the bearer token from the grant.

use std::collections::BTreeMap;

use proxyfleet_sdk::{ProviderError, Result};
use serde::{Deserialize, Serialize};

use crate::names::{is_dns_label, is_dns_subdomain, is_label_value, is_qualified_name};

/// The image proxies run unless the entry or the Proxy says otherwise: the
/// project's own tinyproxy image (`cargo xtask image`: Debian's tinyproxy
/// and `/bin/sh`, non-root). The built-in launcher needs only `/bin/sh` and
/// `tinyproxy` from it.
pub const DEFAULT_IMAGE: &str = "ghcr.io/proxyfleet/tinyproxy:0.1.0";

/// nobody/nogroup on most distributions: any non-root ID works for the
/// default launcher, which only reads its binary and writes to `/tmp`.
pub const DEFAULT_RUN_AS_USER: i64 = 65534;

/// JSON schema of [`Config`], reported by `describe`: derived from the
/// struct, so the two cannot drift.
pub fn config_schema() -> String {
    serde_json::to_string(&schemars::schema_for!(Config)).unwrap_or_default()
}

/// The parsed entry config.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schemars(title = "kubernetes provider entry")]
pub struct Config {
    /// API server base URL without path, e.g.
    /// https://kubernetes.default.svc; must match a grant.
    pub api_server: String,
    /// Namespace the proxy pods are created in.
    pub namespace: String,
    /// Container image of a proxy whose Proxy names no image.
    #[serde(default = "default_image")]
    pub image: String,
    /// A Proxy's image key to the container image it runs.
    #[serde(default)]
    pub images: BTreeMap<String, String>,
    /// The container's command; absent with args absent: the built-in
    /// tinyproxy launcher. $(PROXY_PORT) expands to the listening port.
    #[serde(default)]
    pub command: Option<Vec<String>>,
    /// The container's args; see command.
    #[serde(default)]
    pub args: Option<Vec<String>>,
    /// Port the image listens on whatever the Proxy's port; absent: the
    /// Proxy's port.
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub port: Option<u16>,
    /// Non-root user ID the container runs as.
    #[serde(default = "default_run_as_user")]
    #[schemars(range(min = 1))]
    pub run_as_user: i64,
    /// CPU request, in millicpu, for each of a Proxy's cores (a proxy pod
    /// needs far less than a VM's vCPU).
    #[serde(default = "default_millicpu_per_core")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub millicpu_per_core: u32,
    /// When the node pulls the image.
    #[serde(default)]
    pub image_pull_policy: Option<PullPolicy>,
    /// Names of Secrets in the namespace to pull the images with.
    #[serde(default)]
    pub image_pull_secrets: Vec<String>,
    /// Node labels every proxy pod requires; a Proxy's placement adds to
    /// them.
    #[serde(default)]
    pub node_selector: BTreeMap<String, String>,
    /// Taints every proxy pod tolerates.
    #[serde(default)]
    pub tolerations: Vec<Toleration>,
}

/// Kubernetes' `imagePullPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
pub enum PullPolicy {
    /// Pull on every start.
    Always,
    /// Pull when the node lacks the image.
    IfNotPresent,
    /// Never pull.
    Never,
}

/// A Kubernetes toleration, written into the pod as it is.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Toleration {
    /// The taint key; none with operator Exists tolerates every taint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// How the value is compared; Equal when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator: Option<Operator>,
    /// The taint value, for operator Equal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// The effect tolerated; every effect when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<Effect>,
    /// How long a NoExecute taint is tolerated, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toleration_seconds: Option<i64>,
}

/// A toleration's operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
pub enum Operator {
    /// The taint's value must equal the toleration's.
    Equal,
    /// Any value of the taint's key.
    Exists,
}

/// A taint's effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
pub enum Effect {
    /// Not scheduled onto the node.
    NoSchedule,
    /// Scheduled onto the node only when nothing else fits.
    PreferNoSchedule,
    /// Evicted from the node.
    NoExecute,
}

fn default_image() -> String {
    DEFAULT_IMAGE.to_owned()
}

fn default_run_as_user() -> i64 {
    DEFAULT_RUN_AS_USER
}

/// One CPU per core unless the entry says otherwise.
fn default_millicpu_per_core() -> u32 {
    1000
}

fn invalid(key: &str, what: &str) -> ProviderError {
    ProviderError::InvalidConfig(format!("config key `{key}`: {what}"))
}

/// An image reference as the container runtime takes it; the registry
/// decides the rest when it pulls.
pub fn is_image_reference(image: &str) -> bool {
    !image.is_empty() && !image.chars().any(|c| c.is_whitespace() || c.is_control())
}

impl Toleration {
    /// Why Kubernetes would refuse this toleration, if it would.
    pub fn problem(&self) -> Option<&'static str> {
        let exists = self.operator == Some(Operator::Exists);
        if exists && self.value.as_deref().is_some_and(|value| !value.is_empty()) {
            return Some("operator Exists takes no value");
        }
        if self.key.as_deref().unwrap_or_default().is_empty() && !exists {
            return Some("a toleration without a key needs operator Exists");
        }
        if let Some(key) = self.key.as_deref().filter(|key| !key.is_empty())
            && !is_qualified_name(key)
        {
            return Some("the key is not a valid taint key");
        }
        if self.toleration_seconds.is_some() && self.effect != Some(Effect::NoExecute) {
            return Some("tolerationSeconds only applies to effect NoExecute");
        }
        None
    }
}

impl Config {
    /// Parses and checks an entry config; errors name the key.
    pub fn parse(json: &str) -> Result<Self> {
        let config: Self = proxyfleet_sdk::parse_config(json)?;
        let api_server = config.api_server.trim_end_matches('/');
        let Some(authority) = api_server.strip_prefix("https://") else {
            return Err(invalid(
                "apiServer",
                "must start with https:// (the bearer token must not travel in clear text)",
            ));
        };
        if authority.is_empty() || authority.contains(['/', '?', '#', '@']) {
            return Err(invalid(
                "apiServer",
                "give scheme, host and port only, e.g. https://kubernetes.default.svc",
            ));
        }
        if !is_dns_label(&config.namespace) {
            return Err(invalid(
                "namespace",
                "is not a namespace name (a DNS-1123 label: lowercase letters, digits and `-`, at most 63)",
            ));
        }
        if !is_image_reference(&config.image) {
            return Err(invalid("image", "is not an image reference"));
        }
        for (key, image) in &config.images {
            if key.is_empty() {
                return Err(invalid("images", "image keys must not be empty"));
            }
            if !is_image_reference(image) {
                return Err(invalid(&format!("images.{key}"), "is not an image reference"));
            }
        }
        for (key, list) in [("command", &config.command), ("args", &config.args)] {
            if let Some(index) = list.iter().flatten().position(String::is_empty) {
                return Err(invalid(&format!("{key}[{index}]"), "must not be empty"));
            }
        }
        if config.port == Some(0) {
            return Err(invalid("port", "must be 1 to 65535"));
        }
        if config.run_as_user < 1 {
            return Err(invalid("runAsUser", "must be a non-root user ID (1 or more)"));
        }
        if !(1..=1_000_000).contains(&config.millicpu_per_core) {
            return Err(invalid("millicpuPerCore", "must be 1 to 1000000 (1000 is one CPU)"));
        }
        for (index, secret) in config.image_pull_secrets.iter().enumerate() {
            if !is_dns_subdomain(secret) {
                return Err(invalid(&format!("imagePullSecrets[{index}]"), "is not a Secret name"));
            }
        }
        for (key, value) in &config.node_selector {
            if !is_qualified_name(key) {
                return Err(invalid(&format!("nodeSelector.{key}"), "is not a label key"));
            }
            if !value.is_empty() && !is_label_value(value) {
                return Err(invalid(&format!("nodeSelector.{key}"), "is not a label value"));
            }
        }
        for (index, toleration) in config.tolerations.iter().enumerate() {
            if let Some(problem) = toleration.problem() {
                return Err(invalid(&format!("tolerations[{index}]"), problem));
            }
        }
        Ok(Self { api_server: api_server.to_owned(), ..config })
    }

    /// The container image for a Proxy's image key: the entry's `image`
    /// when the Proxy names none.
    pub fn image_for(&self, key: &str) -> Result<&str> {
        if key.is_empty() {
            return Ok(&self.image);
        }
        self.images.get(key).map(String::as_str).ok_or_else(|| {
            ProviderError::InvalidSpec(format!(
                "image: no container image is configured for `{key}`; add it to the entry's config key `images`, or leave the Proxy's image empty for `{}`",
                self.image
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = r#"{"apiServer":"https://kubernetes.default.svc/","namespace":"proxies"}"#;

    fn error(json: &str) -> String {
        match Config::parse(json) {
            Err(ProviderError::InvalidConfig(message)) => message,
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
    }

    fn with(key: &str, value: &str) -> String {
        VALID.replacen('{', &format!("{{\"{key}\":{value},"), 1)
    }

    #[test]
    fn defaults_fill_the_optional_keys() {
        let config = Config::parse(VALID).expect("valid");
        assert_eq!(config.api_server, "https://kubernetes.default.svc");
        assert_eq!(config.image, DEFAULT_IMAGE);
        assert_eq!(config.run_as_user, DEFAULT_RUN_AS_USER);
        assert_eq!((config.command, config.args, config.port), (None, None, None));
        assert_eq!(Config::parse(VALID).expect("valid").image_for(""), Ok(DEFAULT_IMAGE));
    }

    #[test]
    fn image_keys_map_to_images() {
        let config = Config::parse(&with("images", r#"{"squid":"docker.io/ubuntu/squid:6.6"}"#))
            .expect("valid");
        assert_eq!(config.image_for("squid"), Ok("docker.io/ubuntu/squid:6.6"));
        let unknown = config.image_for("debian-12").expect_err("not configured");
        assert!(
            matches!(&unknown, ProviderError::InvalidSpec(m) if m.starts_with("image:") && m.contains("`images`")),
            "{unknown:?}"
        );
    }

    #[test]
    fn errors_name_the_key() {
        assert!(error(&VALID.replace("https://", "http://")).starts_with("config key `apiServer`"));
        assert!(
            error(&VALID.replace(".svc/", ".svc/api/v1")).starts_with("config key `apiServer`")
        );
        assert!(error(&VALID.replace("proxies", "Proxies")).starts_with("config key `namespace`"));
        assert!(error(&with("image", r#""a b""#)).starts_with("config key `image`"));
        assert!(error(&with("images", r#"{"k":""}"#)).starts_with("config key `images.k`"));
        assert!(error(&with("port", "0")).starts_with("config key `port`"));
        assert!(
            error(&with("command", r#"["tinyproxy",""]"#)).starts_with("config key `command[1]`")
        );
        assert!(error(&with("runAsUser", "0")).starts_with("config key `runAsUser`"));
        assert!(
            error(&with("imagePullSecrets", r#"["ok","Not OK"]"#))
                .starts_with("config key `imagePullSecrets[1]`")
        );
        assert!(
            error(&with("nodeSelector", r#"{"disk type":"ssd"}"#))
                .starts_with("config key `nodeSelector.disk type`")
        );
        assert!(
            error(&with("tolerations", r#"[{"operator":"Exists","value":"x"}]"#))
                .starts_with("config key `tolerations[0]`")
        );
        assert!(
            error(&with("tolerations", r#"[{"key":"k","effect":"Sometimes"}]"#))
                .starts_with("config key `tolerations[0].effect`")
        );
        assert!(
            error(&with("imagePullPolicy", r#""Often""#))
                .starts_with("config key `imagePullPolicy`")
        );
        assert!(error(&with("token", r#""secret""#)).contains("unknown field `token`"));
    }

    #[test]
    fn tolerations_follow_the_api_rules() {
        let toleration = |json: &str| -> Toleration { serde_json::from_str(json).expect("parses") };
        assert_eq!(toleration(r#"{"operator":"Exists"}"#).problem(), None);
        assert_eq!(
            toleration(r#"{"key":"dedicated","value":"proxies","effect":"NoSchedule"}"#).problem(),
            None
        );
        assert!(toleration(r#"{"value":"x"}"#).problem().is_some());
        assert!(
            toleration(r#"{"key":"k","effect":"NoSchedule","tolerationSeconds":5}"#)
                .problem()
                .is_some()
        );
        assert_eq!(
            toleration(
                r#"{"key":"k","operator":"Exists","effect":"NoExecute","tolerationSeconds":5}"#
            )
            .problem(),
            None
        );
    }

    /// The schema is the struct's: derived, so a key added to one is in
    /// the other, and its defaults are what the parser fills in.
    #[test]
    fn the_schema_is_derived_from_the_config_struct() {
        let schema: serde_json::Value =
            serde_json::from_str(&config_schema()).expect("schema parses");
        assert_eq!(schema["title"], "kubernetes provider entry");
        assert_eq!(schema["required"], serde_json::json!(["apiServer", "namespace"]));
        assert_eq!(schema["properties"]["image"]["default"], DEFAULT_IMAGE);
        assert_eq!(schema["properties"]["runAsUser"]["default"], DEFAULT_RUN_AS_USER);
        assert_eq!(schema["properties"]["port"]["minimum"], 1);
        let policies: Vec<&str> = schema["$defs"]["PullPolicy"]["oneOf"]
            .as_array()
            .expect("one schema per policy")
            .iter()
            .filter_map(|policy| policy["const"].as_str())
            .collect();
        assert_eq!(policies, ["Always", "IfNotPresent", "Never"]);
    }

    #[test]
    fn the_config_schema_says_what_validate_config_accepts() {
        proxyfleet_sdk_testkit::assert_config_schema::<crate::Kubernetes>(&serde_json::json!({
            "apiServer": "https://kubernetes.default.svc",
            "namespace": "proxies"
        }));
    }
}
