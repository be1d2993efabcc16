//! What the leader runs in Kubernetes mode: the Proxy and ProxyPool
//! controllers, orphan collection and provider checks, all stopped when
//! leadership is lost.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::api::{Api, ListParams, Patch, PatchParams};
use proxyfleet_core::gc::collect_orphans;
use proxyfleet_core::reconcile::Policy;
use proxyfleet_core::{Health, HealthReason, Provider as _};
use proxyfleet_metrics::Metrics;
use proxyfleet_runtime::{EntryState, Registry};
use tokio::sync::watch;

use crate::controller::{self, Context};
use crate::crd::{ProviderIssue, Proxy, ProxyProvider, ProxyProviderStatus};

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
    /// Where GC, checks and reconciles are recorded.
    pub metrics: Arc<Metrics>,
}

/// Runs until `lost` turns true.
pub async fn lead(
    client: kube::Client,
    registry: Arc<Registry>,
    settings: LeaderSettings,
    identity: String,
    lost: watch::Receiver<bool>,
) {
    let context = Arc::new(
        Context::new(
            client.clone(),
            Arc::clone(&registry),
            settings.policy.clone(),
            Some(identity),
        )
        .with_metrics(Arc::clone(&settings.metrics)),
    );
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
                _ = checks.tick() => {
                    check_providers(&client, &registry, settings.check_interval, &settings.metrics).await;
                }
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
        let report = collect_orphans(
            provider.as_ref(),
            &live,
            settings.gc_min_age,
            now,
            settings.gc_dry_run,
        )
        .await;
        settings.metrics.observe_gc(entry, &report, settings.gc_dry_run);
    }
}

/// Checks every entry, each bounded by min(15 s, interval) so a hanging
/// backend never holds up the next round, and publishes each result as the
/// entry's cluster-scoped ProxyProvider object. Returns the entries whose
/// result could not be published, with why.
pub async fn check_providers(
    client: &kube::Client,
    registry: &Registry,
    interval: Duration,
    metrics: &Metrics,
) -> Vec<(String, kube::Error)> {
    let mut failures = Vec::new();
    let timeout = interval.min(Duration::from_secs(15));
    let api: Api<ProxyProvider> = Api::all(client.clone());
    let now = Timestamp::now();
    for (entry, state) in registry.entries() {
        let mut status =
            ProxyProviderStatus { checked_at: Some(now.to_string()), ..Default::default() };
        match state {
            EntryState::Failed(reason) => {
                tracing::warn!(entry = %entry, "provider entry unavailable: {reason}");
                status.reason = Some("Unavailable".into());
                status.issues = vec![ProviderIssue {
                    reason: "unavailable".into(),
                    message: Some(reason.clone()),
                }];
            }
            EntryState::Ready(provider) => {
                let revision = provider.revision();
                let health =
                    tokio::time::timeout(timeout, provider.check()).await.unwrap_or_else(|_| {
                        Health::unhealthy(
                            HealthReason::Timeout,
                            format!("no answer within {timeout:?}"),
                        )
                    });
                if health.healthy {
                    tracing::info!(entry = %entry, "provider check passed");
                } else {
                    tracing::warn!(entry = %entry, issues = ?health.issues, "provider check failed");
                }
                status.available = true;
                status.healthy = health.healthy;
                status.plugin = Some(revision.info.name.clone());
                status.version = Some(revision.info.version.clone());
                status.digest = Some(revision.digest.clone());
                status.issues = health
                    .issues
                    .iter()
                    .map(|issue| ProviderIssue {
                        reason: serde_json::to_value(issue.reason)
                            .ok()
                            .and_then(|v| v.as_str().map(str::to_owned))
                            .unwrap_or_default(),
                        message: Some(issue.message.clone()).filter(|m| !m.is_empty()),
                    })
                    .collect();
                status.reason = status.issues.first().map(|i| i.reason.clone());
            }
        }
        metrics.record_check(entry, status.healthy);
        status.last_success = if status.healthy {
            Some(now.to_string())
        } else {
            // Carried over, also across a change of leader.
            api.get_opt(entry).await.ok().flatten().and_then(|p| p.status?.last_success)
        };
        let plugin = registry.plugin_of(entry).unwrap_or("unknown");
        if let Err(err) = publish(&api, entry, plugin, &status).await {
            tracing::warn!(entry = %entry, "cannot publish the provider check: {err}");
            failures.push((entry.clone(), err));
        }
    }
    failures
}

async fn publish(
    api: &Api<ProxyProvider>,
    entry: &str,
    plugin: &str,
    status: &ProxyProviderStatus,
) -> Result<(), kube::Error> {
    let params = PatchParams::apply(crate::controller::MANAGER).force();
    let object = serde_json::json!({
        "apiVersion": "proxyfleet.io/v1alpha1",
        "kind": "ProxyProvider",
        "metadata": { "name": entry },
        "spec": { "plugin": plugin },
    });
    api.patch(entry, &params, &Patch::Apply(&object)).await?;
    let status = serde_json::json!({
        "apiVersion": "proxyfleet.io/v1alpha1",
        "kind": "ProxyProvider",
        "status": status,
    });
    api.patch_status(entry, &params, &Patch::Apply(&status)).await?;
    Ok(())
}
