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
    /// The site the proxy is banned for, when the report named one; the
    /// proxy serves every other site.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub site: Option<String>,
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
    pub(crate) const ALL: [Self; 2] = [Self::Ban, Self::Failure];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Ban => "ban",
            Self::Failure => "failure",
        }
    }
}
