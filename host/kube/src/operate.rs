//! What the leader runs in Kubernetes mode: the Proxy and ProxyPool
//! controllers, orphan collection and provider checks, all stopped when
//! leadership is lost. The fleet services (catalog, health engine) run on
//! every replica, leader or not ([`crate::fleet_services`]).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use proxyfleet_core::entry_resources::ResourceEntries;
use proxyfleet_core::liveness::{Heartbeat, Watchdog};
use proxyfleet_core::reconcile::Policy;
use proxyfleet_core::revisions::EntryRevisions;
use proxyfleet_core::source::{ProviderSource, STILL_LOADING};
use proxyfleet_core::spec_key::SpecKey;
use proxyfleet_fleet::Fleet;
use proxyfleet_housekeeping::{
    self as housekeeping, Availability, EntryCheck, GcSettings, check_entries,
};
use proxyfleet_metrics::Metrics;
use tokio::sync::watch;

use crate::controller::{self, Context};
use crate::crd::{
    PluginRevisionRef, ProviderIssue, Proxy, ProxyProvider, ProxyProviderStatus, RejectedRevision,
};
use crate::credentials::Credentials;
use crate::events::{Event, EventType, Recorder, Reporter};
use crate::fleet::Wakes;

/// How the leader works.
#[derive(Clone)]
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
    /// The fleet services the leader's passes work with; `None`: none run.
    pub fleet: Option<LeaderFleet>,
    /// The installation's key of the spec hashes.
    pub spec_key: SpecKey,
    /// Where the leader's loops beat, for `/livez`.
    pub watchdog: Watchdog,
    /// Where ClusterProxyProviders are applied, for their finalizers and
    /// status; `None`: the leader leaves them alone.
    pub resource_entries: Option<Arc<dyn ResourceEntries>>,
}

impl std::fmt::Debug for LeaderSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderSettings")
            .field("watch_namespace", &self.watch_namespace)
            .field("policy", &self.policy)
            .field("gc_interval", &self.gc_interval)
            .field("gc_min_age", &self.gc_min_age)
            .field("gc_dry_run", &self.gc_dry_run)
            .field("check_interval", &self.check_interval)
            .field("fleet", &self.fleet)
            .field("resource_entries", &self.resource_entries.as_ref().map(|e| e.resource_names()))
            .finish_non_exhaustive()
    }
}

/// What the leader's passes share with the fleet services.
#[derive(Debug, Clone)]
pub struct LeaderFleet {
    /// The catalog, whose verdicts the passes write into the status.
    pub fleet: Arc<Fleet>,
    /// Proxies whose verdict changed.
    pub wakes: Arc<Wakes>,
    /// The credentials passes read, which the services publish.
    pub credentials: Arc<Credentials>,
}

/// Runs until `lost` turns true.
pub async fn lead(
    client: kube::Client,
    source: Arc<dyn ProviderSource>,
    settings: LeaderSettings,
    identity: String,
    lost: watch::Receiver<bool>,
) {
    let identity_for_events = identity.clone();
    // Leadership ends by dropping these loops mid-round: each heartbeat is
    // retired here, not where it is used.
    let watchdog = &settings.watchdog;
    let heartbeats = Heartbeats {
        proxies: Arc::new(watchdog.expect_passes("proxy reconciler")),
        pools: Arc::new(watchdog.expect_passes("pool reconciler")),
        providers: Arc::new(watchdog.expect_passes("provider reconciler")),
        housekeeping: watchdog.expect_beats("housekeeping"),
    };
    let mut context = Context::new(
        client.clone(),
        Arc::clone(&source),
        settings.policy.clone(),
        Some(identity),
        settings.spec_key.clone(),
    )
    .with_metrics(Arc::clone(&settings.metrics))
    .with_heartbeat(Arc::clone(&heartbeats.proxies));
    if let Some(link) = &settings.fleet {
        context = context.with_fleet(
            Arc::clone(&link.fleet),
            Arc::clone(&link.wakes),
            Arc::clone(&link.credentials),
        );
    }
    // With ClusterProxyProviders, each serves the namespaces its selector
    // picks; the gate's caches run as long as the controllers.
    let mut gate_caches = None;
    if settings.resource_entries.is_some() {
        let (gate, caches) = crate::namespace_gate::NamespaceGate::watching(&client);
        context = context.with_namespace_gate(gate);
        gate_caches = Some(caches);
    }
    let context = Arc::new(context);
    let stop = |mut lost: watch::Receiver<bool>| async move {
        let _ = lost.wait_for(|lost| *lost).await;
    };
    let controller =
        controller::run(context, settings.watch_namespace.as_deref(), stop(lost.clone()));
    let pools = crate::pool::run(
        client.clone(),
        settings.watch_namespace.as_deref(),
        crate::pool::PoolOptions {
            heartbeat: Some(Arc::clone(&heartbeats.pools)),
            metrics: Some(Arc::clone(&settings.metrics)),
        },
        stop(lost.clone()),
    );
    let providers = {
        let context = settings.resource_entries.clone().map(|entries| {
            crate::cluster_providers::ProviderContext::new(
                client.clone(),
                entries,
                settings.watch_namespace.clone(),
                Some(Arc::clone(&heartbeats.providers)),
            )
        });
        let lost = lost.clone();
        async move {
            if let Some(context) = context {
                crate::cluster_providers::run(context, stop(lost)).await;
            }
        }
    };
    let gate_caches = async move {
        match gate_caches {
            Some(caches) => caches.await,
            None => std::future::pending().await,
        }
    };
    let controllers = async {
        tokio::select! {
            _ = async { tokio::join!(controller, pools, providers) } => {}
            () = gate_caches => {}
        }
    };
    let housekeeping = async {
        let mut gc = tokio::time::interval(settings.gc_interval);
        let mut checks = tokio::time::interval(settings.check_interval);
        let mut revisions = tokio::time::interval(Duration::from_secs(2));
        let mut announcer = RevisionAnnouncer::new(client.clone(), identity_for_events.clone());
        loop {
            tokio::select! {
                _ = gc.tick() => collect_garbage(&client, source.as_ref(), &settings).await,
                _ = checks.tick() => {
                    check_providers_with(&client, source.as_ref(), &resource_names(&settings), settings.check_interval, &settings.metrics).await;
                }
                _ = revisions.tick() => {
                    // A swap or refusal shows on the ProxyProvider at once,
                    // not at the next scheduled check.
                    if announcer.announce(source.as_ref(), &settings.metrics).await {
                        check_providers_with(&client, source.as_ref(), &resource_names(&settings), settings.check_interval, &settings.metrics).await;
                    }
                }
            }
            heartbeats.housekeeping.beat();
        }
    };
    tokio::select! {
        _ = controllers => {}
        () = housekeeping => {}
        () = stop(lost) => {}
    }
    heartbeats.retire();
}

/// The entries ClusterProxyProviders declare, whose checks go on them too.
fn resource_names(settings: &LeaderSettings) -> Vec<String> {
    settings.resource_entries.as_ref().map(|entries| entries.resource_names()).unwrap_or_default()
}

/// The leader's parts on the watchdog.
struct Heartbeats {
    proxies: Arc<Heartbeat>,
    pools: Arc<Heartbeat>,
    providers: Arc<Heartbeat>,
    housekeeping: Heartbeat,
}

impl Heartbeats {
    fn retire(&self) {
        self.proxies.retire();
        self.pools.retire();
        self.providers.retire();
        self.housekeeping.retire();
    }
}

async fn collect_garbage(
    client: &kube::Client,
    source: &dyn ProviderSource,
    settings: &LeaderSettings,
) {
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
    let gc = GcSettings { min_age: settings.gc_min_age, dry_run: settings.gc_dry_run };
    housekeeping::collect_garbage(source, &live, gc, &settings.metrics).await;
}

/// Checks every entry (`proxyfleet_housekeeping::check_entries`) and
/// publishes each result as the entry's cluster-scoped ProxyProvider
/// object. Returns the entries whose result could not be published, with
/// why.
pub async fn check_providers(
    client: &kube::Client,
    source: &dyn ProviderSource,
    interval: Duration,
    metrics: &Metrics,
) -> Vec<(String, kube::Error)> {
    check_providers_with(client, source, &[], interval, metrics).await
}

/// [`check_providers`], which also publishes the result of each entry
/// named in `resources` as the `Checked` condition of its
/// ClusterProxyProvider.
pub async fn check_providers_with(
    client: &kube::Client,
    source: &dyn ProviderSource,
    resources: &[String],
    interval: Duration,
    metrics: &Metrics,
) -> Vec<(String, kube::Error)> {
    let mut failures = Vec::new();
    let api: Api<ProxyProvider> = Api::all(client.clone());
    let now = Timestamp::now();
    let checks = check_entries(source, interval, metrics).await;
    for EntryCheck { entry, availability, health } in checks {
        let entry = &entry;
        if resources.contains(entry)
            && let Err(err) = crate::cluster_providers::publish_check(client, entry, &health).await
        {
            tracing::warn!(entry = %entry, "cannot publish the check on its ClusterProxyProvider: {err}");
            failures.push((entry.clone(), err));
        }
        let mut status =
            ProxyProviderStatus { checked_at: Some(now.to_string()), ..Default::default() };
        match availability {
            Availability::Loading => {
                status.reason = Some("Loading".into());
                status.issues = vec![ProviderIssue {
                    reason: "loading".into(),
                    message: Some(STILL_LOADING.into()),
                }];
            }
            Availability::Failed(reason) => {
                status.reason = Some("Unavailable".into());
                status.issues =
                    vec![ProviderIssue { reason: "unavailable".into(), message: Some(reason) }];
            }
            Availability::Loaded(info) => {
                status.available = true;
                status.healthy = health.healthy;
                status.plugin = Some(info.name);
                status.version = Some(info.version);
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
        let revisions = source.revisions_of(entry);
        let plugin = revisions.as_ref().map_or_else(|| "unknown".to_owned(), |r| r.plugin.clone());
        if let Some(revisions) = revisions {
            if status.available {
                status.digest = revisions.active.as_ref().map(|active| active.digest.clone());
            }
            status.activated_at = revisions.activated_at.and_then(rfc3339);
            status.previous = revisions.previous.map(|previous| PluginRevisionRef {
                version: previous.version,
                digest: previous.digest,
            });
            status.rejected = revisions
                .rejected
                .into_iter()
                .map(|candidate| RejectedRevision {
                    version: candidate.version,
                    digest: candidate.digest,
                    kind: candidate.kind.as_str().to_owned(),
                    reason: candidate.reason,
                })
                .collect();
            if let Some(reason) = revisions.config_refused {
                status
                    .issues
                    .push(ProviderIssue { reason: "configRefused".into(), message: Some(reason) });
                status.reason.get_or_insert_with(|| "configRefused".into());
            }
        }
        status.last_success = if status.healthy {
            Some(now.to_string())
        } else {
            // Carried over, also across a change of leader.
            api.get_opt(entry).await.ok().flatten().and_then(|p| p.status?.last_success)
        };
        if let Err(err) = publish(&api, entry, &plugin, &status).await {
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
    let params = PatchParams::apply(crate::crd::MANAGER).force();
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

fn rfc3339(unix_seconds: u64) -> Option<String> {
    Timestamp::from_second(i64::try_from(unix_seconds).ok()?).ok().map(|t| t.to_string())
}

/// Publishes an Event on an entry's ProxyProvider whenever its registry
/// activates a revision, refuses a candidate or refuses a config edit,
/// deletes the ProxyProvider of an entry removed while running, and keeps
/// the swap metrics.
pub struct RevisionAnnouncer {
    client: kube::Client,
    recorder: Recorder,
    /// Entry → what was already announced of it.
    seen: HashMap<String, Announced>,
    /// Whether the first call, which only takes note, was made.
    primed: bool,
}

/// What [`RevisionAnnouncer`] last saw of an entry.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Announced {
    swaps: u64,
    rejections: u64,
    config_refused: Option<String>,
}

impl std::fmt::Debug for RevisionAnnouncer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RevisionAnnouncer").field("seen", &self.seen).finish_non_exhaustive()
    }
}

impl RevisionAnnouncer {
    /// An announcer reporting as `instance`.
    pub fn new(client: kube::Client, instance: String) -> Self {
        let reporter =
            Reporter { controller: crate::crd::MANAGER.to_owned(), instance: Some(instance) };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            seen: HashMap::new(),
            primed: false,
        }
    }

    /// Announces what changed since the last call (the first call only
    /// takes note); returns whether anything did.
    pub async fn announce(&mut self, source: &dyn ProviderSource, metrics: &Metrics) -> bool {
        let primed = std::mem::replace(&mut self.primed, true);
        let revisions = source.revisions();
        let mut changed = self.forget_removed(&revisions).await;
        for entry in revisions {
            metrics.observe_revisions(&entry.entry, entry.swaps, entry.rejections);
            let now = Announced {
                swaps: entry.swaps,
                rejections: entry.rejections,
                config_refused: entry.config_refused.clone(),
            };
            let Some(before) = self.seen.insert(entry.entry.clone(), now.clone()) else {
                // An entry added while running is checked at once.
                changed |= primed;
                continue;
            };
            if now == before {
                continue;
            }
            changed = true;
            // Events of cluster-scoped objects live in `default`; API
            // servers before 1.22 insist the reference says so too.
            let reference = ObjectReference {
                api_version: Some("proxyfleet.io/v1alpha1".to_owned()),
                kind: Some("ProxyProvider".to_owned()),
                name: Some(entry.entry.clone()),
                namespace: Some("default".to_owned()),
                ..ObjectReference::default()
            };
            if now.swaps > before.swaps
                && let Some(active) = &entry.active
            {
                let note = format!(
                    "entry {} now runs {} {} (sha256:{}){}",
                    entry.entry,
                    active.plugin,
                    active.version,
                    active.digest,
                    entry
                        .previous
                        .as_ref()
                        .map(|p| format!("; previous {} (sha256:{})", p.version, p.digest))
                        .unwrap_or_default()
                );
                self.publish(&reference, EventType::Normal, "PluginActivated", note).await;
            }
            if now.rejections > before.rejections
                && let Some(rejected) = entry.rejected.last()
            {
                let note = format!(
                    "entry {} refused a candidate (sha256:{}, {}): {}",
                    entry.entry,
                    rejected.digest,
                    rejected.kind.as_str(),
                    rejected.reason
                );
                self.publish(&reference, EventType::Warning, "PluginRejected", note).await;
            }
            if let Some(reason) = &now.config_refused
                && before.config_refused.as_ref() != Some(reason)
            {
                let note = format!(
                    "entry {} refused its new config and keeps serving the one before: {reason}",
                    entry.entry
                );
                self.publish(&reference, EventType::Warning, "ConfigRefused", note).await;
            }
        }
        changed
    }

    /// Deletes the ProxyProvider of each entry seen before and gone from
    /// `revisions` (removed from the providers file while running); true
    /// when there was one. Only entries this process saw are deleted, never
    /// an object another installation writes.
    async fn forget_removed(&mut self, revisions: &[EntryRevisions]) -> bool {
        let gone: Vec<String> = self
            .seen
            .keys()
            .filter(|name| !revisions.iter().any(|entry| &entry.entry == *name))
            .cloned()
            .collect();
        let api: Api<ProxyProvider> = Api::all(self.client.clone());
        for name in &gone {
            self.seen.remove(name);
            match api.delete(name, &DeleteParams::default()).await {
                Ok(_) => {
                    tracing::info!(entry = %name, "deleted the ProxyProvider of a removed entry")
                }
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(err) => tracing::warn!(
                    entry = %name,
                    "cannot delete the ProxyProvider of a removed entry: {err}"
                ),
            }
        }
        !gone.is_empty()
    }

    async fn publish(
        &self,
        reference: &ObjectReference,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(note.chars().take(1000).collect()),
            action: "Swap".to_owned(),
            secondary: None,
        };
        if let Err(err) = self.recorder.publish(&event, reference).await {
            tracing::warn!(reason, "cannot record event: {err}");
        }
    }
}

/// The pod label the leader carries; the discovery Service selects on it,
/// so crawlers reach the one replica whose catalog is probed.
pub const LEADER_LABEL: &str = "proxyfleet.io/leader";

/// Sets (or removes) [`LEADER_LABEL`] on pod `name` in `namespace`.
pub async fn mark_leader(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    leader: bool,
) -> Result<(), kube::Error> {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), namespace);
    let value = if leader { serde_json::json!("true") } else { serde_json::Value::Null };
    let patch = serde_json::json!({ "metadata": { "labels": { LEADER_LABEL: value } } });
    pods.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    Ok(())
}
