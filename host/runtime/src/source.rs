//! The registry as the modes see it: a [`ProviderSource`], so that their
//! housekeeping runs over plugins and fakes alike.

use std::sync::Arc;

use proxyfleet_core::installation::InstallationId;
use proxyfleet_core::revisions::{EntryRevisions, RevisionSummary};
use proxyfleet_core::source::{self, ProviderSource, RollbackError};
use proxyfleet_core::{Provider, ProviderError};

use crate::registry::Registry;

impl ProviderSource for Registry {
    fn installation(&self) -> &InstallationId {
        Registry::installation(self)
    }

    fn entries(&self) -> Vec<(String, source::EntryState)> {
        Registry::entries(self)
            .iter()
            .map(|(name, state)| (name.clone(), state.as_source()))
            .collect()
    }

    fn provider(&self, entry: &str) -> Result<Arc<dyn Provider>, ProviderError> {
        Registry::provider(self, entry)
    }

    fn rollback(&self, entry: &str) -> Result<RevisionSummary, RollbackError> {
        Registry::rollback(self, entry)
    }

    fn revisions(&self) -> Vec<EntryRevisions> {
        Registry::revisions(self)
    }

    fn revisions_of(&self, entry: &str) -> Option<EntryRevisions> {
        Registry::revisions_of(self, entry)
    }

    fn concurrency(&self, entry: &str) -> Option<usize> {
        Registry::concurrency_of(self, entry)
    }
}
