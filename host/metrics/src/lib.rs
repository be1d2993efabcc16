//! The operator's metrics, in one Prometheus registry that both modes
//! record into, and [`serve`], the endpoint scrapers read them from.
//!
//! Names carry the `proxyfleet_` prefix; counters get `_total` from the
//! encoder. Labels are provider entry names and error classes only: both
//! sets are small and fixed by configuration, never by traffic.

mod serve;

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use proxyfleet_core::gc::GcReport;
use proxyfleet_core::{ErrorClass, ProviderError};

pub use serve::serve;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EntryLabels {
    entry: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: String,
}

/// Every metric of the operator.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    gc_found: Family<EntryLabels, Counter>,
    gc_deleted: Family<EntryLabels, Counter>,
    gc_skipped_foreign: Family<EntryLabels, Counter>,
    gc_skipped_young: Family<EntryLabels, Counter>,
    gc_failed: Family<EntryLabels, Counter>,
    provider_healthy: Family<EntryLabels, Gauge>,
    provider_checks_failed: Family<EntryLabels, Counter>,
    reconciles: Family<OutcomeLabels, Counter>,
    reconcile_seconds: Histogram,
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
        Self {
            registry,
            gc_found,
            gc_deleted,
            gc_skipped_foreign,
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

    /// Everything, in the Prometheus text format.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
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
            "proxyfleet_provider_healthy{entry=\"pve\"} 0",
            "proxyfleet_provider_checks_failed_total{entry=\"pve\"} 1",
            "proxyfleet_reconciles_total{outcome=\"quota-exceeded\"} 1",
            "proxyfleet_reconcile_seconds_count 1",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
    }
}
