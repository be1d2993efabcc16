//! An API server's Kubernetes version, and what its CRDs may carry.
//!
//! The CRDs hold CEL rules (`x-kubernetes-validations`) for what OpenAPI
//! cannot say, such as a pool's `minAvailable` being at most its
//! `replicas`. Kubernetes enforces them from 1.25 on. Before 1.23 the field
//! does not exist, and the API server refuses a CRD that carries it
//! (server-side apply: "field not declared in schema"; kubectl's
//! validation: "unknown field"); 1.23 and 1.24 take it behind a feature gate
//! that is off by default. So a server before 1.25 gets the CRDs without
//! their rules, and what the rules guard is then left to the controllers.

use std::fmt;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::version::Info;
use serde_json::Value;

/// The key of the CEL rules in a schema.
pub const RULES_KEY: &str = "x-kubernetes-validations";

/// The first minor version of Kubernetes 1 that enforces CEL rules by
/// default.
pub const FIRST_ENFORCING_MINOR: u32 = 25;

/// A Kubernetes version, as far as the CRDs care: major and minor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct KubeVersion {
    /// Major version (1).
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

/// A version that is not `MAJOR.MINOR`.
#[derive(Debug, thiserror::Error)]
#[error("{text:?} is not a Kubernetes version: give MAJOR.MINOR, such as 1.30 or v1.30.2")]
pub struct ParseError {
    text: String,
}

impl KubeVersion {
    /// Reads `1.30`, `v1.30` or `v1.30.2` (anything after the minor is
    /// ignored).
    ///
    /// # Errors
    /// When the text does not start with `MAJOR.MINOR`.
    pub fn parse(text: &str) -> Result<Self, ParseError> {
        let error = || ParseError { text: text.to_owned() };
        let trimmed = text.trim();
        let trimmed = trimmed.strip_prefix('v').unwrap_or(trimmed);
        let mut parts = trimmed.splitn(3, '.');
        let major = parts.next().and_then(|p| p.parse().ok()).ok_or_else(error)?;
        let minor = parts.next().and_then(leading_number).ok_or_else(error)?;
        Ok(Self { major, minor })
    }

    /// The version a server reports at `/version`. Managed offerings add
    /// to the minor (GKE: `"30+"`), so only its leading digits count; when
    /// the fields are empty, as in a server built without version stamps,
    /// the git version says it.
    #[must_use]
    pub fn of_server(info: &Info) -> Option<Self> {
        let fields = info
            .major
            .parse()
            .ok()
            .zip(leading_number(&info.minor))
            .map(|(major, minor)| Self { major, minor });
        fields.or_else(|| Self::parse(&info.git_version).ok())
    }

    /// Whether this version enforces CEL rules in CRDs.
    #[must_use]
    pub fn enforces_cel(self) -> bool {
        self.major > 1 || (self.major == 1 && self.minor >= FIRST_ENFORCING_MINOR)
    }
}

impl fmt::Display for KubeVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

fn leading_number(text: &str) -> Option<u32> {
    let digits: String = text.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// The CRDs as a server of `version` takes them: without their CEL rules
/// when it does not enforce them. `None` (version unknown) keeps them.
#[must_use]
pub fn crds_for(
    crds: impl IntoIterator<Item = CustomResourceDefinition>,
    version: Option<KubeVersion>,
) -> Vec<CustomResourceDefinition> {
    let keep = version.is_none_or(KubeVersion::enforces_cel);
    crds.into_iter().map(|crd| if keep { crd } else { without_rules(crd) }).collect()
}

/// A CRD without any CEL rule in its schemas.
#[must_use]
pub fn without_rules(crd: CustomResourceDefinition) -> CustomResourceDefinition {
    fn strip(value: &mut Value) {
        match value {
            Value::Object(map) => {
                map.remove(RULES_KEY);
                map.values_mut().for_each(strip);
            }
            Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let mut value = serde_json::to_value(&crd).expect("a CRD serializes");
    strip(&mut value);
    serde_json::from_value(value).expect("a CRD without rules is still a CRD")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(major: &str, minor: &str, git: &str) -> Info {
        Info {
            major: major.into(),
            minor: minor.into(),
            git_version: git.into(),
            ..Info::default()
        }
    }

    #[test]
    fn versions_parse_from_flags_and_from_servers() {
        let v = |major, minor| KubeVersion { major, minor };
        assert_eq!(KubeVersion::parse("1.24").unwrap(), v(1, 24));
        assert_eq!(KubeVersion::parse("v1.36.4").unwrap(), v(1, 36));
        assert!(KubeVersion::parse("1").is_err());
        assert!(KubeVersion::parse("latest").is_err());
        let err = KubeVersion::parse("one.two").unwrap_err().to_string();
        assert!(err.contains("MAJOR.MINOR"), "{err}");
        assert_eq!(KubeVersion::of_server(&info("1", "20", "v1.20.2")), Some(v(1, 20)));
        assert_eq!(KubeVersion::of_server(&info("1", "30+", "v1.30.5-gke.1")), Some(v(1, 30)));
        assert_eq!(KubeVersion::of_server(&info("", "", "v1.36.4")), Some(v(1, 36)));
        assert_eq!(KubeVersion::of_server(&info("", "", "v0.0.0-master")), Some(v(0, 0)));
    }

    #[test]
    fn rules_are_enforced_from_1_25() {
        let enforces = |text| KubeVersion::parse(text).unwrap().enforces_cel();
        assert!(!enforces("1.20"));
        assert!(!enforces("1.24"));
        assert!(enforces("1.25"));
        assert!(enforces("1.36"));
    }
}
