//! Orphan collection over every serving entry (the rules are
//! [`proxyfleet_core::gc`]'s).

use std::collections::HashSet;
use std::time::Duration;

use proxyfleet_core::ProviderError;
use proxyfleet_core::clock::unix_now;
use proxyfleet_core::gc::{GcReport, collect_orphans};
use proxyfleet_core::source::{EntryState, ProviderSource};
use proxyfleet_metrics::Metrics;

/// How orphans are collected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GcSettings {
    /// An orphan younger than this is left for a later round.
    pub min_age: Duration,
    /// Report what would be deleted, delete nothing.
    pub dry_run: bool,
}

/// Collects the orphans of every serving entry of `source`, one entry
/// after the other (a backend is never asked for two lists at once).
/// `live_uids` are the UIDs of every Proxy of the installation, including
/// those being deleted. Entries that are loading or failed are left for
/// a later round. Each report is logged and counted in `metrics`.
pub async fn collect_garbage(
    source: &dyn ProviderSource,
    live_uids: &HashSet<String>,
    settings: GcSettings,
    metrics: &Metrics,
) -> Vec<(String, Result<GcReport, ProviderError>)> {
    let mut reports = Vec::new();
    for (entry, state) in source.entries() {
        let EntryState::Ready(provider) = state else { continue };
        let report = collect_orphans(
            provider.as_ref(),
            source.installation(),
            live_uids,
            settings.min_age,
            unix_now(),
            settings.dry_run,
        )
        .await;
        metrics.observe_gc(&entry, &report, settings.dry_run);
        reports.push((entry, report));
    }
    reports
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use proxyfleet_core::fake::FakeProvider;
    use proxyfleet_core::installation::InstallationId;
    use proxyfleet_core::source::StaticSource;
    use proxyfleet_core::{Instance, InstanceState, OwnershipMark};

    use super::*;

    fn marked(id: &str, uid: &str, installation: &InstallationId) -> Instance {
        Instance {
            provider_id: id.into(),
            name: id.into(),
            state: InstanceState::Running,
            addresses: Vec::new(),
            port: None,
            created_at: Some(0),
            mark: Some(OwnershipMark {
                uid: uid.into(),
                namespace: "crawl".into(),
                name: uid.into(),
                created_at: 0,
                installation: installation.as_str().into(),
            }),
        }
    }

    #[tokio::test]
    async fn only_serving_entries_are_collected_and_only_their_orphans() {
        let installation = InstallationId::default();
        let backend = Arc::new(FakeProvider::new("lab"));
        backend.insert(marked("vm-live", "uid-live", &installation));
        backend.insert(marked("vm-orphan", "uid-gone", &installation));
        let source = StaticSource::new(installation)
            .with("lab", EntryState::Ready(Arc::clone(&backend) as _))
            .with("loading", EntryState::Loading);
        let live = HashSet::from(["uid-live".to_owned()]);
        let metrics = Metrics::new();
        let settings = GcSettings { min_age: Duration::from_secs(60), dry_run: false };

        let reports = collect_garbage(&source, &live, settings, &metrics).await;

        assert_eq!(reports.len(), 1, "{reports:?}");
        let (entry, report) = &reports[0];
        assert_eq!(entry, "lab");
        assert_eq!(report.as_ref().unwrap().deleted, ["vm-orphan"]);
        assert_eq!(backend.instances().keys().collect::<Vec<_>>(), ["vm-live"]);
    }
}
