//! The fleet as crawlers see it.
//!
//! A mode publishes its Proxies as [`Member`]s; the health engine records
//! probe results against them; the discovery API lists them, picks healthy
//! ones, leases them out and takes crawlers' reports. The mode reads back
//! verdict changes (to write the `Healthy` condition) and replacement
//! requests (to have a pool replace a banned proxy).
//!
//! Invariants:
//! - Only a member that is `Running`, has an endpoint, has a `Healthy`
//!   verdict and is not quarantined is handed out.
//! - An exclusive lease's proxy is handed to no one else until the lease is
//!   released or expires; an exclusive lease is granted only on a proxy no
//!   live lease holds.
//! - Health counters belong to an endpoint: a member whose endpoint goes
//!   away or changes loses them at the next publish.
//!
//! Picking is the hot path of the API: the healthy candidates live in an
//! immutable [`View`] swapped in whole when membership or verdicts change,
//! so a pick takes one atomic load and one short mutex hold (for leases and
//! quarantines).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use proxyfleet_core::clock::unix_now;
use proxyfleet_core::kv::KvStore;
use proxyfleet_core::proxy::{Phase, ProxyStatus};
use proxyfleet_metrics::{HealthCounts, Metrics};

use crate::error::Result;
use crate::leases::{Held, Lease, LeaseStore, LeaseView, Leases};
use crate::probe::{ProbeFailure, ProbePass};

mod activity;
mod bans;
mod duplicates;
mod error;
mod history;
mod member;
mod report;
mod selector;
mod settings;
#[cfg(test)]
pub(crate) mod tests;
mod verdict;
mod view;

pub use crate::endpoint::Endpoint;
pub use activity::Activity;
use bans::SiteBans;
pub use bans::site_of;
pub use error::CatalogError;
pub use history::HistoryMinute;
pub use member::Member;
pub use report::{ReportKind, ReportOutcome};
use selector::describe;
pub use selector::{Selector, Strategy};
pub use settings::FleetSettings;
pub use verdict::{HealthRecord, Verdict};
pub use view::{ProxyView, SiteBan};

/// A healthy, running member the catalog may hand out.
#[derive(Debug)]
struct Offer {
    id: String,
    /// `namespace/name`.
    name: String,
    endpoint: Endpoint,
    pool: Option<String>,
    provider: String,
    labels: BTreeMap<String, String>,
    url: String,
    /// Monotonic pick counter value when last handed out, for LRU.
    last_handed: AtomicU64,
}

/// The healthy, running members; rebuilt on change, read lock-free.
#[derive(Debug, Default)]
struct View {
    offers: Vec<Offer>,
    /// Round-robin cursors per pool (`""`: no pool named).
    cursors: HashMap<String, AtomicUsize>,
    /// Indices into `offers` per pool.
    by_pool: HashMap<String, Vec<usize>>,
    /// Index into `offers` by proxy ID.
    by_id: HashMap<String, usize>,
    /// Every pool with a member, available or not: a pool missing here is
    /// unknown, not merely busy.
    pools: HashSet<String>,
    /// Running members held out because another one has their endpoint.
    duplicates: HashMap<String, duplicates::Duplicate>,
}

/// A proxy the catalog picked for a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Picked {
    /// The Proxy's UID.
    pub id: String,
    /// `namespace/name`.
    pub name: String,
    /// Its pool, if any.
    pub pool: Option<String>,
    /// `http://ip:port`.
    pub url: String,
    /// Where it listens, and its credential when it asks for one.
    pub endpoint: Endpoint,
}

impl Picked {
    fn of(offer: &Offer) -> Self {
        Self {
            id: offer.id.clone(),
            name: offer.name.clone(),
            pool: offer.pool.clone(),
            url: offer.url.clone(),
            endpoint: offer.endpoint.clone(),
        }
    }
}

/// A sticky session: requests naming the same key get the same proxy while
/// it stays available, for `ttl` from the session's first request.
#[derive(Debug, Clone, Copy)]
pub struct Session<'a> {
    /// The crawler's session ID.
    pub key: &'a str,
    /// How long the session holds its proxy.
    pub ttl: Duration,
}

/// How the leases that keep gateway sessions are named.
const SESSION_PREFIX: &str = "session-";

impl Session<'_> {
    /// The lease the session is kept as.
    pub fn lease_id(&self) -> String {
        format!("{SESSION_PREFIX}{}", self.key)
    }
}

#[derive(Debug, Default)]
struct Holds {
    /// Proxy ID → when its quarantine ends.
    quarantined: HashMap<String, (Instant, u64)>,
    /// Proxy ID → reports so far.
    reports: HashMap<String, u32>,
    site_bans: SiteBans,
    leases: Leases,
    /// Members the mode should replace.
    replace: Vec<Member>,
    /// Proxies already asked to be replaced, so a burst of reports asks once.
    replacing: HashSet<String>,
}

impl Holds {
    fn quarantined(&self, id: &str, now: Instant) -> bool {
        self.quarantined.get(id).is_some_and(|(until, _)| *until > now)
    }

    fn sweep(&mut self, now: Instant) {
        self.leases.expire(now);
        self.quarantined.retain(|_, (until, _)| *until > now);
        self.site_bans.sweep(now);
    }

    /// Whether `offer` may serve a request for `selector` now; `exclusive`
    /// asks for a proxy no live lease holds, and `exclude` lists proxies
    /// the request already failed on.
    fn eligible(
        &self,
        offer: &Offer,
        selector: &Selector,
        exclusive: bool,
        exclude: &[String],
        now: Instant,
    ) -> bool {
        if !selector.matches(offer.pool.as_deref(), &offer.provider, &offer.labels)
            || self.quarantined(&offer.id, now)
            || exclude.contains(&offer.id)
            || selector
                .site
                .as_deref()
                .is_some_and(|site| self.site_bans.banned(&offer.id, site, now))
        {
            return false;
        }
        let (any, held_exclusively) = self.leases.held(&offer.id, now);
        !(held_exclusively || exclusive && any)
    }
}

#[derive(Debug, Default)]
struct State {
    members: BTreeMap<String, Member>,
    health: HashMap<String, HealthRecord>,
    /// Probe results by minute over the last hour.
    history: HashMap<String, history::History>,
    /// Verdicts changed since the mode last asked.
    changed: HashSet<String>,
}

/// The catalog. Shared by the mode, the health engine and the API.
#[derive(Debug)]
pub struct Fleet {
    settings: FleetSettings,
    state: RwLock<State>,
    view: ArcSwap<View>,
    holds: Mutex<Holds>,
    /// Increases with every pick; orders candidates for LRU.
    picks: AtomicU64,
    ready: AtomicBool,
    metrics: Arc<Metrics>,
    /// Where leases outlive this process; `None` keeps them in memory only.
    lease_store: Option<LeaseStore>,
    /// Counts changes a viewer would see: membership, verdicts, holds.
    changes: tokio::sync::watch::Sender<u64>,
    /// What happened lately.
    activity: Mutex<activity::Log>,
}

impl Fleet {
    /// An empty catalog.
    pub fn new(settings: FleetSettings, metrics: Arc<Metrics>) -> Self {
        metrics.init_report_kinds(ReportKind::ALL.map(ReportKind::as_str));
        Self {
            settings,
            state: RwLock::default(),
            view: ArcSwap::default(),
            holds: Mutex::default(),
            picks: AtomicU64::new(0),
            ready: AtomicBool::new(false),
            metrics,
            lease_store: None,
            changes: tokio::sync::watch::Sender::new(0),
            activity: Mutex::default(),
        }
    }

    /// Records an event for people (the console's activity), about proxy
    /// `id` when given.
    pub fn record_activity(&self, id: Option<&str>, what: String) {
        let name = id.and_then(|id| self.state_read().members.get(id).map(Member::qualified_name));
        self.log_activity(id.zip(name), what);
    }

    /// Records an event of Unix second `at` about proxy `(id,
    /// namespace/name)`, which need not be a member yet: the reconciler's
    /// events as they happen, or, after a restart, the operators' actions a
    /// mode kept (oldest first, before anything new happens).
    pub fn record_activity_at(&self, at: u64, proxy: Option<(&str, String)>, what: String) {
        self.activity.lock().unwrap_or_else(PoisonError::into_inner).push_at(at, proxy, what);
        self.changed();
    }

    fn log_activity(&self, proxy: Option<(&str, String)>, what: String) {
        self.activity.lock().unwrap_or_else(PoisonError::into_inner).push(proxy, what);
        self.changed();
    }

    /// The last `limit` events, newest first; only proxy `id`'s when given.
    pub fn activity(&self, id: Option<&str>, limit: usize) -> Vec<Activity> {
        self.activity.lock().unwrap_or_else(PoisonError::into_inner).last(id, limit)
    }

    /// Proxy `id`'s probe results by minute over the last hour, oldest
    /// first.
    pub fn health_history(&self, id: &str) -> Vec<HistoryMinute> {
        self.state_read().history.get(id).map(|h| h.minutes(unix_now())).unwrap_or_default()
    }

    /// Live per-site bans: site → proxies banned for it.
    pub fn ban_counts(&self) -> BTreeMap<String, usize> {
        let now = Instant::now();
        // State before holds, as everywhere else: the other order could
        // wait on a listing that waits on us.
        let state = self.state_read();
        let holds = self.holds();
        let mut counts = BTreeMap::new();
        for id in state.members.keys() {
            for (site, _) in holds.site_bans.of(id, now) {
                *counts.entry(site).or_default() += 1;
            }
        }
        counts
    }

    /// Live gateway sessions (their leases), counted without copying the
    /// lease table: the console samples it every few seconds.
    pub fn session_count(&self) -> usize {
        self.holds().leases.count_prefixed(SESSION_PREFIX, Instant::now())
    }

    /// Told of every change a viewer of the catalog would see: membership,
    /// phases, verdicts, quarantines, bans and leases (not probe counters,
    /// which move every round).
    pub fn watch_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    fn changed(&self) {
        self.changes.send_modify(|version| *version = version.wrapping_add(1));
    }

    /// Keeps leases in `store` as well, so a restart or a new leader keeps
    /// them (see [`crate::leases`]).
    #[must_use]
    pub fn with_lease_store(mut self, store: Arc<dyn KvStore>) -> Self {
        self.lease_store = Some(LeaseStore::new(store));
        self
    }

    /// The settings.
    pub fn settings(&self) -> &FleetSettings {
        &self.settings
    }

    /// The metrics the catalog records into.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Marks the catalog ready to serve: the mode has published once and
    /// the health engine has finished a round.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
    }

    /// See [`Fleet::set_ready`].
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    fn state_read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn state_write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(PoisonError::into_inner)
    }

    fn holds(&self) -> MutexGuard<'_, Holds> {
        self.holds.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Replaces the membership. Health counters of members that left, or
    /// whose endpoint went away or changed, are dropped now.
    pub fn publish(&self, members: Vec<Member>) {
        let mut state = self.state_write();
        let members: BTreeMap<String, Member> =
            members.into_iter().map(|m| (m.id.clone(), m)).collect();
        // Modes publish on every loop turn; most turns change nothing, and
        // then neither counters nor the handed-out view need touching.
        if members == state.members {
            return;
        }
        let removed =
            state.members.keys().filter(|id| !members.contains_key(*id)).cloned().collect();
        self.apply(&mut state, members.into_values().collect(), removed);
    }

    /// Changes part of the membership: `upserts` are added or replace the
    /// members of their IDs, the members `removed` names leave. For a mode
    /// that knows what changed: the cost follows the change, not the
    /// fleet. Health counters go as [`Fleet::publish`] drops them.
    pub fn update(&self, upserts: Vec<Member>, removed: Vec<String>) {
        let mut state = self.state_write();
        self.apply(&mut state, upserts, removed);
    }

    fn apply(&self, state: &mut State, upserts: Vec<Member>, removed: Vec<String>) {
        let mut changed = false;
        let mut left = false;
        let mut events = Vec::new();
        for id in removed {
            let Some(gone) = state.members.remove(&id) else { continue };
            (changed, left) = (true, true);
            self.metrics.gateway().forget_upstream(gone.pool.as_deref(), &gone.qualified_name());
            state.health.remove(&id);
            state.history.remove(&id);
            state.changed.remove(&id);
            events.push((id, gone.qualified_name(), "left the fleet".to_owned()));
        }
        for member in upserts {
            let before = state.members.get(&member.id);
            if before == Some(&member) {
                continue;
            }
            match before {
                None => events.push((
                    member.id.clone(),
                    member.qualified_name(),
                    format!("joined the fleet, {}", member.phase.as_str()),
                )),
                Some(before) if before.phase != member.phase => events.push((
                    member.id.clone(),
                    member.qualified_name(),
                    format!("{} → {}", before.phase.as_str(), member.phase.as_str()),
                )),
                Some(_) => {}
            }
            changed = true;
            let same_endpoint = state.health.get(&member.id).is_some_and(|record| {
                member.endpoint.as_ref().is_some_and(|endpoint| *endpoint == record.endpoint)
            });
            // The counters describe the endpoint that was probed: a member
            // without it starts over, and the mode clears its condition.
            if !same_endpoint && state.health.remove(&member.id).is_some() {
                state.changed.insert(member.id.clone());
            }
            state.members.insert(member.id.clone(), member);
        }
        if !changed {
            return;
        }
        {
            let mut log = self.activity.lock().unwrap_or_else(PoisonError::into_inner);
            for (id, name, what) in events {
                log.push(Some((&id, name)), what);
            }
        }
        let mut phases: BTreeMap<(&str, &'static str), u64> = BTreeMap::new();
        for member in state.members.values() {
            let pool = member.pool.as_deref().unwrap_or_default();
            *phases.entry((pool, member.phase.as_str())).or_default() += 1;
        }
        self.metrics.set_phases(phases);
        self.rebuild(state);
        if left {
            let mut holds = self.holds();
            holds.replacing.retain(|id| state.members.contains_key(id));
            holds.reports.retain(|id, _| state.members.contains_key(id));
            holds.site_bans.retain(|id| state.members.contains_key(id));
        }
    }

    /// Members with an endpoint, for the health engine.
    pub fn probe_targets(&self) -> Vec<(String, Endpoint)> {
        self.state_read()
            .members
            .values()
            .filter_map(|m| m.endpoint.clone().map(|e| (m.id.clone(), e)))
            .collect()
    }

    /// Records a round of probe results. A result for an endpoint the member
    /// no longer has is dropped: it describes a proxy that is gone.
    pub fn record_probes(
        &self,
        results: Vec<(String, Endpoint, Result<ProbePass, ProbeFailure>)>,
        healthy_after: u32,
        unhealthy_after: u32,
    ) {
        let now = unix_now();
        let mut state = self.state_write();
        let mut changed = false;
        let mut verdicts = Vec::new();
        for (id, endpoint, result) in results {
            let current = state.members.get(&id).and_then(|m| m.endpoint.as_ref());
            if current != Some(&endpoint) {
                continue;
            }
            let record =
                state.health.entry(id.clone()).or_insert_with(|| HealthRecord::new(endpoint));
            let before = record.verdict;
            record.checked_at = Some(now);
            let latency = result.as_ref().ok().map(|pass| pass.latency.as_secs_f64() * 1000.0);
            state.history.entry(id.clone()).or_default().record(now, latency);
            let record = state.health.get_mut(&id).expect("inserted above");
            match result {
                Ok(pass) => {
                    record.passes += 1;
                    record.consecutive_passes = record.consecutive_passes.saturating_add(1);
                    record.consecutive_failures = 0;
                    record.latency_ms = Some(pass.latency.as_secs_f64() * 1000.0);
                    record.exit_ip = pass.exit_ip.or(record.exit_ip.take());
                    if record.consecutive_passes >= healthy_after {
                        record.verdict = Verdict::Healthy;
                    }
                }
                Err(failure) => {
                    record.failures += 1;
                    record.consecutive_failures = record.consecutive_failures.saturating_add(1);
                    record.consecutive_passes = 0;
                    record.last_error = Some(failure.0);
                    if record.consecutive_failures >= unhealthy_after {
                        record.verdict = Verdict::Unhealthy;
                    }
                }
            }
            if record.verdict != before {
                tracing::info!(proxy = %id, verdict = ?record.verdict, message = %record.message(), "health verdict changed");
                let what = record.message();
                if let Some(member) = state.members.get(&id) {
                    verdicts.push((id.clone(), member.qualified_name(), what));
                }
                state.changed.insert(id);
                changed = true;
            }
        }
        let mut by_pool: BTreeMap<&str, HealthCounts> = BTreeMap::new();
        for member in state.members.values().filter(|m| m.endpoint.is_some()) {
            let counts = by_pool.entry(member.pool.as_deref().unwrap_or_default()).or_default();
            match state.health.get(&member.id).map(|r| r.verdict) {
                Some(Verdict::Healthy) => counts.healthy += 1,
                Some(Verdict::Unhealthy) => counts.unhealthy += 1,
                Some(Verdict::Unknown) | None => counts.unknown += 1,
            }
        }
        self.metrics.set_health(by_pool);
        if changed {
            self.rebuild(&state);
            drop(state);
            let mut log = self.activity.lock().unwrap_or_else(PoisonError::into_inner);
            for (id, name, what) in verdicts {
                log.push(Some((&id, name)), what);
            }
        }
    }

    /// Verdicts that changed since the last call: `(id, Some(record))` for
    /// a new verdict, `(id, None)` when the counters were dropped.
    pub fn take_verdict_changes(&self) -> Vec<(String, Option<HealthRecord>)> {
        let mut state = self.state_write();
        let changed = std::mem::take(&mut state.changed);
        changed
            .into_iter()
            .map(|id| {
                let record =
                    state.health.get(&id).filter(|r| r.verdict != Verdict::Unknown).cloned();
                (id, record)
            })
            .collect()
    }

    /// The probe counters of one member.
    pub fn health(&self, id: &str) -> Option<HealthRecord> {
        self.state_read().health.get(id).cloned()
    }

    /// Writes the verdict of member `id` into `status` (`Healthy`, then
    /// `Ready`); with no verdict yet, `Healthy` is removed. Both modes'
    /// reconcilers merge it into every status they write, so a verdict
    /// that changed during a pass is never written over. Returns whether
    /// `status` changed.
    pub fn merge_verdict(&self, id: &str, status: &mut ProxyStatus, now: u64) -> bool {
        match self.health(id).filter(|record| record.verdict != Verdict::Unknown) {
            Some(record) => {
                status.set_health(record.verdict == Verdict::Healthy, &record.message(), now)
            }
            None => status.clear_health(now),
        }
    }

    /// Members the mode should replace after crawlers' reports.
    pub fn take_replacements(&self) -> Vec<Member> {
        std::mem::take(&mut self.holds().replace)
    }

    fn rebuild(&self, state: &State) {
        self.changed();
        let old = self.view.load();
        let handed: HashMap<&str, u64> = old
            .offers
            .iter()
            .map(|c| (c.id.as_str(), c.last_handed.load(Ordering::Relaxed)))
            .collect();
        let mut view = View { duplicates: duplicates::find(&state.members), ..View::default() };
        for (id, duplicate) in &view.duplicates {
            if old.duplicates.get(id) == Some(duplicate) {
                continue;
            }
            let Some(member) = state.members.get(id) else { continue };
            tracing::warn!(
                proxy = %member.qualified_name(),
                holder = %duplicate.holder,
                endpoint = %duplicate.endpoint,
                "two Running Proxies report one endpoint: the one made later is held out of the pool"
            );
            let mut log = self.activity.lock().unwrap_or_else(PoisonError::into_inner);
            log.push(Some((id, member.qualified_name())), duplicate.reason());
        }
        for member in state.members.values() {
            if let Some(pool) = &member.pool {
                view.pools.insert(pool.clone());
            }
            let Some(endpoint) = &member.endpoint else { continue };
            let healthy = state.health.get(&member.id).map(|r| r.verdict) == Some(Verdict::Healthy);
            if member.phase != Phase::Running
                || !healthy
                || view.duplicates.contains_key(&member.id)
            {
                continue;
            }
            let index = view.offers.len();
            view.by_id.insert(member.id.clone(), index);
            view.offers.push(Offer {
                id: member.id.clone(),
                name: member.qualified_name(),
                endpoint: endpoint.clone(),
                pool: member.pool.clone(),
                provider: member.provider.clone(),
                labels: member.labels.clone(),
                url: endpoint.url(),
                last_handed: AtomicU64::new(handed.get(member.id.as_str()).copied().unwrap_or(0)),
            });
            view.by_pool.entry(String::new()).or_default().push(index);
            if let Some(pool) = &member.pool {
                view.by_pool.entry(pool.clone()).or_default().push(index);
            }
        }
        // Round robin goes on where it was: a view is rebuilt whenever a
        // member's conditions change, and a cursor started over at 0 handed
        // the first proxy out again.
        view.cursors = view
            .by_pool
            .keys()
            .map(|k| {
                let at = old.cursors.get(k).map_or(0, |c| c.load(Ordering::Relaxed));
                (k.clone(), AtomicUsize::new(at))
            })
            .collect();
        self.view.store(Arc::new(view));
    }

    /// Every member matching `selector` (and `healthy`, when given).
    pub fn list(&self, selector: &Selector, healthy: Option<bool>) -> Vec<ProxyView> {
        let state = self.state_read();
        let now = Instant::now();
        let mut holds = self.holds();
        holds.sweep(now);
        let view = self.view.load();
        state
            .members
            .values()
            .filter(|m| selector.matches(m.pool.as_deref(), &m.provider, &m.labels))
            .map(|m| self.view_of(m, state.health.get(&m.id), &holds, &view.duplicates, now))
            .filter(|v| healthy.is_none_or(|want| v.healthy == want))
            .collect()
    }

    /// One member.
    pub fn get(&self, id: &str) -> Result<ProxyView, CatalogError> {
        let state = self.state_read();
        let member = state.members.get(id).ok_or_else(|| CatalogError::NoProxy(id.to_owned()))?;
        let holds = self.holds();
        let view = self.view.load();
        Ok(self.view_of(member, state.health.get(id), &holds, &view.duplicates, Instant::now()))
    }

    /// `duplicates`: the current view's, loaded once by the caller.
    fn view_of(
        &self,
        member: &Member,
        health: Option<&HealthRecord>,
        holds: &Holds,
        duplicates: &HashMap<String, duplicates::Duplicate>,
        now: Instant,
    ) -> ProxyView {
        let healthy = health.is_some_and(|h| h.verdict == Verdict::Healthy);
        let quarantined = holds.quarantined(&member.id, now);
        let duplicate = duplicates.get(&member.id).map(duplicates::Duplicate::reason);
        ProxyView {
            id: member.id.clone(),
            namespace: member.namespace.clone(),
            name: member.name.clone(),
            pool: member.pool.clone(),
            provider: member.provider.clone(),
            labels: member.labels.clone(),
            phase: member.phase,
            phase_reason: duplicate.clone().or_else(|| member.phase_reason()),
            created_at: member.created_at,
            conditions: member.conditions.clone(),
            url: member.endpoint.as_ref().map(Endpoint::url),
            authenticated: member.endpoint.as_ref().is_some_and(|e| e.credential.is_some()),
            available: healthy
                && member.phase == Phase::Running
                && !quarantined
                && duplicate.is_none(),
            healthy,
            health: health.cloned(),
            quarantined_until: holds
                .quarantined
                .get(&member.id)
                .filter(|(until, _)| *until > now)
                .map(|(_, at)| *at),
            reports: holds.reports.get(&member.id).copied().unwrap_or(0),
            banned_sites: holds
                .site_bans
                .of(&member.id, now)
                .into_iter()
                .map(|(site, until)| SiteBan { site, until })
                .collect(),
            leases: holds.leases.count(&member.id, now),
        }
    }

    /// Picks an available proxy; `exclusive` asks for one no live lease
    /// holds, and none in `exclude` is picked.
    fn pick(
        &self,
        selector: &Selector,
        strategy: Strategy,
        exclusive: bool,
        exclude: &[String],
        holds: &Holds,
        now: Instant,
    ) -> Result<Picked, CatalogError> {
        let view = self.view.load();
        let key = selector.pool.as_deref().unwrap_or("");
        let indices = view.by_pool.get(key).map(Vec::as_slice).unwrap_or_default();
        let eligible =
            |candidate: &Offer| holds.eligible(candidate, selector, exclusive, exclude, now);
        let len = indices.len();
        let chosen = match strategy {
            Strategy::LeastRecentlyUsed => indices
                .iter()
                .map(|&i| &view.offers[i])
                .filter(|c| eligible(c))
                .min_by_key(|c| c.last_handed.load(Ordering::Relaxed)),
            Strategy::RoundRobin | Strategy::Random => {
                let start = if strategy == Strategy::Random {
                    rand::random_range(0..len.max(1))
                } else {
                    view.cursors.get(key).map_or(0, |c| c.fetch_add(1, Ordering::Relaxed))
                };
                (0..len)
                    .map(|step| &view.offers[indices[(start + step) % len]])
                    .find(|c| eligible(c))
            }
        };
        let Some(chosen) = chosen else {
            return Err(match &selector.pool {
                Some(pool) if !view.pools.contains(pool) => CatalogError::UnknownPool(pool.clone()),
                _ => CatalogError::NoneAvailable(describe(selector)),
            });
        };
        chosen.last_handed.store(self.picks.fetch_add(1, Ordering::Relaxed) + 1, Ordering::Relaxed);
        Ok(Picked::of(chosen))
    }

    /// `GET /v1/proxies/next`: one available proxy, not exclusively leased.
    pub fn next(
        &self,
        selector: &Selector,
        strategy: Option<Strategy>,
    ) -> Result<(String, String), CatalogError> {
        self.next_picked(selector, strategy).map(|picked| (picked.id, picked.url))
    }

    /// As [`Fleet::next`], with the whole pick (its credential included).
    pub fn next_picked(
        &self,
        selector: &Selector,
        strategy: Option<Strategy>,
    ) -> Result<Picked, CatalogError> {
        let holds = self.holds();
        self.pick(
            selector,
            strategy.unwrap_or(self.settings.strategy),
            false,
            &[],
            &holds,
            Instant::now(),
        )
    }

    /// The URL of proxy `id` with its credential in it, for a crawler the
    /// API has authorized; `None` when the proxy asks for none (or is gone).
    pub fn url_with_credential(&self, id: &str) -> Option<String> {
        let state = self.state_read();
        let endpoint = state.members.get(id)?.endpoint.as_ref()?;
        endpoint.credential.as_ref()?;
        Some(endpoint.url_with_credential())
    }

    /// Picks the proxy one gateway request goes through: the `session`'s
    /// proxy while it stays available, else one chosen by `strategy`, never
    /// one in `exclude`. A session that gets a new proxy is kept like a
    /// lease (`session-<key>`, non-exclusive) and written to the lease store
    /// after the next health round, so a restart, a new leader or another
    /// replica keeps it.
    pub fn route(
        &self,
        selector: &Selector,
        strategy: Option<Strategy>,
        session: Option<Session<'_>>,
        exclude: &[String],
    ) -> Result<Picked, CatalogError> {
        let strategy = strategy.unwrap_or(self.settings.strategy);
        let now = Instant::now();
        let Some(session) = session else {
            return self.pick(selector, strategy, false, exclude, &self.holds(), now);
        };
        let lease_id = session.lease_id();
        let mut holds = self.holds();
        let view = self.view.load();
        let current = holds
            .leases
            .live(&lease_id, now)
            .and_then(|lease| view.by_id.get(&lease.proxy_id))
            .map(|&index| &view.offers[index])
            .filter(|offer| holds.eligible(offer, selector, false, exclude, now));
        if let Some(offer) = current {
            return Ok(Picked::of(offer));
        }
        let picked = self.pick(selector, strategy, false, exclude, &holds, now)?;
        // Written to the store after the next health round, not on the
        // request's path: a session costs the crawler no store write.
        holds.leases.insert_local(
            lease_id,
            Lease {
                proxy_id: picked.id.clone(),
                url: picked.url.clone(),
                exclusive: false,
                expires: now + session.ttl,
                expires_at: unix_now() + session.ttl.as_secs(),
            },
        );
        Ok(picked)
    }

    /// A gateway request could not reach proxy `id`: counted as a failed
    /// probe, so repeated failures turn it unhealthy before the next round.
    pub fn record_upstream_failure(
        &self,
        id: &str,
        reason: String,
        healthy_after: u32,
        unhealthy_after: u32,
    ) {
        let endpoint = self.state_read().members.get(id).and_then(|m| m.endpoint.clone());
        if let Some(endpoint) = endpoint {
            self.record_probes(
                vec![(id.to_owned(), endpoint, Err(ProbeFailure(reason)))],
                healthy_after,
                unhealthy_after,
            );
        }
    }

    /// Leases an available proxy for `ttl` (the default when `None`).
    /// Answers once the lease store holds it: a lease it does not hold
    /// would end at a restart, and another replica could hand the proxy
    /// out too. A proxy the store shows held in a way that rules the lease
    /// out (by a lease this table did not know yet) is passed over for the
    /// next candidate.
    pub async fn lease(
        &self,
        selector: &Selector,
        strategy: Option<Strategy>,
        exclusive: bool,
        ttl: Option<Duration>,
    ) -> Result<LeaseView, CatalogError> {
        let ttl = self.check_ttl(ttl)?;
        let strategy = strategy.unwrap_or(self.settings.strategy);
        let id = uuid::Uuid::new_v4().simple().to_string();
        let mut taken = Vec::new();
        loop {
            let now = Instant::now();
            let lease = {
                let mut holds = self.holds();
                let picked = self.pick(selector, strategy, exclusive, &taken, &holds, now)?;
                let lease = Lease {
                    proxy_id: picked.id,
                    url: picked.url,
                    exclusive,
                    expires: now + ttl,
                    expires_at: unix_now() + ttl.as_secs(),
                };
                // In the table while its write is under way, so no
                // concurrent pick here hands the proxy out against it.
                holds.leases.insert_local(id.clone(), lease.clone());
                lease
            };
            let claimed = match &self.lease_store {
                None => Ok(true),
                Some(store) => {
                    store.claim(&lease.proxy_id, &id, &lease.url, lease.held(), unix_now()).await
                }
            };
            let mut holds = self.holds();
            match claimed {
                Ok(true) => {
                    holds.leases.written(&id);
                    holds.leases.count_grant();
                    let view = holds.leases.view(&id).expect("granted just now");
                    drop(holds);
                    self.changed();
                    return Ok(view);
                }
                Ok(false) => {
                    // Held elsewhere; the next refresh shows how.
                    holds.leases.remove(&id);
                    taken.push(lease.proxy_id);
                }
                Err(err) => {
                    holds.leases.remove(&id);
                    tracing::warn!(lease = %id, "cannot write a discovery lease to the store: {err}");
                    return Err(CatalogError::StoreUnavailable(err.to_string()));
                }
            }
        }
    }

    fn check_ttl(&self, ttl: Option<Duration>) -> Result<Duration, CatalogError> {
        let ttl = ttl.unwrap_or(self.settings.lease_ttl);
        if ttl.is_zero() || ttl > self.settings.max_lease_ttl {
            return Err(CatalogError::Invalid {
                field: "ttlSeconds".to_owned(),
                message: format!(
                    "{} is out of range; use 1 to {}",
                    ttl.as_secs(),
                    self.settings.max_lease_ttl.as_secs()
                ),
            });
        }
        Ok(ttl)
    }

    /// Extends a live lease by `ttl` from now; answers once the lease
    /// store holds the new end.
    pub async fn renew(
        &self,
        lease_id: &str,
        ttl: Option<Duration>,
    ) -> Result<LeaseView, CatalogError> {
        let ttl = self.check_ttl(ttl)?;
        let lease = self.find_lease(lease_id).await?;
        let now = Instant::now();
        let expires_at = unix_now() + ttl.as_secs();
        let unwritten = self.holds().leases.is_unwritten(lease_id);
        if let Some(store) = self.lease_store.as_ref().filter(|_| !unwritten) {
            let extended = store
                .extend(&lease.proxy_id, lease_id, expires_at, unix_now())
                .await
                .map_err(|err| self.unavailable(lease_id, &err))?;
            if !extended {
                self.holds().leases.remove(lease_id);
                return Err(CatalogError::NoLease(lease_id.to_owned()));
            }
        }
        let mut holds = self.holds();
        let renewed = Lease { expires: now + ttl, expires_at, ..lease };
        match unwritten {
            true => holds.leases.insert_local(lease_id.to_owned(), renewed),
            false => holds.leases.insert(lease_id.to_owned(), renewed),
        }
        Ok(holds.leases.view(lease_id).expect("renewed just now"))
    }

    /// Ends a lease; answers once the lease store no longer holds it.
    pub async fn release(&self, lease_id: &str) -> Result<(), CatalogError> {
        let lease = self.find_lease(lease_id).await?;
        // A session the store does not hold yet ends here alone.
        let unwritten = self.holds().leases.is_unwritten(lease_id);
        if let Some(store) = self.lease_store.as_ref().filter(|_| !unwritten) {
            let ended = store
                .end(&lease.proxy_id, lease_id, unix_now())
                .await
                .map_err(|err| self.unavailable(lease_id, &err))?;
            if !ended {
                self.holds().leases.remove(lease_id);
                return Err(CatalogError::NoLease(lease_id.to_owned()));
            }
        }
        self.holds().leases.remove(lease_id);
        self.changed();
        Ok(())
    }

    /// The live lease `lease_id`: from the table, or else from the store,
    /// where another replica may have granted it since the last refresh.
    async fn find_lease(&self, lease_id: &str) -> Result<Lease, CatalogError> {
        let known = self.holds().leases.live(lease_id, Instant::now()).cloned();
        if let Some(lease) = known {
            return Ok(lease);
        }
        if let Some(store) = &self.lease_store {
            // Granted by another replica since this table last followed the
            // store: a read is enough (writing sessions and tidying wait for
            // the round's refresh, so unknown IDs cost no writes).
            let loaded = store
                .load(unix_now(), Instant::now())
                .await
                .map_err(|err| CatalogError::StoreUnavailable(err.to_string()))?;
            let (moved, known) = {
                let mut holds = self.holds();
                let moved = holds.leases.refresh(loaded.live);
                (moved, holds.leases.live(lease_id, Instant::now()).cloned())
            };
            if moved {
                self.changed();
            }
            if let Some(lease) = known {
                return Ok(lease);
            }
        }
        Err(CatalogError::NoLease(lease_id.to_owned()))
    }

    fn unavailable(&self, lease_id: &str, err: &proxyfleet_core::kv::KvError) -> CatalogError {
        tracing::warn!(lease = %lease_id, "cannot write a discovery lease to the store: {err}");
        CatalogError::StoreUnavailable(err.to_string())
    }

    /// Live leases.
    pub fn leases(&self) -> Vec<LeaseView> {
        let mut holds = self.holds();
        holds.sweep(Instant::now());
        holds.leases.views()
    }

    /// Writes the gateway sessions the store does not hold yet, then reads
    /// the store again, so leases granted by another replica hold here
    /// too, and drops expired leases from it. The health engine calls it
    /// after every round.
    pub async fn sync_leases(&self) {
        if self.lease_store.is_none() {
            return;
        }
        if let Err(err) = self.refresh_leases().await {
            tracing::warn!(
                "discovery leases not yet in step with the store; retrying after the next round: {err}"
            );
        }
    }

    /// Reads the store into the table, writes this table's sessions and
    /// tidies the store; returns how many leases the store held live.
    ///
    /// A grant that ends while the store is read may be missing from the
    /// table until the next refresh: the store still holds it, so no grant
    /// anywhere can break it, and a renewal or release looks it up there.
    async fn refresh_leases(&self) -> Result<usize, CatalogError> {
        let Some(store) = &self.lease_store else { return Ok(0) };
        let unavailable =
            |err: proxyfleet_core::kv::KvError| CatalogError::StoreUnavailable(err.to_string());
        let mut loaded = store.load(unix_now(), Instant::now()).await.map_err(unavailable)?;
        let live = loaded.live.len();
        let stored_on: HashMap<String, String> =
            loaded.live.iter().map(|(id, lease)| (id.clone(), lease.proxy_id.clone())).collect();
        let (mut moved, unwritten) = {
            let mut holds = self.holds();
            // Leases this table holds but the store may not keep their
            // copies here.
            let moved = holds.leases.refresh(loaded.live);
            (moved, holds.leases.unwritten())
        };
        for (id, lease) in unwritten {
            // A grant under way writes its own lease.
            if !id.starts_with(SESSION_PREFIX) {
                continue;
            }
            let held = Held { exclusive: false, expires_at: lease.expires_at };
            let admitted = store
                .claim(&lease.proxy_id, &id, &lease.url, held, unix_now())
                .await
                .map_err(unavailable)?;
            if admitted
                && let Some(before) = stored_on.get(&id).filter(|before| **before != lease.proxy_id)
            {
                // The session moved: its old copy goes.
                loaded.tidy.entry(before.clone()).or_default().push(id.clone());
            }
            let mut holds = self.holds();
            // Unless the session moved on meanwhile.
            if holds.leases.live(&id, Instant::now()).is_some_and(|now| {
                now.proxy_id == lease.proxy_id && now.expires_at == lease.expires_at
            }) {
                match admitted {
                    true => holds.leases.written(&id),
                    // Another replica leased the proxy exclusively: the
                    // session's next request picks again.
                    false => moved |= holds.leases.remove(&id).is_some(),
                }
            }
        }
        for (proxy, drop) in &loaded.tidy {
            if let Err(err) = store.tidy(proxy, drop, unix_now()).await {
                tracing::debug!(proxy = %proxy, "stored discovery leases not tidied yet: {err}");
            }
        }
        // Every round refreshes: only a table that moved tells the viewers
        // (the console fetches again on each change).
        if moved {
            self.changed();
        }
        Ok(live)
    }

    /// Replaces the lease table with the store's: the leases an earlier
    /// process, leader or another replica granted hold here. Expired and
    /// unreadable stored leases are deleted. Returns how many leases are
    /// live.
    pub async fn restore_leases(&self) -> Result<usize, CatalogError> {
        self.refresh_leases().await
    }

    /// A crawler reports a ban or failure: the proxy is quarantined, and
    /// past the threshold its pool is asked to replace it.
    pub fn report(
        &self,
        id: &str,
        kind: ReportKind,
        reason: &str,
    ) -> Result<ReportOutcome, CatalogError> {
        let member = self
            .state_read()
            .members
            .get(id)
            .cloned()
            .ok_or_else(|| CatalogError::NoProxy(id.to_owned()))?;
        let now = Instant::now();
        let until = unix_now() + self.settings.quarantine.as_secs();
        let mut holds = self.holds();
        holds.quarantined.insert(id.to_owned(), (now + self.settings.quarantine, until));
        let reports = {
            let count = holds.reports.entry(id.to_owned()).or_default();
            *count += 1;
            *count
        };
        let replacing = member.pool.is_some()
            && reports >= self.settings.replace_after
            && holds.replacing.insert(id.to_owned());
        tracing::warn!(proxy = %id, name = %member.name, kind = kind.as_str(), reason, reports, replacing, "proxy reported by a crawler");
        let name = member.qualified_name();
        if replacing {
            holds.replace.push(member);
        }
        self.metrics.record_report(kind.as_str(), replacing);
        drop(holds);
        self.log_activity(
            Some((id, name)),
            format!(
                "reported by a crawler ({}): {reason}; quarantined{}",
                kind.as_str(),
                if replacing { ", to be replaced" } else { "" }
            ),
        );
        Ok(ReportOutcome { reports, quarantined_until: until, replacing, site: None })
    }

    /// A site turned proxy `id` away (a crawler's report naming the site,
    /// or a gateway answer with a ban status): the proxy is kept from
    /// requests for `site` for the quarantine time and serves every other
    /// site. A site ban does not count towards replacing the proxy.
    pub fn ban_site(
        &self,
        id: &str,
        site: &str,
        kind: ReportKind,
        reason: &str,
    ) -> Result<ReportOutcome, CatalogError> {
        let site = site_of("host", site)?;
        let (name, qualified) = self
            .state_read()
            .members
            .get(id)
            .map(|m| (m.name.clone(), m.qualified_name()))
            .ok_or_else(|| CatalogError::NoProxy(id.to_owned()))?;
        let now = Instant::now();
        let until = unix_now() + self.settings.quarantine.as_secs();
        let mut holds = self.holds();
        holds.site_bans.insert(id, site.clone(), now + self.settings.quarantine, until);
        let reports = holds.reports.get(id).copied().unwrap_or(0);
        tracing::warn!(proxy = %id, %name, %site, kind = kind.as_str(), reason, "proxy banned for one site");
        self.metrics.record_report(kind.as_str(), false);
        drop(holds);
        self.log_activity(
            Some((id, qualified)),
            format!("banned for {site} ({}): {reason}", kind.as_str()),
        );
        Ok(ReportOutcome { reports, quarantined_until: until, replacing: false, site: Some(site) })
    }

    /// An operator keeps proxy `id` out for `duration`: from every request,
    /// or from requests for `site` only. Unlike a crawler's report it does
    /// not count towards replacing the proxy. Answers when it ends (Unix
    /// seconds).
    pub fn quarantine(
        &self,
        id: &str,
        site: Option<&str>,
        duration: Duration,
    ) -> Result<u64, CatalogError> {
        let site = site.map(|site| site_of("site", site)).transpose()?;
        let name = self.qualified_name_of(id)?;
        let now = Instant::now();
        let until = unix_now() + duration.as_secs();
        let mut holds = self.holds();
        match &site {
            Some(site) => holds.site_bans.insert(id, site.clone(), now + duration, until),
            None => {
                holds.quarantined.insert(id.to_owned(), (now + duration, until));
            }
        }
        drop(holds);
        tracing::info!(proxy = %id, %name, site = site.as_deref().unwrap_or("*"), until, "proxy quarantined by an operator");
        let minutes = duration.as_secs().div_ceil(60);
        let what = match &site {
            Some(site) => format!("quarantined for {site} by an operator for {minutes} min"),
            None => format!("quarantined for every site by an operator for {minutes} min"),
        };
        self.log_activity(Some((id, name)), what);
        Ok(until)
    }

    /// Member `id`'s `namespace/name`.
    fn qualified_name_of(&self, id: &str) -> Result<String, CatalogError> {
        self.state_read()
            .members
            .get(id)
            .map(Member::qualified_name)
            .ok_or_else(|| CatalogError::NoProxy(id.to_owned()))
    }

    /// Puts proxy `id` back: for `site` only, or (without one) from its
    /// quarantine and every site ban, with its report count cleared.
    /// Answers whether anything held it.
    pub fn lift(&self, id: &str, site: Option<&str>) -> Result<bool, CatalogError> {
        let site = site.map(|site| site_of("site", site)).transpose()?;
        let name = self.qualified_name_of(id)?;
        let mut holds = self.holds();
        let lifted = match &site {
            Some(site) => holds.site_bans.remove(id, site),
            None => {
                let quarantined = holds.quarantined.remove(id).is_some();
                let banned = holds.site_bans.remove_all(id);
                holds.reports.remove(id);
                holds.replacing.remove(id);
                quarantined || banned
            }
        };
        drop(holds);
        tracing::info!(proxy = %id, site = site.as_deref().unwrap_or("*"), lifted, "proxy put back by an operator");
        let what = match &site {
            Some(site) => format!("put back for {site} by an operator"),
            None => "put back for every site by an operator".to_owned(),
        };
        self.log_activity(Some((id, name)), what);
        Ok(lifted)
    }

    /// Drops expired leases and quarantines and updates the lease metrics.
    pub fn sweep(&self) {
        let mut holds = self.holds();
        holds.sweep(Instant::now());
        let granted = holds.leases.take_granted();
        self.metrics.record_leases(holds.leases.len(), granted);
    }
}
