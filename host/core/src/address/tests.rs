use super::*;

fn ip(text: &str) -> IpAddr {
    text.parse().expect("an IP address")
}

fn net(text: &str) -> IpNet {
    text.parse().expect("a CIDR range")
}

fn refused(host: &str) -> Option<&'static str> {
    refused_kind(literal_ip(host).expect("an IP literal"), &[]).map(AddressKind::as_str)
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
    assert_eq!(refused_kind(ip("8.8.8.8"), &[]), None);
    assert_eq!(refused_kind(ip("2001:4860::8888"), &[]), None);
}

#[test]
fn a_granted_range_allows_exactly_that_range() {
    let allowed = [net("127.0.0.0/8")];
    assert_eq!(refused_kind(ip("127.0.0.1"), &allowed), None);
    assert_eq!(refused_kind(ip("::ffff:127.0.0.1"), &allowed), None);
    assert_eq!(refused_kind(ip("10.0.0.1"), &allowed), Some(AddressKind::Private));
    assert_eq!(refused_kind(ip("::1"), &allowed), Some(AddressKind::Loopback));
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

/// The ranges that were treated as public before the first review.
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
    for host in ["8.8.8.8", "198.20.0.1", "2001:4860::8888", "::ffff:8.8.8.8", "2001:200::1"] {
        assert_eq!(refused(host), None, "{host}");
    }
    assert_eq!(refused("::1"), Some("loopback"));
    assert_eq!(refused("::"), Some("non-unicast"));
}

/// Issue 43, item 4: documentation, discard, IETF, SRv6, local-use NAT64
/// and IPv4-translated addresses were taken as public, so a provider could
/// report `::ffff:0:a9fe:a9fe` or `64:ff9b:1::a9fe:a9fe` (the metadata
/// address on a translating network) and have it kept.
#[test]
fn issue_43_item_4_the_special_ranges_the_first_pass_missed_are_refused() {
    for (host, kind) in [
        ("192.0.2.1", "documentation"),
        ("198.51.100.7", "documentation"),
        ("203.0.113.9", "documentation"),
        ("2001:db8::1", "documentation"),
        ("3fff::1", "documentation"),
        ("3fff:fff:ffff::1", "documentation"),
        ("100::1", "discard-only"),
        ("2001::1", "IETF protocol assignments"),
        ("2001:1ff:ffff::1", "IETF protocol assignments"),
        ("5f00::1", "reserved"),
        ("64:ff9b:1::808:808", "NAT64"),
        ("::ffff:0:808:808", "IPv4-translated"),
        ("::ffff:0:a9fe:a9fe", "cloud metadata"),
        ("64:ff9b:1::a9fe:a9fe", "cloud metadata"),
        ("::ffff:0:7f00:1", "loopback"),
    ] {
        assert_eq!(refused(host), Some(kind), "{host}");
    }
    // Just outside them.
    for host in ["192.0.3.1", "203.0.114.1", "3fff:1000::1", "2001:db9::1", "5f01::1", "101::1"] {
        assert_eq!(refused(host), None, "{host}");
    }
    for reported in ["::ffff:0:a9fe:a9fe", "64:ff9b:1::a9fe:a9fe", "192.0.2.1", "2001:db8::1"] {
        assert!(refused_proxy_address(ip(reported), &[]).is_some(), "{reported}");
    }
}

/// Issue 43, item 5: shared address space was taken as a private network
/// for proxies, so a reported 100.100.100.200 (Alibaba Cloud's metadata
/// service) was probed and handed out; and a range granted for other
/// reasons opened the metadata address inside it.
#[test]
fn issue_43_item_5_metadata_addresses_are_refused_inside_allowed_ranges() {
    for metadata in [
        "169.254.169.254",
        "100.100.100.200",
        "169.254.170.2",
        "169.254.170.23",
        "169.254.0.23",
        "192.0.0.192",
        "168.63.129.16",
        "fd00:ec2::254",
        "fd00:ec2::23",
        "fd20:ce::254",
        "::ffff:100.100.100.200",
        "64:ff9b::6464:64c8",
    ] {
        assert_eq!(refused(metadata), Some("cloud metadata"), "{metadata}");
        assert!(is_metadata(ip(metadata)), "{metadata}");
        let reported = refused_proxy_address(ip(metadata), &[]);
        assert_eq!(reported.as_deref(), Some("a cloud metadata address"), "{metadata}");
        let wide = [net("0.0.0.0/0"), net("::/0")];
        let reported = refused_proxy_address(ip(metadata), &wide);
        assert_eq!(reported.as_deref(), Some("a cloud metadata address"), "{metadata}");
        assert_eq!(refused_kind(ip(metadata), &wide), Some(AddressKind::CloudMetadata));
    }
    let cgnat = [net("100.64.0.0/10")];
    assert_eq!(refused_kind(ip("100.100.100.200"), &cgnat), Some(AddressKind::CloudMetadata));
    assert_eq!(refused_kind(ip("100.100.100.201"), &cgnat), None);
    // Named exactly, it is the grant's intent.
    let exact = [net("169.254.169.254/32")];
    assert_eq!(refused_kind(ip("169.254.169.254"), &exact), None);
    assert_eq!(refused_kind(ip("::ffff:169.254.169.254"), &exact), None);
    assert_eq!(
        refused_kind(ip("169.254.169.254"), &[net("169.254.0.0/16")]),
        Some(AddressKind::CloudMetadata)
    );
    // Other CGNAT addresses are still a private network for proxies.
    assert_eq!(refused_proxy_address(ip("100.64.0.7"), &[]), None);
}

#[test]
fn metadata_names_in_any_case_and_with_the_root_dot() {
    for name in [
        "metadata.google.internal",
        "METADATA.Google.Internal.",
        "metadata",
        "metadata.goog",
        "instance-data",
        "instance-data.ec2.internal.",
        "metadata.tencentyun.com",
    ] {
        assert!(is_metadata_name(name), "{name}");
    }
    for name in ["metadata.example.com", "google.internal", "metadata..", "example.com"] {
        assert!(!is_metadata_name(name), "{name}");
    }
}

#[test]
fn allowed_ranges_win_also_for_embedded_ipv4() {
    let allowed = [net("10.0.0.0/8")];
    assert_eq!(refused_kind(ip("10.1.2.3"), &allowed), None);
    assert_eq!(refused_kind(ip("::ffff:10.1.2.3"), &allowed), None);
    assert_eq!(refused_kind(ip("64:ff9b::a01:203"), &allowed), None);
}

/// Issue 15, item 8: addresses a plugin reported were probed and handed
/// out unchecked, so a plugin could point the health engine at the
/// metadata service.
#[test]
fn reported_proxy_addresses_take_private_networks_and_refuse_the_rest() {
    for taken in ["10.1.2.3", "192.168.1.9", "100.64.0.7", "fd12::1", "8.8.4.4"] {
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
    let ranges = [net("127.0.0.0/8")];
    assert_eq!(refused_proxy_address(ip("127.0.0.1"), &ranges), None);
    assert_eq!(
        refused_proxy_address(ip("10.1.2.3"), &ranges).as_deref(),
        Some("outside the entry's proxyAddresses")
    );
}
