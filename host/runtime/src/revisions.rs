//! What [`crate::Registry::revisions`] reports per entry (core's
//! [`EntryRevisions`]), and how a loaded plugin revision is summed up in it.

pub use proxyfleet_core::revisions::{EntryRevisions, RejectedCandidate, RevisionSummary};

use crate::plugin::PluginRevision;

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

pub(crate) use proxyfleet_core::clock::unix_seconds;
