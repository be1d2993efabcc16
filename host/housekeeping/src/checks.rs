//! Provider checks: every entry at once, each bounded in time.

use std::time::Duration;

use proxyfleet_core::source::{EntryState, ProviderSource, STILL_LOADING};
use proxyfleet_core::{Health, HealthReason, PluginInfo};
use proxyfleet_metrics::Metrics;

/// The longest one check may take, whatever the interval: a backend that
/// hangs must not hold up the next round.
pub const MAX_CHECK_TIME: Duration = Duration::from_secs(15);

/// The time a check gets when checks run every `interval`.
pub fn check_timeout(interval: Duration) -> Duration {
    interval.min(MAX_CHECK_TIME)
}

/// Whether an entry had a plugin to check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Availability {
    /// Its plugin is still loading.
    Loading,
    /// It has no plugin serving, with why.
    Failed(String),
    /// This plugin answered (or ran out of time).
    Loaded(PluginInfo),
}

/// What one check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryCheck {
    /// Entry name.
    pub entry: String,
    /// Whether it had a plugin.
    pub availability: Availability,
    /// Its health: a loading entry is unhealthy (`Other`), a failed one
    /// `Misconfigured` with the reason, a check that ran out of time
    /// `Timeout`.
    pub health: Health,
}

/// Checks every entry of `source` concurrently, each within
/// [`check_timeout`] of `interval`; logs each failure and records each
/// result in `metrics`. Results are in entry-name order.
pub async fn check_entries(
    source: &dyn ProviderSource,
    interval: Duration,
    metrics: &Metrics,
) -> Vec<EntryCheck> {
    let timeout = check_timeout(interval);
    let checks = source.entries().into_iter().map(|(entry, state)| async move {
        metrics.init_entry(&entry);
        let (availability, health) = match state {
            EntryState::Loading => {
                (Availability::Loading, Health::unhealthy(HealthReason::Other, STILL_LOADING))
            }
            EntryState::Failed(reason) => (
                Availability::Failed(reason.clone()),
                Health::unhealthy(HealthReason::Misconfigured, reason),
            ),
            EntryState::Ready(provider) => {
                let info = provider.info();
                let health =
                    tokio::time::timeout(timeout, provider.check()).await.unwrap_or_else(|_| {
                        Health::unhealthy(
                            HealthReason::Timeout,
                            format!("the check did not answer within {timeout:?}"),
                        )
                    });
                (Availability::Loaded(info), health)
            }
        };
        if health.healthy {
            tracing::debug!(entry = %entry, "provider check passed");
        } else {
            tracing::warn!(entry = %entry, issues = ?health.issues, "provider check failed");
        }
        metrics.record_check(&entry, health.healthy);
        metrics.record_available(&entry, matches!(availability, Availability::Loaded(_)));
        EntryCheck { entry, availability, health }
    });
    futures::future::join_all(checks).await
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use proxyfleet_core::fake::FakeProvider;
    use proxyfleet_core::installation::InstallationId;
    use proxyfleet_core::source::StaticSource;

    use super::*;

    fn source() -> StaticSource {
        StaticSource::new(InstallationId::default())
            .with("ok", EntryState::Ready(Arc::new(FakeProvider::new("ok"))))
            .with("loading", EntryState::Loading)
            .with("broken", EntryState::Failed("the plugin file is missing".into()))
            .with("hangs", EntryState::Ready(Arc::new(FakeProvider::new("hangs").checks_hang())))
    }

    #[tokio::test]
    async fn every_entry_is_checked_and_a_hanging_one_times_out() {
        let metrics = Metrics::new();
        let checks = check_entries(&source(), Duration::from_millis(50), &metrics).await;
        let by_entry = |name: &str| checks.iter().find(|c| c.entry == name).expect(name).clone();

        assert_eq!(
            checks.iter().map(|c| c.entry.as_str()).collect::<Vec<_>>(),
            ["broken", "hangs", "loading", "ok"]
        );
        let ok = by_entry("ok");
        assert!(ok.health.healthy);
        assert!(matches!(ok.availability, Availability::Loaded(_)));

        let hangs = by_entry("hangs");
        assert_eq!(hangs.health.issues[0].reason, HealthReason::Timeout);
        assert!(hangs.health.issues[0].message.contains("50ms"), "{hangs:?}");

        let loading = by_entry("loading");
        assert_eq!(loading.availability, Availability::Loading);
        assert_eq!(loading.health.issues[0].reason, HealthReason::Other);

        let broken = by_entry("broken");
        assert_eq!(broken.availability, Availability::Failed("the plugin file is missing".into()));
        assert_eq!(broken.health.issues[0].reason, HealthReason::Misconfigured);

        let exposition = metrics.encode();
        assert!(exposition.contains("proxyfleet_provider_healthy{entry=\"ok\"} 1"), "{exposition}");
        assert!(
            exposition.contains("proxyfleet_provider_healthy{entry=\"hangs\"} 0"),
            "{exposition}"
        );
    }

    #[test]
    fn a_short_interval_shortens_the_check() {
        assert_eq!(check_timeout(Duration::from_secs(5)), Duration::from_secs(5));
        assert_eq!(check_timeout(Duration::from_secs(300)), MAX_CHECK_TIME);
    }
}
