//! The operator's metrics, in one Prometheus registry that both modes
//! record into, and [`serve`], the endpoint scrapers read them from.
//!
//! Names carry the `proxyfleet_` prefix; counters get `_total` from the
//! encoder. Labels are provider entry names, error classes and pools (and,
//! only when asked for, the gateway's upstream Proxies): sets fixed by
//! configuration and the fleet, never by traffic. The `process_*` metrics
//! ([`process`]) carry no prefix, as every Prometheus client names them.
//!
//! Some series describe what only the leader knows (pools, provider
//! checks): [`Metrics::forget_leader_state`] drops them when a replica
//! stops leading, so no dashboard or alert sums a former leader's stale
//! values with the new one's. Proxies by phase and verdict are each
//! replica's catalog's, kept current on every replica; dashboards count
//! the leader's (`and on (instance) proxyfleet_leader == 1`).

pub mod gateway;
pub mod process;
mod serve;

use std::collections::HashSet;
use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, PoisonError};
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
struct EntryOperationLabels {
    entry: String,
    operation: String,
}

/// A pool (`namespace/name`; empty for Proxies in none) and a state.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolStateLabels {
    pool: String,
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
}

/// A pool's member counts, as its controller decided them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolCounts {
    /// The replicas it asks for.
    pub desired: u32,
    /// Members ready now.
    pub ready: u32,
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

/// What a registry exports beyond its fixed set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MetricsOptions {
    /// The gateway's request, byte and error counters per upstream Proxy
    /// as well as per pool: one series per Proxy, so off by default.
    pub gateway_upstreams: bool,
}

/// Every metric of the operator.
#[derive(Debug)]
pub struct Metrics {
    /// The `process_*` metrics, and the rest under the prefix.
    registry: Registry,
    /// The pools [`Metrics::set_pool`] has set, so that
    /// [`Metrics::retain_pools`] can drop the others.
    pools_seen: Mutex<HashSet<String>>,
    gc_found: Family<EntryLabels, Counter>,
    gc_deleted: Family<EntryLabels, Counter>,
    gc_skipped_foreign: Family<EntryLabels, Counter>,
    gc_skipped_other_installation: Family<EntryLabels, Counter>,
    gc_skipped_young: Family<EntryLabels, Counter>,
    gc_failed: Family<EntryLabels, Counter>,
    provider_healthy: Family<EntryLabels, Gauge>,
    provider_available: Family<EntryLabels, Gauge>,
    provider_checks_failed: Family<EntryLabels, Counter>,
    reconciles: Family<OutcomeLabels, Counter>,
    reconcile_seconds: Histogram,
    provider_calls: Family<CallLabels, Counter>,
    provider_call_seconds: Family<EntryOperationLabels, Histogram>,
    plugin_faults: Family<EntryLabels, Counter>,
    proxies: Family<PoolStateLabels, Gauge>,
    health: Family<PoolStateLabels, Gauge>,
    pool_replicas: Family<PoolLabels, Gauge>,
    pool_ready_replicas: Family<PoolLabels, Gauge>,
    leader: Gauge,
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
    /// A registry with every metric, all at zero, and the per-upstream
    /// gateway series left out.
    pub fn new() -> Self {
        Self::with_options(MetricsOptions::default())
    }

    /// A registry with every metric, all at zero.
    pub fn with_options(options: MetricsOptions) -> Self {
        let mut root = Registry::default();
        process::register(&mut root);
        let registry = root.sub_registry_with_prefix("proxyfleet");
        let build = prometheus_client::metrics::info::Info::new(BuildLabels {
            version: env!("CARGO_PKG_VERSION").to_owned(),
        });
        registry.register("build", "The operator's version", build);
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this replica leads (always, standalone), 0 otherwise",
            leader.clone(),
        );
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
        let provider_available = Family::<EntryLabels, Gauge>::default();
        registry.register(
            "provider_available",
            "1 when a plugin serves the entry, 0 while it loads or failed",
            provider_available.clone(),
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
        let provider_call_seconds = Family::<EntryOperationLabels, Histogram>::new_with_constructor(
            call_histogram as fn() -> _,
        );
        registry.register(
            "provider_call_seconds",
            "Duration of a provider call by entry and operation, from when it got a slot under the entry's limits",
            provider_call_seconds.clone(),
        );
        let plugin_faults = Family::<EntryLabels, Counter>::default();
        registry.register(
            "plugin_faults",
            "Plugin calls that trapped, ran out of time or memory",
            plugin_faults.clone(),
        );
        let proxies = Family::<PoolStateLabels, Gauge>::default();
        registry.register("proxies", "Proxies by pool and phase", proxies.clone());
        let health = Family::<PoolStateLabels, Gauge>::default();
        registry.register(
            "proxies_health",
            "Probed Proxies by pool and verdict (healthy, unhealthy, unknown)",
            health.clone(),
        );
        let pool_replicas = Family::<PoolLabels, Gauge>::default();
        registry.register("pool_replicas", "The members a pool asks for", pool_replicas.clone());
        let pool_ready_replicas = Family::<PoolLabels, Gauge>::default();
        registry.register(
            "pool_ready_replicas",
            "A pool's members that are ready",
            pool_ready_replicas.clone(),
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
        // Outcomes known in advance start at zero, so that rate() sees the
        // first of them.
        for outcome in ["passed", "failed"] {
            drop(probes.get_or_create(&OutcomeLabels { outcome: outcome.to_owned() }));
        }
        drop(reconciles.get_or_create(&OutcomeLabels { outcome: "ok".to_owned() }));
        let gateway = GatewayMetrics::register(registry, options.gateway_upstreams);
        Self {
            registry: root,
            pools_seen: Mutex::default(),
            gateway,
            leader,
            pool_replicas,
            pool_ready_replicas,
            provider_available,
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
            .get_or_create(&EntryOperationLabels {
                entry: entry.to_owned(),
                operation: operation.to_owned(),
            })
            .observe(elapsed.as_secs_f64());
        if fault {
            self.plugin_faults.get_or_create(&EntryLabels { entry: entry.to_owned() }).inc();
        }
    }

    /// Sets the Proxy count of every `(pool, phase)` (pool `""` for
    /// Proxies in none); pairs not named are dropped.
    pub fn set_phases<'a>(&self, counts: impl IntoIterator<Item = ((&'a str, &'a str), u64)>) {
        self.proxies.clear();
        for ((pool, phase), count) in counts {
            let labels = PoolStateLabels { pool: pool.to_owned(), state: phase.to_owned() };
            self.proxies.get_or_create(&labels).set(i64::try_from(count).unwrap_or(i64::MAX));
        }
    }

    /// Sets the member counts of every pool the leader reconciles; pools
    /// not named are dropped.
    pub fn set_pools<'a>(&self, pools: impl IntoIterator<Item = (&'a str, PoolCounts)>) {
        let mut live = HashSet::new();
        for (pool, counts) in pools {
            self.set_pool(pool, counts);
            live.insert(pool.to_owned());
        }
        self.retain_pools(&live);
    }

    /// Sets the member counts of one pool (`namespace/name`).
    pub fn set_pool(&self, pool: &str, counts: PoolCounts) {
        let labels = PoolLabels { pool: pool.to_owned() };
        self.pool_replicas.get_or_create(&labels).set(i64::from(counts.desired));
        self.pool_ready_replicas.get_or_create(&labels).set(i64::from(counts.ready));
        self.pools_seen().insert(labels.pool);
    }

    /// Drops the counts of pools not in `live`.
    pub fn retain_pools(&self, live: &HashSet<String>) {
        self.pools_seen().retain(|pool| {
            let keep = live.contains(pool);
            if !keep {
                let labels = PoolLabels { pool: pool.clone() };
                self.pool_replicas.remove(&labels);
                self.pool_ready_replicas.remove(&labels);
            }
            keep
        });
    }

    fn pools_seen(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.pools_seen.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether this replica leads now.
    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    /// Starts the counters of `entry` at zero, so that rate() and
    /// increase() see its first fault, swap or refusal.
    pub fn init_entry(&self, entry: &str) {
        let labels = EntryLabels { entry: entry.to_owned() };
        for family in [
            &self.plugin_faults,
            &self.plugin_swaps,
            &self.plugin_rejections,
            &self.provider_checks_failed,
            &self.gc_found,
            &self.gc_deleted,
            &self.gc_failed,
        ] {
            drop(family.get_or_create(&labels));
        }
    }

    /// Starts the report counters of each of `kinds` at zero.
    pub fn init_report_kinds<'a>(&self, kinds: impl IntoIterator<Item = &'a str>) {
        for kind in kinds {
            drop(self.reports.get_or_create(&KindLabels { kind: kind.to_owned() }));
        }
    }

    /// Records whether a plugin serves `entry`.
    pub fn record_available(&self, entry: &str, available: bool) {
        let labels = EntryLabels { entry: entry.to_owned() };
        self.provider_available.get_or_create(&labels).set(i64::from(available));
    }

    /// Drops what only the leader knows (pools, provider checks and
    /// availability): a replica that stopped leading no longer reports
    /// them.
    pub fn forget_leader_state(&self) {
        self.pool_replicas.clear();
        self.pool_ready_replicas.clear();
        self.pools_seen().clear();
        self.provider_healthy.clear();
        self.provider_available.clear();
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

    /// Sets the verdict gauges of every pool (`""`: Proxies in none)
    /// after a round of probes; pools not named are dropped. The Proxies in
    /// no pool are always reported, at zero when there are none.
    pub fn set_health<'a>(&self, counts: impl IntoIterator<Item = (&'a str, HealthCounts)>) {
        self.health.clear();
        let set = |pool: &str, counts: HealthCounts| {
            for (state, count) in [
                ("healthy", counts.healthy),
                ("unhealthy", counts.unhealthy),
                ("unknown", counts.unknown),
            ] {
                let labels = PoolStateLabels { pool: pool.to_owned(), state: state.to_owned() };
                self.health.get_or_create(&labels).set(i64::try_from(count).unwrap_or(i64::MAX));
            }
        };
        let mut seen_no_pool = false;
        for (pool, counts) in counts {
            seen_no_pool |= pool.is_empty();
            set(pool, counts);
        }
        if !seen_no_pool {
            set("", HealthCounts::default());
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

    /// Everything, in the OpenMetrics text format.
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
        metrics.set_phases([(("default/web", "Running"), 3), (("", "Pending"), 1)]);
        metrics.set_phases([(("default/web", "Running"), 4)]);
        metrics.record_probe(Duration::from_millis(2), true);
        metrics.record_probe(Duration::from_millis(2), false);
        metrics.record_health_round(Duration::from_millis(1500));
        metrics
            .set_health([("default/web", HealthCounts { healthy: 3, unhealthy: 1, unknown: 0 })]);
        metrics.record_leases(2, 5);
        metrics.record_report("ban", true);
        metrics.observe_revisions("pve", 2, 1);
        metrics.observe_revisions("pve", 3, 1);
        let text = metrics.encode();
        for line in [
            "proxyfleet_provider_calls_total{entry=\"pve\",operation=\"create\",outcome=\"transient\"} 1",
            "proxyfleet_provider_call_seconds_count{entry=\"pve\",operation=\"create\"} 1",
            "proxyfleet_plugin_faults_total{entry=\"pve\"} 1",
            "proxyfleet_proxies{pool=\"default/web\",state=\"Running\"} 4",
            "proxyfleet_health_probes_total{outcome=\"passed\"} 1",
            "proxyfleet_health_probes_total{outcome=\"failed\"} 1",
            "proxyfleet_proxies_health{pool=\"default/web\",state=\"unhealthy\"} 1",
            // Proxies in no pool are reported, at zero, when there are none.
            "proxyfleet_proxies_health{pool=\"\",state=\"healthy\"} 0",
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

    #[test]
    fn leader_build_pools_and_availability_show_up_and_leadership_loss_drops_its_series() {
        let metrics = Metrics::new();
        metrics.set_leader(true);
        metrics.record_available("pve", true);
        metrics.record_check("pve", true);
        metrics.set_pools([
            ("default/web", PoolCounts { desired: 3, ready: 2 }),
            ("default/old", PoolCounts { desired: 1, ready: 1 }),
        ]);
        metrics.set_pool("default/web", PoolCounts { desired: 3, ready: 3 });
        metrics.retain_pools(&HashSet::from(["default/web".to_owned()]));
        let text = metrics.encode();
        let build = format!("proxyfleet_build_info{{version=\"{}\"}} 1", env!("CARGO_PKG_VERSION"));
        for line in [
            build.as_str(),
            "proxyfleet_leader 1",
            "proxyfleet_provider_available{entry=\"pve\"} 1",
            "proxyfleet_pool_replicas{pool=\"default/web\"} 3",
            "proxyfleet_pool_ready_replicas{pool=\"default/web\"} 3",
            "process_cpu_seconds_total ",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
        assert!(!text.contains("default/old"), "a deleted pool's series stay: {text}");
        metrics.set_leader(false);
        metrics.forget_leader_state();
        let text = metrics.encode();
        assert!(text.contains("proxyfleet_leader 0"), "{text}");
        for gone in ["pool=\"default/web\"", "entry=\"pve\""] {
            assert!(!text.contains(gone), "{gone} stays after leadership is lost: {text}");
        }
    }
}
