//! A Proxy as a mode publishes it, and where it listens.

use std::collections::BTreeMap;
use std::net::IpAddr;

use proxyfleet_core::proxy::Phase;
use serde::Serialize;

/// Where a proxy listens.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Endpoint {
    /// IP address.
    pub ip: IpAddr,
    /// Proxy port.
    pub port: u16,
}

impl Endpoint {
    /// `http://ip:port`, the form `curl -x` and crawlers take.
    pub fn url(&self) -> String {
        match self.ip {
            IpAddr::V4(ip) => format!("http://{ip}:{}", self.port),
            IpAddr::V6(ip) => format!("http://[{ip}]:{}", self.port),
        }
    }
}

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
