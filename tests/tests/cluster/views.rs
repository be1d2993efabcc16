//! The providers file's entries as a leader shows them: the
//! ClusterProxyProviders `file_providers` applies, given their status by
//! the provider passes, for tests that read an entry's state from the
//! cluster. Each test's registry is an installation of its own
//! ([`runtime`]): a pass deletes the views of its installation whose entry
//! is not in its file, and the passes leave other installations' views be.

use std::sync::Arc;

use kube::api::Api;
use proxyfleet_core::entry_resources::ResourceEntries;
use proxyfleet_core::installation::InstallationId;
use proxyfleet_kube::cluster_providers::{self, ProviderContext};
use proxyfleet_kube::crd::{ClusterProxyProvider, ClusterProxyProviderStatus, ConditionStatus};
use proxyfleet_kube::file_providers::{FileViews, Shown};
use proxyfleet_runtime::{Runtime, RuntimeOptions};

/// A runtime of an installation of its own.
pub(crate) fn runtime() -> Runtime {
    runtime_with(RuntimeOptions::default())
}

/// A runtime set up with `options`, of an installation of its own.
pub(crate) fn runtime_with(options: RuntimeOptions) -> Runtime {
    use std::sync::atomic::{AtomicU32, Ordering};
    static COUNT: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let id =
        format!("t{:x}-{:x}-{}", std::process::id(), nanos, COUNT.fetch_add(1, Ordering::Relaxed));
    let installation = InstallationId::parse("test", &id).unwrap();
    Runtime::new(RuntimeOptions { installation, ..options }).unwrap()
}

/// The leader's provider parts for one test: the views of `installation`'s
/// file and the passes over them.
pub(crate) struct Views {
    client: kube::Client,
    views: FileViews,
    context: ProviderContext,
}

impl Views {
    pub(crate) fn new(client: &kube::Client, entries: Arc<dyn ResourceEntries>) -> Self {
        Self {
            client: client.clone(),
            views: FileViews::new(client.clone()),
            context: ProviderContext::new(client.clone(), entries, None, None),
        }
    }

    /// One pass of the views, then the provider passes over each view (the
    /// first adds the finalizer, the next writes the status).
    pub(crate) async fn show(&mut self, entries: &dyn ResourceEntries) -> Shown {
        let shown = self.views.pass(entries).await.unwrap();
        let api: Api<ClusterProxyProvider> = Api::all(self.client.clone());
        for name in shown.applied.iter().chain(&shown.deleted) {
            for _ in 0..2 {
                let Some(provider) = api.get_opt(name).await.unwrap() else { break };
                cluster_providers::reconcile(&provider, &self.context).await.unwrap();
            }
        }
        shown
    }

    /// The provider passes over view `name` again (a build swapped, an
    /// edit refused), and its status after them.
    pub(crate) async fn status(&self, name: &str) -> ClusterProxyProviderStatus {
        let api: Api<ClusterProxyProvider> = Api::all(self.client.clone());
        let provider = api.get(name).await.unwrap();
        cluster_providers::reconcile(&provider, &self.context).await.unwrap();
        api.get(name).await.unwrap().status.unwrap_or_default()
    }
}

/// `type=status/reason` of condition `type_` of `status`, and its message.
pub(crate) fn condition(status: &ClusterProxyProviderStatus, type_: &str) -> (String, String) {
    let condition = status.conditions.iter().find(|c| c.type_ == type_);
    let condition = condition.unwrap_or_else(|| panic!("no {type_} condition: {status:?}"));
    let holds = if condition.status == ConditionStatus::True { "True" } else { "False" };
    (format!("{type_}={holds}/{}", condition.reason), condition.message.clone().unwrap_or_default())
}
