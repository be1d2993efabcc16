//! The provider entries of an installation and the plugins serving them.
//!
//! Loading is per file and per entry: a plugin that fails to load, or an
//! entry whose config its plugin refuses, is recorded with the reason and
//! the rest keep working. [`Registry::open`] answers at once with every
//! entry `loading`, for a host that serves its API and probes while cold
//! plugin compiles run; [`Registry::load_pending`] then makes each entry
//! ready or failed as soon as its plugin is compiled and bound.
//!
//! Plugin files may change while the host runs. [`Registry::rescan`] (run
//! by [`crate::watch`] on every change of the plugin directory and
//! periodically) hashes every file; a file whose content changed is a
//! candidate revision, which each entry naming the plugin activates only
//! once it passes [`crate::admission`]. A refused candidate is recorded
//! with its reason and the active revision keeps serving. Each entry keeps
//! its active revision and the one before, for [`Registry::rollback`] and
//! for a file that is removed again; older ones are dropped when their last
//! call ends.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::SystemTime;

use arc_swap::ArcSwap;
use futures::StreamExt as _;

use proxyfleet_core::installation::InstallationId;
use proxyfleet_core::kv::KvStore;
use proxyfleet_core::{Provider, ProviderError};
use proxyfleet_oci::PluginReference;

use crate::admission::{Refusal, check_pin_and_grants, refused_by_digest_pins};
use crate::config::{EntryConfig, ProvidersConfig};
use crate::engine::Runtime;
use crate::error::{LoadError, RuntimeError};
use crate::oci::{OciPlugins, PollError, StoredBuilds};
use crate::plugin::{PluginFile, PluginRevision, file_digest};
use crate::provider::{Bound, PluginProvider};
use crate::revisions::{EntryRevisions, RejectedCandidate, RevisionSummary, unix_seconds};
use proxyfleet_core::source::{RollbackError, STILL_LOADING, no_such_entry};

mod reconfigure;
mod resources;
pub use reconfigure::EntryChange;

/// Refused candidates listed per entry; older ones are only counted.
const MAX_REJECTED: usize = 8;

/// What became of one plugin file.
#[derive(Debug, Clone)]
pub enum PluginLoad {
    /// Loaded.
    Loaded(Arc<PluginRevision>),
    /// Refused, with the reason.
    Failed(String),
    /// Read and hashed but not compiled: no entry names it.
    Unused,
}

/// What became of one provider entry.
#[derive(Debug, Clone)]
pub enum EntryState {
    /// Its plugin is being read and compiled; not serving yet.
    Loading,
    /// Serving calls.
    Ready(Arc<PluginProvider>),
    /// Not serving, with the reason.
    Failed(String),
}

impl EntryState {
    /// The state as a `ProviderSource` shows it: the provider behind the
    /// core trait.
    pub fn as_source(&self) -> proxyfleet_core::source::EntryState {
        use proxyfleet_core::source::EntryState as Shown;
        match self {
            Self::Loading => Shown::Loading,
            Self::Ready(provider) => Shown::Ready(Arc::clone(provider) as Arc<dyn Provider>),
            Self::Failed(reason) => Shown::Failed(reason.clone()),
        }
    }
}

/// The plugin files [`Registry::open`] read, for
/// [`Registry::load_pending`] to compile.
pub struct PendingLoad {
    files: PluginFiles,
    /// `oci://` references with no build in the store yet: pulled first.
    cold: Vec<PluginReference>,
    /// Builds pulled after the one their entries served when the process
    /// last ran (which is in `files`): offered once that one serves.
    newer: Vec<(String, PluginFile)>,
}

impl std::fmt::Debug for PendingLoad {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingLoad")
            .field("files", &self.files.keys())
            .field("cold", &self.cold)
            .field("newer", &self.newer.iter().map(|(name, _)| name).collect::<Vec<_>>())
            .finish()
    }
}

/// Every entry of a providers file, each bound to its plugin or failed.
pub struct Registry {
    runtime: Runtime,
    plugin_dir: PathBuf,
    /// The builds of entries that name an `oci://` reference.
    oci: Option<OciPlugins>,
    kv: Arc<dyn KvStore>,
    /// Each entry's config: the one it serves, or, for an entry that
    /// serves nothing, the one it was last given. Swapped whole by
    /// [`Registry::reconfigure`] (under the scan lock).
    configs: ArcSwap<BTreeMap<String, EntryConfig>>,
    /// The entries and their states, swapped whole on each change (under
    /// the revision lock), read without a lock.
    entries: ArcSwap<BTreeMap<String, EntryState>>,
    revisions: Mutex<RevisionState>,
    /// One rescan at a time: each decides against what the last one saw.
    scanning: tokio::sync::Mutex<()>,
    /// True once no entry is loading any more.
    loaded: tokio::sync::watch::Sender<bool>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("plugin_dir", &self.plugin_dir)
            .field("entries", &*self.entries.load())
            .finish_non_exhaustive()
    }
}

/// What rescans compare against and what [`Registry::revisions`] shows.
#[derive(Default)]
struct RevisionState {
    /// Every plugin file and what became of it, by file stem.
    plugins: BTreeMap<String, PluginLoad>,
    /// The digest each file had when last read, by file stem; a file that
    /// could not be read is absent, so the next rescan tries again.
    files: BTreeMap<String, String>,
    /// Revisions still alive somewhere (active, previous, in a call), by
    /// digest: a file that comes back reuses its revision without compiling.
    by_digest: HashMap<String, Weak<PluginRevision>>,
    entries: BTreeMap<String, EntryHistory>,
    /// The builds (hex digests) the plugin store was last told to keep
    /// for each `oci://` reference, because entries serve them.
    kept: BTreeMap<String, Vec<String>>,
    /// The entries a resource declared (`resources.rs`), which the
    /// providers file neither removes nor takes over.
    resources: std::collections::BTreeSet<String>,
    /// The providers file's entries as it last stated them, parsed and as
    /// written, by name (`resources.rs` tells a resource showing one).
    file: BTreeMap<String, (EntryConfig, serde_json::Value)>,
}

#[derive(Default)]
struct EntryHistory {
    /// The revision served before the active one, with its lookup table,
    /// so that going back needs no call.
    previous: Option<Arc<Bound>>,
    activated_at: Option<SystemTime>,
    rejected: VecDeque<RejectedCandidate>,
    swaps: u64,
    rejections: u64,
    /// The last config [`Registry::reconfigure`] was given for this entry
    /// and could not serve, with why, while the entry serves the one
    /// before; cleared when a config is taken.
    refused_config: Option<(EntryConfig, String)>,
}

/// What a candidate file turned into.
enum Candidate {
    Loaded(Arc<PluginRevision>),
    Failed { digest: String, reason: String, contract_version: Option<String> },
}

impl Candidate {
    fn digest(&self) -> &str {
        match self {
            Self::Loaded(revision) => &revision.digest,
            Self::Failed { digest, .. } => digest,
        }
    }
}

impl Registry {
    /// The installation the entries' plugins mark their instances with;
    /// orphan collection takes only instances marked with it.
    pub fn installation(&self) -> &InstallationId {
        self.runtime.installation()
    }

    /// Loads every `*.wasm` in `plugin_dir` and binds every entry of
    /// `config` to the plugin it names. Only an unreadable plugin directory
    /// is fatal.
    pub async fn load(
        runtime: &Runtime,
        config: &ProvidersConfig,
        plugin_dir: &Path,
        kv: Arc<dyn KvStore>,
    ) -> Result<Self, RuntimeError> {
        let (registry, pending) = Self::open(runtime, config, plugin_dir, kv).await?;
        registry.load_pending(pending).await;
        Ok(registry)
    }

    /// Reads every `*.wasm` in `plugin_dir` and answers a registry whose
    /// entries are all loading, with what [`Registry::load_pending`]
    /// compiles. Only an unreadable plugin directory is fatal.
    pub async fn open(
        runtime: &Runtime,
        config: &ProvidersConfig,
        plugin_dir: &Path,
        kv: Arc<dyn KvStore>,
    ) -> Result<(Self, PendingLoad), RuntimeError> {
        let oci = OciPlugins::new(runtime, config)?;
        let stored = oci.as_ref().map(OciPlugins::stored);
        let mut files =
            read_sources_blocking(plugin_dir.to_owned(), stored, BTreeMap::new()).await?;
        let mut newer = Vec::new();
        if let Some(oci) = &oci {
            let stored = oci.stored();
            let start =
                tokio::task::spawn_blocking(move || stored.at_start()).await.unwrap_or_default();
            oci.set_stored_manifests(&start.manifests);
            for (name, serving) in start.serving {
                if let Some(Ok(current)) = files.insert(name.clone(), Ok(serving)) {
                    newer.push((name, current));
                }
            }
        }
        let cold = oci
            .iter()
            .flat_map(OciPlugins::references)
            .filter(|reference| !files.contains_key(reference.as_str()))
            .cloned()
            .collect();
        let entries =
            config.entries.iter().map(|e| (e.name.clone(), EntryState::Loading)).collect();
        let registry = Self {
            runtime: runtime.clone(),
            plugin_dir: plugin_dir.to_owned(),
            oci,
            kv,
            configs: ArcSwap::from_pointee(
                config.entries.iter().map(|e| (e.name.clone(), e.clone())).collect(),
            ),
            entries: ArcSwap::from_pointee(entries),
            revisions: Mutex::new(RevisionState {
                file: file_entries(config),
                ..RevisionState::default()
            }),
            scanning: tokio::sync::Mutex::new(()),
            loaded: tokio::sync::watch::Sender::new(config.entries.is_empty()),
        };
        Ok((registry, PendingLoad { files, cold, newer }))
    }

    /// Compiles the files [`Registry::open`] read that entries name (one
    /// compilation at a time, each on every core), then pulls the
    /// references the store does not hold, and makes each entry ready (or
    /// failed, with the reason) as soon as its plugin is compiled and
    /// bound. Rescans wait until it is done.
    pub async fn load_pending(&self, pending: PendingLoad) {
        let _one_at_a_time = self.scanning.lock().await;
        // Plugins load side by side: an entry waits for its own plugin,
        // not for every one before it. A build under a second name (two
        // equal files, a file and a pulled reference) waits for the first
        // to compile and takes its revision.
        let mut seen = std::collections::HashSet::new();
        let (firsts, repeats): (Vec<_>, Vec<_>) =
            pending.files.into_iter().partition(|(_, file)| match file {
                Ok(file) => seen.insert(file.digest.clone()),
                Err(_) => true,
            });
        for batch in [firsts, repeats] {
            futures::stream::iter(batch)
                .for_each_concurrent(load_concurrency(), |(name, file)| async move {
                    self.load_first(&name, file).await;
                })
                .await;
        }
        // A build refused while the process last ran is refused again, and
        // listed; one taken by some entries is taken again.
        for (name, file) in pending.newer {
            self.file_changed(&name, file).await;
        }
        if let Some(oci) = &self.oci {
            futures::stream::iter(pending.cold)
                .for_each_concurrent(load_concurrency(), |reference| async move {
                    let file = match oci.pull_cold(&reference).await {
                        Ok(file) => Ok(file),
                        Err(PollError::Refused { manifest_digest, source }) => {
                            self.reject_pulled(&reference, &manifest_digest, &source.to_string());
                            Err(LoadError::Pull { source })
                        }
                        Err(PollError::Registry(source)) => Err(LoadError::Pull { source }),
                    };
                    self.load_first(reference.as_str(), file).await;
                })
                .await;
        }
        for entry in self.configs.load_full().values() {
            if matches!(self.entries.load().get(&entry.name), Some(EntryState::Loading)) {
                let missing = missing_plugin(&entry.plugin, &self.plugin_dir);
                self.settle(entry, EntryState::Failed(missing));
            }
        }
        self.keep_serving().await;
        self.loaded.send_replace(true);
    }

    /// Compiles one plugin read at load and settles the entries naming it.
    async fn load_first(&self, name: &str, file: Result<PluginFile, LoadError>) {
        let configs = self.configs.load_full();
        let using: Vec<&EntryConfig> =
            configs.values().filter(|entry| entry.plugin == name).collect();
        if using.is_empty() {
            match file {
                Ok(file) => self.not_used(name, Some(file.digest)),
                Err(err) => {
                    self.lock()
                        .plugins
                        .insert(name.to_owned(), PluginLoad::Failed(err.to_string()));
                }
            }
            return;
        }
        let mut refused_by_pin = BTreeMap::new();
        let load = match file {
            Ok(file) => match refused_by_digest_pins(using.iter().copied(), &file.digest) {
                Some(refusals) => {
                    for (entry, refusal) in refusals {
                        refused_by_pin.insert(entry.name.clone(), refusal);
                    }
                    self.lock().files.insert(name.to_owned(), file.digest.clone());
                    PluginLoad::Failed(not_compiled(&file.digest))
                }
                None => self.compile(name, file).await,
            },
            Err(err) => {
                tracing::error!(plugin = %name, "{err}");
                PluginLoad::Failed(err.to_string())
            }
        };
        self.lock().plugins.insert(name.to_owned(), load.clone());
        for entry in using {
            let settled = match (refused_by_pin.get(&entry.name), &load) {
                (Some(refusal), _) => {
                    EntryState::Failed(format!("plugin {:?} {refusal}", entry.plugin))
                }
                // Only a file no entry names is left uncompiled.
                (None, PluginLoad::Unused) => {
                    EntryState::Failed(format!("plugin {:?} was not compiled", entry.plugin))
                }
                (None, PluginLoad::Failed(reason)) => EntryState::Failed(format!(
                    "plugin {:?} {}",
                    entry.plugin,
                    Refusal::Load(reason.clone())
                )),
                (None, PluginLoad::Loaded(revision)) => {
                    match bind(&self.runtime, entry, revision, Arc::clone(&self.kv)).await {
                        Ok(provider) => EntryState::Ready(Arc::new(provider)),
                        Err(refusal) => {
                            EntryState::Failed(format!("plugin {:?} {refusal}", entry.plugin))
                        }
                    }
                }
            };
            self.settle(entry, settled);
        }
    }

    /// Compiles `file` as plugin `name`'s content (the same build under
    /// two names, a file and a pulled reference, is compiled once) and
    /// records it: its digest for rescans, its revision by digest, and
    /// what became of it.
    async fn compile(&self, name: &str, file: PluginFile) -> PluginLoad {
        let digest = file.digest.clone();
        let known = self.lock().by_digest.get(&digest).and_then(Weak::upgrade);
        let loaded = match known {
            Some(revision) => Ok(revision),
            None => self.runtime.load_plugin_bytes(&file.path, file.bytes, file.digest).await,
        };
        let mut state = self.lock();
        state.files.insert(name.to_owned(), digest.clone());
        let load = match loaded {
            Ok(revision) => {
                state.by_digest.insert(digest, Arc::downgrade(&revision));
                PluginLoad::Loaded(revision)
            }
            Err(err) => {
                tracing::error!(plugin = %name, "{err}");
                PluginLoad::Failed(err.to_string())
            }
        };
        state.plugins.insert(name.to_owned(), load.clone());
        load
    }

    /// Publishes the first state of a loading entry.
    fn settle(&self, entry: &EntryConfig, settled: EntryState) {
        let mut state = self.lock();
        let history = state.entries.entry(entry.name.clone()).or_default();
        match &settled {
            EntryState::Failed(reason) => {
                tracing::error!(entry = %entry.name, "provider entry unavailable: {reason}");
            }
            EntryState::Ready(provider) => {
                history.activated_at = Some(SystemTime::now());
                let revision = provider.revision();
                tracing::info!(
                    entry = %entry.name,
                    plugin = %revision.info.name,
                    version = %revision.info.version,
                    digest = %revision.digest,
                    "provider entry available"
                );
            }
            EntryState::Loading => {}
        }
        self.publish(&entry.name, settled);
    }

    /// Publishes a new map with `entry` in `state`. Callers hold the
    /// revision lock, so two changes never race.
    fn publish(&self, entry: &str, state: EntryState) {
        let mut next = BTreeMap::clone(&self.entries.load());
        next.insert(entry.to_owned(), state);
        self.entries.store(Arc::new(next));
    }

    /// Waits until no entry is loading any more.
    pub async fn wait_loaded(&self) {
        let mut loaded = self.loaded.subscribe();
        // The sender lives as long as the registry, which outlives this.
        let _ = loaded.wait_for(|loaded| *loaded).await;
    }

    /// The provider serving `entry`, or why there is none.
    pub fn provider(&self, entry: &str) -> Result<Arc<dyn Provider>, ProviderError> {
        let entries = self.entries.load();
        match entries.get(entry) {
            Some(state) => state.as_source().serving(entry),
            None => Err(no_such_entry(entry, entries.keys().map(String::as_str))),
        }
    }

    /// Every entry and its state, by name, as they are now: a later change
    /// publishes a new map and leaves this one as it is. An entry that
    /// failed at load shows as ready once a file it accepts lands; a ready
    /// entry's revision is its provider's ([`PluginProvider::revision`]).
    pub fn entries(&self) -> Arc<BTreeMap<String, EntryState>> {
        self.entries.load_full()
    }

    /// The plugin the providers file names for `entry`, loaded or not.
    pub fn plugin_of(&self, entry: &str) -> Option<String> {
        self.configs.load().get(entry).map(|config| config.plugin.clone())
    }

    /// `entry`'s `limits.concurrency`, from the config it serves (or was
    /// given): asked on every dispatch, so nothing is cloned.
    pub fn concurrency_of(&self, entry: &str) -> Option<usize> {
        self.configs.load().get(entry).map(|config| config.limits.concurrency)
    }

    /// Every plugin file and what became of its current content, by name.
    pub fn plugins(&self) -> BTreeMap<String, PluginLoad> {
        self.lock().plugins.clone()
    }

    /// The directory plugins were loaded from.
    pub fn plugin_dir(&self) -> &Path {
        &self.plugin_dir
    }

    /// The `oci://` references the entries name, once each.
    pub fn oci_references(&self) -> &[PluginReference] {
        self.oci.as_ref().map_or(&[], OciPlugins::references)
    }

    /// Asks `reference`'s registry what it names now and pulls a build the
    /// store does not hold; true when the store moved, which the next
    /// [`Registry::rescan`] offers to the entries. See [`crate::follow`].
    pub async fn poll_reference(&self, reference: &PluginReference) -> Result<bool, PollError> {
        match &self.oci {
            Some(oci) => oci.poll(reference).await,
            None => Ok(false),
        }
    }

    /// Records, for every entry naming `reference`, a build the poll
    /// refused before it was read (its layout, size or digests), as a
    /// refused candidate: listed, counted and reported as a refused file
    /// is. The candidate's digest is its manifest's.
    pub fn reject_pulled(&self, reference: &PluginReference, manifest_digest: &str, reason: &str) {
        let candidate = Candidate::Failed {
            digest: manifest_digest.trim_start_matches("sha256:").to_owned(),
            reason: reason.to_owned(),
            contract_version: None,
        };
        let configs = self.configs.load_full();
        for entry in configs.values().filter(|entry| entry.plugin == reference.as_str()) {
            self.reject(entry, &candidate, &Refusal::Load(reason.to_owned()));
        }
    }

    /// Per entry, in name order: the active and previous revisions and the
    /// refused candidates.
    pub fn revisions(&self) -> Vec<EntryRevisions> {
        let state = self.lock();
        let configs = self.configs.load_full();
        configs.keys().filter_map(|entry| self.revisions_locked(&state, entry)).collect()
    }

    /// [`Registry::revisions`] of one entry.
    pub fn revisions_of(&self, entry: &str) -> Option<EntryRevisions> {
        self.revisions_locked(&self.lock(), entry)
    }

    fn revisions_locked(&self, state: &RevisionState, entry: &str) -> Option<EntryRevisions> {
        let configs = self.configs.load_full();
        let config = configs.get(entry)?;
        let loading = EntryHistory::default();
        let history = state.entries.get(entry).unwrap_or(&loading);
        let (active, unavailable, config_schema) = match self.entries.load().get(entry)? {
            EntryState::Ready(provider) => {
                let revision = provider.revision();
                let schema = revision.info.config_schema.clone();
                (Some(RevisionSummary::from(revision.as_ref())), None, Some(schema))
            }
            EntryState::Loading => (None, Some(STILL_LOADING.to_owned()), None),
            EntryState::Failed(reason) => (None, Some(reason.clone()), None),
        };
        Some(EntryRevisions {
            entry: entry.to_owned(),
            plugin: config.plugin.clone(),
            pin: config.pin.clone(),
            activated_at: active.as_ref().and(history.activated_at).map(unix_seconds),
            active,
            previous: history
                .previous
                .as_ref()
                .map(|bound| RevisionSummary::from(&**bound.revision())),
            rejected: history.rejected.iter().cloned().collect(),
            unavailable,
            swaps: history.swaps,
            rejections: history.rejections,
            config_refused: history.refused_config.as_ref().map(|(_, reason)| reason.clone()),
            pull: self.oci.as_ref().and_then(|oci| oci.status(&config.plugin)),
            grants: crate::grant_summary::grant_summaries(config),
            config_schema,
        })
    }

    /// Makes `entry`'s previous revision serve again, at once (it is still
    /// compiled); the revision it replaces becomes the previous one, so a
    /// second rollback undoes the first. Calls in flight finish on the
    /// revision they started on. The plugin file is left alone: the entry
    /// stays on this revision until the file changes again.
    pub fn rollback(&self, entry: &str) -> Result<RevisionSummary, RollbackError> {
        let provider = match self.entries.load().get(entry) {
            None => return Err(RollbackError::UnknownEntry { entry: entry.to_owned() }),
            Some(EntryState::Failed(reason)) => {
                return Err(RollbackError::Unavailable {
                    entry: entry.to_owned(),
                    reason: reason.clone(),
                });
            }
            Some(EntryState::Loading) => {
                return Err(RollbackError::Unavailable {
                    entry: entry.to_owned(),
                    reason: STILL_LOADING.to_owned(),
                });
            }
            Some(EntryState::Ready(provider)) => Arc::clone(provider),
        };
        let mut state = self.lock();
        let history = state.entries.entry(entry.to_owned()).or_default();
        let Some(previous) = history.previous.take() else {
            return Err(RollbackError::NoPrevious { entry: entry.to_owned() });
        };
        let summary = RevisionSummary::from(previous.revision().as_ref());
        activate(
            entry,
            &provider,
            history,
            previous,
            "rolled back to the previous plugin revision",
        );
        Ok(summary)
    }

    /// Reads every plugin file and acts on those whose content changed
    /// since the last look: a changed file is offered to every entry naming
    /// it, a removed one takes those entries it served back to their
    /// previous revision. An unreadable directory changes nothing.
    pub async fn rescan(&self) {
        let _one_at_a_time = self.scanning.lock().await;
        let known = self.lock().files.clone();
        let stored = self.oci.as_ref().map(OciPlugins::stored);
        let files =
            match read_sources_blocking(self.plugin_dir.clone(), stored, known.clone()).await {
                Ok(files) => files,
                Err(err) => {
                    tracing::warn!("plugin rescan skipped: {err}");
                    return;
                }
            };
        // A pulled build is read only when its digest moved, so an absent
        // `oci://` name means unchanged, never removed.
        let removed: Vec<(String, String)> = known
            .iter()
            .filter(|(name, _)| !files.contains_key(*name) && !is_oci_name(name))
            .map(|(name, digest)| (name.clone(), digest.clone()))
            .collect();
        let mut changed = Vec::new();
        for (name, file) in files {
            match file {
                Ok(file) if known.get(&name) != Some(&file.digest) => changed.push((name, file)),
                Ok(_) => {}
                // Left as it was; the next rescan reads it again.
                Err(err) => tracing::warn!(plugin = %name, "{err}"),
            }
        }
        for (name, file) in changed {
            self.file_changed(&name, file).await;
        }
        for (name, digest) in removed {
            self.file_removed(&name, &digest);
        }
        self.keep_serving().await;
    }

    /// Tells the plugin store which build of each `oci://` reference its
    /// entries serve (after a load, a swap or a rollback), so that a newer
    /// pull does not remove it and the next start serves it again. A
    /// reference none of whose entries serves keeps what it kept.
    async fn keep_serving(&self) {
        let Some(oci) = &self.oci else { return };
        for reference in oci.references() {
            let entries = self.entries.load();
            let mut serving: Vec<String> = self
                .configs
                .load_full()
                .values()
                .filter(|entry| entry.plugin == reference.as_str())
                .filter_map(|entry| match entries.get(&entry.name) {
                    Some(EntryState::Ready(provider)) => Some(provider.revision().digest.clone()),
                    _ => None,
                })
                .collect();
            serving.sort();
            serving.dedup();
            if serving.is_empty() || self.lock().kept.get(reference.as_str()) == Some(&serving) {
                continue;
            }
            match oci.keep(reference, serving.clone()).await {
                Ok(()) => {
                    self.lock().kept.insert(reference.to_string(), serving);
                }
                Err(err) => tracing::warn!(
                    plugin = %reference,
                    "cannot keep the serving build in the plugin store; a restart may serve another: {err}"
                ),
            }
        }
    }

    /// Records a plugin file no entry names: hashed, so a rescan sees it
    /// as unchanged, but never compiled.
    fn not_used(&self, name: &str, digest: Option<String>) {
        tracing::debug!(plugin = %name, "no entry names this plugin file: not compiled");
        let mut state = self.lock();
        if let Some(digest) = digest {
            state.files.insert(name.to_owned(), digest);
        }
        state.plugins.insert(name.to_owned(), PluginLoad::Unused);
    }

    async fn file_changed(&self, name: &str, file: PluginFile) {
        let configs = self.configs.load_full();
        if !configs.values().any(|entry| entry.plugin == name) {
            return self.not_used(name, Some(file.digest));
        }
        let using = configs.values().filter(|entry| entry.plugin == name);
        if let Some(refusals) = refused_by_digest_pins(using, &file.digest) {
            let reason = not_compiled(&file.digest);
            {
                let mut state = self.lock();
                state.files.insert(name.to_owned(), file.digest.clone());
                state.plugins.insert(name.to_owned(), PluginLoad::Failed(reason.clone()));
            }
            let candidate =
                Candidate::Failed { digest: file.digest.clone(), reason, contract_version: None };
            for (entry, refusal) in refusals {
                self.reject(entry, &candidate, &refusal);
            }
            return;
        }
        let known = self.lock().by_digest.get(&file.digest).and_then(Weak::upgrade);
        let candidate = match known {
            Some(revision) => Candidate::Loaded(revision),
            None => {
                let digest = file.digest.clone();
                match self.runtime.load_plugin_bytes(&file.path, file.bytes, file.digest).await {
                    Ok(revision) => Candidate::Loaded(revision),
                    Err(err) => Candidate::Failed {
                        digest,
                        contract_version: refused_contract_version(&err),
                        reason: err.to_string(),
                    },
                }
            }
        };
        {
            let mut state = self.lock();
            state.files.insert(name.to_owned(), candidate.digest().to_owned());
            let load = match &candidate {
                Candidate::Loaded(revision) => {
                    state.by_digest.insert(revision.digest.clone(), Arc::downgrade(revision));
                    PluginLoad::Loaded(Arc::clone(revision))
                }
                Candidate::Failed { reason, .. } => PluginLoad::Failed(reason.clone()),
            };
            state.plugins.insert(name.to_owned(), load);
            state.by_digest.retain(|_, revision| revision.strong_count() > 0);
        }
        let using: Vec<&EntryConfig> =
            configs.values().filter(|entry| entry.plugin == name).collect();
        for entry in using {
            self.offer(entry, &candidate).await;
        }
    }

    /// Runs the admission checks of `candidate` for `entry` and activates
    /// it, or records why not.
    async fn offer(&self, entry: &EntryConfig, candidate: &Candidate) {
        let revision = match candidate {
            Candidate::Loaded(revision) => Arc::clone(revision),
            Candidate::Failed { reason, .. } => {
                return self.reject(entry, candidate, &Refusal::Load(reason.clone()));
            }
        };
        match self.entries.load().get(&entry.name) {
            Some(EntryState::Ready(provider)) => {
                if provider.revision().digest == revision.digest {
                    tracing::debug!(entry = %entry.name, digest = %revision.digest, "plugin file matches the active revision");
                    return;
                }
                let checked = match check_pin_and_grants(entry, &revision) {
                    Ok(()) => provider
                        .validate_config_with(Arc::clone(&revision))
                        .await
                        .map_err(|err| Refusal::Config(err.to_string())),
                    Err(refusal) => Err(refusal),
                };
                match checked {
                    Ok(bound) => {
                        let mut state = self.lock();
                        let history = state.entries.entry(entry.name.clone()).or_default();
                        activate(
                            &entry.name,
                            provider,
                            history,
                            Arc::new(bound),
                            "activated a new plugin revision",
                        );
                    }
                    Err(refusal) => self.reject(entry, candidate, &refusal),
                }
            }
            Some(EntryState::Failed(_) | EntryState::Loading) => {
                match bind(&self.runtime, entry, &revision, Arc::clone(&self.kv)).await {
                    Ok(provider) => self.make_ready(entry, provider),
                    Err(refusal) => self.reject(entry, candidate, &refusal),
                }
            }
            None => {}
        }
    }

    /// Publishes a failed entry as ready.
    fn make_ready(&self, entry: &EntryConfig, provider: PluginProvider) {
        let mut state = self.lock();
        let revision = provider.revision();
        self.publish(&entry.name, EntryState::Ready(Arc::new(provider)));
        let history = state.entries.entry(entry.name.clone()).or_default();
        history.activated_at = Some(SystemTime::now());
        history.swaps += 1;
        tracing::info!(
            entry = %entry.name,
            plugin = %revision.info.name,
            version = %revision.info.version,
            digest = %revision.digest,
            "provider entry available: activated its first plugin revision"
        );
    }

    fn reject(&self, entry: &EntryConfig, candidate: &Candidate, refusal: &Refusal) {
        let reason = format!("plugin {:?} {refusal}", entry.plugin);
        let rejected = match candidate {
            Candidate::Loaded(revision) => RejectedCandidate {
                plugin: Some(revision.info.name.clone()),
                version: Some(revision.info.version.clone()),
                digest: revision.digest.clone(),
                contract_version: Some(revision.info.contract_version.clone()),
                loaded_at: unix_seconds(revision.loaded_at),
                kind: refusal.kind(),
                reason,
            },
            Candidate::Failed { digest, contract_version, .. } => RejectedCandidate {
                plugin: None,
                version: None,
                digest: digest.clone(),
                contract_version: contract_version.clone(),
                loaded_at: unix_seconds(SystemTime::now()),
                kind: refusal.kind(),
                reason,
            },
        };
        tracing::warn!(
            entry = %entry.name,
            plugin = %rejected.plugin.as_deref().unwrap_or(&entry.plugin),
            version = %rejected.version.as_deref().unwrap_or("unknown"),
            digest = %rejected.digest,
            kind = %rejected.kind.as_str(),
            "rejected a plugin candidate; the active revision keeps serving: {}",
            rejected.reason
        );
        let mut state = self.lock();
        let history = state.entries.entry(entry.name.clone()).or_default();
        history.rejections += 1;
        if history.rejected.len() == MAX_REJECTED {
            history.rejected.pop_front();
        }
        history.rejected.push_back(rejected);
    }

    /// A removed file takes the entries it was serving back to their
    /// previous revision; an entry without one keeps serving what it has,
    /// since a missing file never makes an entry unavailable.
    fn file_removed(&self, name: &str, digest: &str) {
        let mut state = self.lock();
        state.files.remove(name);
        state.plugins.remove(name);
        let entries = self.entries.load();
        let configs = self.configs.load_full();
        for entry in configs.values().filter(|entry| entry.plugin == name) {
            let Some(EntryState::Ready(provider)) = entries.get(&entry.name) else {
                continue;
            };
            if provider.revision().digest != digest {
                continue;
            }
            let history = state.entries.entry(entry.name.clone()).or_default();
            match history.previous.take() {
                Some(previous) => activate(
                    &entry.name,
                    provider,
                    history,
                    previous,
                    "plugin file removed: back to the previous revision",
                ),
                None => tracing::warn!(
                    entry = %entry.name,
                    plugin = %name,
                    digest = %digest,
                    "plugin file removed and no previous revision: the entry keeps serving its active one"
                ),
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, RevisionState> {
        self.revisions.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Swaps `revision` in for `entry`; the displaced revision becomes the
/// previous one, and the one before it is dropped once idle.
fn activate(
    entry: &str,
    provider: &PluginProvider,
    history: &mut EntryHistory,
    bound: Arc<Bound>,
    what: &str,
) {
    let revision = Arc::clone(bound.revision());
    let displaced = provider.swap_revision(bound);
    tracing::info!(
        entry = %entry,
        plugin = %revision.info.name,
        version = %revision.info.version,
        digest = %revision.digest,
        previous_version = %displaced.revision().info.version,
        previous_digest = %displaced.revision().digest,
        "{what}"
    );
    history.previous = Some(displaced);
    history.activated_at = Some(SystemTime::now());
    history.swaps += 1;
}

/// Binds an entry to its first revision: pin and grants, then the plugin
/// validates the entry's config.
async fn bind(
    runtime: &Runtime,
    entry: &EntryConfig,
    revision: &Arc<PluginRevision>,
    kv: Arc<dyn KvStore>,
) -> Result<PluginProvider, Refusal> {
    check_pin_and_grants(entry, revision)?;
    crate::capabilities::http::secret::check_refs(
        &entry.grants.http,
        runtime.inner.secrets.as_ref(),
    )
    .await
    .map_err(Refusal::Credential)?;
    PluginProvider::new(runtime, entry.clone(), Arc::clone(revision), kv)
        .await
        .map_err(|err| Refusal::Config(err.to_string()))
}

/// `config`'s entries, parsed and as written, by name; an entry whose
/// written form is unknown is left out (it is not shown as a resource).
fn file_entries(config: &ProvidersConfig) -> BTreeMap<String, (EntryConfig, serde_json::Value)> {
    config
        .entries
        .iter()
        .filter_map(|entry| {
            let written = config.written.get(&entry.name)?;
            Some((entry.name.clone(), (entry.clone(), written.clone())))
        })
        .collect()
}

/// Plugins loaded at once: pulls, checks and the plugins' own `describe`
/// and config validation go side by side; the compilations among them take
/// turns, each on every core (see `RuntimeInner::compiling`).
fn load_concurrency() -> usize {
    std::thread::available_parallelism().map_or(2, usize::from)
}

/// Why an entry whose plugin file is not in the plugin directory serves
/// nothing.
fn missing_plugin(plugin: &str, dir: &Path) -> String {
    format!("plugin {plugin:?} not found: no {plugin}.wasm in {}", dir.display())
}

/// What became of a file that every entry using it refused by digest.
fn not_compiled(digest: &str) -> String {
    format!("not compiled: every entry that uses it pins another digest than sha256:{digest}")
}

/// The contract version a component was refused for exporting, as shown in
/// [`crate::EntryRevisions`].
fn refused_contract_version(err: &LoadError) -> Option<String> {
    match err {
        LoadError::IncompatibleContract { found, .. } => {
            found.rsplit_once('@').map(|(_, version)| version.to_owned())
        }
        _ => None,
    }
}

type PluginFiles = BTreeMap<String, Result<PluginFile, LoadError>>;

/// Reads the plugin directory and, when given, the pulled builds whose
/// digest differs from `known`, off the async threads.
async fn read_sources_blocking(
    dir: PathBuf,
    stored: Option<StoredBuilds>,
    known: BTreeMap<String, String>,
) -> Result<PluginFiles, RuntimeError> {
    let joined = tokio::task::spawn_blocking({
        let dir = dir.clone();
        move || {
            let mut files = read_plugin_dir(&dir)?;
            if let Some(stored) = stored {
                files.extend(stored.read_changed(&known).into_iter().map(|(n, f)| (n, Ok(f))));
            }
            Ok(files)
        }
    })
    .await;
    joined.unwrap_or_else(|err| {
        Err(RuntimeError::PluginDir { path: dir, source: std::io::Error::other(err.to_string()) })
    })
}

/// True for a plugin name that is an `oci://` reference rather than a file.
fn is_oci_name(name: &str) -> bool {
    name.starts_with(proxyfleet_oci::SCHEME)
}

/// Every `*.wasm` directly in `dir` (symbolic links followed, as a mounted
/// ConfigMap has them), by file stem, read whole and hashed.
fn read_plugin_dir(dir: &Path) -> Result<PluginFiles, RuntimeError> {
    let read_err = |source| RuntimeError::PluginDir { path: dir.to_owned(), source };
    let mut files = BTreeMap::new();
    for item in std::fs::read_dir(dir).map_err(read_err)? {
        let path = item.map_err(read_err)?.path();
        if path.extension().is_some_and(|ext| ext == "wasm")
            && path.is_file()
            && let Some(stem) = path.file_stem().and_then(|s| s.to_str())
        {
            let file = std::fs::read(&path)
                .map(|bytes| PluginFile { digest: file_digest(&bytes), bytes, path: path.clone() })
                .map_err(|source| LoadError::Read { path: path.clone(), source });
            files.insert(stem.to_owned(), file);
        }
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refused_contract_version_is_read_from_the_export() {
        let err = LoadError::IncompatibleContract {
            path: "x.wasm".into(),
            found: "proxyfleet:provider/provider@0.1.0".into(),
            host_version: "0.5.0",
            compatible: "0.5.x",
        };
        assert_eq!(refused_contract_version(&err).as_deref(), Some("0.1.0"));
        let err = LoadError::Describe { path: "x.wasm".into(), message: "no".into() };
        assert_eq!(refused_contract_version(&err), None);
    }
}
