//! A builder for test Proxy specs.

use proxyfleet_core::ProxySpec;

/// Builds a [`ProxySpec`] with sensible defaults; the UID derives from the
/// name so two specs built alike are the same Proxy.
#[derive(Debug, Clone)]
pub struct SpecBuilder {
    spec: ProxySpec,
}

impl SpecBuilder {
    /// A spec for Proxy `default/<name>` with UID `uid-<name>`.
    pub fn new(name: &str) -> Self {
        Self {
            spec: ProxySpec {
                name: name.to_owned(),
                namespace: "default".into(),
                uid: format!("uid-{name}"),
                cores: 1,
                memory_mib: 512,
                disk_gib: 4,
                image: "debian-12".into(),
                placement: Vec::new(),
                vlan_tag: None,
                port: 3128,
                user_data: Vec::new(),
                labels: Vec::new(),
                proxy_auth: None,
            },
        }
    }

    /// Sets the UID.
    pub fn uid(mut self, uid: &str) -> Self {
        self.spec.uid = uid.to_owned();
        self
    }

    /// Sets the namespace.
    pub fn namespace(mut self, namespace: &str) -> Self {
        self.spec.namespace = namespace.to_owned();
        self
    }

    /// Sets the proxy port.
    pub fn port(mut self, port: u16) -> Self {
        self.spec.port = port;
        self
    }

    /// Adds a placement hint.
    pub fn placement(mut self, key: &str, value: &str) -> Self {
        self.spec.placement.push((key.to_owned(), value.to_owned()));
        self
    }

    /// The spec.
    pub fn build(self) -> ProxySpec {
        self.spec
    }
}
