//! The provider entries of an installation and the plugins serving them.
//!
//! Loading is per file and per entry: a plugin that fails to load, or an
//! entry whose config its plugin refuses, is recorded with the reason and
//! the rest keep working.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use proxyfleet_core::kv::KvStore;
use proxyfleet_core::{Provider, ProviderError};

use crate::config::ProvidersConfig;
use crate::engine::Runtime;
use crate::error::RuntimeError;
use crate::plugin::PluginRevision;
use crate::provider::PluginProvider;

/// What became of one plugin file.
#[derive(Debug, Clone)]
pub enum PluginLoad {
    /// Loaded.
    Loaded(Arc<PluginRevision>),
    /// Refused, with the reason.
    Failed(String),
}

/// What became of one provider entry.
#[derive(Debug, Clone)]
pub enum EntryState {
    /// Serving calls.
    Ready(Arc<PluginProvider>),
    /// Not serving, with the reason.
    Failed(String),
}

/// Every entry of a providers file, each bound to its plugin or failed.
#[derive(Debug)]
pub struct Registry {
    plugin_dir: PathBuf,
    plugins: BTreeMap<String, PluginLoad>,
    entries: BTreeMap<String, EntryState>,
    /// The plugin each entry names, loaded or not.
    entry_plugins: BTreeMap<String, String>,
}

impl Registry {
    /// Loads every `*.wasm` in `plugin_dir` and binds every entry of
    /// `config` to the plugin it names. Only an unreadable plugin directory
    /// is fatal.
    pub async fn load(
        runtime: &Runtime,
        config: &ProvidersConfig,
        plugin_dir: &Path,
        kv: Arc<dyn KvStore>,
    ) -> Result<Self, RuntimeError> {
        let mut plugins = BTreeMap::new();
        for (name, path) in plugin_files(plugin_dir)? {
            let load = match runtime.load_plugin(&path).await {
                Ok(revision) => PluginLoad::Loaded(revision),
                Err(err) => {
                    tracing::error!(plugin = %name, "{err}");
                    PluginLoad::Failed(err.to_string())
                }
            };
            plugins.insert(name, load);
        }
        let mut entries = BTreeMap::new();
        for entry in &config.entries {
            let state = match plugins.get(&entry.plugin) {
                None => EntryState::Failed(format!(
                    "plugin {:?} not found: no {}.wasm in {}",
                    entry.plugin,
                    entry.plugin,
                    plugin_dir.display()
                )),
                Some(PluginLoad::Failed(reason)) => EntryState::Failed(format!(
                    "plugin {:?} failed to load: {reason}",
                    entry.plugin
                )),
                Some(PluginLoad::Loaded(revision)) => {
                    match PluginProvider::new(
                        runtime,
                        entry.clone(),
                        Arc::clone(revision),
                        Arc::clone(&kv),
                    )
                    .await
                    {
                        Ok(provider) => EntryState::Ready(Arc::new(provider)),
                        Err(err) => EntryState::Failed(format!(
                            "plugin {:?} refused the entry's config: {err}",
                            entry.plugin
                        )),
                    }
                }
            };
            if let EntryState::Failed(reason) = &state {
                tracing::error!(entry = %entry.name, "provider entry unavailable: {reason}");
            }
            entries.insert(entry.name.clone(), state);
        }
        let entry_plugins =
            config.entries.iter().map(|e| (e.name.clone(), e.plugin.clone())).collect();
        Ok(Self { plugin_dir: plugin_dir.to_owned(), plugins, entries, entry_plugins })
    }

    /// The provider serving `entry`, or why there is none.
    pub fn provider(&self, entry: &str) -> Result<Arc<dyn Provider>, ProviderError> {
        match self.entries.get(entry) {
            Some(EntryState::Ready(provider)) => Ok(Arc::clone(provider) as Arc<dyn Provider>),
            Some(EntryState::Failed(reason)) => {
                Err(ProviderError::unavailable(format!("provider entry {entry:?}: {reason}")))
            }
            None => Err(ProviderError::unavailable(format!(
                "no provider entry named {entry:?}; entries are [{}]",
                self.entries.keys().cloned().collect::<Vec<_>>().join(", ")
            ))),
        }
    }

    /// Every entry and its state, by name.
    pub fn entries(&self) -> &BTreeMap<String, EntryState> {
        &self.entries
    }

    /// The plugin the providers file names for `entry`, loaded or not.
    pub fn plugin_of(&self, entry: &str) -> Option<&str> {
        self.entry_plugins.get(entry).map(String::as_str)
    }

    /// Every plugin file and what became of it, by name.
    pub fn plugins(&self) -> &BTreeMap<String, PluginLoad> {
        &self.plugins
    }

    /// The directory plugins were loaded from.
    pub fn plugin_dir(&self) -> &Path {
        &self.plugin_dir
    }
}

/// `*.wasm` files directly in `dir`, by file stem.
fn plugin_files(dir: &Path) -> Result<BTreeMap<String, PathBuf>, RuntimeError> {
    let read_err = |source| RuntimeError::PluginDir { path: dir.to_owned(), source };
    let mut files = BTreeMap::new();
    for item in std::fs::read_dir(dir).map_err(read_err)? {
        let path = item.map_err(read_err)?.path();
        if path.extension().is_some_and(|ext| ext == "wasm")
            && path.is_file()
            && let Some(stem) = path.file_stem().and_then(|s| s.to_str())
        {
            files.insert(stem.to_owned(), path);
        }
    }
    Ok(files)
}
