//! The gateway's metrics: requests, bytes and upstream errors by pool,
//! retries by pool, refusals by reason, and the latency the gateway adds.
//!
//! Per upstream Proxy the counts are kept for the console
//! ([`GatewayMetrics::upstream_totals`]) but exported only when asked for
//! (`MetricsOptions::gateway_upstreams`): one series per Proxy per
//! counter is more than most Prometheus installations want for a large
//! fleet. Then the `upstream` label is a Proxy's `namespace/name`, and
//! [`GatewayMetrics::forget_upstream`] drops a Proxy's series once it
//! leaves the catalog, so replaced proxies do not pile up.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// The `pool` label of a proxy in no pool.
const NO_POOL: &str = "";

/// How a request went through the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// An absolute-form request forwarded to the upstream proxy.
    Http,
    /// A CONNECT tunnel.
    Connect,
}

impl Kind {
    const ALL: [Kind; 2] = [Kind::Http, Kind::Connect];

    fn as_str(self) -> &'static str {
        match self {
            Kind::Http => "http",
            Kind::Connect => "connect",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UpstreamLabels {
    pool: String,
    upstream: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    pool: String,
    upstream: String,
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolKindLabels {
    pool: String,
    kind: String,
}

/// The request, byte and error counters under one kind of labels: per
/// upstream Proxy, or per pool.
#[derive(Debug, Clone)]
struct Flows<R, L> {
    requests: Family<R, Counter>,
    bytes_sent: Family<L, Counter>,
    bytes_received: Family<L, Counter>,
    upstream_errors: Family<L, Counter>,
}

/// The counters per upstream: exported only when asked for, read by the
/// console.
type ByUpstream = Flows<RequestLabels, UpstreamLabels>;

/// The counters per pool, exported when the per-upstream ones are not.
type ByPool = Flows<PoolKindLabels, PoolLabels>;

impl<R, L> Default for Flows<R, L>
where
    R: Clone + std::hash::Hash + Eq,
    L: Clone + std::hash::Hash + Eq,
{
    fn default() -> Self {
        Self {
            requests: Family::default(),
            bytes_sent: Family::default(),
            bytes_received: Family::default(),
            upstream_errors: Family::default(),
        }
    }
}

impl<R, L> Flows<R, L>
where
    R: EncodeLabelSet + Clone + std::hash::Hash + Eq + std::fmt::Debug + Send + Sync + 'static,
    L: EncodeLabelSet + Clone + std::hash::Hash + Eq + std::fmt::Debug + Send + Sync + 'static,
{
    /// Exports these counters under the gateway's names.
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "gateway_requests",
            "Requests and tunnels the gateway sent through an upstream proxy",
            self.requests.clone(),
        );
        registry.register(
            "gateway_bytes_sent",
            "Body and tunnel bytes from crawlers to upstream proxies",
            self.bytes_sent.clone(),
        );
        registry.register(
            "gateway_bytes_received",
            "Body and tunnel bytes from upstream proxies to crawlers",
            self.bytes_received.clone(),
        );
        registry.register(
            "gateway_upstream_errors",
            "Upstream proxies the gateway could not reach or that failed a request",
            self.upstream_errors.clone(),
        );
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

/// The gateway's counters, in the operator's registry.
#[derive(Debug, Clone)]
pub struct GatewayMetrics {
    /// Per upstream: exported only when asked for, read by the console.
    by_upstream: ByUpstream,
    /// The same by pool, exported when the above are not.
    by_pool: Option<ByPool>,
    retries: Family<PoolLabels, Counter>,
    refused: Family<ReasonLabels, Counter>,
    added_seconds: Histogram,
    /// Sums over every label, for the console's rates (not exported: the
    /// families above hold the same counts).
    totals: Totals,
}

#[derive(Debug, Clone, Default)]
struct Totals {
    requests: Counter,
    upstream_errors: Counter,
    refused: Counter,
    refused_by: Arc<Mutex<BTreeMap<&'static str, u64>>>,
    /// Observations of the added time per bucket of [`ADDED_BUCKETS`],
    /// the last one past them all.
    added: Arc<[AtomicU64; ADDED_BUCKETS.len() + 1]>,
}

/// Upper bounds of the added-time buckets, in seconds: 50 µs doubling to
/// about 1.6 s (the exported histogram's).
pub const ADDED_BUCKETS: [f64; 16] = {
    let mut bounds = [0.0; 16];
    let mut i = 0;
    let mut bound = 0.000_05;
    while i < 16 {
        bounds[i] = bound;
        bound *= 2.0;
        i += 1;
    }
    bounds
};

/// The gateway's counts since the start, summed over pools and upstreams.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GatewayTotals {
    /// Requests and tunnels sent through an upstream.
    pub requests: u64,
    /// Upstreams that could not be reached or failed a request.
    pub upstream_errors: u64,
    /// Requests the gateway answered itself.
    pub refused: u64,
    /// The same by reason (`auth`, `routing`, `target`, ...).
    pub refused_by: BTreeMap<&'static str, u64>,
    /// Requests per bucket of the time the gateway added
    /// ([`ADDED_BUCKETS`], then one for longer).
    pub added: [u64; ADDED_BUCKETS.len() + 1],
}

/// One upstream's counts since it joined.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UpstreamTotals {
    /// Requests and tunnels.
    pub requests: u64,
    /// Bytes both ways.
    pub bytes: u64,
    /// Errors.
    pub errors: u64,
}

/// The byte counters of one upstream, taken once per request so the body
/// streams count without a label lookup per chunk.
#[derive(Debug, Clone)]
pub struct ByteCounters {
    /// Bytes from the crawler to the upstream.
    pub sent: ByteCounter,
    /// Bytes from the upstream to the crawler.
    pub received: ByteCounter,
}

/// One direction's bytes of one upstream: its own count and, when the
/// export is by pool, its pool's.
#[derive(Debug, Clone)]
pub struct ByteCounter {
    upstream: Counter,
    pool: Option<Counter>,
}

impl ByteCounter {
    /// Counts `bytes`.
    pub fn inc_by(&self, bytes: u64) {
        self.upstream.inc_by(bytes);
        if let Some(pool) = &self.pool {
            pool.inc_by(bytes);
        }
    }
}

impl GatewayMetrics {
    /// The gateway's metrics in `registry`; `upstreams` exports the
    /// per-upstream series instead of the per-pool ones.
    pub(crate) fn register(registry: &mut Registry, upstreams: bool) -> Self {
        let metrics = Self {
            by_upstream: ByUpstream::default(),
            by_pool: (!upstreams).then(ByPool::default),
            retries: Family::default(),
            refused: Family::default(),
            // 50 µs to about 1.6 s.
            added_seconds: Histogram::new(ADDED_BUCKETS),
            totals: Totals::default(),
        };
        match &metrics.by_pool {
            Some(by_pool) => by_pool.register(registry),
            None => metrics.by_upstream.register(registry),
        }
        // Counters start at zero, so that rate() and increase() see the
        // first request: the pool of Proxies in none always has its series.
        if let Some(by_pool) = &metrics.by_pool {
            let none = PoolLabels { pool: NO_POOL.to_owned() };
            for kind in Kind::ALL {
                let labels =
                    PoolKindLabels { pool: NO_POOL.to_owned(), kind: kind.as_str().to_owned() };
                drop(by_pool.requests.get_or_create(&labels));
            }
            drop(by_pool.bytes_sent.get_or_create(&none));
            drop(by_pool.bytes_received.get_or_create(&none));
            drop(by_pool.upstream_errors.get_or_create(&none));
        }
        drop(metrics.retries.get_or_create(&PoolLabels { pool: NO_POOL.to_owned() }));
        registry.register(
            "gateway_retries",
            "Requests sent to another upstream after one failed",
            metrics.retries.clone(),
        );
        registry.register(
            "gateway_refused",
            "Requests the gateway answered itself, by reason",
            metrics.refused.clone(),
        );
        registry.register(
            "gateway_added_seconds",
            "Time the gateway adds to a request: choosing the upstream and passing the answer on",
            metrics.added_seconds.clone(),
        );
        metrics
    }

    fn upstream(pool: Option<&str>, upstream: &str) -> UpstreamLabels {
        UpstreamLabels { pool: pool.unwrap_or(NO_POOL).to_owned(), upstream: upstream.to_owned() }
    }

    /// Counts a request or tunnel through `upstream` and hands back its
    /// byte counters.
    pub fn record_request(&self, pool: Option<&str>, upstream: &str, kind: Kind) -> ByteCounters {
        let labels = Self::upstream(pool, upstream);
        self.by_upstream
            .requests
            .get_or_create(&RequestLabels {
                pool: labels.pool.clone(),
                upstream: labels.upstream.clone(),
                kind: kind.as_str().to_owned(),
            })
            .inc();
        self.totals.requests.inc();
        let pool_labels = PoolLabels { pool: labels.pool.clone() };
        if let Some(by_pool) = &self.by_pool {
            by_pool
                .requests
                .get_or_create(&PoolKindLabels {
                    pool: labels.pool.clone(),
                    kind: kind.as_str().to_owned(),
                })
                .inc();
        }
        let pool_counter = |family: fn(&ByPool) -> &Family<PoolLabels, Counter>| {
            self.by_pool.as_ref().map(|by_pool| family(by_pool).get_or_create(&pool_labels).clone())
        };
        ByteCounters {
            sent: ByteCounter {
                upstream: self.by_upstream.bytes_sent.get_or_create(&labels).clone(),
                pool: pool_counter(|by_pool| &by_pool.bytes_sent),
            },
            received: ByteCounter {
                upstream: self.by_upstream.bytes_received.get_or_create(&labels).clone(),
                pool: pool_counter(|by_pool| &by_pool.bytes_received),
            },
        }
    }

    /// Counts an upstream that could not be reached or failed a request.
    pub fn record_upstream_error(&self, pool: Option<&str>, upstream: &str) {
        let labels = Self::upstream(pool, upstream);
        if let Some(by_pool) = &self.by_pool {
            by_pool.upstream_errors.get_or_create(&PoolLabels { pool: labels.pool.clone() }).inc();
        }
        self.by_upstream.upstream_errors.get_or_create(&labels).inc();
        self.totals.upstream_errors.inc();
    }

    /// Counts a request sent to another upstream.
    pub fn record_retry(&self, pool: Option<&str>) {
        self.retries.get_or_create(&PoolLabels { pool: pool.unwrap_or(NO_POOL).to_owned() }).inc();
    }

    /// Counts a request the gateway answered itself (`auth`, `routing`,
    /// `unavailable`, `upstream`, `request`).
    pub fn record_refused(&self, reason: &'static str) {
        self.refused.get_or_create(&ReasonLabels { reason: reason.to_owned() }).inc();
        self.totals.refused.inc();
        *self
            .totals
            .refused_by
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(reason)
            .or_default() += 1;
    }

    /// The counts since the start, over every pool and upstream.
    pub fn totals(&self) -> GatewayTotals {
        GatewayTotals {
            requests: self.totals.requests.get(),
            upstream_errors: self.totals.upstream_errors.get(),
            refused: self.totals.refused.get(),
            refused_by: self
                .totals
                .refused_by
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
            added: std::array::from_fn(|i| self.totals.added[i].load(Ordering::Relaxed)),
        }
    }

    /// The counts of one upstream (`namespace/name`) in `pool`; zeros when
    /// the gateway never used it. Creates no series.
    pub fn upstream_totals(&self, pool: Option<&str>, upstream: &str) -> UpstreamTotals {
        let labels = Self::upstream(pool, upstream);
        let requests = Kind::ALL
            .iter()
            .filter_map(|kind| {
                self.by_upstream
                    .requests
                    .get(&RequestLabels {
                        pool: labels.pool.clone(),
                        upstream: labels.upstream.clone(),
                        kind: kind.as_str().to_owned(),
                    })
                    .map(|counter| counter.get())
            })
            .sum();
        let count = |family: &Family<UpstreamLabels, Counter>| {
            family.get(&labels).map_or(0, |counter| counter.get())
        };
        UpstreamTotals {
            requests,
            bytes: count(&self.by_upstream.bytes_sent) + count(&self.by_upstream.bytes_received),
            errors: count(&self.by_upstream.upstream_errors),
        }
    }

    /// Records the time the gateway added to one request.
    pub fn observe_added(&self, added: Duration) {
        let seconds = added.as_secs_f64();
        self.added_seconds.observe(seconds);
        let bucket =
            ADDED_BUCKETS.iter().position(|bound| seconds <= *bound).unwrap_or(ADDED_BUCKETS.len());
        self.totals.added[bucket].fetch_add(1, Ordering::Relaxed);
    }

    /// Drops the series of a proxy that left the catalog.
    pub fn forget_upstream(&self, pool: Option<&str>, upstream: &str) {
        let labels = Self::upstream(pool, upstream);
        for kind in Kind::ALL {
            self.by_upstream.requests.remove(&RequestLabels {
                pool: labels.pool.clone(),
                upstream: labels.upstream.clone(),
                kind: kind.as_str().to_owned(),
            });
        }
        self.by_upstream.bytes_sent.remove(&labels);
        self.by_upstream.bytes_received.remove(&labels);
        self.by_upstream.upstream_errors.remove(&labels);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(metrics: &GatewayMetrics) {
        let bytes = metrics.record_request(Some("default/web"), "default/web-1", Kind::Http);
        bytes.sent.inc_by(10);
        bytes.received.inc_by(200);
        let bytes = metrics.record_request(Some("default/web"), "default/web-2", Kind::Http);
        bytes.sent.inc_by(5);
        metrics.record_request(None, "default/solo", Kind::Connect);
        metrics.record_upstream_error(Some("default/web"), "default/web-2");
    }

    fn encode(registry: &Registry) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
        text
    }

    /// By default the export is by pool, one series per pool however many
    /// proxies it has; the console still reads each upstream's counts.
    #[test]
    fn by_default_the_counters_are_exported_by_pool_and_kept_per_upstream() {
        let mut registry = Registry::with_prefix("proxyfleet");
        let metrics = GatewayMetrics::register(&mut registry, false);
        record(&metrics);
        let text = encode(&registry);
        for line in [
            r#"proxyfleet_gateway_requests_total{pool="default/web",kind="http"} 2"#,
            r#"proxyfleet_gateway_requests_total{pool="",kind="connect"} 1"#,
            r#"proxyfleet_gateway_bytes_sent_total{pool="default/web"} 15"#,
            r#"proxyfleet_gateway_bytes_received_total{pool="default/web"} 200"#,
            r#"proxyfleet_gateway_upstream_errors_total{pool="default/web"} 1"#,
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
        assert!(!text.contains("upstream=\""), "no per-upstream series: {text}");
        assert_eq!(
            metrics.upstream_totals(Some("default/web"), "default/web-2"),
            UpstreamTotals { requests: 1, bytes: 5, errors: 1 }
        );
    }

    #[test]
    fn requests_bytes_and_errors_show_up_by_pool_and_upstream_and_go_with_the_proxy() {
        let mut registry = Registry::with_prefix("proxyfleet");
        let metrics = GatewayMetrics::register(&mut registry, true);
        let bytes = metrics.record_request(Some("default/web"), "default/web-1", Kind::Http);
        bytes.sent.inc_by(10);
        bytes.received.inc_by(200);
        metrics.record_request(None, "default/solo", Kind::Connect);
        metrics.record_upstream_error(Some("default/web"), "default/web-2");
        metrics.record_retry(Some("default/web"));
        metrics.record_refused("auth");
        metrics.observe_added(Duration::from_micros(120));
        let encode = || {
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
            text
        };
        let text = encode();
        for line in [
            r#"proxyfleet_gateway_requests_total{pool="default/web",upstream="default/web-1",kind="http"} 1"#,
            r#"proxyfleet_gateway_requests_total{pool="",upstream="default/solo",kind="connect"} 1"#,
            r#"proxyfleet_gateway_bytes_sent_total{pool="default/web",upstream="default/web-1"} 10"#,
            r#"proxyfleet_gateway_bytes_received_total{pool="default/web",upstream="default/web-1"} 200"#,
            r#"proxyfleet_gateway_upstream_errors_total{pool="default/web",upstream="default/web-2"} 1"#,
            r#"proxyfleet_gateway_retries_total{pool="default/web"} 1"#,
            r#"proxyfleet_gateway_refused_total{reason="auth"} 1"#,
            "proxyfleet_gateway_added_seconds_count 1",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
        metrics.forget_upstream(Some("default/web"), "default/web-1");
        let text = encode();
        assert!(!text.contains("web-1"), "a forgotten upstream's series stay:\n{text}");
        assert!(text.contains("default/solo"), "{text}");
    }
}
