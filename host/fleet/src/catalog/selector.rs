//! How crawlers ask for proxies: which ones, and in what order.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::error::{Error, Result};

/// How crawlers get proxies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    /// In turn.
    #[default]
    RoundRobin,
    /// The one handed out longest ago.
    LeastRecentlyUsed,
    /// Any.
    Random,
}

impl Strategy {
    /// Parses `round-robin`, `least-recently-used` or `random`.
    pub fn parse(setting: &str, text: &str) -> Result<Self> {
        match text {
            "round-robin" => Ok(Self::RoundRobin),
            "least-recently-used" => Ok(Self::LeastRecentlyUsed),
            "random" => Ok(Self::Random),
            other => Err(Error::setting(
                setting,
                format!(
                    "{other:?} is not a strategy; use round-robin, least-recently-used or random"
                ),
            )),
        }
    }
}

/// Which proxies a request wants.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    /// ProxyPool, `namespace/name`.
    pub pool: Option<String>,
    /// Provider entry.
    pub provider: Option<String>,
    /// Labels that must all match.
    pub labels: Vec<(String, String)>,
    /// The site (target host) the proxy is wanted for: proxies banned for
    /// it are left out, and stay available for every other site.
    pub site: Option<String>,
}

impl Selector {
    pub(super) fn matches(
        &self,
        pool: Option<&str>,
        provider: &str,
        labels: &BTreeMap<String, String>,
    ) -> bool {
        self.pool.as_deref().is_none_or(|want| pool == Some(want))
            && self.provider.as_deref().is_none_or(|want| provider == want)
            && self.labels.iter().all(|(k, v)| labels.get(k) == Some(v))
    }
}

/// The selector as errors name it: empty, or a leading space and its parts.
pub(super) fn describe(selector: &Selector) -> String {
    let mut parts = Vec::new();
    if let Some(pool) = &selector.pool {
        parts.push(format!("pool {pool}"));
    }
    if let Some(provider) = &selector.provider {
        parts.push(format!("provider {provider}"));
    }
    for (k, v) in &selector.labels {
        parts.push(format!("label {k}={v}"));
    }
    if let Some(site) = &selector.site {
        parts.push(format!("site {site}"));
    }
    if parts.is_empty() { String::new() } else { format!(" {}", parts.join(", ")) }
}
