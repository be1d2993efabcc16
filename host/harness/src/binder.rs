//! A provider entry bound the way the operator binds it, and bound again
//! with another config on demand: what the conformance suite
//! (`proxyfleet-conformance`) drives a component through.

use std::sync::Arc;

use async_trait::async_trait;
use proxyfleet_conformance::Binder;
use proxyfleet_core::installation::InstallationId;
use proxyfleet_core::kv::{KvStore, MemoryKv};
use proxyfleet_core::{Provider, ProviderError};
use proxyfleet_runtime::config::EntryConfig;
use proxyfleet_runtime::{PluginProvider, PluginRevision, Runtime};

/// One entry of a loaded component, with its key-value store.
#[derive(Debug, Clone)]
pub struct EntryBinder {
    runtime: Runtime,
    entry: EntryConfig,
    revision: Arc<PluginRevision>,
    kv: Arc<dyn KvStore>,
}

impl EntryBinder {
    /// `entry` served by `revision`, storing into `kv`.
    pub fn new(
        runtime: Runtime,
        entry: EntryConfig,
        revision: Arc<PluginRevision>,
        kv: Arc<dyn KvStore>,
    ) -> Self {
        Self { runtime, entry, revision, kv }
    }

    /// The entry with its own config.
    ///
    /// # Errors
    /// What the plugin's `validate-config` answered.
    pub async fn bind_own(&self) -> Result<Arc<dyn Provider>, ProviderError> {
        self.bind(&self.entry.config).await
    }
}

#[async_trait]
impl Binder for EntryBinder {
    async fn bind(&self, config: &serde_json::Value) -> Result<Arc<dyn Provider>, ProviderError> {
        let mut entry = self.entry.clone();
        entry.config = config.clone();
        let provider = PluginProvider::new(
            &self.runtime,
            entry,
            Arc::clone(&self.revision),
            Arc::clone(&self.kv),
        )
        .await?;
        Ok(Arc::new(provider))
    }

    fn installation(&self) -> String {
        self.runtime.installation().to_string()
    }

    async fn bind_elsewhere(
        &self,
        config: &serde_json::Value,
    ) -> Option<Result<Arc<dyn Provider>, ProviderError>> {
        let other = if self.runtime.installation().as_str() == OTHER { OTHER_TOO } else { OTHER };
        let installation = InstallationId::parse("the other installation", other)
            .unwrap_or_else(|_| unreachable!("a valid installation ID"));
        let runtime = self.runtime.for_installation(installation);
        let mut entry = self.entry.clone();
        entry.config = config.clone();
        let kv: Arc<dyn KvStore> = Arc::new(MemoryKv::new());
        let bound = PluginProvider::new(&runtime, entry, Arc::clone(&self.revision), kv).await;
        Some(bound.map(|provider| Arc::new(provider) as Arc<dyn Provider>))
    }
}

/// The installation the suite's second binding serves (another, when the
/// entry's own is called that).
const OTHER: &str = "conformance-other";
const OTHER_TOO: &str = "conformance-another";
