//! Entries that change while the host runs: an entry added to, edited in or
//! removed from the providers file takes effect without a restart.
//!
//! An added or edited entry is bound the way one is at load (pin, grants,
//! then the plugin's `validate-config`) before it serves. An edit that is
//! refused leaves the entry serving the config it had, and its revisions
//! say why (`configRefused`) until a config is taken; a new entry that is
//! refused is unavailable with the reason, as one refused at load is. A
//! removed entry stops serving at once; calls in flight finish on the
//! provider they started on.
//!
//! An edit that keeps the plugin keeps the build serving the entry (a
//! rolled-back entry stays rolled back): the config changes, the code does
//! not. The revision before it is forgotten, since it was bound to the old
//! config. The `registries` section is read at start only.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

use crate::admission::Refusal;
use crate::capabilities::http::secret::{check_refs, names_secrets};
use crate::config::{EntryConfig, ProvidersConfig};
use crate::plugin::{PluginFile, PluginRevision, file_digest};
use crate::provider::PluginProvider;

use super::{EntryState, PluginLoad, Registry, bind, is_oci_name, missing_plugin};

/// What [`Registry::reconfigure`] did with one entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryChange {
    /// A new entry, serving.
    Added,
    /// An edited entry, serving its new config.
    Updated,
    /// Gone from the configuration: serves nothing any more.
    Removed,
    /// A new or edited entry whose config cannot serve, with why (no
    /// secret in it). `kept_serving`: the entry served before the edit and
    /// still serves the config it had.
    Refused {
        /// Why, naming the field or plugin at fault.
        reason: String,
        /// Whether the entry's previous config still serves.
        kept_serving: bool,
    },
}

impl Registry {
    /// Makes the registry serve `config`'s entries: entries it does not
    /// name are removed, new ones bound, edited ones rebound; entries
    /// whose config is unchanged are left alone (and absent from the
    /// answer). Waits for a load or rescan under way.
    pub async fn reconfigure(&self, config: &ProvidersConfig) -> BTreeMap<String, EntryChange> {
        let _one_at_a_time = self.scanning.lock().await;
        let before = self.configs.load_full();
        let resources = {
            let mut state = self.lock();
            state.file = super::file_entries(config);
            state.resources.clone()
        };
        let mut changes = BTreeMap::new();
        for name in before.keys() {
            if !resources.contains(name) && !config.entries.iter().any(|entry| &entry.name == name)
            {
                self.remove_entry(name);
                changes.insert(name.clone(), EntryChange::Removed);
            }
        }
        for entry in &config.entries {
            if resources.contains(&entry.name) {
                let reason = format!(
                    "a ClusterProxyProvider named {:?} serves this name; rename the entry or the \
                     resource",
                    entry.name
                );
                tracing::error!(entry = %entry.name, "provider entry not served: {reason}");
                changes.insert(
                    entry.name.clone(),
                    EntryChange::Refused { reason, kept_serving: false },
                );
                continue;
            }
            if before.get(&entry.name) == Some(entry) {
                self.withdraw_refused(&entry.name);
                continue;
            }
            if let Some(change) = self.apply_entry(entry, before.contains_key(&entry.name)).await {
                changes.insert(entry.name.clone(), change);
            }
        }
        self.forget_unused_plugins();
        self.keep_serving().await;
        changes
    }

    /// Binds again, as its config stands, every entry that serves nothing
    /// and names Secrets that read now: they may have been created since
    /// its binding failed, with no change of the entry. Entries whose
    /// Secrets still do not read are left as they are (binding compiles
    /// the plugin, which no entry may hold any more), and so are entries
    /// naming no Secret: nothing else they need appears on its own (a
    /// plugin file that does is picked up by the rescan). Answers the
    /// entries that serve now.
    pub async fn retry_failed(&self) -> Vec<String> {
        let _one_at_a_time = self.scanning.lock().await;
        let states = self.entries.load_full();
        let failed: Vec<EntryConfig> = self
            .configs
            .load()
            .values()
            .filter(|entry| matches!(states.get(&entry.name), Some(EntryState::Failed(_))))
            .filter(|entry| names_secrets(&entry.grants.http))
            .cloned()
            .collect();
        let mut serving = Vec::new();
        for entry in failed {
            if check_refs(&entry.grants.http, self.runtime.inner.secrets.as_ref()).await.is_err() {
                continue;
            }
            if let Some(EntryChange::Added) = self.apply_entry(&entry, false).await {
                serving.push(entry.name);
            }
        }
        if !serving.is_empty() {
            self.forget_unused_plugins();
            self.keep_serving().await;
        }
        serving
    }

    /// Binds a new or edited entry and publishes it; `None` when it is the
    /// edit refused last time, unchanged since.
    pub(super) async fn apply_entry(
        &self,
        entry: &EntryConfig,
        existed: bool,
    ) -> Option<EntryChange> {
        let refused_before = self
            .lock()
            .entries
            .get(&entry.name)
            .and_then(|history| history.refused_config.as_ref())
            .is_some_and(|(refused, _)| refused == entry);
        if refused_before {
            return None;
        }
        let serving = match self.entries.load().get(&entry.name) {
            Some(EntryState::Ready(provider)) => Some(Arc::clone(provider)),
            _ => None,
        };
        let revision = match &serving {
            Some(provider) if provider.config().plugin == entry.plugin => Ok(provider.revision()),
            _ => self.revision_for(entry).await,
        };
        let bound = match revision {
            Ok(revision) => bind(&self.runtime, entry, &revision, Arc::clone(&self.kv))
                .await
                .map_err(|refusal| format!("plugin {:?} {refusal}", entry.plugin)),
            Err(reason) => Err(reason),
        };
        Some(match (bound, serving) {
            (Ok(provider), _) => {
                self.serve(entry, provider, existed);
                if existed { EntryChange::Updated } else { EntryChange::Added }
            }
            (Err(reason), Some(_)) => {
                tracing::warn!(
                    entry = %entry.name,
                    "refused the entry's new config; it keeps serving the one before: {reason}"
                );
                let mut state = self.lock();
                let history = state.entries.entry(entry.name.clone()).or_default();
                history.refused_config = Some((entry.clone(), reason.clone()));
                EntryChange::Refused { reason, kept_serving: true }
            }
            (Err(reason), None) => {
                tracing::error!(entry = %entry.name, "provider entry unavailable: {reason}");
                self.store_config(entry);
                let mut state = self.lock();
                state.entries.entry(entry.name.clone()).or_default().refused_config = None;
                self.publish(&entry.name, EntryState::Failed(reason.clone()));
                EntryChange::Refused { reason, kept_serving: false }
            }
        })
    }

    /// Publishes `provider` for `entry` with the config it was bound to.
    fn serve(&self, entry: &EntryConfig, provider: PluginProvider, existed: bool) {
        self.store_config(entry);
        let revision = provider.revision();
        let mut state = self.lock();
        let history = state.entries.entry(entry.name.clone()).or_default();
        history.refused_config = None;
        // Bound to the config before: bringing it back would serve that.
        history.previous = None;
        history.activated_at = Some(SystemTime::now());
        self.publish(&entry.name, EntryState::Ready(Arc::new(provider)));
        tracing::info!(
            entry = %entry.name,
            plugin = %revision.info.name,
            version = %revision.info.version,
            digest = %revision.digest,
            "{}",
            if existed { "provider entry serves its new config" } else { "provider entry added" }
        );
    }

    fn store_config(&self, entry: &EntryConfig) {
        let mut configs = BTreeMap::clone(&self.configs.load());
        configs.insert(entry.name.clone(), entry.clone());
        self.configs.store(Arc::new(configs));
    }

    pub(super) fn remove_entry(&self, name: &str) {
        let mut configs = BTreeMap::clone(&self.configs.load());
        configs.remove(name);
        self.configs.store(Arc::new(configs));
        let mut state = self.lock();
        state.entries.remove(name);
        let mut entries = BTreeMap::clone(&self.entries.load());
        entries.remove(name);
        self.entries.store(Arc::new(entries));
        tracing::info!(
            entry = %name,
            "provider entry removed; its Proxies are unavailable until an entry of that name \
             comes back, and their instances are left as they are"
        );
    }

    /// The entry's config is the one it serves again: an edit refused
    /// before is no longer asked for.
    pub(super) fn withdraw_refused(&self, name: &str) {
        let mut state = self.lock();
        if let Some(history) = state.entries.get_mut(name)
            && history.refused_config.take().is_some()
        {
            tracing::info!(entry = %name, "the refused config edit was withdrawn");
        }
    }

    /// Lets go of compiled plugins that no entry names any more; their
    /// revisions are dropped once their last call ends.
    pub(super) fn forget_unused_plugins(&self) {
        let configs = self.configs.load_full();
        let mut state = self.lock();
        for (name, load) in state.plugins.iter_mut() {
            if matches!(load, PluginLoad::Loaded(_))
                && !configs.values().any(|entry| &entry.plugin == name)
            {
                *load = PluginLoad::Unused;
            }
        }
    }

    /// The revision of the plugin `entry` names: the one loaded, or the
    /// directory's file compiled now when no entry named it before.
    async fn revision_for(&self, entry: &EntryConfig) -> Result<Arc<PluginRevision>, String> {
        let plugin = &entry.plugin;
        match self.lock().plugins.get(plugin) {
            Some(PluginLoad::Loaded(revision)) => return Ok(Arc::clone(revision)),
            Some(PluginLoad::Failed(reason)) => {
                return Err(format!("plugin {plugin:?} {}", Refusal::Load(reason.clone())));
            }
            Some(PluginLoad::Unused) | None => {}
        }
        if is_oci_name(plugin) {
            return Err(format!(
                "plugin {plugin:?}: registry references are pulled when the operator starts, \
                 and no entry named this one then; restart the operator to serve it"
            ));
        }
        let path = self.plugin_dir.join(format!("{plugin}.wasm"));
        let read = tokio::task::spawn_blocking({
            let path = path.clone();
            move || std::fs::read(path)
        })
        .await
        .map_err(|err| err.to_string())
        .and_then(|read| {
            read.map_err(|err| match err.kind() {
                std::io::ErrorKind::NotFound => missing_plugin(plugin, &self.plugin_dir),
                _ => format!("plugin {plugin:?}: cannot read {}: {err}", path.display()),
            })
        });
        let bytes = read?;
        let file = PluginFile { digest: file_digest(&bytes), bytes, path };
        match self.compile(plugin, file).await {
            PluginLoad::Loaded(revision) => Ok(revision),
            PluginLoad::Failed(reason) => {
                Err(format!("plugin {plugin:?} {}", Refusal::Load(reason)))
            }
            // `compile` answers loaded or failed.
            PluginLoad::Unused => Err(format!("plugin {plugin:?} was not compiled")),
        }
    }
}
