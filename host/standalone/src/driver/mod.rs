//! The standalone driver: reads desired Proxies from files, keeps their
//! records in the embedded store, and runs the core reconciler, orphan
//! collection and provider checks on them, over whatever
//! [`ProviderSource`] it is given (the plugin registry in the operator,
//! core's fakes in the tests).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use proxyfleet_core::clock::unix_now;
use proxyfleet_core::gc::GcReport;
use proxyfleet_core::liveness::{Heartbeat, Watchdog};
use proxyfleet_core::pool::{self, PoolMember};
use proxyfleet_core::proxy::{ConditionStatus, ConditionType, Phase, ProxyMeta, ProxyStatus};
use proxyfleet_core::reconcile::{FinalizerChange, Policy, ProxyState, random_jitter, reconcile};
use proxyfleet_core::source::ProviderSource;
use proxyfleet_core::spec_key::SpecKey;
use proxyfleet_core::{Health, Provider, ProviderError};
use proxyfleet_fleet::action::{Action, ProxyRef};
use proxyfleet_fleet::api::{ModeStatus, Refusal};
use proxyfleet_fleet::{Endpoint, Fleet, FleetSettings, HealthEngine, HealthSettings};
use proxyfleet_housekeeping::{
    self as housekeeping, Availability, EntryCheck, GcSettings, check_entries,
};
use proxyfleet_metrics::{Metrics, PoolCounts};

use crate::desired;
pub use crate::dispatch::UNKNOWN_ENTRY_CONCURRENCY;
use crate::dispatch::{Dispatch, Turn};
use crate::error::{Error, Result};
use crate::state::StateDb;
use crate::store::{LoggedAction, ProxyRecord, Store, record_key};

#[cfg(test)]
mod tests;

/// How a standalone installation runs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// A Proxy manifest file or folder.
    pub proxies: PathBuf,
    /// How many passes of each entry's Proxies may run at once, for an
    /// entry whose source does not say ([`ProviderSource::concurrency`]);
    /// an entry named nowhere gets [`UNKNOWN_ENTRY_CONCURRENCY`].
    pub concurrency: BTreeMap<String, usize>,
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
    /// Where the reconciler and the run loop's parts beat, for `/livez`.
    pub watchdog: Watchdog,
}

impl Settings {
    /// Settings with the default timings, for the manifests at `proxies`.
    pub fn new(proxies: PathBuf) -> Self {
        Self {
            proxies,
            concurrency: BTreeMap::new(),
            policy: Policy::default(),
            rescan: Duration::from_secs(2),
            gc_interval: Duration::from_secs(300),
            gc_min_age: Duration::from_secs(600),
            gc_dry_run: false,
            check_interval: Duration::from_secs(60),
            fleet: FleetSettings::default(),
            health: None,
            watchdog: Watchdog::default(),
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
pub struct Standalone {
    settings: Settings,
    store: Arc<Store>,
    /// The key of the spec hashes, kept in the store.
    spec_key: SpecKey,
    source: Arc<dyn ProviderSource>,
    /// When each record is due for its next pass; a record that is absent
    /// waits for a change of its manifest.
    schedule: Mutex<HashMap<String, Instant>>,
    checks: Mutex<BTreeMap<String, ProviderCheck>>,
    metrics: Arc<Metrics>,
    fleet: Arc<Fleet>,
    /// What the fleet was last given; `None` before the first publish.
    published: Mutex<Option<Published>>,
    /// What the last full sync saw; `None` before the first.
    synced: Mutex<Option<Synced>>,
    /// Every pass is marked on it: one stuck past the watchdog's bound
    /// fails `/livez`.
    reconciler: Heartbeat,
}

/// What a sync read: while the manifests keep their stamp, no pool's member
/// reaches its `maxAge` and no record is written (with pools: a member's
/// readiness plans its pool) or removed (without: a Proxy still wanted
/// whose deletion ended needs its record again), another sync would change
/// nothing, so it reads nothing.
#[derive(Debug)]
struct Synced {
    stamp: desired::Stamp,
    /// The files the manifests named then, stamped with them next time.
    referenced: Vec<std::path::PathBuf>,
    /// The store's record-write count before the sync read the records.
    writes: u64,
    /// The store's record-removal count, read with `writes`.
    removals: u64,
    /// Whether the manifests declared a pool.
    pools: bool,
    /// The Unix second a pool's oldest member expires, the soonest of all.
    until: Option<u64>,
}

/// What the catalog was last given.
#[derive(Debug)]
struct Published {
    /// The store's record-write count then: while it stands, the records
    /// (and so the members) are unchanged.
    writes: u64,
    /// Record key → the UID its member was published under.
    uids: HashMap<String, String>,
}

/// The Proxies a sync found new, written together in one commit at its
/// end (a first start with thousands pays for one commit, not one each).
struct NewRecords {
    /// The sync's Unix second: their creation time.
    now: u64,
    records: Vec<ProxyRecord>,
}

/// Operators' actions from the state log the console shows after a restart.
const RESTORED_ACTIONS: usize = 100;

/// How often the run loop syncs, publishes and queues due passes.
const TURN: Duration = Duration::from_millis(250);

impl std::fmt::Debug for Standalone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Standalone")
            .field("settings", &self.settings)
            .field("installation", self.source.installation())
            .finish_non_exhaustive()
    }
}

impl Standalone {
    /// An installation on the state database `state`, reconciling on the
    /// entries of `source` (built for `state`'s installation, with the
    /// database as its key-value store) and recording into `metrics`.
    ///
    /// # Errors
    /// When `source` serves another installation than the database keeps,
    /// or the records cannot be read.
    pub fn new(
        settings: Settings,
        state: StateDb,
        source: Arc<dyn ProviderSource>,
        metrics: Arc<Metrics>,
    ) -> Result<Self> {
        if source.installation() != state.installation() {
            return Err(Error::InstallationMismatch {
                database: state.installation().clone(),
                providers: source.installation().clone(),
            });
        }
        let (store, spec_key) = state.into_parts();
        // Every stored record gets a pass after a restart: that is how an
        // interrupted create or delete resumes.
        let now = Instant::now();
        let schedule = store.records()?.into_iter().map(|r| (r.key(), now)).collect();
        // Discovery leases live in the same database as the records.
        let fleet = Arc::new(
            Fleet::new(settings.fleet.clone(), Arc::clone(&metrics))
                .with_lease_store(Arc::clone(&store) as _),
        );
        // The console shows operators' actions from before the restart.
        for logged in store.logged_actions(RESTORED_ACTIONS)? {
            let proxy = logged.action.proxy().map(|p| (p.id.as_str(), p.qualified()));
            fleet.record_activity_at(logged.at, proxy, logged.action.note());
        }
        let reconciler = settings.watchdog.expect_passes("proxy reconciler");
        Ok(Self {
            reconciler,
            settings,
            store,
            spec_key,
            source,
            schedule: Mutex::new(schedule),
            checks: Mutex::new(BTreeMap::new()),
            metrics,
            fleet,
            published: Mutex::new(None),
            synced: Mutex::new(None),
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

    /// How many times every record was read; an idle installation adds
    /// none.
    pub fn record_scans(&self) -> u64 {
        self.store.record_scans()
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
    pub fn source(&self) -> &Arc<dyn ProviderSource> {
        &self.source
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
    /// written reads nothing from the store, and one after writes reads
    /// only the records written: a turn's cost follows what changed, not
    /// the fleet's size.
    pub fn publish_fleet(&self) -> Result<()> {
        // Read before the records: a write in between makes the next turn
        // publish again, never skip a change.
        let writes = self.store.record_writes();
        let mut published = self.published.lock().unwrap_or_else(PoisonError::into_inner);
        if published.as_ref().is_some_and(|last| last.writes == writes) {
            return Ok(());
        }
        let changed = self.store.take_changed();
        let outcome = match published.as_mut() {
            None => self.publish_all(writes),
            Some(last) => self.publish_changed(last, changed).map(|()| {
                last.writes = writes;
                None
            }),
        };
        match outcome {
            Ok(Some(first)) => *published = Some(first),
            Ok(None) => {}
            Err(err) => {
                // The drained keys are lost with it: start over from
                // every record next turn.
                *published = None;
                return Err(err);
            }
        }
        Ok(())
    }

    /// Publishes every record: the first publish, or after a failed one.
    fn publish_all(&self, writes: u64) -> Result<Option<Published>> {
        let records = self.store.records()?;
        let uids = records.iter().map(|r| (r.key(), r.meta.uid.clone())).collect();
        self.fleet.publish(records.into_iter().map(member_of).collect());
        Ok(Some(Published { writes, uids }))
    }

    /// Publishes the records at `keys` (written since `last`).
    fn publish_changed(&self, last: &mut Published, keys: HashSet<String>) -> Result<()> {
        let mut upserts = Vec::new();
        let mut removed = Vec::new();
        for key in keys {
            let record = self.store.record(&key)?;
            let uid = record.as_ref().map(|r| r.meta.uid.clone());
            // Gone, or another Proxy under the same name now.
            if let Some(before) = last.uids.get(&key)
                && uid.as_ref() != Some(before)
            {
                removed.push(before.clone());
            }
            match (record, uid) {
                (Some(record), Some(uid)) => {
                    last.uids.insert(key, uid);
                    upserts.push(member_of(record));
                }
                _ => {
                    last.uids.remove(&key);
                }
            }
        }
        self.fleet.update(upserts, removed);
        Ok(())
    }

    /// Writes the health engine's new verdicts into the records' `Healthy`
    /// and `Ready` conditions, and deletes pool members crawlers reported
    /// too often (their pool makes replacements on the next sync).
    ///
    /// Each write changes one record in one transaction, and a pass that
    /// ends later merges the same verdict from the catalog: a write here
    /// and a reconcile in flight never undo each other.
    pub fn apply_health(&self) -> Result<()> {
        let now = unix_now();
        let changes = self.fleet.take_verdict_changes();
        if !changes.is_empty() {
            let keys: HashMap<String, String> =
                self.store.records()?.into_iter().map(|r| (r.meta.uid.clone(), r.key())).collect();
            for (uid, _) in changes {
                let Some(key) = keys.get(&uid) else { continue };
                self.store.update_record(key, |fresh| {
                    fresh.meta.uid == uid
                        && !fresh.deleting
                        && self.fleet.merge_verdict(&uid, &mut fresh.status, now)
                })?;
            }
        }
        for member in self.fleet.take_replacements() {
            let key = record_key(&member.namespace, &member.name);
            if self.mark_deleting(&key, &member.id, |fresh| fresh.pool.is_some())? {
                tracing::warn!(proxy = %key, pool = ?member.pool, "replacing a proxy crawlers reported too often");
            }
        }
        Ok(())
    }

    /// Marks the record at `key` deleting when it is still Proxy `uid`, not
    /// yet deleting, and `also` holds for it; its pass is due at once.
    /// Returns whether it marked it.
    fn mark_deleting(
        &self,
        key: &str,
        uid: &str,
        also: impl FnOnce(&ProxyRecord) -> bool,
    ) -> Result<bool> {
        let mut marked = false;
        self.store.update_record(key, |fresh| {
            marked = fresh.meta.uid == uid && !fresh.deleting && also(fresh);
            fresh.deleting |= marked;
            marked
        })?;
        if marked {
            self.schedule().insert(key.to_owned(), Instant::now());
        }
        Ok(marked)
    }

    /// Reads the manifests and brings the records in line: new Proxies get
    /// a UID and a record, changed ones a new generation, removed ones are
    /// marked for deletion; pools are planned and their members made or
    /// removed. A manifest error changes nothing.
    ///
    /// When neither the manifests nor any record changed since the last
    /// sync, and no pool member has reached its `maxAge`, it reads nothing:
    /// an idle installation does no work per Proxy here. Without pools,
    /// only a removed record counts as a change: the passes of a converging
    /// fleet write records all the time, and none of those writes changes
    /// what the manifests want.
    pub fn sync_desired(&self) -> Result<()> {
        let referenced =
            self.synced().as_ref().map(|last| last.referenced.clone()).unwrap_or_default();
        let stamp = desired::Stamp::of(&self.settings.proxies, &referenced)?;
        // Read before the records, as the fleet publish does: the sync's
        // own writes make the next one read again, never miss a change.
        let writes = self.store.record_writes();
        let removals = self.store.record_removals();
        let now = unix_now();
        let unchanged = self.synced().as_ref().is_some_and(|last| {
            stamp.unchanged_since(&last.stamp)
                && if last.pools { last.writes == writes } else { last.removals == removals }
                && last.until.is_none_or(|at| now < at)
        });
        if unchanged {
            return Ok(());
        }
        let wanted = desired::load(&self.settings.proxies)?;
        let mut records: HashMap<String, ProxyRecord> =
            self.store.records()?.into_iter().map(|r| (r.key(), r)).collect();
        let mut until: Option<u64> = None;
        let mut keep = HashSet::new();
        let mut batch = NewRecords { now, records: Vec::new() };
        for proxy in wanted.proxies {
            let key = record_key(&proxy.namespace, &proxy.name);
            keep.insert(key.clone());
            let existing = records.remove(&key);
            self.upsert(existing, &proxy.namespace, &proxy.name, proxy.desired, None, &mut batch)?;
        }
        let mut pool_counts = Vec::new();
        for pool in &wanted.pools {
            let pool_key = record_key(&pool.namespace, &pool.name);
            let members: Vec<&ProxyRecord> =
                records.values().filter(|r| r.pool.as_deref() == Some(pool_key.as_str())).collect();
            let view: Vec<PoolMember> = members
                .iter()
                .map(|r| PoolMember {
                    name: r.meta.name.clone(),
                    provider: r.desired.provider.clone(),
                    created_at: r.created_at,
                    ready: r.status.condition(ConditionType::Ready).map(|c| c.status)
                        == Some(ConditionStatus::True),
                    deleting: r.deleting,
                })
                .collect();
            let plan = pool::plan(&pool.spec, &view, now);
            pool_counts.push((
                pool_key.clone(),
                PoolCounts { desired: pool.spec.replicas, ready: plan.ready },
            ));
            until = until.into_iter().chain(plan.next_rotation).min();
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
                self.upsert(Some(member), &namespace, &name, want, Some(&pool_key), &mut batch)?;
            }
            for provider in plan.create {
                let suffix = &uuid::Uuid::new_v4().simple().to_string()[..5];
                let stem: String = pool.name.chars().take(57).collect();
                let name = format!("{}-{suffix}", stem.trim_end_matches('-'));
                keep.insert(record_key(&pool.namespace, &name));
                let mut want = pool.template.clone();
                want.provider = provider;
                self.upsert(None, &pool.namespace, &name, want, Some(&pool_key), &mut batch)?;
            }
        }
        self.store.put_records(&batch.records)?;
        let written = Instant::now();
        self.schedule().extend(batch.records.iter().map(|record| (record.key(), written)));
        for (key, record) in records {
            if !record.deleting
                && !keep.contains(&key)
                && self.mark_deleting(&key, &record.meta.uid, |_| true)?
            {
                tracing::info!(proxy = %key, "Proxy no longer wanted; deleting its instance");
            }
        }
        self.metrics.set_pools(pool_counts.iter().map(|(pool, counts)| (pool.as_str(), *counts)));
        let pools = !wanted.pools.is_empty();
        *self.synced() =
            Some(Synced { stamp, referenced: wanted.referenced, writes, removals, pools, until });
        Ok(())
    }

    fn synced(&self) -> std::sync::MutexGuard<'_, Option<Synced>> {
        self.synced.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Creates or updates one record from its desired state.
    fn upsert(
        &self,
        existing: Option<ProxyRecord>,
        namespace: &str,
        name: &str,
        mut desired: proxyfleet_core::proxy::ProxyDesired,
        pool: Option<&str>,
        batch: &mut NewRecords,
    ) -> Result<()> {
        let key = record_key(namespace, name);
        // The manifests never carry an operator's replacement request: the
        // record does, and keeps it while the Proxy is wanted.
        if let Some(record) = &existing {
            desired.replace_token.clone_from(&record.desired.replace_token);
        }
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
                    // Written before any pass can create an instance, in
                    // the sync's commit: a pass of its own to put it on
                    // would cost every new Proxy a commit and a dispatch.
                    finalizer: true,
                    deleting: false,
                    pool: pool.map(str::to_owned),
                    created_at: batch.now,
                };
                tracing::info!(proxy = %key, uid = %record.meta.uid, pool = ?pool, "new Proxy");
                batch.records.push(record);
            }
            // A Proxy re-added while its old incarnation is still being
            // deleted is created once that deletion has finished.
            Some(record) if record.deleting => {}
            // Only the desired state and its generation are written: a
            // pass in flight keeps its status and wakes again.
            Some(record) if record.desired != desired => {
                let mut generation = None;
                self.store.update_record(&key, |fresh| {
                    if fresh.meta.uid != record.meta.uid
                        || fresh.deleting
                        || fresh.desired == desired
                    {
                        return false;
                    }
                    fresh.desired = desired;
                    fresh.meta.generation += 1;
                    generation = Some(fresh.meta.generation);
                    true
                })?;
                if let Some(generation) = generation {
                    tracing::info!(proxy = %key, generation, "Proxy changed");
                    self.schedule().insert(key, Instant::now());
                }
            }
            Some(_) => {}
        }
        Ok(())
    }

    /// Runs a pass for every record that is due and waits for them all;
    /// returns how many ran. The run loop does not wait: it keeps passes in
    /// flight across its turns ([`Standalone::run`]).
    pub async fn reconcile_due(&self) -> usize {
        let mut dispatch = Dispatch::new();
        let count = self.queue_due(&mut dispatch);
        loop {
            self.start_queued(&mut dispatch);
            if dispatch.next().await.is_none() {
                break count;
            }
        }
    }

    /// Puts every due record that is not already waiting or running in
    /// line, in the order they became due; returns how many. A queued key
    /// leaves the schedule: a wake while its pass runs (a manifest edit, a
    /// new verdict) puts it back, and the pass's own requeue never moves
    /// that wake later.
    fn queue_due(&self, dispatch: &mut Dispatch<'_, ProxyRecord>) -> usize {
        let now = Instant::now();
        let mut due: Vec<(Instant, String)> = self
            .schedule()
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(key, at)| (*at, key.clone()))
            .collect();
        due.sort_unstable();
        due.into_iter().filter(|(_, key)| self.queue_if_due(dispatch, key.clone())).count()
    }

    /// Puts `key` in line if it is due now and has a record; returns
    /// whether it did.
    fn queue_if_due(&self, dispatch: &mut Dispatch<'_, ProxyRecord>, key: String) -> bool {
        let due = self.schedule().get(&key).is_some_and(|at| *at <= Instant::now());
        if !due || dispatch.is_busy(&key) {
            return false;
        }
        self.schedule().remove(&key);
        match self.store.record(&key) {
            Ok(Some(record)) => {
                let begun = record.deleting
                    || matches!(record.status.phase, Phase::Provisioning | Phase::Deleting);
                let turn = if begun { Turn::Ahead } else { Turn::Behind };
                dispatch.queue(key, record.desired.provider.clone(), record, turn);
                true
            }
            Ok(None) => false,
            Err(err) => {
                self.reconcile_failed(&key, &err);
                false
            }
        }
    }

    /// Starts what waits, each entry up to its `limits.concurrency`
    /// ([`Dispatch`]): the passes run at the speed each entry's limits
    /// allow, and a slow entry takes only its own slots.
    fn start_queued<'a>(&'a self, dispatch: &mut Dispatch<'a, ProxyRecord>) {
        dispatch.start(
            |entry| self.entry_concurrency(entry),
            |key, record| async move {
                if let Err(err) = self.reconcile_record(&key, record).await {
                    self.reconcile_failed(&key, &err);
                }
            },
        );
    }

    /// How many passes of Proxies on `entry` may be in flight at once: its
    /// `limits.concurrency`, as many as its plugin may have calls open.
    /// Asked on every dispatch, so an entry edited while running gets its
    /// new bound at once.
    fn entry_concurrency(&self, entry: &str) -> usize {
        self.source
            .concurrency(entry)
            .or_else(|| self.settings.concurrency.get(entry).copied())
            .unwrap_or(UNKNOWN_ENTRY_CONCURRENCY)
    }

    fn reconcile_failed(&self, key: &str, err: &Error) {
        tracing::error!(proxy = %key, "reconcile failed: {err}");
        self.schedule().insert(key.to_owned(), Instant::now() + self.settings.policy.backoff_base);
    }

    /// Runs one pass on `record` and writes its outcome. It writes only
    /// what it owns (status and finalizer) into the record as it is then,
    /// with the latest health verdict merged: a manifest sync or a verdict
    /// that came in during the pass is kept, and wakes the Proxy again.
    async fn reconcile_record(&self, key: &str, record: ProxyRecord) -> Result<()> {
        let _pass = self.reconciler.pass();
        let provider = self.source.provider(&record.desired.provider);
        let provider_ref: Result<&dyn Provider, ProviderError> = match &provider {
            Ok(provider) => Ok(provider.as_ref()),
            Err(err) => Err(err.clone()),
        };
        let mut status = record.status.clone();
        if !record.deleting {
            self.fleet.merge_verdict(&record.meta.uid, &mut status, unix_now());
        }
        let state = ProxyState {
            meta: &record.meta,
            desired: &record.desired,
            status: &status,
            deleting: record.deleting,
            has_finalizer: record.finalizer,
            spec_key: &self.spec_key,
        };
        let started = Instant::now();
        let outcome =
            reconcile(state, provider_ref, &self.settings.policy, unix_now(), random_jitter())
                .await;
        for event in &outcome.events {
            if event.warning {
                tracing::warn!(proxy = %key, reason = event.reason, "{}", event.message);
            } else {
                tracing::info!(proxy = %key, reason = event.reason, "{}", event.message);
            }
            // The console's activity: what Kubernetes keeps as Events.
            self.fleet.record_activity_at(
                unix_now(),
                Some((&record.meta.uid, key.to_owned())),
                format!("{}: {}", event.reason, event.message),
            );
        }
        tracing::debug!(proxy = %key, elapsed_ms = started.elapsed().as_millis() as u64, phase = ?outcome.status.phase, "reconciled");
        self.metrics.record_reconcile(started.elapsed(), outcome.error);
        let finalizer = match outcome.finalizer {
            FinalizerChange::Add => true,
            FinalizerChange::Remove => false,
            FinalizerChange::Keep => record.finalizer,
        };
        let mut status = outcome.status;
        let now = unix_now();
        // A pass that changed nothing (a settled Proxy's resync) writes
        // nothing: a write would make every reader of the records (the
        // fleet publish) decode them all again.
        let current = self.store.update_record(key, |fresh| {
            if fresh.meta.uid != record.meta.uid || (fresh.deleting && !finalizer) {
                return false;
            }
            if !fresh.deleting {
                self.fleet.merge_verdict(&fresh.meta.uid, &mut status, now);
            }
            let changed = fresh.status != status || fresh.finalizer != finalizer;
            fresh.status = status;
            fresh.finalizer = finalizer;
            changed
        })?;
        let Some(current) = current.filter(|fresh| fresh.meta.uid == record.meta.uid) else {
            return Ok(());
        };
        if current.deleting && !finalizer {
            self.store.remove_record(key)?;
            self.schedule().remove(key);
            tracing::info!(proxy = %key, "Proxy deleted");
            return Ok(());
        }
        if let Some(after) = outcome.requeue_after {
            let at = Instant::now() + after;
            let mut schedule = self.schedule();
            let next = schedule.entry(key.to_owned()).or_insert(at);
            *next = (*next).min(at);
        }
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
        let settings =
            GcSettings { min_age: self.settings.gc_min_age, dry_run: self.settings.gc_dry_run };
        housekeeping::collect_garbage(self.source.as_ref(), &live, settings, &self.metrics).await
    }

    /// Checks every entry (`proxyfleet_housekeeping::check_entries`) and
    /// publishes the results on the state API.
    pub async fn check_providers(&self) -> Vec<ProviderCheck> {
        let now = unix_now();
        let results =
            check_entries(self.source.as_ref(), self.settings.check_interval, &self.metrics).await;
        let mut published = self.checks.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for EntryCheck { entry, availability, health } in results {
            let plugin = match availability {
                Availability::Loaded(info) => Some(format!("{} {}", info.name, info.version)),
                Availability::Loading | Availability::Failed(_) => None,
            };
            let last_success = if health.healthy {
                Some(now)
            } else {
                published.get(&entry).and_then(|c| c.last_success)
            };
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
        // The tasks below are aborted at the end: each heartbeat is retired
        // here, not where it is used.
        let watchdog = &self.settings.watchdog;
        let health =
            self.settings.health.as_ref().map(|_| Arc::new(watchdog.expect_beats("health engine")));
        let checks = Arc::new(watchdog.expect_beats("provider checks"));
        let turns = watchdog.expect_beats("run loop");
        let prober = self.settings.health.clone().zip(health.clone()).map(|(settings, health)| {
            let engine =
                HealthEngine::new(settings, Arc::clone(&self.fleet)).with_heartbeat(health);
            tokio::spawn(engine.run(std::future::pending()))
        });
        let checker = {
            let this = Arc::clone(&self);
            let checks = Arc::clone(&checks);
            tokio::spawn(async move {
                loop {
                    this.check_providers().await;
                    checks.beat();
                    tokio::time::sleep(this.settings.check_interval).await;
                }
            })
        };
        tokio::pin!(shutdown);
        let mut dispatch = Dispatch::new();
        let mut next_turn = Instant::now();
        let mut next_rescan = Instant::now();
        let mut next_gc = Instant::now() + self.settings.gc_interval;
        loop {
            if Instant::now() >= next_turn {
                if Instant::now() >= next_rescan {
                    if let Err(err) = self.sync_desired() {
                        tracing::error!("manifests not applied: {err}");
                    }
                    next_rescan = Instant::now() + self.settings.rescan;
                }
                if let Err(err) = self.publish_fleet().and_then(|()| self.apply_health()) {
                    tracing::error!("health verdicts not applied: {err}");
                }
                for entry in self.source.revisions() {
                    self.metrics.observe_revisions(&entry.entry, entry.swaps, entry.rejections);
                }
                if Instant::now() >= next_gc {
                    // Orphans are told apart by the records: collect with
                    // no pass in flight, so none is between making an
                    // instance and recording it. Passes wait meanwhile.
                    while dispatch.next().await.is_some() {}
                    self.collect_garbage().await;
                    next_gc = Instant::now() + self.settings.gc_interval;
                }
                self.queue_due(&mut dispatch);
                next_turn = Instant::now() + TURN;
                turns.beat();
            }
            self.start_queued(&mut dispatch);
            // Passes run across turns; each result is published at the
            // next turn, not when the slowest pass of a batch ends.
            tokio::select! {
                () = &mut shutdown => break,
                // A pass that asked to run again at once (after adding
                // the finalizer, say) does not wait for the next turn.
                Some(key) = dispatch.next() => {
                    self.queue_if_due(&mut dispatch, key);
                }
                () = tokio::time::sleep_until(next_turn.into()) => {}
            }
        }
        // A pass cut off between a provider call and its record would
        // leave an instance to adopt later: let the running ones end.
        while dispatch.next().await.is_some() {}
        checker.abort();
        if let Some(prober) = prober {
            prober.abort();
        }
        for heartbeat in health.iter().chain([&checks]) {
            heartbeat.retire();
        }
        turns.retire();
        Ok(())
    }
}

/// The catalog member of a record: it gets an endpoint once it runs with
/// an address, and loses it when it stops or is deleted.
fn member_of(record: ProxyRecord) -> proxyfleet_fleet::Member {
    let endpoint = record
        .status
        .ip
        .as_deref()
        .and_then(|ip| ip.parse().ok())
        .filter(|_| record.status.phase == Phase::Running && !record.deleting)
        .map(|ip| {
            Endpoint::new(ip, record.status.port.unwrap_or(record.desired.port))
                .with_credential(record.desired.proxy_auth.clone())
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
        created_at: (record.created_at > 0).then_some(record.created_at),
        conditions: record.status.conditions,
    }
}

#[async_trait::async_trait]
impl ModeStatus for Standalone {
    fn providers(&self) -> serde_json::Value {
        serde_json::json!({ "checks": self.provider_checks(), "revisions": self.source.revisions() })
    }

    fn rollback(&self, entry: &str) -> Result<serde_json::Value, Refusal> {
        let active = housekeeping::rollback(self.source.as_ref(), entry)?;
        Ok(serde_json::to_value(active).unwrap_or_default())
    }

    fn name(&self) -> &'static str {
        "standalone"
    }

    fn revisions(&self) -> Vec<proxyfleet_core::revisions::EntryRevisions> {
        self.source.revisions()
    }

    fn session_key(&self) -> Option<[u8; 32]> {
        Some(self.spec_key.derive(proxyfleet_fleet::console::SESSION_KEY_PURPOSE))
    }

    async fn replace(&self, proxy: &ProxyRef) -> std::result::Result<(), Refusal> {
        let key = record_key(&proxy.namespace, &proxy.name);
        let current = self
            .store
            .update_record(&key, |fresh| {
                if fresh.meta.uid != proxy.id || fresh.deleting {
                    return false;
                }
                fresh.desired.replace_token = Some(uuid::Uuid::new_v4().to_string());
                fresh.meta.generation += 1;
                true
            })
            .map_err(|err| Refusal::Unavailable(err.to_string()))?;
        match current {
            Some(record) if record.meta.uid == proxy.id && !record.deleting => {
                tracing::info!(proxy = %key, generation = record.meta.generation, "replacement asked for");
                self.schedule().insert(key, Instant::now());
                Ok(())
            }
            Some(record) if record.meta.uid == proxy.id => Err(Refusal::Conflict(format!(
                "Proxy {key} is being deleted; there is no instance to replace"
            ))),
            _ => Err(Refusal::NotFound(format!("Proxy {key} is gone"))),
        }
    }

    async fn record(&self, action: &Action) {
        let logged = LoggedAction { at: unix_now(), action: action.clone() };
        if let Err(err) = self.store.log_action(&logged) {
            tracing::warn!(reason = action.reason(), "cannot log an operator's action: {err}");
        }
    }

    fn checks(&self) -> Vec<proxyfleet_fleet::api::EntryCheck> {
        self.provider_checks()
            .into_iter()
            .map(|check| proxyfleet_fleet::api::EntryCheck {
                entry: check.entry,
                health: check.health,
                checked_at: check.checked_at,
            })
            .collect()
    }
}
