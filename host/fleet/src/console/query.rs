//! The Proxies page's query: filters, sort and page, checked strictly
//! like the API's (an unknown key or value is named with the fix).

use proxyfleet_core::proxy::Phase;

use crate::catalog::Verdict;

/// Rows per page.
pub(super) const PER_PAGE: usize = 50;

/// The phases, in the order a filter lists them.
pub(super) const PHASES: [Phase; 5] =
    [Phase::Pending, Phase::Provisioning, Phase::Running, Phase::Failed, Phase::Deleting];

/// What the Proxies table is sorted by.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) enum Sort {
    /// `namespace/name`.
    #[default]
    Name,
    /// The last probe's latency, fastest first (unknown last).
    Latency,
    /// Failed probes, most first.
    Failures,
    /// Gateway errors through it, most first.
    Errors,
    /// Age, oldest first (unknown last).
    Age,
}

impl Sort {
    pub(super) const ALL: [Sort; 5] =
        [Sort::Name, Sort::Age, Sort::Latency, Sort::Failures, Sort::Errors];

    pub(super) fn as_str(self) -> &'static str {
        match self {
            Sort::Name => "name",
            Sort::Latency => "latency",
            Sort::Failures => "failures",
            Sort::Errors => "errors",
            Sort::Age => "age",
        }
    }

    pub(super) fn label(self) -> &'static str {
        match self {
            Sort::Name => "Name",
            Sort::Latency => "Probe latency",
            Sort::Failures => "Failed probes",
            Sort::Errors => "Gateway errors",
            Sort::Age => "Age, oldest first",
        }
    }
}

/// The Proxies page's query.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct ProxyQuery {
    pub pool: Option<String>,
    pub entry: Option<String>,
    pub phase: Option<Phase>,
    pub health: Option<Verdict>,
    /// Only proxies banned for this site.
    pub site: Option<String>,
    pub sort: Sort,
    /// 1-based.
    pub page: usize,
}

const KEYS: &str = "pool, entry, phase, health, site, sort, page";

impl ProxyQuery {
    pub(super) fn parse(query: &str) -> Result<Self, String> {
        let mut parsed = Self { page: 1, ..Self::default() };
        for (key, value) in form_urlencoded::parse(query.as_bytes()) {
            // An empty value is a filter left at "any".
            if value.is_empty() {
                continue;
            }
            match key.as_ref() {
                "pool" => parsed.pool = Some(value.into_owned()),
                "entry" => parsed.entry = Some(value.into_owned()),
                "site" => parsed.site = Some(value.trim().to_ascii_lowercase()),
                "phase" => {
                    parsed.phase = Some(
                        PHASES.into_iter().find(|p| p.as_str() == value).ok_or_else(|| {
                            format!(
                                "phase: {value:?} is not a phase; use one of {}",
                                PHASES.map(Phase::as_str).join(", ")
                            )
                        })?,
                    );
                }
                "health" => {
                    parsed.health = Some(match value.as_ref() {
                        "healthy" => Verdict::Healthy,
                        "unhealthy" => Verdict::Unhealthy,
                        "unknown" => Verdict::Unknown,
                        other => {
                            return Err(format!(
                                "health: {other:?} is not a verdict; use healthy, unhealthy or unknown"
                            ));
                        }
                    });
                }
                "sort" => {
                    parsed.sort =
                        Sort::ALL.into_iter().find(|s| s.as_str() == value).ok_or_else(|| {
                            format!(
                                "sort: {value:?} is not a column; use one of {}",
                                Sort::ALL.map(Sort::as_str).join(", ")
                            )
                        })?;
                }
                "page" => {
                    parsed.page =
                        value.parse().ok().filter(|page| *page >= 1).ok_or_else(|| {
                            format!("page: {value:?} is not a page number; use 1 or more")
                        })?;
                }
                other => {
                    return Err(format!(
                        "unknown query parameter {other:?}; this page takes {KEYS}"
                    ));
                }
            }
        }
        Ok(parsed)
    }

    /// The query string of this query on another `page`.
    pub(super) fn on_page(&self, page: usize) -> String {
        let mut out = form_urlencoded::Serializer::new(String::new());
        for (key, value) in [
            ("pool", self.pool.as_deref()),
            ("entry", self.entry.as_deref()),
            ("phase", self.phase.map(Phase::as_str)),
            ("health", self.health.map(verdict_str)),
            ("site", self.site.as_deref()),
        ] {
            if let Some(value) = value {
                out.append_pair(key, value);
            }
        }
        if self.sort != Sort::Name {
            out.append_pair("sort", self.sort.as_str());
        }
        out.append_pair("page", &page.to_string());
        out.finish()
    }
}

/// A verdict as the query and the table spell it.
pub(super) fn verdict_str(verdict: Verdict) -> &'static str {
    match verdict {
        Verdict::Healthy => "healthy",
        Verdict::Unhealthy => "unhealthy",
        Verdict::Unknown => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_sort_and_page_are_read_strictly() {
        let q = ProxyQuery::parse(
            "pool=default%2Fweb&phase=Running&health=healthy&sort=latency&page=2&entry=",
        )
        .unwrap();
        assert_eq!(q.pool.as_deref(), Some("default/web"));
        assert_eq!(q.phase, Some(Phase::Running));
        assert_eq!(q.health, Some(Verdict::Healthy));
        assert_eq!(q.sort, Sort::Latency);
        assert_eq!(q.page, 2);
        assert_eq!(q.entry, None);
        assert_eq!(ProxyQuery::parse(&q.on_page(2)).unwrap(), q);
        let err = ProxyQuery::parse("colour=red").unwrap_err();
        assert!(err.contains("\"colour\"") && err.contains("pool, entry"), "{err}");
        let err = ProxyQuery::parse("phase=running").unwrap_err();
        assert!(err.contains("Running"), "{err}");
        assert!(ProxyQuery::parse("page=0").unwrap_err().contains("1 or more"));
        assert_eq!(ProxyQuery::parse("sort=age").unwrap().sort, Sort::Age);
        assert!(ProxyQuery::parse("sort=colour").unwrap_err().contains("latency"));
    }
}
