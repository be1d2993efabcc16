//! What every replica runs for crawlers, leader or not: a watch of the
//! Proxies published to the replica's catalog with the credentials their
//! Secrets hold, and the health engine probing them. So every replica
//! serves the discovery API, the gateway and the console, and is ready once
//! it has restored the shared leases and probed the fleet once; a change of
//! leader leaves crawlers' connections alone.
//!
//! Each replica probes on its own: verdicts do not depend on another
//! process, and probes multiply by the replica count (two by default),
//! which the health interval's cost budget allows for. Only the leader
//! writes verdicts into the Proxies' status ([`crate::fleet::Wakes`]).

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use kube::ResourceExt as _;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use proxyfleet_fleet::{Fleet, HealthEngine};

use crate::crd::Proxy;
use crate::credentials::Credentials;
use crate::fleet::{CacheChanges, Wakes};
use crate::spec_secrets::{SecretError, proxy_auth};

/// How often the credential reader looks for Proxies whose credential it
/// has not read, and how soon it tries a refused Secret again.
const READ_EVERY: Duration = Duration::from_secs(1);
const RETRY_REFUSED: Duration = Duration::from_secs(30);

/// Runs the fleet services over the Proxies in `namespace` (every
/// namespace when `None`) until `shutdown`: the watch, the publisher, the
/// credential reader and `engine`. `credentials` is shared with the
/// leader's controller (whose passes read the same Secrets), `wakes` with
/// its listener.
pub async fn serve(
    client: kube::Client,
    namespace: Option<String>,
    fleet: Arc<Fleet>,
    engine: HealthEngine,
    credentials: Arc<Credentials>,
    wakes: Arc<Wakes>,
    shutdown: impl Future<Output = ()>,
) {
    let proxies: Api<Proxy> = match &namespace {
        Some(namespace) => Api::namespaced(client.clone(), namespace),
        None => Api::all(client.clone()),
    };
    let (store, writer) = reflector::store();
    let changes = Arc::new(CacheChanges::default());
    let watch = watcher(proxies, watcher::Config::default())
        .default_backoff()
        // Server-side apply's field records are most of a stored Proxy's
        // bytes, and nothing here reads them.
        .modify(|proxy| proxy.managed_fields_mut().clear())
        .reflect(writer)
        // After `reflect`: the event is in the cache when it is counted.
        .for_each({
            let changes = Arc::clone(&changes);
            move |event| {
                if let Err(err) = event {
                    tracing::warn!("the fleet's watch of Proxies failed; retrying: {err}");
                }
                changes.bump();
                std::future::ready(())
            }
        });
    let publisher = tokio::spawn(crate::fleet::publish(
        store.clone(),
        changes,
        Arc::clone(&fleet),
        Arc::clone(&credentials),
        wakes,
        client.clone(),
    ));
    let reader = read_credentials(client.clone(), namespace.as_deref(), store, credentials);
    tokio::select! {
        () = watch => {}
        () = reader => {}
        () = engine.run(shutdown) => {}
    }
    publisher.abort();
}

/// Keeps `credentials` holding what the Secrets of the cached Proxies say:
/// each Proxy's is read once it is seen and again whenever its Secret
/// changes; a refused one is tried again after [`RETRY_REFUSED`]. The
/// leader's passes write the same values.
async fn read_credentials(
    client: kube::Client,
    namespace: Option<&str>,
    store: Store<Proxy>,
    credentials: Arc<Credentials>,
) {
    // Proxy UID → the Secret its credential was read from, and when that
    // was refused (`None`: read; again only when the Secret changes).
    let mut read: HashMap<String, (Option<String>, Option<Instant>)> = HashMap::new();
    let secrets = crate::secrets::changes(&client, namespace);
    tokio::pin!(secrets);
    let mut tick = tokio::time::interval(READ_EVERY);
    loop {
        tokio::select! {
            changed = secrets.next() => match changed {
                Some(secret) => {
                    for proxy in crate::secrets::proxies_naming(&store, &secret) {
                        if let Some(uid) = store.get(&proxy).and_then(|p| p.uid()) {
                            read.remove(&uid);
                        }
                    }
                }
                None => return,
            },
            _ = tick.tick() => {}
        }
        let cached = store.state();
        read.retain(|uid, _| cached.iter().any(|p| p.uid().as_deref() == Some(uid)));
        for proxy in cached.iter().filter(|p| p.metadata.deletion_timestamp.is_none()) {
            let (Some(uid), Some(namespace)) = (proxy.uid(), proxy.namespace()) else { continue };
            let secret = proxy.spec.proxy_auth_secret_ref.as_ref().map(|r| r.name.clone());
            let fresh = read.get(&uid).is_some_and(|(from, refused)| {
                *from == secret && refused.is_none_or(|at| at.elapsed() < RETRY_REFUSED)
            });
            if fresh {
                continue;
            }
            let refused = match proxy_auth(&client, &namespace, proxy).await {
                Ok(credential) => {
                    credentials.set(&uid, credential);
                    None
                }
                Err(SecretError::Refused(message)) => {
                    // The leader's pass says so on the Proxy; here it only
                    // keeps the proxy out of the catalog.
                    tracing::debug!(proxy = %proxy.name_any(), "{message}");
                    credentials.set(&uid, None);
                    Some(Instant::now())
                }
                Err(SecretError::Kube(err)) => {
                    tracing::warn!(proxy = %proxy.name_any(), "cannot read a Proxy's credential yet: {err}");
                    Some(Instant::now())
                }
            };
            read.insert(uid, (secret, refused));
        }
    }
}
