use std::collections::HashMap;

use super::*;

/// Names resolved from a table; anything else does not exist.
#[derive(Debug, Default)]
pub(crate) struct Table(pub(crate) HashMap<&'static str, Vec<IpAddr>>);

#[async_trait]
impl Resolve for Table {
    async fn resolve(&self, host: &str) -> std::io::Result<Vec<IpAddr>> {
        self.0.get(host).cloned().ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::NotFound, "no such name in the table")
        })
    }
}

fn ip(text: &str) -> IpAddr {
    text.parse().expect("an IP address")
}

async fn target(
    policy: &TargetPolicy,
    table: &Table,
    host: &str,
) -> Result<SocketAddr, TargetRefusal> {
    policy.target(table, host, 80, Duration::from_secs(1)).await
}

/// Issue 43, item 1: through the gateway a crawler reached the metadata
/// service (by address, by name, in decimal), AWS's IPv6 metadata address,
/// Alibaba's 100.100.100.200 and the gateway's own address.
#[tokio::test]
async fn issue_43_item_1_metadata_and_special_targets_are_refused_in_every_spelling() {
    let table = Table(HashMap::from([
        ("rebind.test", vec![ip("169.254.169.254")]),
        ("alibaba.test", vec![ip("100.100.100.200")]),
        ("site.test", vec![ip("93.184.215.14")]),
        ("mixed.test", vec![ip("10.0.0.1"), ip("93.184.215.15")]),
    ]));
    let policy = TargetPolicy::default();
    for host in [
        "169.254.169.254",
        "2852039166",
        "0xa9.0xfe.0xa9.0xfe",
        "0251.0376.0251.0376",
        "169.254.43518",
        "[fd00:ec2::254]",
        "[::ffff:169.254.169.254]",
        "[::ffff:0:a9fe:a9fe]",
        "[64:ff9b::a9fe:a9fe]",
        "100.100.100.200",
        "rebind.test",
        "alibaba.test",
    ] {
        let refusal = target(&policy, &table, host).await.expect_err(host);
        assert!(
            matches!(
                refusal,
                TargetRefusal::Prohibited {
                    why: Prohibited::Special(AddressKind::CloudMetadata),
                    ..
                }
            ),
            "{host}: {refusal:?}"
        );
        assert_eq!(refusal.error_type(), "destination_ip_prohibited");
    }
    for name in
        ["metadata.google.internal", "METADATA.GOOGLE.INTERNAL.", "metadata", "instance-data"]
    {
        let refusal = target(&policy, &table, name).await.expect_err(name);
        assert_eq!(refusal, TargetRefusal::MetadataName(name.to_owned()));
    }
    // Even a range that holds them does not open them.
    let wide =
        TargetPolicy { allow: vec!["0.0.0.0/0".parse().unwrap()], ..TargetPolicy::default() };
    assert!(target(&wide, &table, "169.254.169.254").await.is_err());
    assert!(target(&wide, &table, "100.100.100.200").await.is_err());
    assert_eq!(
        target(&wide, &table, "100.100.100.201").await,
        Ok("100.100.100.201:80".parse().unwrap())
    );
    // The first allowed address is the target, pinned.
    assert_eq!(target(&policy, &table, "site.test").await, Ok("93.184.215.14:80".parse().unwrap()));
    assert_eq!(
        target(&policy, &table, "mixed.test").await,
        Ok("93.184.215.15:80".parse().unwrap())
    );
    let refusal = target(&policy, &table, "nowhere.test").await.expect_err("unresolved");
    assert_eq!(refusal.error_type(), "dns_error");
}

#[tokio::test]
async fn loopback_private_and_link_local_need_allow_targets_and_deny_wins() {
    let table = Table::default();
    let policy = TargetPolicy::default();
    for host in
        ["127.0.0.1", "[::1]", "10.1.2.3", "192.168.1.1", "169.254.1.1", "[fe80::1]", "0.0.0.0"]
    {
        assert!(target(&policy, &table, host).await.is_err(), "{host}");
    }
    let allowing = TargetPolicy {
        allow: vec!["127.0.0.0/8".parse().unwrap(), "10.0.0.0/8".parse().unwrap()],
        deny: vec!["10.96.0.0/12".parse().unwrap()],
        ..TargetPolicy::default()
    };
    assert!(target(&allowing, &table, "127.0.0.1").await.is_ok());
    assert!(target(&allowing, &table, "10.1.2.3").await.is_ok());
    let refusal = target(&allowing, &table, "10.96.0.1").await.expect_err("the service range");
    assert!(
        matches!(refusal, TargetRefusal::Prohibited { why: Prohibited::Denied, .. }),
        "{refusal:?}"
    );
    // Every IPv6 form that reaches the service range is denied with it.
    for spelling in ["[::ffff:10.96.0.1]", "[64:ff9b::a60:1]", "[::ffff:0:a60:1]"] {
        let refusal = target(&allowing, &table, spelling).await.expect_err(spelling);
        assert!(
            matches!(refusal, TargetRefusal::Prohibited { why: Prohibited::Denied, .. }),
            "{spelling}: {refusal:?}"
        );
    }
    // A public address in the deny list.
    let denying =
        TargetPolicy { deny: vec!["93.184.215.0/24".parse().unwrap()], ..TargetPolicy::default() };
    assert!(target(&denying, &table, "93.184.215.14").await.is_err());
}

#[tokio::test]
async fn the_operators_own_listeners_are_refused_even_inside_allowed_ranges() {
    let table = Table::default();
    let own = OwnAddresses::new(
        vec!["127.0.0.1:8481".parse().unwrap(), "0.0.0.0:8480".parse().unwrap()],
        vec![ip("10.0.0.9")],
    );
    let policy = TargetPolicy {
        allow: vec!["127.0.0.0/8".parse().unwrap(), "10.0.0.0/8".parse().unwrap()],
        deny: Vec::new(),
        own,
    };
    // Every IPv6 spelling of an own address is that address: mapped,
    // NAT64 and 6to4.
    for host in [
        "127.0.0.1:8481",
        "127.0.0.1:8480",
        "127.0.0.2:8480",
        "10.0.0.9:443",
        "[::ffff:10.0.0.9]:443",
        "[64:ff9b::a00:9]:443",
        "[2002:a00:9::1]:443",
        "[::ffff:127.0.0.1]:8481",
    ] {
        let (host, port) = host.rsplit_once(':').unwrap();
        let refusal = policy
            .target(&table, host, port.parse().unwrap(), Duration::from_secs(1))
            .await
            .expect_err(host);
        assert!(
            matches!(refusal, TargetRefusal::Prohibited { why: Prohibited::Own, .. }),
            "{refusal:?}"
        );
    }
    // Another port on loopback is somebody else's server.
    assert!(policy.target(&table, "127.0.0.1", 18080, Duration::from_secs(1)).await.is_ok());
    assert!(policy.target(&table, "127.0.0.2", 8481, Duration::from_secs(1)).await.is_ok());
}
