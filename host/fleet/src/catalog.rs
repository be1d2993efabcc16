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
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use proxyfleet_core::clock::unix_now;
use proxyfleet_core::kv::KvStore;
use proxyfleet_core::proxy::{Phase, ProxyStatus};
use proxyfleet_metrics::{HealthCounts, Metrics};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::leases::{Lease, LeaseStore, LeaseView, Leases};
use crate::probe::{ProbeFailure, ProbePass};

/// Where a proxy listens.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Endpoint {
    /// IP address.
    pub ip: IpAddr,
    /// Proxy port.
    pub port: u16,
}

impl Endpoint {
    /// `http://ip:port`, the form `curl -x` and crawlers take.
    pub fn url(&self) -> String {
        match self.ip {
            IpAddr::V4(ip) => format!("http://{ip}:{}", self.port),
            IpAddr::V6(ip) => format!("http://[{ip}]:{}", self.port),
        }
    }
}

/// One Proxy, as a mode publishes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The Proxy's UID: stable, unique, and safe in a URL path.
    pub id: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The ProxyPool it belongs to (`namespace/name`).
    pub pool: Option<String>,
    /// Provider entry.
    pub provider: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Phase.
    pub phase: Phase,
    /// Where it listens, once known.
    pub endpoint: Option<Endpoint>,
}

/// What the probes say of a proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Verdict {
    /// Too few probes yet.
    Unknown,
    /// Passed the last `healthy_after` probes.
    Healthy,
    /// Failed the last `unhealthy_after` probes.
    Unhealthy,
}

/// Probe counters of one proxy.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthRecord {
    /// The endpoint the counters belong to.
    #[serde(skip)]
    pub endpoint: Endpoint,
    /// Verdict.
    pub verdict: Verdict,
    /// Probes passed, in all.
    pub passes: u64,
    /// Probes failed, in all.
    pub failures: u64,
    /// Passed in a row.
    pub consecutive_passes: u32,
    /// Failed in a row.
    pub consecutive_failures: u32,
    /// Latency of the last passing probe.
    pub latency_ms: Option<f64>,
    /// Why the last failing probe failed.
    pub last_error: Option<String>,
    /// The exit address the check target saw.
    pub exit_ip: Option<String>,
    /// Unix seconds of the last probe.
    pub checked_at: Option<u64>,
}

impl HealthRecord {
    fn new(endpoint: Endpoint) -> Self {
        Self {
            endpoint,
            verdict: Verdict::Unknown,
            passes: 0,
            failures: 0,
            consecutive_passes: 0,
            consecutive_failures: 0,
            latency_ms: None,
            last_error: None,
            exit_ip: None,
            checked_at: None,
        }
    }

    /// A sentence for the `Healthy` condition. It carries no counters, so
    /// it changes only with the verdict, the error or the exit address, and
    /// a status writer that compares before writing stays quiet.
    pub fn message(&self) -> String {
        match (self.verdict, &self.last_error) {
            (Verdict::Unhealthy, Some(error)) => format!("probes through the proxy fail: {error}"),
            (Verdict::Unhealthy, None) => "probes through the proxy fail".to_owned(),
            _ => match &self.exit_ip {
                Some(ip) => format!("probes through the proxy pass; exit address {ip}"),
                None => "probes through the proxy pass".to_owned(),
            },
        }
    }
}

/// How crawlers get proxies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    /// In turn.
    #[default]
    RoundRobin,
    /// The one handed out longest ago.
    LeastRecentlyUsed,
    /// Any.
    Random,
}

impl Strategy {
    /// Parses `round-robin`, `least-recently-used` or `random`.
    pub fn parse(setting: &str, text: &str) -> Result<Self> {
        match text {
            "round-robin" => Ok(Self::RoundRobin),
            "least-recently-used" => Ok(Self::LeastRecentlyUsed),
            "random" => Ok(Self::Random),
            other => Err(Error::setting(
                setting,
                format!(
                    "{other:?} is not a strategy; use round-robin, least-recently-used or random"
                ),
            )),
        }
    }
}

/// Which proxies a request wants.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    /// ProxyPool, `namespace/name`.
    pub pool: Option<String>,
    /// Provider entry.
    pub provider: Option<String>,
    /// Labels that must all match.
    pub labels: Vec<(String, String)>,
}

impl Selector {
    fn matches(
        &self,
        pool: Option<&str>,
        provider: &str,
        labels: &BTreeMap<String, String>,
    ) -> bool {
        self.pool.as_deref().is_none_or(|want| pool == Some(want))
            && self.provider.as_deref().is_none_or(|want| provider == want)
            && self.labels.iter().all(|(k, v)| labels.get(k) == Some(v))
    }
}

/// Timings and thresholds of the catalog.
#[derive(Debug, Clone)]
pub struct FleetSettings {
    /// How long a reported proxy is kept from crawlers.
    pub quarantine: Duration,
    /// Reports after which a pool member is replaced.
    pub replace_after: u32,
    /// Strategy when a request names none.
    pub strategy: Strategy,
    /// Lease TTL when a request names none.
    pub lease_ttl: Duration,
    /// The longest lease TTL granted.
    pub max_lease_ttl: Duration,
}

impl Default for FleetSettings {
    fn default() -> Self {
        Self {
            quarantine: Duration::from_secs(600),
            replace_after: 3,
            strategy: Strategy::RoundRobin,
            lease_ttl: Duration::from_secs(300),
            max_lease_ttl: Duration::from_secs(86_400),
        }
    }
}

/// A proxy as the API shows it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProxyView {
    /// The Proxy's UID.
    pub id: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// ProxyPool.
    pub pool: Option<String>,
    /// Provider entry.
    pub provider: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Phase.
    pub phase: Phase,
    /// `http://ip:port`, once the address is known.
    pub url: Option<String>,
    /// Would be handed out now: running, healthy, not quarantined.
    pub available: bool,
    /// Probes pass.
    pub healthy: bool,
    /// Probe counters.
    pub health: Option<HealthRecord>,
    /// Unix seconds until which crawlers' reports keep it out.
    pub quarantined_until: Option<u64>,
    /// Crawler reports so far.
    pub reports: u32,
    /// Live leases on it.
    pub leases: usize,
}

/// What a report did.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReportOutcome {
    /// Reports on the proxy so far.
    pub reports: u32,
    /// Unix seconds the quarantine ends.
    pub quarantined_until: u64,
    /// The proxy's pool will replace it.
    pub replacing: bool,
}

/// What a crawler reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ReportKind {
    /// The target site banned the exit address.
    Ban,
    /// Requests through the proxy failed.
    Failure,
}

impl ReportKind {
    fn as_str(self) -> &'static str {
        match self {
            Self::Ban => "ban",
            Self::Failure => "failure",
        }
    }
}

/// Why a catalog request could not be met.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CatalogError {
    /// No such proxy.
    #[error("no proxy with id {0:?}")]
    NoProxy(String),
    /// No such lease, or it expired.
    #[error("no live lease with id {0:?}: it expired or was released")]
    NoLease(String),
    /// Nothing matches and is available.
    #[error(
        "no available proxy matches{0}: none is running, healthy, unquarantined and (for an exclusive lease) unleased"
    )]
    NoneAvailable(String),
    /// The lease store cannot be written now; the request may be retried.
    #[error("the lease store cannot be written now ({0}); retry the request")]
    StoreUnavailable(String),
    /// A request value is out of range.
    #[error("{field}: {message}")]
    Invalid {
        /// The field.
        field: String,
        /// What is allowed.
        message: String,
    },
}

/// One handed-out candidate.
#[derive(Debug)]
struct Candidate {
    id: String,
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
    candidates: Vec<Candidate>,
    /// Round-robin cursors per pool (`""`: no pool named).
    cursors: HashMap<String, AtomicUsize>,
    /// Candidate indices per pool.
    by_pool: HashMap<String, Vec<usize>>,
}

#[derive(Debug, Default)]
struct Holds {
    /// Proxy ID → when its quarantine ends.
    quarantined: HashMap<String, (Instant, u64)>,
    /// Proxy ID → reports so far.
    reports: HashMap<String, u32>,
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
    }
}

#[derive(Debug, Default)]
struct State {
    members: BTreeMap<String, Member>,
    health: HashMap<String, HealthRecord>,
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
}

impl Fleet {
    /// An empty catalog.
    pub fn new(settings: FleetSettings, metrics: Arc<Metrics>) -> Self {
        Self {
            settings,
            state: RwLock::default(),
            view: ArcSwap::default(),
            holds: Mutex::default(),
            picks: AtomicU64::new(0),
            ready: AtomicBool::new(false),
            metrics,
            lease_store: None,
        }
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
        let mut forgotten = Vec::new();
        state.health.retain(|id, record| {
            let keep = members
                .get(id)
                .and_then(|m| m.endpoint.as_ref())
                .is_some_and(|endpoint| *endpoint == record.endpoint);
            if !keep {
                forgotten.push(id.clone());
            }
            keep
        });
        for id in forgotten {
            // The mode clears the condition of a member that is still there.
            if members.contains_key(&id) {
                state.changed.insert(id);
            } else {
                state.changed.remove(&id);
            }
        }
        state.members = members;
        let mut phases: BTreeMap<&'static str, u64> = BTreeMap::new();
        for member in state.members.values() {
            *phases.entry(member.phase.as_str()).or_default() += 1;
        }
        self.metrics.set_phases(phases);
        self.rebuild(&state);
        let mut holds = self.holds();
        holds.replacing.retain(|id| state.members.contains_key(id));
        holds.reports.retain(|id, _| state.members.contains_key(id));
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
        for (id, endpoint, result) in results {
            let current = state.members.get(&id).and_then(|m| m.endpoint.as_ref());
            if current != Some(&endpoint) {
                continue;
            }
            let record =
                state.health.entry(id.clone()).or_insert_with(|| HealthRecord::new(endpoint));
            let before = record.verdict;
            record.checked_at = Some(now);
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
                state.changed.insert(id);
                changed = true;
            }
        }
        let mut counts = HealthCounts::default();
        for member in state.members.values().filter(|m| m.endpoint.is_some()) {
            match state.health.get(&member.id).map(|r| r.verdict) {
                Some(Verdict::Healthy) => counts.healthy += 1,
                Some(Verdict::Unhealthy) => counts.unhealthy += 1,
                Some(Verdict::Unknown) | None => counts.unknown += 1,
            }
        }
        self.metrics.set_health(counts);
        if changed {
            self.rebuild(&state);
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
        let old = self.view.load();
        let handed: HashMap<&str, u64> = old
            .candidates
            .iter()
            .map(|c| (c.id.as_str(), c.last_handed.load(Ordering::Relaxed)))
            .collect();
        let mut view = View::default();
        for member in state.members.values() {
            let Some(endpoint) = &member.endpoint else { continue };
            let healthy = state.health.get(&member.id).map(|r| r.verdict) == Some(Verdict::Healthy);
            if member.phase != Phase::Running || !healthy {
                continue;
            }
            let index = view.candidates.len();
            view.candidates.push(Candidate {
                id: member.id.clone(),
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
        view.cursors = view.by_pool.keys().map(|k| (k.clone(), AtomicUsize::new(0))).collect();
        self.view.store(Arc::new(view));
    }

    /// Every member matching `selector` (and `healthy`, when given).
    pub fn list(&self, selector: &Selector, healthy: Option<bool>) -> Vec<ProxyView> {
        let state = self.state_read();
        let now = Instant::now();
        let mut holds = self.holds();
        holds.sweep(now);
        state
            .members
            .values()
            .filter(|m| selector.matches(m.pool.as_deref(), &m.provider, &m.labels))
            .map(|m| self.view_of(m, state.health.get(&m.id), &holds, now))
            .filter(|v| healthy.is_none_or(|want| v.healthy == want))
            .collect()
    }

    /// One member.
    pub fn get(&self, id: &str) -> Result<ProxyView, CatalogError> {
        let state = self.state_read();
        let member = state.members.get(id).ok_or_else(|| CatalogError::NoProxy(id.to_owned()))?;
        let holds = self.holds();
        Ok(self.view_of(member, state.health.get(id), &holds, Instant::now()))
    }

    fn view_of(
        &self,
        member: &Member,
        health: Option<&HealthRecord>,
        holds: &Holds,
        now: Instant,
    ) -> ProxyView {
        let healthy = health.is_some_and(|h| h.verdict == Verdict::Healthy);
        let quarantined = holds.quarantined(&member.id, now);
        ProxyView {
            id: member.id.clone(),
            namespace: member.namespace.clone(),
            name: member.name.clone(),
            pool: member.pool.clone(),
            provider: member.provider.clone(),
            labels: member.labels.clone(),
            phase: member.phase,
            url: member.endpoint.as_ref().map(Endpoint::url),
            available: healthy && member.phase == Phase::Running && !quarantined,
            healthy,
            health: health.cloned(),
            quarantined_until: holds
                .quarantined
                .get(&member.id)
                .filter(|(until, _)| *until > now)
                .map(|(_, at)| *at),
            reports: holds.reports.get(&member.id).copied().unwrap_or(0),
            leases: holds.leases.count(&member.id, now),
        }
    }

    /// Picks an available proxy; `exclusive` asks for one no live lease
    /// holds. Returns its ID and URL.
    fn pick(
        &self,
        selector: &Selector,
        strategy: Strategy,
        exclusive: bool,
        holds: &Holds,
        now: Instant,
    ) -> Result<(String, String), CatalogError> {
        let view = self.view.load();
        let key = selector.pool.as_deref().unwrap_or("");
        let indices = view.by_pool.get(key).map(Vec::as_slice).unwrap_or_default();
        let eligible = |candidate: &Candidate| {
            if !selector.matches(candidate.pool.as_deref(), &candidate.provider, &candidate.labels)
                || holds.quarantined(&candidate.id, now)
            {
                return false;
            }
            let (any, held_exclusively) = holds.leases.held(&candidate.id, now);
            !(held_exclusively || exclusive && any)
        };
        let len = indices.len();
        let chosen = match strategy {
            Strategy::LeastRecentlyUsed => indices
                .iter()
                .map(|&i| &view.candidates[i])
                .filter(|c| eligible(c))
                .min_by_key(|c| c.last_handed.load(Ordering::Relaxed)),
            Strategy::RoundRobin | Strategy::Random => {
                let start = if strategy == Strategy::Random {
                    rand::random_range(0..len.max(1))
                } else {
                    view.cursors.get(key).map_or(0, |c| c.fetch_add(1, Ordering::Relaxed))
                };
                (0..len)
                    .map(|step| &view.candidates[indices[(start + step) % len]])
                    .find(|c| eligible(c))
            }
        };
        let chosen = chosen.ok_or_else(|| CatalogError::NoneAvailable(describe(selector)))?;
        chosen.last_handed.store(self.picks.fetch_add(1, Ordering::Relaxed) + 1, Ordering::Relaxed);
        Ok((chosen.id.clone(), chosen.url.clone()))
    }

    /// `GET /v1/proxies/next`: one available proxy, not exclusively leased.
    pub fn next(
        &self,
        selector: &Selector,
        strategy: Option<Strategy>,
    ) -> Result<(String, String), CatalogError> {
        let holds = self.holds();
        self.pick(
            selector,
            strategy.unwrap_or(self.settings.strategy),
            false,
            &holds,
            Instant::now(),
        )
    }

    /// Leases an available proxy for `ttl` (the default when `None`).
    /// Answers once the lease store holds it: a lease it does not hold
    /// would end at a restart.
    pub async fn lease(
        &self,
        selector: &Selector,
        strategy: Option<Strategy>,
        exclusive: bool,
        ttl: Option<Duration>,
    ) -> Result<LeaseView, CatalogError> {
        let ttl = self.check_ttl(ttl)?;
        let now = Instant::now();
        let id = uuid::Uuid::new_v4().simple().to_string();
        let view = {
            let mut holds = self.holds();
            let (proxy_id, url) = self.pick(
                selector,
                strategy.unwrap_or(self.settings.strategy),
                exclusive,
                &holds,
                now,
            )?;
            let lease = Lease {
                proxy_id,
                url,
                exclusive,
                expires: now + ttl,
                expires_at: unix_now() + ttl.as_secs(),
            };
            holds.leases.insert(id.clone(), lease);
            holds.leases.view(&id).expect("just inserted")
        };
        if let Err(err) = self.persist_lease(&id).await {
            // Not granted after all; the next sync deletes whatever copy
            // the failed write may have left.
            self.holds().leases.remove(&id);
            return Err(err);
        }
        self.holds().leases.count_grant();
        Ok(view)
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
        let now = Instant::now();
        let view = {
            let mut holds = self.holds();
            let lease = holds
                .leases
                .live_mut(lease_id, now)
                .ok_or_else(|| CatalogError::NoLease(lease_id.to_owned()))?;
            lease.expires = now + ttl;
            lease.expires_at = unix_now() + ttl.as_secs();
            holds.leases.view(lease_id).expect("renewed just now")
        };
        self.persist_lease(lease_id).await?;
        Ok(view)
    }

    /// Ends a lease; answers once the lease store no longer holds it.
    pub async fn release(&self, lease_id: &str) -> Result<(), CatalogError> {
        let now = Instant::now();
        let live = {
            let mut holds = self.holds();
            match holds.leases.remove(lease_id) {
                Some(lease) if lease.expires > now => true,
                Some(_) => {
                    // Expired: not the crawler's to release, but its stored
                    // copy goes at the next sync.
                    holds.leases.mark_unsynced(lease_id);
                    false
                }
                None => false,
            }
        };
        if !live {
            return Err(CatalogError::NoLease(lease_id.to_owned()));
        }
        self.persist_lease(lease_id).await
    }

    /// Live leases.
    pub fn leases(&self) -> Vec<LeaseView> {
        let mut holds = self.holds();
        holds.sweep(Instant::now());
        holds.leases.views()
    }

    /// Brings the stored copy of one lease in step with the table. On a
    /// failure the lease is left for [`Fleet::sync_leases`].
    async fn persist_lease(&self, id: &str) -> Result<(), CatalogError> {
        let Some(store) = &self.lease_store else { return Ok(()) };
        store.sync(id, || self.holds().leases.stored(id)).await.map_err(|err| {
            self.holds().leases.mark_unsynced(id);
            tracing::warn!(lease = %id, "cannot write a discovery lease to the store: {err}");
            CatalogError::StoreUnavailable(err.to_string())
        })
    }

    /// Writes to the lease store what earlier writes failed to and deletes
    /// the stored copies of expired leases. The health engine calls it
    /// after every round.
    pub async fn sync_leases(&self) {
        let Some(store) = &self.lease_store else { return };
        let unsynced = self.holds().leases.take_unsynced();
        let mut failed = 0usize;
        for id in &unsynced {
            if store.sync(id, || self.holds().leases.stored(id)).await.is_err() {
                self.holds().leases.mark_unsynced(id);
                failed += 1;
            }
        }
        if failed > 0 {
            tracing::warn!(
                failed,
                "discovery leases not yet in step with the store; retrying after the next round"
            );
        }
    }

    /// Replaces the lease table with the store's: the leases an earlier
    /// process or leader granted hold again here. Expired and unreadable
    /// stored leases are deleted. Returns how many leases are live.
    pub async fn restore_leases(&self) -> Result<usize, CatalogError> {
        let Some(store) = &self.lease_store else { return Ok(0) };
        let restored = store
            .load(unix_now(), Instant::now())
            .await
            .map_err(|err| CatalogError::StoreUnavailable(err.to_string()))?;
        let live = restored.live.len();
        {
            let mut holds = self.holds();
            holds.leases.restore(restored.live);
            for id in &restored.stale {
                holds.leases.mark_unsynced(id);
            }
        }
        self.sync_leases().await;
        Ok(live)
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
        if replacing {
            holds.replace.push(member);
        }
        self.metrics.record_report(kind.as_str(), replacing);
        Ok(ReportOutcome { reports, quarantined_until: until, replacing })
    }

    /// Drops expired leases and quarantines and updates the lease metrics.
    pub fn sweep(&self) {
        let mut holds = self.holds();
        holds.sweep(Instant::now());
        let granted = holds.leases.take_granted();
        self.metrics.record_leases(holds.leases.len(), granted);
    }
}

fn describe(selector: &Selector) -> String {
    let mut parts = Vec::new();
    if let Some(pool) = &selector.pool {
        parts.push(format!("pool {pool}"));
    }
    if let Some(provider) = &selector.provider {
        parts.push(format!("provider {provider}"));
    }
    for (k, v) in &selector.labels {
        parts.push(format!("label {k}={v}"));
    }
    if parts.is_empty() { String::new() } else { format!(" {}", parts.join(", ")) }
}

#[cfg(test)]
pub(crate) mod tests {
    use proxyfleet_core::kv::{CasOutcome, KvEntry, KvError};

    use super::*;

    /// A builder of members for tests.
    pub(crate) struct MemberBuilder(Member);

    impl MemberBuilder {
        pub(crate) fn new(n: u8) -> Self {
            Self(Member {
                id: format!("uid-{n}"),
                namespace: "default".into(),
                name: format!("proxy-{n}"),
                pool: None,
                provider: "lab".into(),
                labels: BTreeMap::new(),
                phase: Phase::Running,
                endpoint: Some(Endpoint { ip: IpAddr::from([127, 0, 0, n]), port: 3128 }),
            })
        }
        pub(crate) fn pool(mut self, pool: &str) -> Self {
            self.0.pool = Some(pool.into());
            self
        }
        pub(crate) fn label(mut self, k: &str, v: &str) -> Self {
            self.0.labels.insert(k.into(), v.into());
            self
        }
        pub(crate) fn phase(mut self, phase: Phase) -> Self {
            self.0.phase = phase;
            self
        }
        pub(crate) fn no_endpoint(mut self) -> Self {
            self.0.endpoint = None;
            self
        }
        pub(crate) fn build(self) -> Member {
            self.0
        }
    }

    fn pass() -> Result<ProbePass, ProbeFailure> {
        Ok(ProbePass { latency: Duration::from_millis(3), exit_ip: Some("198.51.100.7".into()) })
    }

    fn fail() -> Result<ProbePass, ProbeFailure> {
        Err(ProbeFailure("connection refused".into()))
    }

    /// A catalog whose members all passed `rounds` probes.
    pub(crate) fn fleet_with(members: Vec<Member>, settings: FleetSettings) -> Fleet {
        let fleet = Fleet::new(settings, Arc::new(Metrics::new()));
        fleet.publish(members);
        let results = fleet.probe_targets().into_iter().map(|(id, e)| (id, e, pass())).collect();
        fleet.record_probes(results, 1, 1);
        fleet
    }

    #[test]
    fn verdicts_need_n_passes_and_m_failures_in_a_row() {
        let fleet = Fleet::new(FleetSettings::default(), Arc::new(Metrics::new()));
        fleet.publish(vec![MemberBuilder::new(1).build()]);
        let (id, endpoint) = fleet.probe_targets().remove(0);
        let round =
            |result| fleet.record_probes(vec![(id.clone(), endpoint.clone(), result)], 2, 3);
        round(pass());
        assert_eq!(fleet.health(&id).unwrap().verdict, Verdict::Unknown);
        round(pass());
        assert_eq!(fleet.health(&id).unwrap().verdict, Verdict::Healthy);
        assert_eq!(fleet.take_verdict_changes().len(), 1);
        round(fail());
        round(fail());
        assert_eq!(fleet.health(&id).unwrap().verdict, Verdict::Healthy);
        assert!(fleet.take_verdict_changes().is_empty());
        round(fail());
        let record = fleet.health(&id).unwrap();
        assert_eq!(record.verdict, Verdict::Unhealthy);
        assert_eq!((record.passes, record.failures), (2, 3));
        assert_eq!(record.exit_ip.as_deref(), Some("198.51.100.7"));
        assert!(record.message().contains("connection refused"), "{}", record.message());
        assert!(fleet.next(&Selector::default(), None).is_err());
    }

    #[test]
    fn a_proxy_whose_address_goes_away_is_forgotten_at_once() {
        let fleet = fleet_with(vec![MemberBuilder::new(1).build()], FleetSettings::default());
        fleet.take_verdict_changes();
        fleet.publish(vec![MemberBuilder::new(1).no_endpoint().phase(Phase::Provisioning).build()]);
        assert_eq!(fleet.health("uid-1"), None);
        assert_eq!(fleet.take_verdict_changes(), vec![("uid-1".to_owned(), None)]);
        assert!(fleet.next(&Selector::default(), None).is_err());
        // A result of the old endpoint that lands late is not recorded.
        let old = Endpoint { ip: IpAddr::from([127, 0, 0, 1]), port: 3128 };
        fleet.record_probes(vec![("uid-1".into(), old, pass())], 1, 1);
        assert_eq!(fleet.health("uid-1"), None);
    }

    #[test]
    fn round_robin_visits_every_healthy_member_of_the_pool() {
        let members = vec![
            MemberBuilder::new(1).pool("default/a").build(),
            MemberBuilder::new(2).pool("default/a").build(),
            MemberBuilder::new(3).pool("default/b").build(),
            MemberBuilder::new(4).pool("default/a").phase(Phase::Provisioning).build(),
        ];
        let fleet = fleet_with(members, FleetSettings::default());
        let pool_a = Selector { pool: Some("default/a".into()), ..Selector::default() };
        let picks: HashSet<String> = (0..4).map(|_| fleet.next(&pool_a, None).unwrap().0).collect();
        assert_eq!(picks, HashSet::from(["uid-1".to_owned(), "uid-2".to_owned()]));
        let everyone: HashSet<String> =
            (0..6).map(|_| fleet.next(&Selector::default(), None).unwrap().0).collect();
        assert_eq!(everyone.len(), 3);
    }

    #[test]
    fn least_recently_used_hands_out_the_longest_idle() {
        let members = (1..=3).map(|n| MemberBuilder::new(n).build()).collect();
        let fleet = fleet_with(members, FleetSettings::default());
        let lru = Some(Strategy::LeastRecentlyUsed);
        let first: Vec<String> =
            (0..3).map(|_| fleet.next(&Selector::default(), lru).unwrap().0).collect();
        assert_eq!(first.iter().collect::<HashSet<_>>().len(), 3);
        assert_eq!(fleet.next(&Selector::default(), lru).unwrap().0, first[0]);
    }

    #[test]
    fn labels_and_providers_filter() {
        let members = vec![
            MemberBuilder::new(1).label("tier", "gold").build(),
            MemberBuilder::new(2).label("tier", "bronze").build(),
        ];
        let fleet = fleet_with(members, FleetSettings::default());
        let gold = Selector { labels: vec![("tier".into(), "gold".into())], ..Selector::default() };
        for _ in 0..3 {
            assert_eq!(fleet.next(&gold, Some(Strategy::Random)).unwrap().0, "uid-1");
        }
        let other = Selector { provider: Some("gcp".into()), ..Selector::default() };
        let err = fleet.next(&other, None).unwrap_err().to_string();
        assert!(err.contains("provider gcp"), "{err}");
        assert_eq!(fleet.list(&gold, Some(true)).len(), 1);
        assert_eq!(fleet.list(&Selector::default(), Some(false)).len(), 0);
    }

    #[tokio::test]
    async fn exclusive_leases_keep_others_off_until_released() {
        let members = (1..=2).map(|n| MemberBuilder::new(n).build()).collect();
        let fleet = fleet_with(members, FleetSettings::default());
        let any = Selector::default();
        let a = fleet.lease(&any, None, true, None).await.unwrap();
        let b = fleet.lease(&any, None, true, None).await.unwrap();
        assert_ne!(a.proxy_id, b.proxy_id);
        assert!(matches!(
            fleet.lease(&any, None, true, None).await,
            Err(CatalogError::NoneAvailable(_))
        ));
        assert!(fleet.next(&any, None).is_err());
        fleet.release(&a.id).await.unwrap();
        assert_eq!(fleet.next(&any, None).unwrap().0, a.proxy_id);
        assert!(matches!(fleet.release(&a.id).await, Err(CatalogError::NoLease(_))));
    }

    #[tokio::test]
    async fn shared_leases_block_only_exclusive_ones() {
        let fleet = fleet_with(vec![MemberBuilder::new(1).build()], FleetSettings::default());
        let any = Selector::default();
        let shared = fleet.lease(&any, None, false, None).await.unwrap();
        assert!(fleet.lease(&any, None, false, None).await.is_ok());
        assert!(fleet.next(&any, None).is_ok());
        assert!(fleet.lease(&any, None, true, None).await.is_err());
        assert_eq!(fleet.get(&shared.proxy_id).unwrap().leases, 2);
    }

    #[tokio::test]
    async fn lease_ttls_are_checked_and_renewals_extend() {
        let fleet = fleet_with(vec![MemberBuilder::new(1).build()], FleetSettings::default());
        let any = Selector::default();
        let err = fleet.lease(&any, None, true, Some(Duration::ZERO)).await.unwrap_err();
        assert!(err.to_string().starts_with("ttlSeconds: "), "{err}");
        let lease = fleet.lease(&any, None, true, Some(Duration::from_secs(10))).await.unwrap();
        let renewed = fleet.renew(&lease.id, Some(Duration::from_secs(100))).await.unwrap();
        assert!(renewed.expires_at >= lease.expires_at + 89);
        assert!(fleet.renew("nope", None).await.is_err());
    }

    /// A store that refuses every call while it is down.
    #[derive(Debug, Default)]
    struct Flaky {
        inner: proxyfleet_core::kv::MemoryKv,
        down: AtomicBool,
    }

    impl Flaky {
        fn check(&self) -> std::result::Result<(), KvError> {
            if self.down.load(Ordering::SeqCst) {
                return Err(KvError::Unavailable("connection refused".into()));
            }
            Ok(())
        }
    }

    #[async_trait::async_trait]
    impl KvStore for Flaky {
        async fn get(
            &self,
            scope: &str,
            key: &str,
        ) -> std::result::Result<Option<KvEntry>, KvError> {
            self.check()?;
            self.inner.get(scope, key).await
        }

        async fn compare_and_swap(
            &self,
            scope: &str,
            key: &str,
            expected: Option<u64>,
            value: Option<Vec<u8>>,
        ) -> std::result::Result<CasOutcome, KvError> {
            self.check()?;
            self.inner.compare_and_swap(scope, key, expected, value).await
        }

        async fn list(
            &self,
            scope: &str,
            prefix: &str,
        ) -> std::result::Result<Vec<KvEntry>, KvError> {
            self.check()?;
            self.inner.list(scope, prefix).await
        }
    }

    fn stored_fleet(store: &Arc<Flaky>) -> Fleet {
        let members = (1..=2).map(|n| MemberBuilder::new(n).build()).collect();
        let fleet = fleet_with(members, FleetSettings::default());
        fleet.with_lease_store(Arc::clone(store) as _)
    }

    async fn stored_ids(store: &dyn KvStore) -> Vec<String> {
        store.list(crate::leases::SCOPE, "").await.unwrap().into_iter().map(|e| e.key).collect()
    }

    #[tokio::test]
    async fn regression_a_restart_keeps_discovery_leases() {
        let store = Arc::new(Flaky::default());
        let any = Selector::default();
        let before = stored_fleet(&store);
        let held = before.lease(&any, None, true, None).await.unwrap();
        drop(before);

        // The next process (or leader) over the same store.
        let after = stored_fleet(&store);
        assert_eq!(after.restore_leases().await.unwrap(), 1);
        assert_eq!(after.leases(), std::slice::from_ref(&held));
        let renewed = after.renew(&held.id, Some(Duration::from_secs(600))).await.unwrap();
        assert!(renewed.expires_at >= held.expires_at);
        let other = after.lease(&any, None, true, None).await.unwrap();
        assert_ne!(other.proxy_id, held.proxy_id, "the restored lease still excludes others");
        assert!(matches!(
            after.lease(&any, None, true, None).await,
            Err(CatalogError::NoneAvailable(_))
        ));
        after.release(&held.id).await.unwrap();
        assert_eq!(stored_ids(store.as_ref()).await, [other.id]);
    }

    #[tokio::test]
    async fn a_lease_the_store_cannot_hold_is_not_granted() {
        let store = Arc::new(Flaky::default());
        let fleet = stored_fleet(&store);
        let any = Selector::default();
        store.down.store(true, Ordering::SeqCst);
        let err = fleet.lease(&any, None, true, None).await.unwrap_err();
        assert!(matches!(err, CatalogError::StoreUnavailable(_)), "{err}");
        assert!(err.to_string().contains("retry"), "{err}");
        assert!(fleet.leases().is_empty());
        store.down.store(false, Ordering::SeqCst);
        fleet.sync_leases().await;
        assert!(stored_ids(store.as_ref()).await.is_empty());
        // Both proxies are still free for exclusive leases.
        fleet.lease(&any, None, true, None).await.unwrap();
        fleet.lease(&any, None, true, None).await.unwrap();
    }

    #[tokio::test]
    async fn a_release_the_store_missed_is_written_at_the_next_sync() {
        let store = Arc::new(Flaky::default());
        let fleet = stored_fleet(&store);
        let held = fleet.lease(&Selector::default(), None, true, None).await.unwrap();
        store.down.store(true, Ordering::SeqCst);
        let err = fleet.release(&held.id).await.unwrap_err();
        assert!(matches!(err, CatalogError::StoreUnavailable(_)), "{err}");
        assert_eq!(stored_ids(&store.inner).await, std::slice::from_ref(&held.id));
        store.down.store(false, Ordering::SeqCst);
        fleet.sync_leases().await;
        assert!(stored_ids(store.as_ref()).await.is_empty());
        // A restart now does not bring the released lease back.
        let after = stored_fleet(&store);
        assert_eq!(after.restore_leases().await.unwrap(), 0);
    }

    #[tokio::test]
    async fn expired_leases_leave_the_store() {
        let store = Arc::new(Flaky::default());
        let fleet = stored_fleet(&store);
        fleet.lease(&Selector::default(), None, true, Some(Duration::from_secs(1))).await.unwrap();
        assert_eq!(stored_ids(store.as_ref()).await.len(), 1);
        // Expire it on the table's clock, as a sweep after its end would.
        fleet.holds().sweep(Instant::now() + Duration::from_secs(2));
        fleet.sync_leases().await;
        assert!(stored_ids(store.as_ref()).await.is_empty());
    }

    #[test]
    fn reports_quarantine_and_pool_members_are_replaced_once() {
        let settings = FleetSettings { replace_after: 2, ..FleetSettings::default() };
        let members =
            vec![MemberBuilder::new(1).pool("default/a").build(), MemberBuilder::new(2).build()];
        let fleet = fleet_with(members, settings);
        let first = fleet.report("uid-1", ReportKind::Ban, "403 from target").unwrap();
        assert!(!first.replacing);
        assert_eq!(fleet.next(&Selector::default(), None).unwrap().0, "uid-2");
        assert!(!fleet.get("uid-1").unwrap().available);
        assert!(fleet.report("uid-1", ReportKind::Failure, "").unwrap().replacing);
        assert!(!fleet.report("uid-1", ReportKind::Ban, "").unwrap().replacing);
        let replace = fleet.take_replacements();
        assert_eq!(replace.iter().map(|m| m.id.as_str()).collect::<Vec<_>>(), ["uid-1"]);
        // Not in a pool: quarantined, never replaced.
        for _ in 0..3 {
            assert!(!fleet.report("uid-2", ReportKind::Ban, "").unwrap().replacing);
        }
        assert!(fleet.take_replacements().is_empty());
        assert!(matches!(
            fleet.report("uid-9", ReportKind::Ban, ""),
            Err(CatalogError::NoProxy(_))
        ));
    }

    #[test]
    fn strategies_parse_and_name_the_choices() {
        assert_eq!(Strategy::parse("s", "random").unwrap(), Strategy::Random);
        let err = Strategy::parse("--discovery-strategy", "fastest").unwrap_err().to_string();
        assert!(err.contains("round-robin, least-recently-used or random"), "{err}");
    }

    #[test]
    fn ipv6_urls_are_bracketed() {
        let endpoint = Endpoint { ip: "2001:db8::2".parse().unwrap(), port: 8080 };
        assert_eq!(endpoint.url(), "http://[2001:db8::2]:8080");
    }
}
