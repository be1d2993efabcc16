//! Fleet services in Kubernetes mode: the leader publishes the Proxies its
//! controller watches to the discovery catalog, wakes the controller for a
//! Proxy whose health verdict changed, and deletes pool members crawlers
//! reported too often (their ProxyPool makes replacements).
//!
//! Only the Proxy controller writes a Proxy's status: it merges the latest
//! verdict in on every pass ([`Fleet::merge_verdict`]). A second writer patching
//! `Healthy` from a cached copy could put back fields the reconciler had
//! just changed.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, Preconditions};
use kube::runtime::reflector::{ObjectRef, Store};
use proxyfleet_core::proxy::Phase;
use proxyfleet_fleet::{Endpoint, Fleet, Member};
use tokio::sync::mpsc;

use crate::crd::{POOL_LABEL, Proxy, ProxyPhase};
use crate::credentials::Credentials;

/// How often the catalog is refreshed from the controller's cache.
const PUBLISH_EVERY: Duration = Duration::from_secs(1);

/// The catalog member of a Proxy: it gets an endpoint only while it is
/// `Running` with an address and not being deleted, with the credential
/// the controller last read for it.
pub fn member_of(proxy: &Proxy, credentials: &Credentials) -> Option<Member> {
    let namespace = proxy.namespace()?;
    let status = proxy.status.as_ref();
    let phase = match status.map(|s| s.phase) {
        None | Some(ProxyPhase::Pending) => Phase::Pending,
        Some(ProxyPhase::Provisioning) => Phase::Provisioning,
        Some(ProxyPhase::Running) => Phase::Running,
        Some(ProxyPhase::Failed) => Phase::Failed,
        Some(ProxyPhase::Deleting) => Phase::Deleting,
    };
    let deleting = proxy.metadata.deletion_timestamp.is_some();
    let endpoint = status
        .and_then(|s| s.ip.as_deref())
        .and_then(|ip| ip.parse().ok())
        .filter(|_| phase == Phase::Running && !deleting)
        .map(|ip| Endpoint::new(ip, status.and_then(|s| s.port).unwrap_or(proxy.spec.port)));
    // A Proxy that names a credential is published without an endpoint
    // until the controller has read it (after a restart or a new leader):
    // probed without it, the proxy would turn unhealthy for nothing.
    let credential = proxy.uid().and_then(|uid| credentials.get(&uid));
    let endpoint = match (&proxy.spec.proxy_auth_secret_ref, credential) {
        (Some(_), None) => None,
        (_, credential) => endpoint.map(|endpoint| endpoint.with_credential(credential)),
    };
    Some(Member {
        id: proxy.uid()?,
        pool: proxy.labels().get(POOL_LABEL).map(|pool| format!("{namespace}/{pool}")),
        namespace,
        name: proxy.name_any(),
        provider: proxy.spec.provider.clone(),
        labels: proxy.spec.labels.clone(),
        phase: if deleting { Phase::Deleting } else { phase },
        endpoint,
    })
}

/// Runs until aborted: publishes the cache, wakes the controller for
/// changed verdicts, deletes reported pool members.
pub async fn publish(
    store: Store<Proxy>,
    fleet: Arc<Fleet>,
    credentials: Arc<Credentials>,
    wake: mpsc::UnboundedSender<ObjectRef<Proxy>>,
    client: kube::Client,
) {
    loop {
        let proxies = store.state();
        fleet.publish(proxies.iter().filter_map(|p| member_of(p, &credentials)).collect());
        let by_uid: HashMap<String, &Arc<Proxy>> =
            proxies.iter().filter_map(|p| Some((p.uid()?, p))).collect();
        credentials.retain(|uid| by_uid.contains_key(uid));
        for (uid, _) in fleet.take_verdict_changes() {
            if let Some(proxy) = by_uid.get(&uid) {
                let _ = wake.send(ObjectRef::from_obj(proxy.as_ref()));
            }
        }
        for member in fleet.take_replacements() {
            let api: Api<Proxy> = Api::namespaced(client.clone(), &member.namespace);
            // The UID precondition: never delete a newer Proxy of that name.
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: Some(member.id.clone()),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match api.delete(&member.name, &params).await {
                Ok(_) => {
                    tracing::warn!(proxy = %member.name, namespace = %member.namespace, pool = ?member.pool, "replacing a proxy crawlers reported too often")
                }
                Err(err) => {
                    tracing::warn!(proxy = %member.name, "cannot delete a reported proxy for replacement: {err}")
                }
            }
        }
        tokio::time::sleep(PUBLISH_EVERY).await;
    }
}
