//! A Proxy as a mode publishes it.

use std::collections::BTreeMap;

use crate::endpoint::Endpoint;
use proxyfleet_core::proxy::Phase;

/// One Proxy, as a mode publishes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The Proxy's UID: stable, unique, and safe in a URL path.
    pub id: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The ProxyPool it belongs to (`namespace/name`).
    pub pool: Option<String>,
    /// Provider entry.
    pub provider: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Phase.
    pub phase: Phase,
    /// Where it listens, once known.
    pub endpoint: Option<Endpoint>,
}

impl Member {
    /// `namespace/name`, as the gateway's metrics and errors name it.
    pub fn qualified_name(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}
