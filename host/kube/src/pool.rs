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
use kube::runtime::watcher;
use kube::{Resource as _, ResourceExt as _};
use proxyfleet_core::pool::{PoolMember, PoolSpec, parse_max_age, plan};

use crate::crd::{MANAGER, POOL_LABEL, Proxy, ProxyPool, ProxyPoolStatus, ProxySpec};

/// Why a pool reconcile could not finish.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Kubernetes API failed.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The pool spec cannot be planned.
    #[error("{0}")]
    Spec(String),
}

/// Runs the pool controller over `namespace` (all when `None`) until
/// `shutdown`.
pub async fn run(
    client: kube::Client,
    namespace: Option<&str>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let (pools, proxies): (Api<ProxyPool>, Api<Proxy>) = match namespace {
        Some(ns) => (Api::namespaced(client.clone(), ns), Api::namespaced(client.clone(), ns)),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    Controller::new(pools, watcher::Config::default())
        .owns(proxies, watcher::Config::default())
        .graceful_shutdown_on(shutdown)
        .run(reconcile_pool, error_policy, Arc::new(client))
        .for_each(|result| async move {
            if let Err(err) = result {
                tracing::warn!("pool reconcile failed: {err}");
            }
        })
        .await;
}

fn error_policy(pool: Arc<ProxyPool>, err: &Error, _client: Arc<kube::Client>) -> Action {
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

async fn reconcile_pool(pool: Arc<ProxyPool>, client: Arc<kube::Client>) -> Result<Action, Error> {
    let namespace =
        pool.namespace().ok_or_else(|| Error::Spec("the pool has no namespace".into()))?;
    let name = pool.name_any();
    let planned = pool_spec(&pool)?;
    let proxies: Api<Proxy> = Api::namespaced(client.as_ref().clone(), &namespace);
    let selector = format!("{POOL_LABEL}={name}");
    let owned: Vec<Proxy> = proxies
        .list(&ListParams::default().labels(&selector))
        .await?
        .items
        .into_iter()
        .filter(|p| p.owner_references().iter().any(|o| Some(&o.uid) == pool.uid().as_ref()))
        .collect();
    let members: Vec<PoolMember> = owned
        .iter()
        .map(|p| PoolMember {
            name: p.name_any(),
            provider: p.spec.provider.clone(),
            created_at: p
                .creation_timestamp()
                .map_or(0, |t| u64::try_from(t.0.as_second()).unwrap_or(0)),
            ready: p.status.as_ref().is_some_and(|s| {
                s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True")
            }),
            deleting: p.metadata.deletion_timestamp.is_some(),
        })
        .collect();
    let now = proxyfleet_core::clock::unix_now();
    let decided = plan(&planned, &members, now);

    for member in &decided.delete {
        tracing::info!(pool = %name, proxy = %member, "removing a member");
        proxies.delete(member, &DeleteParams::default()).await?;
    }
    for proxy in owned.iter().filter(|p| {
        p.metadata.deletion_timestamp.is_none() && !decided.delete.contains(&p.name_any())
    }) {
        let want = member_spec(&pool, &proxy.spec.provider);
        if proxy.spec != want {
            // The Proxy controller replaces the instance when the change
            // needs one.
            let patch = serde_json::json!({ "spec": want });
            proxies
                .patch(&proxy.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
    }
    let owner =
        pool.controller_owner_ref(&()).ok_or_else(|| Error::Spec("the pool has no UID".into()))?;
    for provider in &decided.create {
        let mut labels: BTreeMap<String, String> =
            pool.spec.template.metadata.as_ref().map(|m| m.labels.clone()).unwrap_or_default();
        labels.insert(POOL_LABEL.to_owned(), name.clone());
        let member = Proxy {
            metadata: kube::api::ObjectMeta {
                generate_name: Some(format!("{name}-")),
                namespace: Some(namespace.clone()),
                labels: Some(labels),
                owner_references: Some(vec![owner.clone()]),
                ..Default::default()
            },
            spec: member_spec(&pool, provider),
            status: None,
        };
        let created = proxies.create(&PostParams::default(), &member).await?;
        tracing::info!(pool = %name, proxy = %created.name_any(), provider = %provider, "added a member");
    }

    let status = ProxyPoolStatus {
        replicas: decided.total,
        ready_replicas: decided.ready,
        selector: Some(selector),
        observed_generation: pool.metadata.generation.unwrap_or(0),
    };
    if pool.status.as_ref() != Some(&status) {
        let pools: Api<ProxyPool> = Api::namespaced(client.as_ref().clone(), &namespace);
        let patch = serde_json::json!({
            "apiVersion": "proxyfleet.io/v1alpha1",
            "kind": "ProxyPool",
            "status": status,
        });
        pools
            .patch_status(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&patch))
            .await?;
    }
    // Owned Proxies wake the pool on every change; recycling by age also
    // needs the clock, at the moment the oldest member expires.
    Ok(match decided.next_rotation {
        Some(at) => Action::requeue(Duration::from_secs(at.saturating_sub(now).max(1))),
        None => Action::await_change(),
    })
}
