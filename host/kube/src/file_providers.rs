//! The providers file's entries, shown in a cluster as ClusterProxyProviders.
//!
//! The leader applies each entry of the file, as the file writes it, as a
//! ClusterProxyProvider labelled [`FILE_LABEL`] with the installation's ID,
//! and deletes the ones it labelled once their entry leaves the file. The
//! file stays what serves them: the registry takes such a resource for a
//! view of its file entry ([`ResourceEntries::apply`] answers with what the
//! entry comes to), so these objects carry the same conditions, builds and
//! checks as the resources a platform team applies, and `kubectl get
//! cpxprov` lists every provider the operator serves.
//!
//! A ClusterProxyProvider of the same name that is not this installation's
//! view of the file (a platform team's, another installation's) is never
//! written or deleted; the file's entry is then refused, as the registry
//! says. An edit made to a view is undone at the next full pass: the file
//! is where such an entry changes.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use proxyfleet_core::entry_resources::ResourceEntries;

use crate::crd::ClusterProxyProvider;

/// The label of a ClusterProxyProvider that shows a providers-file entry;
/// its value is the ID of the installation whose file states it.
pub const FILE_LABEL: &str = "proxyfleet.io/providers-file";

/// The field manager of the views' specs.
pub const FILE_MANAGER: &str = "proxyfleet-providers-file";

/// How often the file's entries are compared with their views.
const INTERVAL: Duration = Duration::from_secs(5);

/// Every how many passes each view is applied again even when its entry
/// did not change, undoing an edit made to the object.
const FULL_PASS_EVERY: u32 = 12;

/// What one pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Shown {
    /// Entries whose view was applied (created or brought in line).
    pub applied: Vec<String>,
    /// Views deleted because their entry left the file.
    pub deleted: Vec<String>,
    /// Entries not shown: a ClusterProxyProvider of their name is not
    /// this installation's view.
    pub taken: Vec<String>,
}

/// Whether `provider` is a view of a providers file (any installation's):
/// it declares no entry, the file serves it.
pub fn is_file_view(provider: &ClusterProxyProvider) -> bool {
    provider.labels().contains_key(FILE_LABEL)
}

/// Whether `provider` is another installation's view of its own providers
/// file: this installation neither serves it nor writes its status.
pub fn shown_by_another(provider: &ClusterProxyProvider, installation: &str) -> bool {
    provider.labels().get(FILE_LABEL).is_some_and(|owner| owner != installation)
}

/// Keeps the views in line with the file's entries, a pass every few
/// seconds, until dropped (the leader runs it while it leads).
pub async fn show(client: kube::Client, entries: &dyn ResourceEntries) {
    let mut views = FileViews::new(client);
    let mut ticks = tokio::time::interval(INTERVAL);
    let mut pass = 0u32;
    loop {
        ticks.tick().await;
        if pass.is_multiple_of(FULL_PASS_EVERY) {
            views.applied.clear();
        }
        pass = pass.wrapping_add(1);
        if let Err(err) = views.pass(entries).await {
            tracing::warn!(
                "cannot show the providers file's entries as ClusterProxyProviders: {err}"
            );
        }
    }
}

/// The views one installation keeps (the installation of the entries each
/// pass is given), and what it last applied of each.
#[derive(Debug)]
pub struct FileViews {
    api: Api<ClusterProxyProvider>,
    /// Entry → the spec last applied as its view.
    applied: BTreeMap<String, serde_json::Value>,
    /// Entries already reported as taken, so each is logged once.
    taken: BTreeSet<String>,
}

impl FileViews {
    /// Views applied through `client`.
    pub fn new(client: kube::Client) -> Self {
        Self { api: Api::all(client), applied: BTreeMap::new(), taken: BTreeSet::new() }
    }

    /// One pass: applies the view of each entry that is new or changed (or
    /// whose view is gone), and deletes the views of entries that left.
    pub async fn pass(&mut self, entries: &dyn ResourceEntries) -> Result<Shown, kube::Error> {
        let installation = entries.installation().as_str();
        let selector = format!("{FILE_LABEL}={installation}");
        let existing: BTreeSet<String> = self
            .api
            .list(&ListParams::default().labels(&selector))
            .await?
            .items
            .iter()
            .map(ResourceExt::name_any)
            .collect();
        let file = entries.file_entries();
        let mut shown = Shown::default();
        for (name, spec) in &file {
            if existing.contains(name) && self.applied.get(name) == Some(spec) {
                continue;
            }
            if !existing.contains(name) && self.api.get_opt(name).await?.is_some() {
                if self.taken.insert(name.clone()) {
                    tracing::warn!(
                        entry = %name,
                        "a ClusterProxyProvider of this name is not this installation's view of \
                         the providers file; the entry is not shown (rename the entry or the \
                         resource)"
                    );
                }
                shown.taken.push(name.clone());
                continue;
            }
            self.taken.remove(name);
            let object = serde_json::json!({
                "apiVersion": "proxyfleet.io/v1alpha1",
                "kind": "ClusterProxyProvider",
                "metadata": { "name": name, "labels": { FILE_LABEL: installation } },
                "spec": spec,
            });
            self.api
                .patch(name, &PatchParams::apply(FILE_MANAGER).force(), &Patch::Apply(&object))
                .await?;
            self.applied.insert(name.clone(), spec.clone());
            shown.applied.push(name.clone());
        }
        for name in existing.iter().filter(|name| !file.iter().any(|(entry, _)| entry == *name)) {
            match self.api.delete(name, &DeleteParams::default()).await {
                Ok(_) => {
                    tracing::info!(entry = %name, "the entry left the providers file: its ClusterProxyProvider is deleted")
                }
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(err) => return Err(err),
            }
            self.applied.remove(name);
            shown.deleted.push(name.clone());
        }
        Ok(shown)
    }
}
