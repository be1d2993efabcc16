//! What happened to the fleet lately, for people: proxies joining and
//! leaving, phase and verdict changes, quarantines, bans, reports and the
//! console's actions. A bounded ring in memory: the last [`KEPT`] events.

use std::collections::VecDeque;

use proxyfleet_core::clock::unix_now;
use serde::Serialize;

/// Events kept.
pub const KEPT: usize = 1000;

/// One event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Activity {
    /// Unix seconds.
    pub at: u64,
    /// The proxy it concerns: its ID.
    pub proxy_id: Option<String>,
    /// The proxy's `namespace/name`.
    pub proxy: Option<String>,
    /// What happened, a sentence.
    pub what: String,
}

/// The ring.
#[derive(Debug, Default)]
pub(super) struct Log(VecDeque<Activity>);

impl Log {
    pub(super) fn push(&mut self, proxy: Option<(&str, String)>, what: String) {
        self.push_at(unix_now(), proxy, what);
    }

    pub(super) fn push_at(&mut self, at: u64, proxy: Option<(&str, String)>, what: String) {
        if self.0.len() == KEPT {
            self.0.pop_front();
        }
        let (proxy_id, proxy) = proxy.map(|(id, name)| (id.to_owned(), name)).unzip();
        self.0.push_back(Activity { at, proxy_id, proxy, what });
    }

    /// The last `limit` events, newest first, of proxy `id` when given.
    pub(super) fn last(&self, id: Option<&str>, limit: usize) -> Vec<Activity> {
        self.0
            .iter()
            .rev()
            .filter(|event| id.is_none_or(|id| event.proxy_id.as_deref() == Some(id)))
            .take(limit)
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_newest_and_filters_by_proxy() {
        let mut log = Log::default();
        for n in 0..KEPT + 5 {
            log.push(Some((if n % 2 == 0 { "a" } else { "b" }, "ns/x".to_owned())), format!("{n}"));
        }
        log.push(None, "fleet-wide".to_owned());
        let last = log.last(None, 3);
        assert_eq!(
            last.iter().map(|e| e.what.as_str()).collect::<Vec<_>>(),
            ["fleet-wide", "1004", "1003"]
        );
        assert!(log.last(Some("a"), 2).iter().all(|e| e.proxy_id.as_deref() == Some("a")));
        assert_eq!(log.0.len(), KEPT);
    }
}
