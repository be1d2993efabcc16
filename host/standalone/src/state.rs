//! The state database opened with the installation it belongs to: what a
//! provider source is built on (its marks name the installation, its
//! key-value store is the database) before the driver starts.

use std::path::Path;
use std::sync::Arc;

use proxyfleet_core::installation::{self, InstallationId};
use proxyfleet_core::kv::KvStore;
use proxyfleet_core::spec_key::{self, SpecKey};

use crate::error::Result;
use crate::store::Store;

/// An open state database and its installation.
#[derive(Debug)]
pub struct StateDb {
    store: Arc<Store>,
    installation: InstallationId,
    spec_key: SpecKey,
}

impl StateDb {
    /// Opens (or creates) the database at `path` and settles the
    /// installation: `named` when the operator names one, otherwise the one
    /// the database keeps, generated at the first start; and the key of its
    /// spec hashes, kept there too.
    ///
    /// # Errors
    /// When the database cannot be opened, or `named` differs from the kept
    /// ID.
    pub async fn open(path: &Path, named: Option<&InstallationId>) -> Result<Self> {
        let store = Arc::new(Store::open(path)?);
        let (installation, settled) = installation::settle(store.as_ref(), named).await?;
        tracing::info!(installation = %installation, ?settled, "installation");
        let spec_key = spec_key::settle(store.as_ref()).await?;
        Ok(Self { store, installation, spec_key })
    }

    /// The installation every ownership mark must name.
    pub fn installation(&self) -> &InstallationId {
        &self.installation
    }

    /// The database as the plugins' key-value store.
    pub fn kv(&self) -> Arc<dyn KvStore> {
        Arc::clone(&self.store) as _
    }

    pub(crate) fn into_parts(self) -> (Arc<Store>, SpecKey) {
        (self.store, self.spec_key)
    }
}
