//! A proxy as the API shows it.

use std::collections::BTreeMap;

use proxyfleet_core::proxy::{Condition, Phase};
use serde::Serialize;

use super::HealthRecord;

/// A proxy as the API shows it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProxyView {
    /// The Proxy's UID.
    pub id: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// ProxyPool.
    pub pool: Option<String>,
    /// Provider entry.
    pub provider: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Phase.
    pub phase: Phase,
    /// Why it is in its phase, when a condition holds it back.
    pub phase_reason: Option<String>,
    /// Unix seconds the Proxy was made, when known.
    pub created_at: Option<u64>,
    /// The reconciler's conditions.
    pub conditions: Vec<Condition>,
    /// `http://ip:port`, once the address is known; never with the
    /// credential.
    pub url: Option<String>,
    /// The proxy asks for a credential: `next` and leases hand it out in
    /// their URL to callers with an API token.
    pub authenticated: bool,
    /// Would be handed out now: running, healthy, not quarantined.
    pub available: bool,
    /// Probes pass.
    pub healthy: bool,
    /// Probe counters.
    pub health: Option<HealthRecord>,
    /// Unix seconds until which crawlers' reports keep it out.
    pub quarantined_until: Option<u64>,
    /// Crawler reports so far.
    pub reports: u32,
    /// Sites it is banned for, and until when.
    pub banned_sites: Vec<SiteBan>,
    /// Live leases on it.
    pub leases: usize,
}

/// A site a proxy is banned for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SiteBan {
    /// The site's host name.
    pub site: String,
    /// Unix seconds the ban ends.
    pub until: u64,
}
