//! What the leader runs in Kubernetes mode: the Proxy and ProxyPool
//! controllers, orphan collection and provider checks, all stopped when
//! leadership is lost. The fleet services (catalog, health engine) run on
//! every replica, leader or not ([`crate::fleet_services`]).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::ResourceExt as _;
use kube::api::{Api, ListParams, Patch, PatchParams};
use proxyfleet_core::entry_resources::ResourceEntries;
use proxyfleet_core::liveness::{Heartbeat, Watchdog};
use proxyfleet_core::reconcile::Policy;
use proxyfleet_core::source::ProviderSource;
use proxyfleet_core::spec_key::SpecKey;
use proxyfleet_fleet::Fleet;
use proxyfleet_housekeeping::{self as housekeeping, EntryCheck, GcSettings, check_entries};
use proxyfleet_metrics::Metrics;
use tokio::sync::watch;

use crate::controller::{self, Context};
use crate::crd::Proxy;
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
    /// status, and whose providers-file entries the leader shows as
    /// ClusterProxyProviders ([`crate::file_providers`]); `None`: the
    /// leader leaves them alone.
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
    // The file's entries shown as ClusterProxyProviders, beside those.
    let file_views = {
        let (client, entries) = (client.clone(), settings.resource_entries.clone());
        async move {
            match entries {
                Some(entries) => crate::file_providers::show(client, entries.as_ref()).await,
                None => std::future::pending().await,
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
            () = file_views => {}
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
                    check_all(&client, source.as_ref(), &settings).await;
                }
                _ = revisions.tick() => {
                    // A swap or refusal is checked at once, not at the next
                    // scheduled check.
                    if announcer.announce(source.as_ref(), &settings.metrics).await {
                        check_all(&client, source.as_ref(), &settings).await;
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

/// The leader's provider checks: published when it keeps
/// ClusterProxyProviders, measured only otherwise.
async fn check_all(client: &kube::Client, source: &dyn ProviderSource, settings: &LeaderSettings) {
    let (interval, metrics) = (settings.check_interval, settings.metrics.as_ref());
    match &settings.resource_entries {
        Some(entries) => {
            check_providers(client, entries.as_ref(), interval, metrics).await;
        }
        None => {
            check_entries(source, interval, metrics).await;
        }
    }
}

/// Checks every entry (`proxyfleet_housekeeping::check_entries`) and
/// publishes each result as the `Checked` condition of the entry's
/// ClusterProxyProvider (a platform team's, or the view of a providers-file
/// entry); an entry without one is only measured. Returns the entries
/// whose result could not be published, with why.
pub async fn check_providers(
    client: &kube::Client,
    entries: &dyn ResourceEntries,
    interval: Duration,
    metrics: &Metrics,
) -> Vec<(String, kube::Error)> {
    let mut failures = Vec::new();
    for EntryCheck { entry, health, .. } in check_entries(entries, interval, metrics).await {
        let published =
            crate::cluster_providers::publish_check(client, entries, &entry, &health).await;
        if let Err(err) = published {
            tracing::warn!(entry = %entry, "cannot publish the check on its ClusterProxyProvider: {err}");
            failures.push((entry, err));
        }
    }
    failures
}

/// Publishes an Event on an entry's ClusterProxyProvider whenever its
/// registry activates a revision, refuses a candidate or refuses a config
/// edit, and keeps the swap metrics.
pub struct RevisionAnnouncer {
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
        Self { recorder: Recorder::new(client, reporter), seen: HashMap::new(), primed: false }
    }

    /// Announces what changed since the last call (the first call only
    /// takes note); returns whether anything did.
    pub async fn announce(&mut self, source: &dyn ProviderSource, metrics: &Metrics) -> bool {
        let primed = std::mem::replace(&mut self.primed, true);
        let revisions = source.revisions();
        // An entry removed while running is news too: its checks stop.
        let before = self.seen.len();
        self.seen.retain(|name, _| revisions.iter().any(|entry| &entry.entry == name));
        let mut changed = self.seen.len() != before;
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
                kind: Some("ClusterProxyProvider".to_owned()),
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
