//! What a mode (standalone or Kubernetes) adds to the API and the console
//! beyond the catalog: its provider entries, their checks and revisions,
//! rollbacks, replacing a Proxy's instance, and where operators' actions
//! are recorded.

use async_trait::async_trait;
use proxyfleet_core::Health;
use proxyfleet_core::revisions::EntryRevisions;
use proxyfleet_core::source::RollbackError;

use crate::action::{Action, ProxyRef};

/// What a mode adds to the API beyond the catalog.
#[async_trait]
pub trait ModeStatus: Send + Sync {
    /// `GET /v1/providers`: the provider entries, their checks and plugin
    /// revisions, as the mode knows them.
    fn providers(&self) -> serde_json::Value;

    /// `POST /v1/providers/{entry}/rollback`: brings back the entry's
    /// previous plugin revision; answers the revision now serving.
    fn rollback(&self, entry: &str) -> Result<serde_json::Value, Refusal>;

    /// Which mode this is, for people: `standalone`, `Kubernetes`.
    fn name(&self) -> &'static str;

    /// The entries' plugin revisions, as the console shows them.
    fn revisions(&self) -> Vec<EntryRevisions>;

    /// The entries' last checks, where this replica knows them.
    fn checks(&self) -> Vec<EntryCheck> {
        Vec::new()
    }

    /// This replica in a leader election, when there is one.
    fn replica(&self) -> Option<Replica> {
        None
    }

    /// The key the console signs its sessions with, the same on every
    /// replica of the installation and after a restart (derived from the
    /// installation's spec key); `None` leaves the console a key of this
    /// process alone, whose sessions end with it.
    fn session_key(&self) -> Option<[u8; 32]> {
        None
    }

    /// Asks for a new instance in place of `proxy`'s current one: the
    /// reconciler deletes the instance, waits until it is gone and creates
    /// another, as for a spec change.
    async fn replace(&self, proxy: &ProxyRef) -> Result<(), Refusal>;

    /// Records an operator's action where this mode keeps such records.
    /// A failure to record is logged, never the action's failure.
    async fn record(&self, action: &Action);
}

/// A replica of the operator, as the console shows which one it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replica {
    /// Its identity in the leader election.
    pub identity: String,
    /// Whether it leads (probes, reconciles and serves the fleet) now.
    pub leading: bool,
}

/// A provider entry's last check, as the console shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryCheck {
    /// The entry.
    pub entry: String,
    /// What the check found.
    pub health: Health,
    /// Unix seconds of the check.
    pub checked_at: u64,
}

/// Why a mode refused a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Nothing by that name.
    NotFound(String),
    /// It exists but cannot do that now.
    Conflict(String),
    /// What the mode stands on (the Kubernetes API) did not do it; worth
    /// trying again.
    Unavailable(String),
}

impl Refusal {
    /// The HTTP status that answers it, and the message.
    pub fn into_answer(self) -> (http::StatusCode, String) {
        match self {
            Self::NotFound(message) => (http::StatusCode::NOT_FOUND, message),
            Self::Conflict(message) => (http::StatusCode::CONFLICT, message),
            Self::Unavailable(message) => (http::StatusCode::SERVICE_UNAVAILABLE, message),
        }
    }
}

impl From<RollbackError> for Refusal {
    fn from(err: RollbackError) -> Self {
        match err {
            RollbackError::UnknownEntry { .. } => Refusal::NotFound(err.to_string()),
            RollbackError::Unavailable { .. } | RollbackError::NoPrevious { .. } => {
                Refusal::Conflict(err.to_string())
            }
        }
    }
}
