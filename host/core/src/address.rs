//! The address policy every part of proxyfleet judges IP addresses by:
//! which special-purpose range an address lies in, the cloud metadata
//! services wherever they hide, and IP literals read the way HTTP
//! transports read them.
//!
//! The plugins' HTTP grants, the proxy addresses plugins report, the
//! gateway's targets and a registry's redirects all ask [`classify`], so a
//! range added here is refused everywhere at once. A metadata address is
//! never admitted by a range that merely contains it ([`refused_kind`]):
//! `100.64.0.0/10` or `169.254.0.0/16` granted for other reasons must not
//! open the metadata service inside it.
//!
//! Transports dial an IP-literal host without asking the resolver, and
//! they parse URLs by the WHATWG rules, under which `127.1`, `2130706433`,
//! `0x7f.0.0.1` and `0177.0.0.1` are all 127.0.0.1. So every check reads a
//! host with the same rules ([`literal_ip`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

/// What kind of special-purpose address an address is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressKind {
    /// A cloud provider's instance metadata or host service
    /// ([`METADATA_V4`], [`METADATA_V6`]).
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
    /// 192.0.0.0/24, 2001::/23.
    IetfProtocol,
    /// 198.18.0.0/15.
    Benchmarking,
    /// 192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24, 2001:db8::/32,
    /// 3fff::/20.
    Documentation,
    /// 100::/64, discard-only.
    Discard,
    /// 240.0.0.0/4, 5f00::/16 (SRv6 SIDs).
    Reserved,
    /// fec0::/10.
    SiteLocal,
    /// A public IPv4 address written IPv4-compatible (::a.b.c.d).
    Ipv4Compatible,
    /// A public IPv4 address written IPv4-translated (::ffff:0:a.b.c.d).
    Ipv4Translated,
    /// A public IPv4 address behind a NAT64 prefix (64:ff9b::/96, and the
    /// local-use 64:ff9b:1::/48).
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
            Self::Documentation => "documentation",
            Self::Discard => "discard-only",
            Self::Reserved => "reserved",
            Self::SiteLocal => "site-local",
            Self::Ipv4Compatible => "IPv4-compatible",
            Self::Ipv4Translated => "IPv4-translated",
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

/// The IPv4 addresses of cloud metadata and host services: AWS, GCP,
/// Azure, Oracle, DigitalOcean, Hetzner and OpenStack instance metadata
/// (169.254.169.254), AWS ECS task metadata (169.254.170.2), EKS Pod
/// Identity (169.254.170.23), Alibaba Cloud (100.100.100.200), Tencent
/// Cloud (169.254.0.23), Oracle Cloud's legacy address (192.0.0.192) and
/// Azure's WireServer (168.63.129.16, in public space).
pub const METADATA_V4: [Ipv4Addr; 7] = [
    Ipv4Addr::new(169, 254, 169, 254),
    Ipv4Addr::new(169, 254, 170, 2),
    Ipv4Addr::new(169, 254, 170, 23),
    Ipv4Addr::new(100, 100, 100, 200),
    Ipv4Addr::new(169, 254, 0, 23),
    Ipv4Addr::new(192, 0, 0, 192),
    Ipv4Addr::new(168, 63, 129, 16),
];

/// The IPv6 addresses of cloud metadata services: AWS's instance metadata
/// (fd00:ec2::254) and EKS Pod Identity (fd00:ec2::23), and GCE's
/// metadata server (fd20:ce::254).
pub const METADATA_V6: [Ipv6Addr; 3] = [
    Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254),
    Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x23),
    Ipv6Addr::new(0xfd20, 0xce, 0, 0, 0, 0, 0, 0x254),
];

/// The names cloud metadata services answer to: GCE's
/// (`metadata.google.internal`, `metadata.goog`, and the bare `metadata`
/// its search path completes), AWS's (`instance-data`,
/// `instance-data.ec2.internal`), Tencent Cloud's and Equinix Metal's.
pub const METADATA_NAMES: [&str; 7] = [
    "metadata.google.internal",
    "metadata.goog",
    "metadata",
    "instance-data",
    "instance-data.ec2.internal",
    "metadata.tencentyun.com",
    "metadata.platformequinix.com",
];

/// Whether `host` (a DNS name, any case, with or without the root's
/// trailing dot) names a cloud metadata service.
pub fn is_metadata_name(host: &str) -> bool {
    let host = host.strip_suffix('.').unwrap_or(host);
    METADATA_NAMES.iter().any(|name| name.eq_ignore_ascii_case(host))
}

/// The special-purpose kind of `ip`, or `None` for an ordinary public
/// address. An IPv4 address written as IPv6 (mapped, translated,
/// compatible, NAT64, 6to4) reaches that IPv4 address, so it is judged as
/// one; the translation prefixes are a kind of their own even around a
/// public IPv4 address.
pub fn classify(ip: IpAddr) -> Option<AddressKind> {
    if let IpAddr::V6(v6) = ip
        && let Some((v4, prefix)) = embedded_v4(v6)
    {
        return classify_v4(v4).or(prefix);
    }
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

/// Why `ip` is refused (the kind of address), or `None` when it may be
/// reached. `allowed` ranges are reachable, with one exception: a cloud
/// metadata address only when an entry of `allowed` names exactly that
/// address, never through a wider range around it.
pub fn refused_kind(ip: IpAddr, allowed: &[IpNet]) -> Option<AddressKind> {
    let kind = classify(ip);
    let inner = embedded_ipv4(ip).map(IpAddr::V4);
    let candidates = [Some(ip), inner];
    let candidates = candidates.iter().flatten();
    if kind == Some(AddressKind::CloudMetadata) {
        let named = candidates.into_iter().any(|candidate| {
            allowed
                .iter()
                .any(|net| net.prefix_len() == net.max_prefix_len() && net.addr() == *candidate)
        });
        return (!named).then_some(AddressKind::CloudMetadata);
    }
    if candidates.into_iter().any(|candidate| allowed.iter().any(|net| net.contains(candidate))) {
        return None;
    }
    kind
}

/// The IPv4 address an IPv6 address reaches when it carries one (mapped,
/// translated, compatible, NAT64, 6to4); `None` otherwise. Ranges written
/// as IPv4 hold such an address too.
pub fn embedded_ipv4(ip: IpAddr) -> Option<Ipv4Addr> {
    match ip {
        IpAddr::V6(v6) => embedded_v4(v6).map(|(v4, _)| v4),
        IpAddr::V4(_) => None,
    }
}

/// Whether `ip` is a cloud metadata address in any of its spellings.
pub fn is_metadata(ip: IpAddr) -> bool {
    classify(ip) == Some(AddressKind::CloudMetadata)
}

/// Why a proxy address a plugin reports is refused, or `None` when the
/// health engine may probe it and the discovery API hand it out. A cloud
/// metadata address is always refused. With `ranges` (the entry's
/// `proxyAddresses`), exactly those ranges are taken. Without, private
/// networks are taken (most proxies live there) and every other
/// special-purpose address is refused: loopback, link-local, documentation
/// and the rest, also written as IPv6.
pub fn refused_proxy_address(ip: IpAddr, ranges: &[IpNet]) -> Option<String> {
    if is_metadata(ip) {
        return Some(format!("a {} address", AddressKind::CloudMetadata));
    }
    if !ranges.is_empty() {
        return (!ranges.iter().any(|net| net.contains(&ip)))
            .then(|| "outside the entry's proxyAddresses".to_owned());
    }
    classify(ip).filter(|kind| !kind.is_private_network()).map(|kind| format!("a {kind} address"))
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

/// The IPv4 address an IPv6 address carries in one of the forms that
/// reach it, with the kind of the translation prefix it goes through:
/// those are refused even around a public IPv4 address; a mapped address
/// has none.
fn embedded_v4(v6: Ipv6Addr) -> Option<(Ipv4Addr, Option<AddressKind>)> {
    let s = v6.segments();
    let low = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    if let Some(mapped) = v6.to_ipv4_mapped() {
        Some((mapped, None))
    } else if s[..6] == [0, 0, 0, 0, 0xffff, 0] {
        // IPv4-translated (::ffff:0:a.b.c.d, RFC 2765).
        Some((low, Some(AddressKind::Ipv4Translated)))
    } else if s[..6] == [0, 0, 0, 0, 0, 0] && !(s[6] == 0 && s[7] <= 1) {
        // IPv4-compatible (::a.b.c.d); `::` and `::1` are IPv6's own.
        Some((low, Some(AddressKind::Ipv4Compatible)))
    } else if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] || s[..3] == [0x64, 0xff9b, 1] {
        // The well-known NAT64 prefix and the local-use one (RFC 8215),
        // whose operators most often take a /96 in it.
        Some((low, Some(AddressKind::Nat64)))
    } else if s[0] == 0x2002 {
        let v4 = Ipv4Addr::new((s[1] >> 8) as u8, s[1] as u8, (s[2] >> 8) as u8, s[2] as u8);
        Some((v4, Some(AddressKind::SixToFour)))
    } else {
        None
    }
}

fn classify_v4(ip: Ipv4Addr) -> Option<AddressKind> {
    let [a, b, c, _] = ip.octets();
    if METADATA_V4.contains(&ip) {
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
    } else if (a, b, c) == (192, 0, 2) || (a, b, c) == (198, 51, 100) || (a, b, c) == (203, 0, 113)
    {
        Some(AddressKind::Documentation)
    } else if a == 198 && (b & 0xfe) == 18 {
        Some(AddressKind::Benchmarking)
    } else if a >= 240 {
        Some(AddressKind::Reserved)
    } else {
        None
    }
}

fn classify_v6(ip: Ipv6Addr) -> Option<AddressKind> {
    let s = ip.segments();
    if METADATA_V6.contains(&ip) {
        Some(AddressKind::CloudMetadata)
    } else if ip.is_loopback() {
        Some(AddressKind::Loopback)
    } else if ip.is_unique_local() {
        Some(AddressKind::Private)
    } else if ip.is_unicast_link_local() {
        Some(AddressKind::LinkLocal)
    } else if (s[0] & 0xffc0) == 0xfec0 {
        Some(AddressKind::SiteLocal)
    } else if ip.is_unspecified() || ip.is_multicast() {
        Some(AddressKind::NonUnicast)
    } else if s[..4] == [0x100, 0, 0, 0] {
        Some(AddressKind::Discard)
    } else if (s[0], s[1]) == (0x2001, 0xdb8) || (s[0] == 0x3fff && s[1] < 0x1000) {
        Some(AddressKind::Documentation)
    } else if s[0] == 0x2001 && s[1] < 0x200 {
        Some(AddressKind::IetfProtocol)
    } else if s[0] == 0x5f00 {
        Some(AddressKind::Reserved)
    } else {
        None
    }
}

#[cfg(test)]
mod tests;
