//! The ProxyPool controller: keeps each pool's member Proxies at the
//! planned number and spread (the core planner decides), brings members in
//! line with the template, and reports ready and total counts. Members are
//! ordinary Proxies with the pool as their controller owner, so the Proxy
//! controller provisions them and garbage collection removes them with
//! their pool.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Resource as _, ResourceExt as _};
use proxyfleet_core::liveness::Heartbeat;
use proxyfleet_core::pool::{PoolMember, PoolPlan, PoolSpec, parse_max_age, plan};
use proxyfleet_metrics::{Metrics, PoolCounts};

use crate::crd::{Condition, MANAGER, POOL_LABEL, Proxy, ProxyPool, ProxyPoolStatus, ProxySpec};
use crate::pool_status::{Findings, Problem, conditions};

/// Why a pool reconcile could not finish.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Kubernetes API failed.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The pool spec cannot be planned; the message names the field.
    #[error("{0}")]
    Spec(String),
    /// The pool has no namespace or UID (an object not from the API server).
    #[error("the pool has no {0}")]
    Incomplete(&'static str),
}

/// What a pool pass reads besides its pool: the client and the members as
/// the controller's own watch last saw them.
#[derive(Clone)]
pub struct PoolContext {
    client: kube::Client,
    members: Store<Proxy>,
    /// Where each pass records its pool's counts, with the pools the
    /// controller sees (so a deleted pool's series go).
    metrics: Option<(Arc<Metrics>, Store<ProxyPool>)>,
}

impl std::fmt::Debug for PoolContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolContext").field("members", &self.members.len()).finish_non_exhaustive()
    }
}

impl PoolContext {
    /// A context over `members`, a cache of the Proxies that carry the pool
    /// label (the controller's own, or a test's).
    pub fn new(client: kube::Client, members: Store<Proxy>) -> Self {
        Self { client, members, metrics: None }
    }
}

/// What the pool controller reports to, besides the API server.
#[derive(Debug, Clone, Default)]
pub struct PoolOptions {
    /// Each pass is marked on it (its owner retires it).
    pub heartbeat: Option<Arc<Heartbeat>>,
    /// Each pool's desired and ready counts go here.
    pub metrics: Option<Arc<Metrics>>,
}

/// Runs the pool controller over `namespace` (all when `None`) until
/// `shutdown`.
pub async fn run(
    client: kube::Client,
    namespace: Option<&str>,
    options: PoolOptions,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let (pools, proxies): (Api<ProxyPool>, Api<Proxy>) = match namespace {
        Some(ns) => (Api::namespaced(client.clone(), ns), Api::namespaced(client.clone(), ns)),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    // Members only: every Proxy a pool made carries its label. The cache
    // lets a pass that has nothing to change skip listing them.
    let (members, writer) = reflector::store();
    let changes = watcher(proxies, watcher::Config::default().labels(POOL_LABEL))
        .default_backoff()
        .modify(|proxy| proxy.managed_fields_mut().clear())
        .reflect(writer)
        .touched_objects();
    let controller = Controller::new(pools, watcher::Config::default());
    let mut context = PoolContext::new(client, members);
    context.metrics = options.metrics.map(|metrics| (metrics, controller.store()));
    let context = Arc::new(context);
    let heartbeat = options.heartbeat;
    controller
        .owns_stream(changes)
        .graceful_shutdown_on(shutdown)
        .run(
            move |pool, context| {
                let pass = heartbeat.as_ref().map(|heartbeat| heartbeat.pass());
                async move {
                    let result = reconcile_pool(pool, context).await;
                    drop(pass);
                    result
                }
            },
            error_policy,
            context,
        )
        .for_each(|result| async move {
            if let Err(err) = result {
                tracing::warn!("pool reconcile failed: {err}");
            }
        })
        .await;
}

fn error_policy(pool: Arc<ProxyPool>, err: &Error, _context: Arc<PoolContext>) -> Action {
    tracing::warn!(pool = %pool.name_any(), "{err}; retrying in 15s");
    Action::requeue(Duration::from_secs(15))
}

/// The planner's view of a pool spec.
pub fn pool_spec(pool: &ProxyPool) -> Result<PoolSpec, Error> {
    let spec = &pool.spec;
    let entries = if spec.providers.is_empty() {
        vec![(spec.template.spec.provider.clone(), 1)]
    } else {
        spec.providers.iter().map(|p| (p.name.clone(), p.weight)).collect()
    };
    let max_age = spec
        .max_age
        .as_deref()
        .map(|text| {
            parse_max_age(text).ok_or_else(|| {
                Error::Spec(format!("spec.maxAge: {text:?} is not a duration such as 24h or 90m"))
            })
        })
        .transpose()?;
    Ok(PoolSpec { replicas: spec.replicas, entries, max_age, min_available: spec.min_available })
}

/// The spec a member on `provider` should have.
fn member_spec(pool: &ProxyPool, provider: &str) -> ProxySpec {
    let mut spec = pool.spec.template.spec.clone();
    provider.clone_into(&mut spec.provider);
    spec
}

/// Member creates, deletions or spec patches a pass sends at once, at most.
const MAX_IN_FLIGHT: usize = 32;

/// What a pass would change about a pool's members, seen from one view of
/// them.
struct Changes {
    plan: PoolPlan,
    /// Members whose spec no longer follows the template, with the spec
    /// they should have.
    drifted: Vec<(String, ProxySpec)>,
}

impl Changes {
    fn of(pool: &ProxyPool, planned: &PoolSpec, members: &[Arc<Proxy>], now: u64) -> Self {
        let plan = plan(planned, &members.iter().map(|p| pool_member(p)).collect::<Vec<_>>(), now);
        let drifted = members
            .iter()
            .filter(|p| {
                p.metadata.deletion_timestamp.is_none() && !plan.delete.contains(&p.name_any())
            })
            .filter_map(|p| {
                let want = member_spec(pool, &p.spec.provider);
                (p.spec != want).then(|| (p.name_any(), want))
            })
            .collect();
        Self { plan, drifted }
    }

    fn any(&self) -> bool {
        !self.plan.create.is_empty() || !self.plan.delete.is_empty() || !self.drifted.is_empty()
    }
}

fn pool_member(proxy: &Proxy) -> PoolMember {
    PoolMember {
        name: proxy.name_any(),
        provider: proxy.spec.provider.clone(),
        created_at: proxy
            .creation_timestamp()
            .map_or(0, |t| u64::try_from(t.0.as_second()).unwrap_or(0)),
        ready: proxy.status.as_ref().is_some_and(|s| Condition::is_true(&s.conditions, "Ready")),
        deleting: proxy.metadata.deletion_timestamp.is_some(),
    }
}

/// The pool's members among `proxies`: those it is the controller owner of.
fn owned_by(pool: &ProxyPool, proxies: impl IntoIterator<Item = Arc<Proxy>>) -> Vec<Arc<Proxy>> {
    let uid = pool.uid();
    proxies
        .into_iter()
        .filter(|p| p.owner_references().iter().any(|o| Some(&o.uid) == uid.as_ref()))
        .collect()
}

/// Runs `call` for each of `items`, in batches of 1, 2, 4, … up to
/// [`MAX_IN_FLIGHT`] sent at once, and stops after the first batch with a
/// failure: a pool whose creates are refused (a quota, an admission
/// webhook) costs one refused request, not one per missing member. The
/// ReplicaSet controller's slow start does the same.
async fn slow_start<'a, T, F, Fut>(items: &'a [T], call: F) -> Result<(), Error>
where
    F: Fn(&'a T) -> Fut,
    Fut: Future<Output = Result<(), Error>>,
{
    let mut batch = 1;
    let mut rest = items;
    while !rest.is_empty() {
        let (now, later) = rest.split_at(batch.min(rest.len()));
        for result in futures::future::join_all(now.iter().map(&call)).await {
            result?;
        }
        rest = later;
        batch = (batch * 2).min(MAX_IN_FLIGHT);
    }
    Ok(())
}

/// One pass over a pool: plans from the cached members, and when the plan
/// changes anything, plans again from a fresh list and applies that. The
/// status reports the counts and the `Ready` and `Available` conditions,
/// also when the spec cannot be planned or the API server refuses a member
/// change.
pub async fn reconcile_pool(
    pool: Arc<ProxyPool>,
    context: Arc<PoolContext>,
) -> Result<Action, Error> {
    let namespace = pool.namespace().ok_or(Error::Incomplete("namespace"))?;
    let name = pool.name_any();
    let now = proxyfleet_core::clock::unix_now();
    let planned = match pool_spec(&pool) {
        Ok(planned) => planned,
        Err(Error::Spec(message)) => {
            // Nothing is planned from a spec that cannot be read; a spec
            // change wakes the pool again.
            tracing::warn!(pool = %name, "{message}");
            let members = owned_by(&pool, context.members.state());
            let counted = members.iter().map(|p| pool_member(p)).filter(|m| !m.deleting);
            let (total, ready) =
                counted.fold((0, 0), |(total, ready), m| (total + 1, ready + u32::from(m.ready)));
            let findings = Findings { total, ready, problem: Some(Problem::InvalidSpec(message)) };
            report(&pool, &context, &namespace, findings, now).await?;
            return Ok(Action::await_change());
        }
        Err(err) => return Err(err),
    };
    let proxies: Api<Proxy> = Api::namespaced(context.client.clone(), &namespace);
    let selector = format!("{POOL_LABEL}={name}");
    // Every member's status write wakes its pool; on the cache such a
    // pass costs no request unless the counts it reports moved.
    let mut decided = Changes::of(&pool, &planned, &owned_by(&pool, context.members.state()), now);
    if decided.any() {
        // The cache may not hold this controller's last creates and
        // deletions yet: what to change is decided on a fresh list, so a
        // cache that lags never makes or removes a member twice.
        let listed = proxies.list(&ListParams::default().labels(&selector)).await?.items;
        decided =
            Changes::of(&pool, &planned, &owned_by(&pool, listed.into_iter().map(Arc::new)), now);
    }
    let Changes { plan: decided, drifted } = decided;
    // A refusal is the pool's state until it clears: it goes into the
    // conditions, and the pass fails so that it is retried.
    let (problem, refused) = match change_members(&pool, &proxies, &decided, &drifted).await {
        Ok(()) => (None, None),
        Err(Error::Kube(kube::Error::Api(status))) => {
            let problem = Problem::MemberChangeRefused(status.message.clone());
            (Some(problem), Some(Error::Kube(kube::Error::Api(status))))
        }
        Err(err) => return Err(err),
    };

    if let Some((metrics, pools)) = &context.metrics {
        let counts = PoolCounts { desired: pool.spec.replicas, ready: decided.ready };
        metrics.set_pool(&format!("{namespace}/{name}"), counts);
        let live = pools
            .state()
            .iter()
            .filter_map(|pool| Some(format!("{}/{}", pool.namespace()?, pool.name_any())))
            .collect();
        metrics.retain_pools(&live);
    }
    let findings = Findings { total: decided.total, ready: decided.ready, problem };
    report(&pool, &context, &namespace, findings, now).await?;
    if let Some(err) = refused {
        return Err(err);
    }
    // Owned Proxies wake the pool on every change; recycling by age also
    // needs the clock, at the moment the oldest member expires.
    Ok(match decided.next_rotation {
        Some(at) => Action::requeue(Duration::from_secs(at.saturating_sub(now).max(1))),
        None => Action::await_change(),
    })
}

/// Deletes, brings in line and creates members as `plan` and `drifted`
/// say, each kind in slow-start batches.
async fn change_members(
    pool: &ProxyPool,
    proxies: &Api<Proxy>,
    plan: &PoolPlan,
    drifted: &[(String, ProxySpec)],
) -> Result<(), Error> {
    let name = pool.name_any();
    slow_start(&plan.delete, |member| {
        let name = &name;
        async move {
            tracing::info!(pool = %name, proxy = %member, "removing a member");
            proxies.delete(member, &DeleteParams::default()).await?;
            Ok(())
        }
    })
    .await?;
    // The Proxy controller replaces the instance when the change needs one.
    slow_start(drifted, |(member, want)| async move {
        let patch = serde_json::json!({ "spec": want });
        proxies.patch(member, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        Ok(())
    })
    .await?;
    let owner = pool.controller_owner_ref(&()).ok_or(Error::Incomplete("UID"))?;
    let mut labels: BTreeMap<String, String> =
        pool.spec.template.metadata.as_ref().map(|m| m.labels.clone()).unwrap_or_default();
    labels.insert(POOL_LABEL.to_owned(), name.clone());
    slow_start(&plan.create, |provider| {
        let member = Proxy {
            metadata: kube::api::ObjectMeta {
                generate_name: Some(format!("{name}-")),
                namespace: pool.namespace(),
                labels: Some(labels.clone()),
                owner_references: Some(vec![owner.clone()]),
                ..Default::default()
            },
            spec: member_spec(pool, provider),
            status: None,
        };
        let name = &name;
        async move {
            let created = proxies.create(&PostParams::default(), &member).await?;
            tracing::info!(pool = %name, proxy = %created.name_any(), provider = %provider, "added a member");
            Ok(())
        }
    })
    .await
}

/// Applies the pool's status for `findings` when it differs from the one
/// the pool carries.
async fn report(
    pool: &ProxyPool,
    context: &PoolContext,
    namespace: &str,
    findings: Findings,
    now: u64,
) -> Result<(), Error> {
    let generation = pool.metadata.generation.unwrap_or(0);
    let previous = pool.status.as_ref().map_or(&[][..], |s| &s.conditions[..]);
    let status = ProxyPoolStatus {
        replicas: findings.total,
        ready_replicas: findings.ready,
        selector: Some(format!("{POOL_LABEL}={}", pool.name_any())),
        observed_generation: generation,
        conditions: conditions(&pool.spec, generation, &findings, previous, now),
    };
    if pool.status.as_ref() == Some(&status) {
        return Ok(());
    }
    let pools: Api<ProxyPool> = Api::namespaced(context.client.clone(), namespace);
    let patch = serde_json::json!({
        "apiVersion": "proxyfleet.io/v1alpha1",
        "kind": "ProxyPool",
        "status": status,
    });
    pools
        .patch_status(&pool.name_any(), &PatchParams::apply(MANAGER).force(), &Patch::Apply(&patch))
        .await?;
    Ok(())
}
