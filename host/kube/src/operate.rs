//! What the leader runs in Kubernetes mode: the Proxy and ProxyPool
//! controllers, orphan collection and provider checks, all stopped when
//! leadership is lost.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt as _;
use kube::api::{Api, ListParams};
use proxyfleet_core::gc::collect_orphans;
use proxyfleet_core::reconcile::Policy;
use proxyfleet_core::{HealthReason, Provider as _};
use proxyfleet_runtime::{EntryState, Registry};
use tokio::sync::watch;

use crate::controller::{self, Context};
use crate::crd::Proxy;

/// How the leader works.
#[derive(Debug, Clone)]
pub struct LeaderSettings {
    /// Only Proxies in this namespace; every namespace when `None`.
    pub watch_namespace: Option<String>,
    /// Reconciler timing.
    pub policy: Policy,
    /// How often orphans are collected.
    pub gc_interval: Duration,
    /// Orphans younger than this are left alone.
    pub gc_min_age: Duration,
    /// Log what would be collected instead of deleting it.
    pub gc_dry_run: bool,
    /// How often every provider entry is checked.
    pub check_interval: Duration,
}

/// Runs until `lost` turns true.
pub async fn lead(
    client: kube::Client,
    registry: Arc<Registry>,
    settings: LeaderSettings,
    identity: String,
    lost: watch::Receiver<bool>,
) {
    let context = Arc::new(Context::new(
        client.clone(),
        Arc::clone(&registry),
        settings.policy.clone(),
        Some(identity),
    ));
    let stop = |mut lost: watch::Receiver<bool>| async move {
        let _ = lost.wait_for(|lost| *lost).await;
    };
    let controller =
        controller::run(context, settings.watch_namespace.as_deref(), stop(lost.clone()));
    let pools =
        crate::pool::run(client.clone(), settings.watch_namespace.as_deref(), stop(lost.clone()));
    let controllers = async { tokio::join!(controller, pools) };
    let housekeeping = async {
        let mut gc = tokio::time::interval(settings.gc_interval);
        let mut checks = tokio::time::interval(settings.check_interval);
        loop {
            tokio::select! {
                _ = gc.tick() => collect_garbage(&client, &registry, &settings).await,
                _ = checks.tick() => check_providers(&registry, settings.check_interval).await,
            }
        }
    };
    tokio::select! {
        _ = controllers => {}
        () = housekeeping => {}
        () = stop(lost) => {}
    }
}

async fn collect_garbage(client: &kube::Client, registry: &Registry, settings: &LeaderSettings) {
    let proxies: Api<Proxy> = match &settings.watch_namespace {
        Some(namespace) => Api::namespaced(client.clone(), namespace),
        None => Api::all(client.clone()),
    };
    // Every Proxy of the installation counts as live, including those being
    // deleted: their instances are the finalizer's to remove.
    let live: HashSet<String> = match proxies.list(&ListParams::default()).await {
        Ok(list) => list.items.iter().filter_map(|p| p.uid()).collect(),
        Err(err) => {
            tracing::warn!("orphan collection skipped: cannot list Proxies: {err}");
            return;
        }
    };
    for (entry, state) in registry.entries() {
        let EntryState::Ready(provider) = state else { continue };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        match collect_orphans(
            provider.as_ref(),
            &live,
            settings.gc_min_age,
            now,
            settings.gc_dry_run,
        )
        .await
        {
            Ok(report) if settings.gc_dry_run && !report.deleted.is_empty() => {
                tracing::warn!(entry = %entry, would_delete = ?report.deleted, "orphans found (dry run: nothing deleted)");
            }
            Ok(report) => tracing::info!(
                entry = %entry,
                found = report.found,
                deleted = report.deleted.len(),
                skipped_foreign = report.skipped_foreign,
                skipped_young = report.skipped_young,
                failed = report.failed.len(),
                "orphan collection"
            ),
            Err(err) => tracing::warn!(entry = %entry, "orphan collection failed: {err}"),
        }
    }
}

/// Checks every entry, each bounded by min(15 s, interval) so a hanging
/// backend never holds up the next round.
async fn check_providers(registry: &Registry, interval: Duration) {
    let timeout = interval.min(Duration::from_secs(15));
    for (entry, state) in registry.entries() {
        match state {
            EntryState::Failed(reason) => {
                tracing::warn!(entry = %entry, "provider entry unavailable: {reason}")
            }
            EntryState::Ready(provider) => {
                let health =
                    tokio::time::timeout(timeout, provider.check()).await.unwrap_or_else(|_| {
                        proxyfleet_core::Health::unhealthy(
                            HealthReason::Timeout,
                            format!("no answer within {timeout:?}"),
                        )
                    });
                if health.healthy {
                    tracing::info!(entry = %entry, "provider check passed");
                } else {
                    tracing::warn!(entry = %entry, issues = ?health.issues, "provider check failed");
                }
            }
        }
    }
}
