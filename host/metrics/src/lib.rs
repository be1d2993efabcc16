//! The operator's metrics, in one Prometheus registry that both modes
//! record into, and [`serve`], the endpoint scrapers read them from.
//!
//! Names carry the `proxyfleet_` prefix; counters get `_total` from the
//! encoder. Labels are provider entry names, error classes, pools and (for
//! the gateway) Proxy names: sets fixed by configuration and the fleet,
//! never by traffic.

pub mod gateway;
mod serve;

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use proxyfleet_core::gc::GcReport;
use proxyfleet_core::observe::CallObserver;
use proxyfleet_core::{ErrorClass, ProviderError};

pub use gateway::{ADDED_BUCKETS, GatewayMetrics, GatewayTotals, UpstreamTotals};
pub use serve::{MAX_CONNECTIONS, serve};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EntryLabels {
    entry: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    entry: String,
    operation: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    operation: String,
}

/// How many Proxies the health engine holds in each verdict.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HealthCounts {
    /// Passing their probes.
    pub healthy: u64,
    /// Failing them.
    pub unhealthy: u64,
    /// Probed too few times for a verdict.
    pub unknown: u64,
}

/// Every metric of the operator.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    gc_found: Family<EntryLabels, Counter>,
    gc_deleted: Family<EntryLabels, Counter>,
    gc_skipped_foreign: Family<EntryLabels, Counter>,
    gc_skipped_other_installation: Family<EntryLabels, Counter>,
    gc_skipped_young: Family<EntryLabels, Counter>,
    gc_failed: Family<EntryLabels, Counter>,
    provider_healthy: Family<EntryLabels, Gauge>,
    provider_checks_failed: Family<EntryLabels, Counter>,
    reconciles: Family<OutcomeLabels, Counter>,
    reconcile_seconds: Histogram,
    provider_calls: Family<CallLabels, Counter>,
    provider_call_seconds: Family<OperationLabels, Histogram>,
    plugin_faults: Family<EntryLabels, Counter>,
    proxies: Family<StateLabels, Gauge>,
    health: Family<StateLabels, Gauge>,
    probes: Family<OutcomeLabels, Counter>,
    probe_seconds: Histogram,
    health_round_seconds: Gauge<f64, AtomicU64>,
    leases_active: Gauge,
    leases_granted: Counter,
    reports: Family<KindLabels, Counter>,
    replacements: Counter,
    plugin_swaps: Family<EntryLabels, Counter>,
    plugin_rejections: Family<EntryLabels, Counter>,
    gateway: GatewayMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry with every metric, all at zero.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("proxyfleet");
        let family = || Family::<EntryLabels, Counter>::default();
        let (gc_found, gc_deleted, gc_skipped_foreign, gc_skipped_young, gc_failed) =
            (family(), family(), family(), family(), family());
        registry.register("gc_found", "Instances orphan collection listed", gc_found.clone());
        registry.register(
            "gc_deleted",
            "Orphans deleted (or, in a dry run, that would have been)",
            gc_deleted.clone(),
        );
        registry.register(
            "gc_skipped_foreign",
            "Instances without our ownership mark, left alone",
            gc_skipped_foreign.clone(),
        );
        let gc_skipped_other_installation = family();
        registry.register(
            "gc_skipped_other_installation",
            "Instances marked by another installation sharing the backend, left alone",
            gc_skipped_other_installation.clone(),
        );
        registry.register(
            "gc_skipped_young",
            "Orphans younger than the minimum age",
            gc_skipped_young.clone(),
        );
        registry.register("gc_failed", "Orphans whose delete failed", gc_failed.clone());
        let provider_healthy = Family::<EntryLabels, Gauge>::default();
        registry.register(
            "provider_healthy",
            "1 when the entry's last check passed, 0 otherwise",
            provider_healthy.clone(),
        );
        let provider_checks_failed = Family::<EntryLabels, Counter>::default();
        registry.register(
            "provider_checks_failed",
            "Provider checks that did not pass",
            provider_checks_failed.clone(),
        );
        let reconciles = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "reconciles",
            "Reconcile passes by outcome (ok or the error class)",
            reconciles.clone(),
        );
        let reconcile_seconds = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        registry.register(
            "reconcile_seconds",
            "Duration of a reconcile pass",
            reconcile_seconds.clone(),
        );
        let provider_calls = Family::<CallLabels, Counter>::default();
        registry.register(
            "provider_calls",
            "Provider calls by entry, operation and outcome (ok or the error class)",
            provider_calls.clone(),
        );
        let provider_call_seconds =
            Family::<OperationLabels, Histogram>::new_with_constructor(call_histogram as fn() -> _);
        registry.register(
            "provider_call_seconds",
            "Duration of a provider call by operation, from when it got a slot under the entry's limits",
            provider_call_seconds.clone(),
        );
        let plugin_faults = Family::<EntryLabels, Counter>::default();
        registry.register(
            "plugin_faults",
            "Plugin calls that trapped, ran out of time or memory",
            plugin_faults.clone(),
        );
        let proxies = Family::<StateLabels, Gauge>::default();
        registry.register("proxies", "Proxies by phase", proxies.clone());
        let health = Family::<StateLabels, Gauge>::default();
        registry.register(
            "proxies_health",
            "Probed Proxies by verdict (healthy, unhealthy, unknown)",
            health.clone(),
        );
        let probes = Family::<OutcomeLabels, Counter>::default();
        registry.register("health_probes", "Health probes by outcome", probes.clone());
        let probe_seconds = call_histogram();
        registry.register(
            "health_probe_seconds",
            "Duration of a passing health probe",
            probe_seconds.clone(),
        );
        let health_round_seconds = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "health_round_seconds",
            "Wall time of the last round of health probes (keep it below --health-interval)",
            health_round_seconds.clone(),
        );
        let leases_active = Gauge::default();
        registry.register("leases_active", "Leases held now", leases_active.clone());
        let leases_granted = Counter::default();
        registry.register("leases_granted", "Leases granted", leases_granted.clone());
        let reports = Family::<KindLabels, Counter>::default();
        registry.register(
            "proxy_reports",
            "Crawler reports of a banned or failing proxy, by kind",
            reports.clone(),
        );
        let replacements = Counter::default();
        registry.register(
            "proxy_replacements",
            "Proxies replaced after too many reports",
            replacements.clone(),
        );
        let plugin_swaps = Family::<EntryLabels, Counter>::default();
        registry.register(
            "plugin_swaps",
            "Plugin revisions activated (swaps, rollbacks, file removals)",
            plugin_swaps.clone(),
        );
        let plugin_rejections = Family::<EntryLabels, Counter>::default();
        registry.register(
            "plugin_rejections",
            "Plugin candidates refused before activation",
            plugin_rejections.clone(),
        );
        let gateway = GatewayMetrics::register(&mut registry);
        Self {
            registry,
            gateway,
            plugin_swaps,
            plugin_rejections,
            provider_calls,
            provider_call_seconds,
            plugin_faults,
            proxies,
            health,
            probes,
            probe_seconds,
            health_round_seconds,
            leases_active,
            leases_granted,
            reports,
            replacements,
            gc_found,
            gc_deleted,
            gc_skipped_foreign,
            gc_skipped_other_installation,
            gc_skipped_young,
            gc_failed,
            provider_healthy,
            provider_checks_failed,
            reconciles,
            reconcile_seconds,
        }
    }

    /// Records one orphan collection of `entry`.
    pub fn record_gc(&self, entry: &str, report: &GcReport) {
        let labels = EntryLabels { entry: entry.to_owned() };
        let add = |family: &Family<EntryLabels, Counter>, n: usize| {
            family.get_or_create(&labels).inc_by(n as u64);
        };
        add(&self.gc_found, report.found);
        add(&self.gc_deleted, report.deleted.len());
        add(&self.gc_skipped_foreign, report.skipped_foreign);
        add(&self.gc_skipped_other_installation, report.skipped_other_installation);
        add(&self.gc_skipped_young, report.skipped_young);
        add(&self.gc_failed, report.failed.len());
    }

    /// Records and logs the outcome of one orphan collection of `entry`:
    /// both modes report it the same way.
    pub fn observe_gc(&self, entry: &str, report: &Result<GcReport, ProviderError>, dry_run: bool) {
        match report {
            Ok(report) => {
                self.record_gc(entry, report);
                if dry_run && !report.deleted.is_empty() {
                    tracing::warn!(entry, would_delete = ?report.deleted, "orphans found (dry run: nothing deleted)");
                } else {
                    tracing::info!(
                        entry,
                        found = report.found,
                        deleted = report.deleted.len(),
                        skipped_foreign = report.skipped_foreign,
                        skipped_other_installation = report.skipped_other_installation,
                        skipped_young = report.skipped_young,
                        failed = report.failed.len(),
                        "orphan collection"
                    );
                }
            }
            Err(err) => tracing::warn!(entry, "orphan collection failed: {err}"),
        }
    }

    /// Records one provider check of `entry`.
    pub fn record_check(&self, entry: &str, healthy: bool) {
        let labels = EntryLabels { entry: entry.to_owned() };
        self.provider_healthy.get_or_create(&labels).set(i64::from(healthy));
        if !healthy {
            self.provider_checks_failed.get_or_create(&labels).inc();
        }
    }

    /// Records one reconcile pass.
    pub fn record_reconcile(&self, elapsed: Duration, error: Option<ErrorClass>) {
        self.reconcile_seconds.observe(elapsed.as_secs_f64());
        let outcome = error.map_or("ok", ErrorClass::as_str).to_owned();
        self.reconciles.get_or_create(&OutcomeLabels { outcome }).inc();
    }

    /// Records one provider call; `fault` marks a plugin that trapped or
    /// ran out of time or memory.
    pub fn record_provider_call(
        &self,
        entry: &str,
        operation: &str,
        elapsed: Duration,
        error: Option<ErrorClass>,
        fault: bool,
    ) {
        let outcome = error.map_or("ok", ErrorClass::as_str).to_owned();
        self.provider_calls
            .get_or_create(&CallLabels {
                entry: entry.to_owned(),
                operation: operation.to_owned(),
                outcome,
            })
            .inc();
        self.provider_call_seconds
            .get_or_create(&OperationLabels { operation: operation.to_owned() })
            .observe(elapsed.as_secs_f64());
        if fault {
            self.plugin_faults.get_or_create(&EntryLabels { entry: entry.to_owned() }).inc();
        }
    }

    /// Sets the Proxy count of every phase; phases not named drop to zero.
    pub fn set_phases<'a>(&self, counts: impl IntoIterator<Item = (&'a str, u64)>) {
        self.proxies.clear();
        for (phase, count) in counts {
            let gauge = self.proxies.get_or_create(&StateLabels { state: phase.to_owned() });
            gauge.set(i64::try_from(count).unwrap_or(i64::MAX));
        }
    }

    /// Records one health probe.
    pub fn record_probe(&self, elapsed: Duration, passed: bool) {
        let outcome = if passed { "passed" } else { "failed" }.to_owned();
        self.probes.get_or_create(&OutcomeLabels { outcome }).inc();
        if passed {
            self.probe_seconds.observe(elapsed.as_secs_f64());
        }
    }

    /// Records how long a whole round of probes took.
    pub fn record_health_round(&self, elapsed: Duration) {
        self.health_round_seconds.set(elapsed.as_secs_f64());
    }

    /// Sets the verdict gauges after a round of probes.
    pub fn set_health(&self, counts: HealthCounts) {
        for (state, count) in [
            ("healthy", counts.healthy),
            ("unhealthy", counts.unhealthy),
            ("unknown", counts.unknown),
        ] {
            let gauge = self.health.get_or_create(&StateLabels { state: state.to_owned() });
            gauge.set(i64::try_from(count).unwrap_or(i64::MAX));
        }
    }

    /// Sets how many leases are held and counts new grants.
    pub fn record_leases(&self, active: usize, granted: u64) {
        self.leases_active.set(i64::try_from(active).unwrap_or(i64::MAX));
        self.leases_granted.inc_by(granted);
    }

    /// Records a crawler's report; `replacing` when it pushed the proxy
    /// past the replacement threshold.
    pub fn record_report(&self, kind: &str, replacing: bool) {
        self.reports.get_or_create(&KindLabels { kind: kind.to_owned() }).inc();
        if replacing {
            self.replacements.inc();
        }
    }

    /// Brings the swap and rejection counters of `entry` up to the totals
    /// its registry reports; callers may call it as often as they like.
    pub fn observe_revisions(&self, entry: &str, swaps: u64, rejections: u64) {
        let labels = EntryLabels { entry: entry.to_owned() };
        for (family, total) in [(&self.plugin_swaps, swaps), (&self.plugin_rejections, rejections)]
        {
            let counter = family.get_or_create(&labels);
            let seen = counter.get();
            if total > seen {
                counter.inc_by(total - seen);
            }
        }
    }

    /// The gateway's metrics.
    pub fn gateway(&self) -> &GatewayMetrics {
        &self.gateway
    }

    /// Everything, in the Prometheus text format.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}

/// The runtime reports every provider call here when a mode hands the
/// metrics to it as its observer.
impl CallObserver for Metrics {
    fn provider_call(
        &self,
        entry: &str,
        operation: &str,
        elapsed: Duration,
        error: Option<ErrorClass>,
        fault: bool,
    ) {
        self.record_provider_call(entry, operation, elapsed, error, fault);
    }
}

/// Buckets from 1 ms to about 65 s.
fn call_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gc_checks_and_reconciles_show_up_with_their_labels() {
        let metrics = Metrics::new();
        let report = GcReport {
            found: 4,
            deleted: vec!["a".into()],
            skipped_foreign: 2,
            skipped_other_installation: 1,
            ..GcReport::default()
        };
        metrics.record_gc("pve", &report);
        metrics.record_check("pve", false);
        metrics.record_reconcile(Duration::from_millis(3), Some(ErrorClass::QuotaExceeded));
        let text = metrics.encode();
        for line in [
            "proxyfleet_gc_found_total{entry=\"pve\"} 4",
            "proxyfleet_gc_deleted_total{entry=\"pve\"} 1",
            "proxyfleet_gc_skipped_foreign_total{entry=\"pve\"} 2",
            "proxyfleet_gc_skipped_other_installation_total{entry=\"pve\"} 1",
            "proxyfleet_provider_healthy{entry=\"pve\"} 0",
            "proxyfleet_provider_checks_failed_total{entry=\"pve\"} 1",
            "proxyfleet_reconciles_total{outcome=\"quota-exceeded\"} 1",
            "proxyfleet_reconcile_seconds_count 1",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
    }

    #[test]
    fn fleet_probe_lease_and_call_metrics_show_up() {
        let metrics = Metrics::new();
        metrics.record_provider_call(
            "pve",
            "create",
            Duration::from_millis(20),
            Some(ErrorClass::Transient),
            true,
        );
        metrics.set_phases([("Running", 3), ("Pending", 1)]);
        metrics.set_phases([("Running", 4)]);
        metrics.record_probe(Duration::from_millis(2), true);
        metrics.record_probe(Duration::from_millis(2), false);
        metrics.record_health_round(Duration::from_millis(1500));
        metrics.set_health(HealthCounts { healthy: 3, unhealthy: 1, unknown: 0 });
        metrics.record_leases(2, 5);
        metrics.record_report("ban", true);
        metrics.observe_revisions("pve", 2, 1);
        metrics.observe_revisions("pve", 3, 1);
        let text = metrics.encode();
        for line in [
            "proxyfleet_provider_calls_total{entry=\"pve\",operation=\"create\",outcome=\"transient\"} 1",
            "proxyfleet_provider_call_seconds_count{operation=\"create\"} 1",
            "proxyfleet_plugin_faults_total{entry=\"pve\"} 1",
            "proxyfleet_proxies{state=\"Running\"} 4",
            "proxyfleet_health_probes_total{outcome=\"passed\"} 1",
            "proxyfleet_health_probes_total{outcome=\"failed\"} 1",
            "proxyfleet_proxies_health{state=\"unhealthy\"} 1",
            "proxyfleet_health_round_seconds 1.5",
            "proxyfleet_leases_active 2",
            "proxyfleet_leases_granted_total 5",
            "proxyfleet_proxy_reports_total{kind=\"ban\"} 1",
            "proxyfleet_proxy_replacements_total 1",
            "proxyfleet_plugin_swaps_total{entry=\"pve\"} 3",
            "proxyfleet_plugin_rejections_total{entry=\"pve\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
        assert!(!text.contains("state=\"Pending\""), "a phase no Proxy is in stays: {text}");
    }
}
