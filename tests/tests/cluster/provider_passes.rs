//! What every replica and the leader run for ClusterProxyProviders, for
//! one test's registry: the follower that serves them as entries and the
//! leader's passes that keep their finalizers and status.

use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, DeleteParams};
use proxyfleet_core::entry_resources::ResourceEntries;
use proxyfleet_kube::cluster_providers::{self, ProviderContext};
use proxyfleet_kube::crd::ClusterProxyProvider;
use proxyfleet_tests::wait_for;

/// The follower and the leader's passes, running until [`Passes::stop`].
pub(crate) struct Passes {
    follow: tokio::task::JoinHandle<()>,
    leader: tokio::task::JoinHandle<()>,
    stop: tokio::sync::oneshot::Sender<()>,
}

impl Passes {
    /// Both, for `entries`, the leader looking for Proxies in `namespace`.
    pub(crate) fn start(
        client: &kube::Client,
        entries: Arc<dyn ResourceEntries>,
        namespace: &str,
    ) -> Self {
        let follow = tokio::spawn(cluster_providers::follow(client.clone(), Arc::clone(&entries)));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let context =
            ProviderContext::new(client.clone(), entries, Some(namespace.to_owned()), None);
        let leader = tokio::spawn(cluster_providers::run(context, async move {
            let _ = stopped.await;
        }));
        Self { follow, leader, stop }
    }

    /// Stops the leader's passes (letting the one under way finish) and the
    /// follower.
    pub(crate) async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.leader.await;
        self.follow.abort();
    }
}

/// Deletes the providers `names` and waits until they are gone (their
/// finalizers let go) or `patience` ran out; whether they went.
pub(crate) async fn delete_all(
    api: &Api<ClusterProxyProvider>,
    names: &[&str],
    patience: Duration,
) -> bool {
    for name in names {
        api.delete(name, &DeleteParams::default()).await.unwrap();
    }
    wait_for(patience, || async {
        for name in names {
            if api.get_opt(name).await.ok()?.is_some() {
                return None;
            }
        }
        Some(())
    })
    .await
    .is_some()
}
