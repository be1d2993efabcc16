//! Where the modes get their providers from: the loaded provider entries.
//!
//! The plugin runtime's registry implements [`ProviderSource`] for
//! WebAssembly plugins; tests implement it over fakes. The modes'
//! housekeeping (the `proxyfleet-housekeeping` crate) and the Proxy
//! controller need nothing else.

use std::sync::Arc;

use crate::installation::InstallationId;
use crate::revisions::{EntryRevisions, RevisionSummary};
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

    /// Per entry, in name order: the revision serving it, the one before,
    /// the candidates refused, and the swap and refusal counts.
    fn revisions(&self) -> Vec<EntryRevisions>;

    /// How many calls `entry`'s plugin may have open at once (its
    /// `limits.concurrency`), as configured now; `None` when the source
    /// does not say or has no such entry.
    fn concurrency(&self, entry: &str) -> Option<usize> {
        let _ = entry;
        None
    }

    /// [`ProviderSource::revisions`] of one entry; `None` when no entry has
    /// that name.
    fn revisions_of(&self, entry: &str) -> Option<EntryRevisions> {
        self.revisions().into_iter().find(|revisions| revisions.entry == entry)
    }
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

    /// A fixed set loads no files: each entry names its provider's plugin
    /// and has no revision history.
    fn revisions(&self) -> Vec<EntryRevisions> {
        self.entries
            .iter()
            .map(|(name, state)| {
                let (plugin, unavailable) = match state {
                    EntryState::Ready(provider) => (provider.info().name, None),
                    EntryState::Loading => (String::new(), Some(STILL_LOADING.to_owned())),
                    EntryState::Failed(reason) => (String::new(), Some(reason.clone())),
                };
                EntryRevisions {
                    entry: name.clone(),
                    plugin,
                    pin: None,
                    active: None,
                    activated_at: None,
                    previous: None,
                    rejected: Vec::new(),
                    unavailable,
                    swaps: 0,
                    rejections: 0,
                    config_refused: None,
                    pull: None,
                    grants: Vec::new(),
                    config_schema: None,
                }
            })
            .collect()
    }
}
