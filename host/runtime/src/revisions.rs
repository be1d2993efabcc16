//! What [`crate::Registry::revisions`] reports per entry: the revision
//! serving it, the one a rollback would bring back, and the candidates it
//! refused, with why. Serializable as is for an HTTP API or a CLI.

use serde::Serialize;

use crate::admission::RejectionKind;
use crate::config::Pin;
use crate::oci::PullStatus;
use crate::plugin::PluginRevision;

pub use proxyfleet_core::source::RevisionSummary;

impl From<&PluginRevision> for RevisionSummary {
    fn from(revision: &PluginRevision) -> Self {
        Self {
            plugin: revision.info.name.clone(),
            version: revision.info.version.clone(),
            digest: revision.digest.clone(),
            contract_version: revision.info.contract_version.clone(),
            loaded_at: unix_seconds(revision.loaded_at),
            source: revision.source.clone(),
        }
    }
}

/// A candidate revision an entry did not activate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RejectedCandidate {
    /// The name its `describe` reports; `None` when it never got that far.
    pub plugin: Option<String>,
    /// The version it reports, likewise.
    pub version: Option<String>,
    /// sha256 of the file, lower-case hex.
    pub digest: String,
    /// The contract version it speaks, when known (also for a component
    /// refused for exporting another breaking version).
    pub contract_version: Option<String>,
    /// When it was loaded (or found unloadable), in seconds since the Unix
    /// epoch.
    pub loaded_at: u64,
    /// Which check it failed.
    pub kind: RejectionKind,
    /// Why, for people: names the file, the pin or the missing grant.
    pub reason: String,
}

/// The revisions of one provider entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EntryRevisions {
    /// The entry's name.
    pub entry: String,
    /// The plugin the entry names: a file without `.wasm`, or an `oci://`
    /// reference.
    pub plugin: String,
    /// The build the entry is pinned to, if any.
    pub pin: Option<Pin>,
    /// The revision serving calls; `None` while the entry is unavailable.
    pub active: Option<RevisionSummary>,
    /// When the active revision started serving this entry, in seconds
    /// since the Unix epoch.
    pub activated_at: Option<u64>,
    /// What a rollback would bring back.
    pub previous: Option<RevisionSummary>,
    /// The most recent refused candidates, oldest first.
    pub rejected: Vec<RejectedCandidate>,
    /// Why the entry serves nothing, when it does not.
    pub unavailable: Option<String>,
    /// Revisions activated since load, by swaps, file removals and
    /// rollbacks (the one bound at load not counted).
    pub swaps: u64,
    /// Candidates refused since load, including those no longer listed.
    pub rejections: u64,
    /// For an `oci://` plugin: what the last look at its registry found.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pull: Option<PullStatus>,
}

pub(crate) use proxyfleet_core::clock::unix_seconds;
