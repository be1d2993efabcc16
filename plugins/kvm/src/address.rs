//! A domain's addresses from the sources the entry names, in order: the
//! guest agent knows best, libvirt's DHCP leases and the host's ARP table
//! know only what crossed the host.
//!
//! The rule that keeps a healthy proxy from being dropped: a source that
//! fails is not a source that answered "none". When one source answers
//! with addresses, they are the answer. When none does, but at least one
//! answered (empty), the domain has no address yet. Only when every source
//! failed is the lookup itself a failure, and a transient one.

use std::net::IpAddr;

use proxyfleet_sdk::ProviderError;
use proxyfleet_sdk::libvirt::{InterfaceAddress, LibvirtError};

use crate::config::AddressSourceName;

/// The usable addresses of `found`: IPv4 first, then IPv6, each in the
/// order reported; loopback, link-local, unspecified and multicast
/// addresses are left out (a guest agent reports `lo` too).
fn usable(found: &[InterfaceAddress]) -> Vec<String> {
    let mut v4 = Vec::new();
    let mut v6 = Vec::new();
    for entry in found {
        let Ok(ip) = entry.address.parse::<IpAddr>() else { continue };
        if ip.is_loopback() || ip.is_unspecified() || ip.is_multicast() {
            continue;
        }
        match ip {
            IpAddr::V4(v4_ip) if !v4_ip.is_link_local() => v4.push(ip.to_string()),
            IpAddr::V6(v6_ip) if (v6_ip.segments()[0] & 0xffc0) != 0xfe80 => {
                v6.push(ip.to_string());
            }
            _ => {}
        }
    }
    // The same address on two interfaces is one address.
    let mut addresses: Vec<String> = Vec::with_capacity(v4.len() + v6.len());
    for address in v4.into_iter().chain(v6) {
        if !addresses.contains(&address) {
            addresses.push(address);
        }
    }
    addresses
}

/// The addresses of a domain, asking `query` for each source in `sources`
/// until one answers with a usable address.
pub fn resolve(
    sources: &[AddressSourceName],
    mut query: impl FnMut(AddressSourceName) -> Result<Vec<InterfaceAddress>, LibvirtError>,
) -> Result<Vec<String>, ProviderError> {
    let mut failures = Vec::new();
    let mut answered = false;
    for &source in sources {
        match query(source) {
            Ok(found) => {
                let addresses = usable(&found);
                if !addresses.is_empty() {
                    return Ok(addresses);
                }
                answered = true;
            }
            Err(error) => failures.push(format!("{}: {}", name(source), error.message())),
        }
    }
    if answered || failures.is_empty() {
        Ok(Vec::new())
    } else {
        Err(ProviderError::Transient(format!(
            "no address source answered: {}",
            failures.join("; ")
        )))
    }
}

fn name(source: AddressSourceName) -> &'static str {
    match source {
        AddressSourceName::Agent => "guest agent",
        AddressSourceName::Lease => "DHCP leases",
        AddressSourceName::Arp => "ARP table",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use AddressSourceName::{Agent, Arp, Lease};

    fn found(addresses: &[&str]) -> Vec<InterfaceAddress> {
        addresses
            .iter()
            .map(|address| InterfaceAddress {
                device: "eth0".into(),
                mac: None,
                address: (*address).to_owned(),
                prefix: 24,
            })
            .collect()
    }

    fn lost() -> LibvirtError {
        LibvirtError::Transient("connection is closed".into())
    }

    #[test]
    fn the_first_source_with_an_address_wins() {
        let mut asked = Vec::new();
        let addresses = resolve(&[Agent, Lease, Arp], |source| {
            asked.push(source);
            Ok(match source {
                Agent => found(&["127.0.0.1", "fe80::1", "2001:db8::5", "192.0.2.7", "192.0.2.7"]),
                _ => found(&["198.51.100.1"]),
            })
        })
        .expect("valid");
        assert_eq!(addresses, ["192.0.2.7", "2001:db8::5"]);
        assert_eq!(asked, [Agent], "later sources are not asked");
    }

    #[test]
    fn a_failing_agent_falls_back_to_the_lease_table() {
        let addresses = resolve(&[Agent, Lease], |source| match source {
            Agent => Err(LibvirtError::Transient("Guest agent is not responding".into())),
            _ => Ok(found(&["192.0.2.9"])),
        })
        .expect("valid");
        assert_eq!(addresses, ["192.0.2.9"]);
    }

    /// Regression: "connection is closed" from one source read as "no
    /// address yet" dropped a healthy proxy. Here one source failing while
    /// the other answers empty is "none yet", but every source failing is
    /// an error the caller retries, never an empty answer.
    #[test]
    fn only_every_source_failing_is_an_error() {
        let none_yet = resolve(&[Agent, Lease], |source| match source {
            Agent => Err(lost()),
            _ => Ok(Vec::new()),
        })
        .expect("valid");
        assert!(none_yet.is_empty());

        let err = resolve(&[Agent, Lease, Arp], |_| Err(lost())).expect_err("an error");
        assert!(matches!(err, ProviderError::Transient(_)), "{err:?}");
        assert!(err.message().contains("guest agent: connection is closed"), "{err:?}");
        assert!(err.message().contains("ARP table"), "{err:?}");
    }
}
