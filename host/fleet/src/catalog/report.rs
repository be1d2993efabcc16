//! Crawlers' reports on proxies and what they did.

use serde::Serialize;

/// What a report did.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReportOutcome {
    /// Reports on the proxy so far.
    pub reports: u32,
    /// Unix seconds the quarantine ends.
    pub quarantined_until: u64,
    /// The proxy's pool will replace it.
    pub replacing: bool,
}

/// What a crawler reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ReportKind {
    /// The target site banned the exit address.
    Ban,
    /// Requests through the proxy failed.
    Failure,
}

impl ReportKind {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::Ban => "ban",
            Self::Failure => "failure",
        }
    }
}
