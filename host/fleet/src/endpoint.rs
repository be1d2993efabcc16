//! Where a proxy listens, and the credential it asks for: what the
//! catalog hands out, the health engine probes and the gateway dials.

use std::net::{IpAddr, SocketAddr};

use base64::Engine as _;
use http::HeaderValue;
use proxyfleet_core::credential::ProxyCredential;
use serde::Serialize;

/// Where a proxy listens, and the credential it asks for.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Endpoint {
    /// IP address.
    pub ip: IpAddr,
    /// Proxy port.
    pub port: u16,
    /// The proxy's Basic credential, when it asks for one. Never shown:
    /// only sent to the proxy, and handed to authorized crawlers.
    #[serde(skip)]
    pub credential: Option<ProxyCredential>,
}

impl Endpoint {
    /// A proxy that asks for no credential.
    pub fn new(ip: IpAddr, port: u16) -> Self {
        Self { ip, port, credential: None }
    }

    /// The same proxy, asking for `credential`.
    #[must_use]
    pub fn with_credential(mut self, credential: Option<ProxyCredential>) -> Self {
        self.credential = credential;
        self
    }

    /// Where to connect.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::new(self.ip, self.port)
    }

    /// `http://ip:port`, the form `curl -x` and crawlers take; never with
    /// the credential.
    pub fn url(&self) -> String {
        match self.ip {
            IpAddr::V4(ip) => format!("http://{ip}:{}", self.port),
            IpAddr::V6(ip) => format!("http://[{ip}]:{}", self.port),
        }
    }

    /// `http://user:password@ip:port` when the proxy asks for a credential
    /// (each part percent-encoded), else [`Endpoint::url`]: for crawlers
    /// the API has authorized.
    pub fn url_with_credential(&self) -> String {
        let url = self.url();
        match &self.credential {
            None => url,
            Some(credential) => url.replacen(
                "http://",
                &format!(
                    "http://{}:{}@",
                    userinfo(credential.username()),
                    userinfo(credential.password())
                ),
                1,
            ),
        }
    }

    /// The `Proxy-Authorization` value for this proxy, marked sensitive.
    pub fn proxy_authorization(&self) -> Option<HeaderValue> {
        let credential = self.credential.as_ref()?;
        let token = base64::engine::general_purpose::STANDARD.encode(format!(
            "{}:{}",
            credential.username(),
            credential.password()
        ));
        let mut value = HeaderValue::from_str(&format!("Basic {token}")).ok()?;
        value.set_sensitive(true);
        Some(value)
    }
}

/// Percent-encodes all but RFC 3986's unreserved characters: what a URL's
/// user information may hold as it is. (form_urlencoded would write a
/// space as `+`, which means a plus there.)
fn userinfo(text: &str) -> String {
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_credential_goes_into_the_header_and_the_handed_out_url_but_not_the_plain_url() {
        let credential = ProxyCredential::parse("crawl er:p@ss/w:rd").unwrap();
        let endpoint = Endpoint::new([192, 0, 2, 1].into(), 3128).with_credential(Some(credential));
        assert_eq!(endpoint.url(), "http://192.0.2.1:3128");
        assert_eq!(
            endpoint.url_with_credential(),
            "http://crawl%20er:p%40ss%2Fw%3Ard@192.0.2.1:3128"
        );
        let header = endpoint.proxy_authorization().unwrap();
        assert!(header.is_sensitive());
        assert_eq!(header, "Basic Y3Jhd2wgZXI6cEBzcy93OnJk");
        assert!(!serde_json::to_string(&endpoint).unwrap().contains("ss"), "serialised without it");
        assert!(Endpoint::new([192, 0, 2, 1].into(), 3128).proxy_authorization().is_none());
    }
}
