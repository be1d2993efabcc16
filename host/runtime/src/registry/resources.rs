//! Entries declared one by one by resources (a Kubernetes
//! `ClusterProxyProvider`) beside the providers file's: each spec is parsed
//! as a file entry is and bound live as [`Registry::reconfigure`] binds an
//! edit, so a refused edit keeps the entry on its spec.
//!
//! The two never take each other's names: a resource naming a file entry
//! serves nothing ([`Applied::NameTaken`]), and the file cannot take over
//! or remove an entry a resource declared. A resource that states a file
//! entry exactly as the file writes it is that entry's view (a cluster
//! shows its file entries so): it comes to what the file entry comes to,
//! and removing it removes nothing.

use async_trait::async_trait;
use proxyfleet_core::entry_resources::{Applied, ResourceEntries};
use proxyfleet_core::source::STILL_LOADING;

use crate::capabilities::http::secret::{check_refs, names_secrets};
use crate::config::ProvidersConfig;

use super::{EntryChange, EntryState, Registry};

impl Registry {
    /// [`ResourceEntries::apply`]: parses `spec` as entry `name` and
    /// serves it.
    pub async fn apply_resource(&self, name: &str, spec: &serde_json::Value) -> Applied {
        let entry = match ProvidersConfig::parse_entry(name, spec) {
            Ok(entry) => entry,
            Err(err) => return Applied::Invalid { message: err.to_string() },
        };
        let _one_at_a_time = self.scanning.lock().await;
        let before = self.configs.load_full();
        if before.contains_key(name) && !self.lock().resources.contains(name) {
            let shows_the_file = self.lock().file.get(name).is_some_and(|(file, _)| *file == entry);
            return if shows_the_file { self.applied_now(name) } else { Applied::NameTaken };
        }
        self.lock().resources.insert(name.to_owned());
        // An entry that could not serve its spec for want of a Secret is
        // tried again when the spec is applied (the leader's resync does)
        // and its Secrets read now; no other failure mends on its own, and
        // binding compiles the plugin again.
        let failed = matches!(self.entries.load().get(name), Some(EntryState::Failed(_)))
            && names_secrets(&entry.grants.http)
            && check_refs(&entry.grants.http, self.runtime.inner.secrets.as_ref()).await.is_ok();
        if before.get(name) == Some(&entry) && !failed {
            self.withdraw_refused(name);
            return self.applied_now(name);
        }
        let change = self.apply_entry(&entry, before.contains_key(name)).await;
        self.forget_unused_plugins();
        self.keep_serving().await;
        match change {
            Some(EntryChange::Refused { reason, kept_serving }) => {
                Applied::Refused { reason, kept_serving }
            }
            Some(EntryChange::Added | EntryChange::Updated | EntryChange::Removed) => {
                Applied::Serving
            }
            // The edit refused last time, asked for again.
            None => self.applied_now(name),
        }
    }

    /// [`ResourceEntries::remove`]: stops serving `name` when a resource
    /// declared it; a file entry of that name is left alone.
    pub async fn remove_resource(&self, name: &str) {
        let _one_at_a_time = self.scanning.lock().await;
        if self.lock().resources.remove(name) {
            self.remove_entry(name);
            self.forget_unused_plugins();
        }
    }

    /// What the entry `name` serves now, as [`Applied`].
    fn applied_now(&self, name: &str) -> Applied {
        let refused =
            self.lock().entries.get(name).and_then(|history| {
                history.refused_config.as_ref().map(|(_, reason)| reason.clone())
            });
        match self.entries.load().get(name) {
            Some(EntryState::Ready(_)) => match refused {
                Some(reason) => Applied::Refused { reason, kept_serving: true },
                None => Applied::Serving,
            },
            Some(EntryState::Failed(reason)) => {
                Applied::Refused { reason: reason.clone(), kept_serving: false }
            }
            Some(EntryState::Loading) | None => {
                Applied::Refused { reason: STILL_LOADING.to_owned(), kept_serving: false }
            }
        }
    }
}

#[async_trait]
impl ResourceEntries for Registry {
    async fn apply(&self, name: &str, spec: &serde_json::Value) -> Applied {
        self.apply_resource(name, spec).await
    }

    async fn remove(&self, name: &str) {
        self.remove_resource(name).await;
    }

    fn resource_names(&self) -> Vec<String> {
        self.lock().resources.iter().cloned().collect()
    }

    fn file_entries(&self) -> Vec<(String, serde_json::Value)> {
        let state = self.lock();
        state
            .file
            .iter()
            .filter(|(name, _)| !state.resources.contains(*name))
            .map(|(name, (_, written))| (name.clone(), written.clone()))
            .collect()
    }
}
