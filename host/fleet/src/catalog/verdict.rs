//! What the probes say of a proxy, and the counters behind it.

use serde::Serialize;

use super::Endpoint;

/// What the probes say of a proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Verdict {
    /// Too few probes yet.
    Unknown,
    /// Passed the last `healthy_after` probes.
    Healthy,
    /// Failed the last `unhealthy_after` probes.
    Unhealthy,
}

/// Probe counters of one proxy.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthRecord {
    /// The endpoint the counters belong to.
    #[serde(skip)]
    pub endpoint: Endpoint,
    /// Verdict.
    pub verdict: Verdict,
    /// Probes passed, in all.
    pub passes: u64,
    /// Probes failed, in all.
    pub failures: u64,
    /// Passed in a row.
    pub consecutive_passes: u32,
    /// Failed in a row.
    pub consecutive_failures: u32,
    /// Latency of the last passing probe.
    pub latency_ms: Option<f64>,
    /// Why the last failing probe failed.
    pub last_error: Option<String>,
    /// The exit address the check target saw.
    pub exit_ip: Option<String>,
    /// Unix seconds of the last probe.
    pub checked_at: Option<u64>,
}

impl HealthRecord {
    pub(super) fn new(endpoint: Endpoint) -> Self {
        Self {
            endpoint,
            verdict: Verdict::Unknown,
            passes: 0,
            failures: 0,
            consecutive_passes: 0,
            consecutive_failures: 0,
            latency_ms: None,
            last_error: None,
            exit_ip: None,
            checked_at: None,
        }
    }

    /// A sentence for the `Healthy` condition. It carries no counters, so
    /// it changes only with the verdict, the error or the exit address, and
    /// a status writer that compares before writing stays quiet.
    pub fn message(&self) -> String {
        match (self.verdict, &self.last_error) {
            (Verdict::Unhealthy, Some(error)) => format!("probes through the proxy fail: {error}"),
            (Verdict::Unhealthy, None) => "probes through the proxy fail".to_owned(),
            _ => match &self.exit_ip {
                Some(ip) => format!("probes through the proxy pass; exit address {ip}"),
                None => "probes through the proxy pass".to_owned(),
            },
        }
    }
}
