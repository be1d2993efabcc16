//! The discovery catalog in Kubernetes mode: every replica publishes the
//! Proxies it watches to its catalog, wakes the leader's controller (when
//! this replica leads) for a Proxy whose health verdict changed, and
//! deletes pool members crawlers reported too often (their ProxyPool makes
//! replacements).
//!
//! Only the leader's Proxy controller writes a Proxy's status: it merges
//! the latest verdict in on every pass ([`Fleet::merge_verdict`]). A second
//! writer patching `Healthy` from a cached copy could put back fields the
//! reconciler had just changed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, Preconditions};
use kube::runtime::reflector::{ObjectRef, Store};
use proxyfleet_core::proxy::Phase;
use proxyfleet_fleet::{Endpoint, Fleet, Member};
use tokio::sync::mpsc;

use crate::convert::status_from_crd;
use crate::crd::{POOL_LABEL, Proxy, ProxyPhase};
use crate::credentials::Credentials;

/// How often the publisher looks for changes: the catalog is rebuilt at
/// most this often, and only after the cache or a credential changed.
const PUBLISH_EVERY: Duration = Duration::from_secs(1);

/// Counts the watch events the controller's cache has taken, so the
/// publisher can tell whether it changed since the last look.
#[derive(Debug, Default)]
pub struct CacheChanges(AtomicU64);

impl CacheChanges {
    /// One more event applied to the cache: call after it is applied.
    pub fn bump(&self) {
        self.0.fetch_add(1, Ordering::Release);
    }

    fn get(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }
}

/// The Proxies whose verdict changed, for the leader's controller: the
/// publisher runs on every replica, a controller listens only while its
/// replica leads.
#[derive(Debug, Default)]
pub struct Wakes(Mutex<Option<mpsc::UnboundedSender<ObjectRef<Proxy>>>>);

impl Wakes {
    /// Wakes from now on go to the receiver returned (and to no earlier
    /// one); dropping it stops them.
    pub fn listen(&self) -> mpsc::UnboundedReceiver<ObjectRef<Proxy>> {
        let (send, receive) = mpsc::unbounded_channel();
        *self.lock() = Some(send);
        receive
    }

    fn send(&self, proxy: ObjectRef<Proxy>) {
        let mut listener = self.lock();
        if listener.as_ref().is_some_and(|send| send.send(proxy).is_err()) {
            *listener = None;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<mpsc::UnboundedSender<ObjectRef<Proxy>>>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

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
        created_at: proxy
            .metadata
            .creation_timestamp
            .as_ref()
            .and_then(|t| u64::try_from(t.0.as_second()).ok()),
        conditions: status.map(|s| status_from_crd(s).conditions).unwrap_or_default(),
    })
}

/// The publisher's view of what it last published.
#[derive(Debug, Default)]
pub struct Published {
    /// The counts of cache and credential changes it was built from.
    seen: Option<(u64, u64)>,
    /// The published Proxies by UID, to wake one whose verdict changed.
    by_uid: HashMap<String, ObjectRef<Proxy>>,
}

impl Published {
    /// Rebuilds the catalog from `store` when the cache or a credential
    /// changed since the last call (always on the first); returns whether
    /// it did. An idle fleet costs nothing here: this used to rebuild every
    /// member every second.
    pub fn refresh(
        &mut self,
        store: &Store<Proxy>,
        changes: &CacheChanges,
        fleet: &Fleet,
        credentials: &Credentials,
    ) -> bool {
        // Read before the cache: a change landing in between is published
        // now and once more next time, never missed.
        let seen = (changes.get(), credentials.changes());
        if self.seen == Some(seen) {
            return false;
        }
        let proxies = store.state();
        fleet.publish(proxies.iter().filter_map(|p| member_of(p, credentials)).collect());
        self.by_uid = proxies
            .iter()
            .filter_map(|p| Some((p.uid()?, ObjectRef::from_obj(p.as_ref()))))
            .collect();
        credentials.retain(|uid| self.by_uid.contains_key(uid));
        self.seen = Some(seen);
        true
    }

    /// The Proxy published under `uid`.
    pub fn proxy(&self, uid: &str) -> Option<&ObjectRef<Proxy>> {
        self.by_uid.get(uid)
    }
}

/// Runs until aborted: publishes the cache when it changed (`changes`
/// counts its events), wakes the leader's controller for changed verdicts,
/// deletes reported pool members.
pub async fn publish(
    store: Store<Proxy>,
    changes: Arc<CacheChanges>,
    fleet: Arc<Fleet>,
    credentials: Arc<Credentials>,
    wakes: Arc<Wakes>,
    client: kube::Client,
) {
    let mut published = Published::default();
    loop {
        published.refresh(&store, &changes, &fleet, &credentials);
        for (uid, _) in fleet.take_verdict_changes() {
            if let Some(proxy) = published.proxy(&uid) {
                wakes.send(proxy.clone());
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

#[cfg(test)]
mod tests {
    use kube::runtime::reflector;
    use kube::runtime::watcher;
    use proxyfleet_core::credential::ProxyCredential;
    use proxyfleet_fleet::FleetSettings;
    use proxyfleet_metrics::Metrics;

    use super::*;

    fn running(name: &str, ip: &str) -> Proxy {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "proxyfleet.io/v1alpha1",
            "kind": "Proxy",
            "metadata": { "name": name, "namespace": "ns", "uid": format!("uid-{name}") },
            "spec": { "provider": "lab", "port": 3128 },
            "status": { "phase": "Running", "ip": ip },
        }))
        .expect("a Proxy")
    }

    /// The publisher rebuilt every member from the cache every second,
    /// whether or not anything had changed: per-Proxy work on an idle
    /// operator.
    #[test]
    fn regression_an_idle_publisher_rebuilds_nothing_and_a_change_is_published() {
        let (store, mut writer) = reflector::store::<Proxy>();
        let changes = CacheChanges::default();
        let credentials = Credentials::default();
        let fleet = Fleet::new(FleetSettings::default(), Arc::new(Metrics::new()));
        let mut published = Published::default();
        let mut apply = |proxy: Proxy| {
            writer.apply_watcher_event(&watcher::Event::Apply(proxy));
            changes.bump();
        };
        apply(running("a", "10.0.0.1"));

        assert!(published.refresh(&store, &changes, &fleet, &credentials), "the first look");
        assert_eq!(fleet.get("uid-a").expect("published").name, "a");
        assert!(published.proxy("uid-a").is_some());
        for _ in 0..3 {
            assert!(!published.refresh(&store, &changes, &fleet, &credentials), "nothing changed");
        }

        apply(running("b", "10.0.0.2"));
        assert!(published.refresh(&store, &changes, &fleet, &credentials), "a new Proxy");
        assert!(fleet.get("uid-b").is_ok());

        // A credential read by a pass changes the member without any
        // change to the cached object.
        let credential =
            ProxyCredential::new("crawler".into(), "secret-password".into()).expect("valid");
        credentials.set("uid-a", Some(credential.clone()));
        assert!(published.refresh(&store, &changes, &fleet, &credentials), "a new credential");
        credentials.set("uid-a", Some(credential));
        assert!(
            !published.refresh(&store, &changes, &fleet, &credentials),
            "the same credential read again"
        );
    }
}
