//! The standalone driver: reads desired Proxies from files, keeps their
//! records in the embedded store, and runs the core reconciler, orphan
//! collection and provider checks on them.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use proxyfleet_core::gc::{GcReport, collect_orphans};
use proxyfleet_core::kv::KvStore;
use proxyfleet_core::pool::{self, Member};
use proxyfleet_core::proxy::{ConditionStatus, ConditionType, Phase, ProxyMeta, ProxyStatus};
use proxyfleet_core::reconcile::{FinalizerChange, Policy, ProxyState, reconcile};
use proxyfleet_core::{Health, HealthReason, Provider, ProviderError};
use proxyfleet_fleet::api::{ModeStatus, Refusal};
use proxyfleet_fleet::{Endpoint, Fleet, FleetSettings, HealthEngine, HealthSettings};
use proxyfleet_metrics::Metrics;
use proxyfleet_oci::PullLimits;
use proxyfleet_runtime::config::ProvidersConfig;
use proxyfleet_runtime::follow::FollowOptions;
use proxyfleet_runtime::watch::WatchOptions;
use proxyfleet_runtime::{EntryState, Registry, RollbackError, Runtime, RuntimeOptions};

use crate::desired;
use crate::dispatch::{Dispatch, UNKNOWN_ENTRY_CONCURRENCY};
use crate::error::{Error, Result};
use crate::store::{ProxyRecord, Store, record_key};

/// How a standalone installation runs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// A Proxy manifest file or folder.
    pub proxies: PathBuf,
    /// The state database file.
    pub state: PathBuf,
    /// Provider entries.
    pub providers: ProvidersConfig,
    /// Folder of plugin components.
    pub plugin_dir: PathBuf,
    /// Folder for precompiled plugins and builds pulled from registries.
    pub cache_dir: Option<PathBuf>,
    /// What a pull of an `oci://` plugin accepts.
    pub pull_limits: PullLimits,
    /// How the `oci://` plugins' tags are followed.
    pub follow: FollowOptions,
    /// Reconciler timing.
    pub policy: Policy,
    /// How often the manifests are read again.
    pub rescan: Duration,
    /// How often orphans are collected.
    pub gc_interval: Duration,
    /// Orphans younger than this are left alone.
    pub gc_min_age: Duration,
    /// Log what would be collected instead of deleting it.
    pub gc_dry_run: bool,
    /// How often providers are checked.
    pub check_interval: Duration,
    /// Quarantine, replacement and lease settings of the discovery catalog.
    pub fleet: FleetSettings,
    /// Health probes; `None` runs none, so no Proxy is ever handed out.
    pub health: Option<HealthSettings>,
}

impl Settings {
    /// Settings with the default timings.
    pub fn new(
        proxies: PathBuf,
        state: PathBuf,
        providers: ProvidersConfig,
        plugin_dir: PathBuf,
    ) -> Self {
        Self {
            proxies,
            state,
            providers,
            plugin_dir,
            cache_dir: None,
            pull_limits: PullLimits::default(),
            follow: FollowOptions::default(),
            policy: Policy::default(),
            rescan: Duration::from_secs(2),
            gc_interval: Duration::from_secs(300),
            gc_min_age: Duration::from_secs(600),
            gc_dry_run: false,
            check_interval: Duration::from_secs(60),
            fleet: FleetSettings::default(),
            health: None,
        }
    }
}

/// The result of a provider check, as published.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderCheck {
    /// Entry name.
    pub entry: String,
    /// Plugin name and version, when loaded.
    pub plugin: Option<String>,
    /// Whether the entry can serve calls.
    pub health: Health,
    /// Unix seconds of the last healthy check.
    pub last_success: Option<u64>,
    /// Unix seconds of this check.
    pub checked_at: u64,
}

/// A standalone installation.
#[derive(Debug)]
pub struct Standalone {
    settings: Settings,
    store: Arc<Store>,
    registry: Arc<Registry>,
    /// When each record is due for its next pass; a record that is absent
    /// waits for a change of its manifest.
    schedule: Mutex<HashMap<String, Instant>>,
    checks: Mutex<BTreeMap<String, ProviderCheck>>,
    metrics: Arc<Metrics>,
    fleet: Arc<Fleet>,
    /// The store's record-write count at the last publish to the fleet:
    /// while it stands, the records (and so the members) are unchanged.
    published_at: AtomicU64,
}

/// `published_at` before the first publish.
const NEVER_PUBLISHED: u64 = u64::MAX;

impl Standalone {
    /// Opens the state database and loads the providers.
    pub async fn open(settings: Settings) -> Result<Self> {
        let store = Arc::new(Store::open(&settings.state)?);
        let metrics = Arc::new(Metrics::new());
        let runtime = Runtime::new(RuntimeOptions {
            cache_dir: settings.cache_dir.clone(),
            pull_limits: settings.pull_limits,
            observer: Some(Arc::clone(&metrics) as _),
            ..RuntimeOptions::default()
        })?;
        let kv: Arc<dyn KvStore> = Arc::clone(&store) as _;
        let registry = Arc::new(
            Registry::load(&runtime, &settings.providers, &settings.plugin_dir, kv).await?,
        );
        // Every stored record gets a pass after a restart: that is how an
        // interrupted create or delete resumes.
        let now = Instant::now();
        let schedule = store.records()?.into_iter().map(|r| (r.key(), now)).collect();
        let fleet = Arc::new(Fleet::new(settings.fleet.clone(), Arc::clone(&metrics)));
        Ok(Self {
            settings,
            store,
            registry,
            schedule: Mutex::new(schedule),
            checks: Mutex::new(BTreeMap::new()),
            metrics,
            fleet,
            published_at: AtomicU64::new(NEVER_PUBLISHED),
        })
    }

    fn schedule(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.schedule.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// How many record writes this installation has committed; a settled
    /// fleet adds none.
    pub fn record_writes(&self) -> u64 {
        self.store.record_writes()
    }

    /// Every Proxy record.
    pub fn records(&self) -> Result<Vec<ProxyRecord>> {
        self.store.records()
    }

    /// The metrics this installation records.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The provider entries.
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// The discovery catalog the health engine and the API work on.
    pub fn fleet(&self) -> &Arc<Fleet> {
        &self.fleet
    }

    /// Publishes every record to the catalog: a Proxy gets an endpoint once
    /// it runs with an address and loses it when it stops or is deleted,
    /// which drops its probe counters in the same step.
    ///
    /// The driver calls this every turn; a turn after which no record was
    /// written reads nothing from the store.
    pub fn publish_fleet(&self) -> Result<()> {
        // Read before the records: a write in between makes the next turn
        // publish again, never skip a change.
        let writes = self.store.record_writes();
        if self.published_at.load(Ordering::Acquire) == writes {
            return Ok(());
        }
        let members = self
            .store
            .records()?
            .into_iter()
            .map(|record| {
                let endpoint = record
                    .status
                    .ip
                    .as_deref()
                    .and_then(|ip| ip.parse().ok())
                    .filter(|_| record.status.phase == Phase::Running && !record.deleting)
                    .map(|ip| Endpoint {
                        ip,
                        port: record.status.port.unwrap_or(record.desired.port),
                    });
                proxyfleet_fleet::Member {
                    id: record.meta.uid,
                    namespace: record.meta.namespace,
                    name: record.meta.name,
                    pool: record.pool,
                    provider: record.desired.provider,
                    labels: record.desired.labels,
                    phase: if record.deleting { Phase::Deleting } else { record.status.phase },
                    endpoint,
                }
            })
            .collect();
        self.fleet.publish(members);
        self.published_at.store(writes, Ordering::Release);
        Ok(())
    }

    /// Writes the health engine's new verdicts into the records' `Healthy`
    /// and `Ready` conditions, and deletes pool members crawlers reported
    /// too often (their pool makes replacements on the next sync).
    ///
    /// Runs on the driver's loop between reconcile passes, so a status
    /// write here never races one of the reconciler's.
    pub fn apply_health(&self) -> Result<()> {
        let now = unix_now();
        let changes = self.fleet.take_verdict_changes();
        if !changes.is_empty() {
            let mut by_uid: HashMap<String, ProxyRecord> =
                self.store.records()?.into_iter().map(|r| (r.meta.uid.clone(), r)).collect();
            for (uid, health) in changes {
                let Some(mut record) = by_uid.remove(&uid) else { continue };
                let changed = match &health {
                    Some(health) => record.status.set_health(
                        health.verdict == proxyfleet_fleet::Verdict::Healthy,
                        &health.message(),
                        now,
                    ),
                    None => record.status.clear_health(now),
                };
                if changed {
                    self.store.put_record(&record)?;
                }
            }
        }
        for member in self.fleet.take_replacements() {
            let key = record_key(&member.namespace, &member.name);
            let Some(mut record) = self.store.record(&key)? else { continue };
            if record.meta.uid != member.id || record.deleting || record.pool.is_none() {
                continue;
            }
            tracing::warn!(proxy = %key, pool = ?record.pool, "replacing a proxy crawlers reported too often");
            record.deleting = true;
            self.store.put_record(&record)?;
            self.schedule().insert(key, Instant::now());
        }
        Ok(())
    }

    /// Reads the manifests and brings the records in line: new Proxies get
    /// a UID and a record, changed ones a new generation, removed ones are
    /// marked for deletion; pools are planned and their members made or
    /// removed. A manifest error changes nothing.
    pub fn sync_desired(&self) -> Result<()> {
        let wanted = desired::load(&self.settings.proxies)?;
        let mut records: HashMap<String, ProxyRecord> =
            self.store.records()?.into_iter().map(|r| (r.key(), r)).collect();
        let now = unix_now();
        let mut keep = HashSet::new();
        for proxy in wanted.proxies {
            let key = record_key(&proxy.namespace, &proxy.name);
            keep.insert(key.clone());
            let existing = records.remove(&key);
            self.upsert(existing, &proxy.namespace, &proxy.name, proxy.desired, None, now)?;
        }
        for pool in &wanted.pools {
            let pool_key = record_key(&pool.namespace, &pool.name);
            let members: Vec<&ProxyRecord> =
                records.values().filter(|r| r.pool.as_deref() == Some(pool_key.as_str())).collect();
            let view: Vec<Member> = members
                .iter()
                .map(|r| Member {
                    name: r.meta.name.clone(),
                    provider: r.desired.provider.clone(),
                    created_at: r.created_at,
                    ready: r.status.condition(ConditionType::Ready).map(|c| c.status)
                        == Some(ConditionStatus::True),
                    deleting: r.deleting,
                })
                .collect();
            let plan = pool::plan(&pool.spec, &view, now);
            if !plan.create.is_empty() || !plan.delete.is_empty() {
                tracing::info!(pool = %pool_key, create = ?plan.create, delete = ?plan.delete, ready = plan.ready, total = plan.total, "pool plan");
            }
            let mut updates = Vec::new();
            for member in members {
                if member.deleting || plan.delete.contains(&member.meta.name) {
                    continue;
                }
                keep.insert(member.key());
                let mut want = pool.template.clone();
                want.provider = member.desired.provider.clone();
                updates.push((member.clone(), want));
            }
            for (member, want) in updates {
                let (namespace, name) = (member.meta.namespace.clone(), member.meta.name.clone());
                self.upsert(Some(member), &namespace, &name, want, Some(&pool_key), now)?;
            }
            for provider in plan.create {
                let suffix = &uuid::Uuid::new_v4().simple().to_string()[..5];
                let stem: String = pool.name.chars().take(57).collect();
                let name = format!("{}-{suffix}", stem.trim_end_matches('-'));
                keep.insert(record_key(&pool.namespace, &name));
                let mut want = pool.template.clone();
                want.provider = provider;
                self.upsert(None, &pool.namespace, &name, want, Some(&pool_key), now)?;
            }
        }
        for (key, mut record) in records {
            if !record.deleting && !keep.contains(&key) {
                record.deleting = true;
                tracing::info!(proxy = %key, "Proxy no longer wanted; deleting its instance");
                self.store.put_record(&record)?;
                self.schedule().insert(key, Instant::now());
            }
        }
        Ok(())
    }

    /// Creates or updates one record from its desired state.
    fn upsert(
        &self,
        existing: Option<ProxyRecord>,
        namespace: &str,
        name: &str,
        desired: proxyfleet_core::proxy::ProxyDesired,
        pool: Option<&str>,
        now: u64,
    ) -> Result<()> {
        let key = record_key(namespace, name);
        match existing {
            None => {
                let record = ProxyRecord {
                    meta: ProxyMeta {
                        uid: uuid::Uuid::new_v4().to_string(),
                        namespace: namespace.to_owned(),
                        name: name.to_owned(),
                        generation: 1,
                    },
                    desired,
                    status: ProxyStatus::default(),
                    finalizer: false,
                    deleting: false,
                    pool: pool.map(str::to_owned),
                    created_at: now,
                };
                tracing::info!(proxy = %key, uid = %record.meta.uid, pool = ?pool, "new Proxy");
                self.store.put_record(&record)?;
                self.schedule().insert(key, Instant::now());
            }
            // A Proxy re-added while its old incarnation is still being
            // deleted is created once that deletion has finished.
            Some(record) if record.deleting => {}
            Some(mut record) if record.desired != desired => {
                record.desired = desired;
                record.meta.generation += 1;
                tracing::info!(proxy = %key, generation = record.meta.generation, "Proxy changed");
                self.store.put_record(&record)?;
                self.schedule().insert(key, Instant::now());
            }
            Some(_) => {}
        }
        Ok(())
    }

    /// Runs a pass for every record that is due; returns how many ran.
    ///
    /// Each entry has at most its `limits.concurrency` passes in flight
    /// ([`Dispatch`]): the pass runs at the speed each entry's limits allow,
    /// and a slow entry takes only its own slots. The pass still ends with
    /// its slowest reconcile: sync, health and publishing run between
    /// passes, so that their record writes never race the reconciler's.
    pub async fn reconcile_due(&self) -> usize {
        let now = Instant::now();
        let mut due: Vec<(Instant, String)> = self
            .schedule()
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(key, at)| (*at, key.clone()))
            .collect();
        due.sort_unstable();
        // Due records by entry, each queue in the order it became due.
        let mut waiting: BTreeMap<String, VecDeque<(String, ProxyRecord)>> = BTreeMap::new();
        let mut count = 0;
        for (_, key) in due {
            match self.store.record(&key) {
                Ok(Some(record)) => {
                    count += 1;
                    let queue = waiting.entry(record.desired.provider.clone()).or_default();
                    queue.push_back((key, record));
                }
                Ok(None) => {
                    self.schedule().remove(&key);
                }
                Err(err) => self.reconcile_failed(&key, &err),
            }
        }
        let mut dispatch = Dispatch::new();
        loop {
            for (entry, queue) in &mut waiting {
                let limit = self.entry_concurrency(entry);
                while dispatch.has_room(entry, limit) {
                    let Some((key, record)) = queue.pop_front() else { break };
                    dispatch.start(key.clone(), entry.clone(), async move {
                        if let Err(err) = self.reconcile_record(&key, record).await {
                            self.reconcile_failed(&key, &err);
                        }
                    });
                }
            }
            waiting.retain(|_, queue| !queue.is_empty());
            if dispatch.next().await.is_none() {
                break;
            }
        }
        count
    }

    /// How many passes of Proxies on `entry` may be in flight at once: its
    /// `limits.concurrency`, as many as its plugin may have calls open.
    fn entry_concurrency(&self, entry: &str) -> usize {
        self.settings
            .providers
            .entries
            .iter()
            .find(|candidate| candidate.name == entry)
            .map_or(UNKNOWN_ENTRY_CONCURRENCY, |found| found.limits.concurrency)
    }

    fn reconcile_failed(&self, key: &str, err: &Error) {
        tracing::error!(proxy = %key, "reconcile failed: {err}");
        self.schedule().insert(key.to_owned(), Instant::now() + self.settings.policy.backoff_base);
    }

    async fn reconcile_record(&self, key: &str, mut record: ProxyRecord) -> Result<()> {
        let provider = self.registry.provider(&record.desired.provider);
        let provider_ref: Result<&dyn Provider, ProviderError> = match &provider {
            Ok(provider) => Ok(provider.as_ref()),
            Err(err) => Err(err.clone()),
        };
        let state = ProxyState {
            meta: &record.meta,
            desired: &record.desired,
            status: &record.status,
            deleting: record.deleting,
            has_finalizer: record.finalizer,
        };
        let started = Instant::now();
        let outcome =
            reconcile(state, provider_ref, &self.settings.policy, unix_now(), rand::random()).await;
        for event in &outcome.events {
            if event.warning {
                tracing::warn!(proxy = %key, reason = event.reason, "{}", event.message);
            } else {
                tracing::info!(proxy = %key, reason = event.reason, "{}", event.message);
            }
        }
        tracing::debug!(proxy = %key, elapsed_ms = started.elapsed().as_millis() as u64, phase = ?outcome.status.phase, "reconciled");
        self.metrics.record_reconcile(started.elapsed(), outcome.error);
        let unchanged = record.status == outcome.status
            && matches!(
                (&outcome.finalizer, record.finalizer),
                (FinalizerChange::Keep, _)
                    | (FinalizerChange::Add, true)
                    | (FinalizerChange::Remove, false)
            );
        record.status = outcome.status;
        match outcome.finalizer {
            FinalizerChange::Add => record.finalizer = true,
            FinalizerChange::Remove => record.finalizer = false,
            FinalizerChange::Keep => {}
        }
        if record.deleting && !record.finalizer {
            self.store.remove_record(key)?;
            self.schedule().remove(key);
            tracing::info!(proxy = %key, "Proxy deleted");
            return Ok(());
        }
        // A pass that changed nothing (a settled Proxy's resync) writes
        // nothing: a write would make every reader of the records (the
        // fleet publish) decode them all again.
        if !unchanged {
            self.store.put_record(&record)?;
        }
        let mut schedule = self.schedule();
        match outcome.requeue_after {
            Some(after) => schedule.insert(key.to_owned(), Instant::now() + after),
            None => schedule.remove(key),
        };
        Ok(())
    }

    /// Collects orphans on every loaded entry.
    pub async fn collect_garbage(&self) -> Vec<(String, Result<GcReport, ProviderError>)> {
        let live: HashSet<String> = match self.store.records() {
            Ok(records) => records.into_iter().map(|r| r.meta.uid).collect(),
            Err(err) => {
                // Without the live set nothing can be told apart: skip.
                tracing::error!("orphan collection skipped: {err}");
                return Vec::new();
            }
        };
        let mut reports = Vec::new();
        for (name, state) in self.registry.entries() {
            let EntryState::Ready(provider) = state else { continue };
            let report = collect_orphans(
                provider.as_ref(),
                &live,
                self.settings.gc_min_age,
                unix_now(),
                self.settings.gc_dry_run,
            )
            .await;
            self.metrics.observe_gc(name, &report, self.settings.gc_dry_run);
            reports.push((name.clone(), report));
        }
        reports
    }

    /// Checks every entry, each within min(15 s, the check interval); a
    /// check that runs out of time reports `Timeout`.
    pub async fn check_providers(&self) -> Vec<ProviderCheck> {
        let timeout = self.settings.check_interval.min(Duration::from_secs(15));
        let now = unix_now();
        let checks = self.registry.entries().iter().map(|(name, state)| async move {
            let (plugin, health) = match state {
                EntryState::Failed(reason) => {
                    (None, Health::unhealthy(HealthReason::Misconfigured, reason.clone()))
                }
                EntryState::Loading => {
                    (None, Health::unhealthy(HealthReason::Other, "its plugin is still loading"))
                }
                EntryState::Ready(provider) => {
                    let revision = provider.revision();
                    let plugin = Some(format!("{} {}", revision.info.name, revision.info.version));
                    let health = tokio::time::timeout(timeout, provider.check())
                        .await
                        .unwrap_or_else(|_| {
                            Health::unhealthy(
                                HealthReason::Timeout,
                                format!("check did not answer within {timeout:?}"),
                            )
                        });
                    (plugin, health)
                }
            };
            (name.clone(), plugin, health)
        });
        let results = futures::future::join_all(checks).await;
        let mut published = self.checks.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for (entry, plugin, health) in results {
            self.metrics.record_check(&entry, health.healthy);
            let last_success = if health.healthy {
                Some(now)
            } else {
                published.get(&entry).and_then(|c| c.last_success)
            };
            if !health.healthy {
                tracing::warn!(entry = %entry, issues = ?health.issues, "provider check failed");
            }
            published.insert(
                entry.clone(),
                ProviderCheck { entry, plugin, health, last_success, checked_at: now },
            );
        }
        published.values().cloned().collect()
    }

    /// The latest provider checks.
    pub fn provider_checks(&self) -> Vec<ProviderCheck> {
        self.checks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .values()
            .cloned()
            .collect()
    }

    /// Reconciles until every Proxy is running or failed and no deletion is
    /// pending, or `timeout` passes. Returns the records as they are then.
    pub async fn run_until_settled(&self, timeout: Duration) -> Result<Vec<ProxyRecord>> {
        let deadline = Instant::now() + timeout;
        loop {
            // Pools are planned on every sync: a member that went away is
            // replaced by the next one.
            self.sync_desired()?;
            self.reconcile_due().await;
            let records = self.store.records()?;
            let settled = records
                .iter()
                .all(|r| !r.deleting && matches!(r.status.phase, Phase::Running | Phase::Failed));
            if settled || Instant::now() >= deadline {
                return Ok(records);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Runs until `shutdown` resolves: rescans the manifests, reconciles
    /// what is due, collects orphans and checks providers on their
    /// intervals. Checks run in their own task so a slow check never holds
    /// up a reconcile.
    pub async fn run(self: Arc<Self>, shutdown: impl Future<Output = ()>) -> Result<()> {
        // Publish once before the first round, so the engine's first round
        // already probes what the store knows.
        self.publish_fleet()?;
        // A new plugin file in the directory is admitted and swapped in
        // while everything keeps running.
        let _watcher = self.registry.watch(WatchOptions::default());
        // So is a new build behind an `oci://` plugin's tag.
        let _follower = self.registry.follow(self.settings.follow);
        let prober = self.settings.health.clone().map(|settings| {
            let engine = HealthEngine::new(settings, Arc::clone(&self.fleet));
            tokio::spawn(engine.run(std::future::pending()))
        });
        let checker = {
            let this = Arc::clone(&self);
            tokio::spawn(async move {
                loop {
                    this.check_providers().await;
                    tokio::time::sleep(this.settings.check_interval).await;
                }
            })
        };
        tokio::pin!(shutdown);
        let mut next_rescan = Instant::now();
        let mut next_gc = Instant::now() + self.settings.gc_interval;
        let result = loop {
            if Instant::now() >= next_rescan {
                if let Err(err) = self.sync_desired() {
                    tracing::error!("manifests not applied: {err}");
                }
                next_rescan = Instant::now() + self.settings.rescan;
            }
            self.reconcile_due().await;
            if let Err(err) = self.publish_fleet().and_then(|()| self.apply_health()) {
                tracing::error!("health verdicts not applied: {err}");
            }
            for entry in self.registry.revisions() {
                self.metrics.observe_revisions(&entry.entry, entry.swaps, entry.rejections);
            }
            if Instant::now() >= next_gc {
                self.collect_garbage().await;
                next_gc = Instant::now() + self.settings.gc_interval;
            }
            tokio::select! {
                () = &mut shutdown => break Ok(()),
                () = tokio::time::sleep(Duration::from_millis(250)) => {}
            }
        };
        checker.abort();
        if let Some(prober) = prober {
            prober.abort();
        }
        result
    }
}

impl ModeStatus for Standalone {
    fn providers(&self) -> serde_json::Value {
        serde_json::json!({ "checks": self.provider_checks(), "revisions": self.registry.revisions() })
    }

    fn rollback(&self, entry: &str) -> Result<serde_json::Value, Refusal> {
        rollback(&self.registry, entry)
    }
}

/// Rolls `entry` back on `registry`, as the API answers it; both modes
/// share it.
pub fn rollback(registry: &Registry, entry: &str) -> Result<serde_json::Value, Refusal> {
    match registry.rollback(entry) {
        Ok(active) => {
            tracing::warn!(entry, version = %active.version, digest = %active.digest, "rolled back to the previous plugin revision");
            Ok(serde_json::to_value(active).unwrap_or_default())
        }
        Err(err @ RollbackError::UnknownEntry { .. }) => Err(Refusal::NotFound(err.to_string())),
        Err(err) => Err(Refusal::Conflict(err.to_string())),
    }
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}
