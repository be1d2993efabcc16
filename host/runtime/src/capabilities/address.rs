//! Which addresses a plugin's HTTP may reach: the ranges refused unless a
//! grant's `allowAddresses` names them, and IP literals read the way the
//! transport's URL parser reads them.
//!
//! The transport dials an IP-literal host without asking the resolver
//! (where the policy is also applied), and it parses URLs by the WHATWG
//! rules, under which `127.1`, `2130706433`, `0x7f.0.0.1` and
//! `0177.0.0.1` are all 127.0.0.1. So every check reads a host with the
//! same rules ([`literal_ip`]), and the providers file refuses such
//! spellings outright ([`non_canonical`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

use crate::error::ConfigError;

/// What kind of special-purpose address an address is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressKind {
    /// A cloud provider's instance metadata service.
    CloudMetadata,
    /// 127.0.0.0/8, ::1.
    Loopback,
    /// RFC 1918 ranges, IPv6 unique-local.
    Private,
    /// 169.254.0.0/16, fe80::/10.
    LinkLocal,
    /// 0.0.0.0/8, broadcast, multicast, `::`.
    NonUnicast,
    /// 100.64.0.0/10.
    SharedCgnat,
    /// 192.0.0.0/24.
    IetfProtocol,
    /// 198.18.0.0/15.
    Benchmarking,
    /// 240.0.0.0/4.
    Reserved,
    /// fec0::/10.
    SiteLocal,
    /// A public IPv4 address written IPv4-compatible (::a.b.c.d).
    Ipv4Compatible,
    /// A public IPv4 address behind the NAT64 prefix.
    Nat64,
    /// A public IPv4 address behind the 6to4 prefix.
    SixToFour,
}

impl AddressKind {
    /// Its name in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::CloudMetadata => "cloud metadata",
            Self::Loopback => "loopback",
            Self::Private => "private",
            Self::LinkLocal => "link-local",
            Self::NonUnicast => "non-unicast",
            Self::SharedCgnat => "shared (CGNAT)",
            Self::IetfProtocol => "IETF protocol assignments",
            Self::Benchmarking => "benchmarking",
            Self::Reserved => "reserved",
            Self::SiteLocal => "site-local",
            Self::Ipv4Compatible => "IPv4-compatible",
            Self::Nat64 => "NAT64",
            Self::SixToFour => "6to4",
        }
    }

    /// Whether it is a private network's range, where proxies usually
    /// live: RFC 1918, IPv6 unique-local and shared (CGNAT) space.
    pub fn is_private_network(self) -> bool {
        matches!(self, Self::Private | Self::SharedCgnat)
    }
}

impl std::fmt::Display for AddressKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a proxy address a plugin reports is refused, or `None` when the
/// health engine may probe it and the discovery API hand it out. With
/// `ranges` (the entry's `proxyAddresses`), exactly those ranges are
/// taken. Without, private networks are taken (most proxies live there)
/// and every other special-purpose address is refused: loopback,
/// link-local, cloud metadata and the rest, also written as IPv6.
pub fn refused_proxy_address(ip: IpAddr, ranges: &[IpNet]) -> Option<String> {
    if !ranges.is_empty() {
        return (!ranges.iter().any(|net| net.contains(&ip)))
            .then(|| "outside the entry's proxyAddresses".to_owned());
    }
    refused_kind(ip, &[])
        .filter(|kind| !kind.is_private_network())
        .map(|kind| format!("a {kind} address"))
}

/// The address `host` (without brackets) denotes as an IP literal under
/// the WHATWG URL rules, or `None` for a domain name.
pub fn literal_ip(host: &str) -> Option<IpAddr> {
    if host.contains(':') {
        return host.parse::<Ipv6Addr>().ok().map(IpAddr::V6);
    }
    match url::Host::parse(host) {
        Ok(url::Host::Ipv4(v4)) => Some(IpAddr::V4(v4)),
        Ok(url::Host::Ipv6(v6)) => Some(IpAddr::V6(v6)),
        _ => None,
    }
}

/// The canonical spelling of `host` when it is an IP literal written any
/// other way (`127.1` → `127.0.0.1`).
pub fn non_canonical(host: &str) -> Option<IpAddr> {
    literal_ip(host).filter(|ip| ip.to_string() != host.to_ascii_lowercase())
}

/// Why `ip` is refused (the kind of address), or `None` when it may be
/// reached. `allowed` ranges are always reachable.
pub fn refused_kind(ip: IpAddr, allowed: &[IpNet]) -> Option<AddressKind> {
    if allowed.iter().any(|net| net.contains(&ip)) {
        return None;
    }
    // An IPv4 address written as IPv6 (mapped ::ffff:a.b.c.d, compatible
    // ::a.b.c.d, NAT64 64:ff9b::/96, 6to4 2002::/16) reaches that IPv4
    // address, so it is judged as one.
    if let IpAddr::V6(v6) = ip
        && let Some((v4, prefix)) = embedded_v4(v6)
    {
        if allowed.iter().any(|net| net.contains(&IpAddr::V4(v4))) {
            return None;
        }
        return refused_v4(v4).or(prefix);
    }
    match ip {
        IpAddr::V4(v4) => refused_v4(v4),
        IpAddr::V6(v6) => refused_v6(v6),
    }
}

/// The IPv4 address an IPv6 address carries in one of the forms that
/// reach it, with the name of the translation prefix it goes through:
/// those are refused even around a public IPv4 address (a plugin has no
/// business going through them); a mapped address has none.
fn embedded_v4(v6: Ipv6Addr) -> Option<(Ipv4Addr, Option<AddressKind>)> {
    let s = v6.segments();
    let low = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    if let Some(mapped) = v6.to_ipv4_mapped() {
        Some((mapped, None))
    } else if s[..6] == [0, 0, 0, 0, 0, 0] && !(s[6] == 0 && s[7] <= 1) {
        // IPv4-compatible (::a.b.c.d); `::` and `::1` are IPv6's own.
        Some((low, Some(AddressKind::Ipv4Compatible)))
    } else if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        Some((low, Some(AddressKind::Nat64)))
    } else if s[0] == 0x2002 {
        let v4 = Ipv4Addr::new((s[1] >> 8) as u8, s[1] as u8, (s[2] >> 8) as u8, s[2] as u8);
        Some((v4, Some(AddressKind::SixToFour)))
    } else {
        None
    }
}

fn refused_v4(ip: Ipv4Addr) -> Option<AddressKind> {
    let [a, b, c, _] = ip.octets();
    if ip == Ipv4Addr::new(169, 254, 169, 254) {
        Some(AddressKind::CloudMetadata)
    } else if ip.is_loopback() {
        Some(AddressKind::Loopback)
    } else if ip.is_private() {
        Some(AddressKind::Private)
    } else if ip.is_link_local() {
        Some(AddressKind::LinkLocal)
    } else if a == 0 || ip.is_broadcast() || ip.is_multicast() {
        Some(AddressKind::NonUnicast)
    } else if a == 100 && (b & 0xc0) == 64 {
        Some(AddressKind::SharedCgnat)
    } else if a == 192 && b == 0 && c == 0 {
        Some(AddressKind::IetfProtocol)
    } else if a == 198 && (b & 0xfe) == 18 {
        Some(AddressKind::Benchmarking)
    } else if a >= 240 {
        Some(AddressKind::Reserved)
    } else {
        None
    }
}

fn refused_v6(ip: Ipv6Addr) -> Option<AddressKind> {
    const EC2_METADATA: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254);
    let first = ip.segments()[0];
    if ip == EC2_METADATA {
        Some(AddressKind::CloudMetadata)
    } else if ip.is_loopback() {
        Some(AddressKind::Loopback)
    } else if ip.is_unique_local() {
        Some(AddressKind::Private)
    } else if ip.is_unicast_link_local() {
        Some(AddressKind::LinkLocal)
    } else if (first & 0xffc0) == 0xfec0 {
        Some(AddressKind::SiteLocal)
    } else if ip.is_unspecified() || ip.is_multicast() {
        Some(AddressKind::NonUnicast)
    } else {
        None
    }
}

/// IP addresses and CIDR ranges, e.g. `allowAddresses`.
pub(crate) fn parse_ranges(
    at: &str,
    key: &str,
    texts: &[String],
) -> Result<Vec<IpNet>, ConfigError> {
    texts
        .iter()
        .enumerate()
        .map(|(j, text)| {
            text.parse::<IpNet>()
                .or_else(|_| text.parse::<std::net::IpAddr>().map(IpNet::from))
                .map_err(|_| {
                    ConfigError::invalid(
                        at,
                        format!("{key}[{j}]"),
                        format!(
                            "{text:?} is neither an IP address nor a CIDR range like 10.0.0.0/8"
                        ),
                    )
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("an IP address")
    }

    #[test]
    fn special_addresses_are_refused_by_default() {
        for (addr, kind) in [
            ("127.0.0.1", "loopback"),
            ("::1", "loopback"),
            ("10.1.2.3", "private"),
            ("192.168.0.1", "private"),
            ("172.16.0.1", "private"),
            ("169.254.169.254", "cloud metadata"),
            ("fd00:ec2::254", "cloud metadata"),
            ("169.254.1.1", "link-local"),
            ("fe80::1", "link-local"),
            ("fd12::1", "private"),
            ("::ffff:127.0.0.1", "loopback"),
            ("0.0.0.0", "non-unicast"),
            ("100.64.0.1", "shared (CGNAT)"),
        ] {
            assert_eq!(refused_kind(ip(addr), &[]).map(AddressKind::as_str), Some(kind), "{addr}");
        }
        assert_eq!(refused_kind(ip("203.0.113.7"), &[]), None);
        assert_eq!(refused_kind(ip("2001:db8::1"), &[]), None);
    }

    #[test]
    fn a_granted_range_allows_exactly_that_range() {
        let allowed = ["127.0.0.0/8".parse().unwrap()];
        assert_eq!(refused_kind(ip("127.0.0.1"), &allowed), None);
        assert_eq!(refused_kind(ip("::ffff:127.0.0.1"), &allowed), None);
        assert_eq!(refused_kind(ip("10.0.0.1"), &allowed), Some(AddressKind::Private));
        assert_eq!(refused_kind(ip("::1"), &allowed), Some(AddressKind::Loopback));
    }

    fn refused(host: &str) -> Option<&'static str> {
        refused_kind(literal_ip(host).expect("an IP literal"), &[]).map(AddressKind::as_str)
    }

    /// The attack: a grant naming one of these reached loopback, because
    /// the transport reads them as 127.0.0.1 and dials without the resolver.
    #[test]
    fn non_canonical_ipv4_literals_read_as_the_transport_reads_them() {
        for host in ["127.1", "2130706433", "0x7f.0.0.1", "0177.0.0.1", "0x7f000001"] {
            assert_eq!(literal_ip(host), Some(IpAddr::V4(Ipv4Addr::LOCALHOST)), "{host}");
            assert_eq!(non_canonical(host), Some(IpAddr::V4(Ipv4Addr::LOCALHOST)), "{host}");
            assert_eq!(refused(host), Some("loopback"), "{host}");
        }
        assert_eq!(non_canonical("127.0.0.1"), None);
        assert_eq!(non_canonical("2001:db8::1"), None);
        assert_eq!(literal_ip("pve.lan"), None);
        assert_eq!(literal_ip("compute.googleapis.com"), None);
    }

    /// The ranges that were treated as public.
    #[test]
    fn special_purpose_ranges_are_refused() {
        for (host, kind) in [
            ("0.1.2.3", "non-unicast"),
            ("198.18.0.1", "benchmarking"),
            ("198.19.255.1", "benchmarking"),
            ("240.0.0.1", "reserved"),
            ("192.0.0.8", "IETF protocol assignments"),
            ("fec0::1", "site-local"),
            // The metadata address behind NAT64, 6to4 and the IPv4-compatible form.
            ("64:ff9b::a9fe:a9fe", "cloud metadata"),
            ("2002:a9fe:a9fe::1", "cloud metadata"),
            ("::169.254.169.254", "cloud metadata"),
            ("::ffff:127.0.0.1", "loopback"),
            // A public IPv4 address through a translation prefix.
            ("64:ff9b::808:808", "NAT64"),
            ("2002:808:808::1", "6to4"),
        ] {
            assert_eq!(refused(host), Some(kind), "{host}");
        }
        for host in ["8.8.8.8", "198.20.0.1", "192.0.2.1", "2001:4860::8888", "::ffff:8.8.8.8"] {
            assert_eq!(refused(host), None, "{host}");
        }
        assert_eq!(refused("::1"), Some("loopback"));
        assert_eq!(refused("::"), Some("non-unicast"));
    }

    #[test]
    fn allowed_ranges_win_also_for_embedded_ipv4() {
        let allowed: Vec<IpNet> = vec!["10.0.0.0/8".parse().expect("net")];
        assert_eq!(refused_kind("10.1.2.3".parse().expect("ip"), &allowed), None);
        assert_eq!(refused_kind("::ffff:10.1.2.3".parse().expect("ip"), &allowed), None);
        assert_eq!(refused_kind("64:ff9b::a01:203".parse().expect("ip"), &allowed), None);
    }

    /// Issue 15, item 8: addresses a plugin reported were probed and handed
    /// out unchecked, so a plugin could point the health engine at the
    /// metadata service.
    #[test]
    fn reported_proxy_addresses_take_private_networks_and_refuse_the_rest() {
        for taken in ["10.1.2.3", "192.168.1.9", "100.64.0.7", "fd12::1", "203.0.113.7"] {
            assert_eq!(refused_proxy_address(ip(taken), &[]), None, "{taken}");
        }
        for (refused, why) in [
            ("169.254.169.254", "a cloud metadata address"),
            ("127.0.0.1", "a loopback address"),
            ("::ffff:169.254.169.254", "a cloud metadata address"),
            ("64:ff9b::a9fe:a9fe", "a cloud metadata address"),
            ("fe80::1", "a link-local address"),
            ("0.0.0.0", "a non-unicast address"),
        ] {
            assert_eq!(refused_proxy_address(ip(refused), &[]).as_deref(), Some(why), "{refused}");
        }
        let ranges: Vec<IpNet> = vec!["127.0.0.0/8".parse().expect("net")];
        assert_eq!(refused_proxy_address(ip("127.0.0.1"), &ranges), None);
        assert_eq!(
            refused_proxy_address(ip("10.1.2.3"), &ranges).as_deref(),
            Some("outside the entry's proxyAddresses")
        );
    }
}
