//! `proxyfleet:provider/kv`: the entry-scoped store, backed by whatever
//! [`proxyfleet_core::kv::KvStore`] the host was given.

use proxyfleet_core::kv::{CasOutcome, KvEntry, KvError};

use crate::bindings::kv as wit;
use crate::state::PluginState;

impl wit::Host for PluginState {
    async fn get(&mut self, key: String) -> Result<Option<wit::KvEntry>, wit::KvError> {
        let scope = &self.scope;
        scope.kv.get(&scope.entry, &key).await.map(|e| e.map(to_wit)).map_err(err_to_wit)
    }

    async fn compare_and_swap(
        &mut self,
        key: String,
        expected: Option<u64>,
        value: Option<Vec<u8>>,
    ) -> Result<wit::CasOutcome, wit::KvError> {
        let scope = &self.scope;
        match scope.kv.compare_and_swap(&scope.entry, &key, expected, value).await {
            Ok(CasOutcome::Applied(version)) => Ok(wit::CasOutcome::Applied(version)),
            Ok(CasOutcome::Conflict(now)) => Ok(wit::CasOutcome::Conflict(now.map(to_wit))),
            Err(err) => Err(err_to_wit(err)),
        }
    }

    async fn list(&mut self, prefix: String) -> Result<Vec<wit::KvEntry>, wit::KvError> {
        let scope = &self.scope;
        scope
            .kv
            .list(&scope.entry, &prefix)
            .await
            .map(|entries| entries.into_iter().map(to_wit).collect())
            .map_err(err_to_wit)
    }
}

fn to_wit(entry: KvEntry) -> wit::KvEntry {
    wit::KvEntry { key: entry.key, value: entry.value, version: entry.version }
}

fn err_to_wit(err: KvError) -> wit::KvError {
    match err {
        KvError::Unavailable(message) => wit::KvError::Unavailable(message),
        KvError::Invalid(message) => wit::KvError::Invalid(message),
    }
}
