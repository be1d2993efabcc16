//! Where the modes get their providers from: the loaded provider entries.
//!
//! The plugin runtime's registry implements [`ProviderSource`] for
//! WebAssembly plugins; tests implement it over fakes. The modes'
//! housekeeping (the `proxyfleet-housekeeping` crate) and the Proxy
//! controller need nothing else.

use std::path::PathBuf;
use std::sync::Arc;

use serde::Serialize;

use crate::installation::InstallationId;
use crate::{Provider, ProviderError};

/// Why a loading entry serves nothing yet.
pub const STILL_LOADING: &str = "its plugin is still loading";

/// One provider entry as it stands now.
#[derive(Clone)]
pub enum EntryState {
    /// Its plugin is being read and compiled; not serving yet.
    Loading,
    /// Serving calls.
    Ready(Arc<dyn Provider>),
    /// Not serving, with the reason (safe to show: no secret in it).
    Failed(String),
}

impl std::fmt::Debug for EntryState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Loading => f.write_str("Loading"),
            Self::Ready(provider) => f.debug_tuple("Ready").field(&provider.entry()).finish(),
            Self::Failed(reason) => f.debug_tuple("Failed").field(reason).finish(),
        }
    }
}

impl EntryState {
    /// The provider when the entry serves; otherwise `Unavailable`, naming
    /// the entry and why.
    pub fn serving(&self, entry: &str) -> Result<Arc<dyn Provider>, ProviderError> {
        match self {
            Self::Ready(provider) => Ok(Arc::clone(provider)),
            Self::Loading => Err(ProviderError::unavailable(format!(
                "provider entry {entry:?}: {STILL_LOADING}"
            ))),
            Self::Failed(reason) => {
                Err(ProviderError::unavailable(format!("provider entry {entry:?}: {reason}")))
            }
        }
    }
}

/// The refusal for an entry no one configured, listing those that are.
pub fn no_such_entry<'a>(entry: &str, names: impl IntoIterator<Item = &'a str>) -> ProviderError {
    ProviderError::unavailable(format!(
        "no provider entry named {entry:?}; entries are [{}]",
        names.into_iter().collect::<Vec<_>>().join(", ")
    ))
}

/// One loaded revision of a plugin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RevisionSummary {
    /// The name the plugin's `describe` reports.
    pub plugin: String,
    /// The version it reports.
    pub version: String,
    /// sha256 of the component file, lower-case hex.
    pub digest: String,
    /// The contract version it was built against.
    pub contract_version: String,
    /// When the file was loaded, in seconds since the Unix epoch.
    pub loaded_at: u64,
    /// The file it was loaded from.
    pub source: PathBuf,
}

/// A rollback that could not be done.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RollbackError {
    /// No entry has that name.
    #[error("no provider entry named {entry:?}")]
    UnknownEntry {
        /// The name asked for.
        entry: String,
    },
    /// The entry serves no revision, so there is nothing to roll back.
    #[error("provider entry {entry:?} is unavailable: {reason}")]
    Unavailable {
        /// The entry.
        entry: String,
        /// Why it is unavailable.
        reason: String,
    },
    /// The entry has served only one revision since the host started (or the
    /// one before is gone).
    #[error("provider entry {entry:?} has no previous revision to roll back to")]
    NoPrevious {
        /// The entry.
        entry: String,
    },
}

/// The provider entries an installation serves.
pub trait ProviderSource: Send + Sync {
    /// The installation every ownership mark names.
    fn installation(&self) -> &InstallationId;

    /// Every configured entry, by name, in name order.
    fn entries(&self) -> Vec<(String, EntryState)>;

    /// The provider serving `entry`; `Unavailable` with why when it is
    /// loading, failed or not configured.
    fn provider(&self, entry: &str) -> Result<Arc<dyn Provider>, ProviderError>;

    /// Makes the revision `entry` served before the current one serve
    /// again, and returns it.
    fn rollback(&self, entry: &str) -> Result<RevisionSummary, RollbackError>;
}

/// A fixed set of entries, for tests and embedders that load providers
/// themselves.
#[derive(Debug, Clone)]
pub struct StaticSource {
    installation: InstallationId,
    entries: Vec<(String, EntryState)>,
}

impl StaticSource {
    /// No entries yet, for `installation`.
    pub fn new(installation: InstallationId) -> Self {
        Self { installation, entries: Vec::new() }
    }

    /// Adds (or replaces) the entry `name`.
    #[must_use]
    pub fn with(mut self, name: &str, state: EntryState) -> Self {
        self.entries.retain(|(n, _)| n != name);
        self.entries.push((name.to_owned(), state));
        self.entries.sort_by(|a, b| a.0.cmp(&b.0));
        self
    }
}

impl ProviderSource for StaticSource {
    fn installation(&self) -> &InstallationId {
        &self.installation
    }

    fn entries(&self) -> Vec<(String, EntryState)> {
        self.entries.clone()
    }

    fn provider(&self, entry: &str) -> Result<Arc<dyn Provider>, ProviderError> {
        match self.entries.iter().find(|(name, _)| name == entry) {
            Some((_, state)) => state.serving(entry),
            None => Err(no_such_entry(entry, self.entries.iter().map(|(name, _)| name.as_str()))),
        }
    }

    /// A fixed set has one revision per entry: nothing to roll back to.
    fn rollback(&self, entry: &str) -> Result<RevisionSummary, RollbackError> {
        match self.entries.iter().find(|(name, _)| name == entry) {
            None => Err(RollbackError::UnknownEntry { entry: entry.to_owned() }),
            Some(_) => Err(RollbackError::NoPrevious { entry: entry.to_owned() }),
        }
    }
}
