//! The gateway on loopback, against small upstream proxies written here:
//! each answers an absolute-form request with its own name, the URL and
//! the credential it was sent, 403 for a URL with `banned` in it, 407 for
//! one with `auth-only` in it sent without a credential, and CONNECT with a
//! tunnel that echoes.
//! The tests in `tests/` run it against tinyproxy.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use proxyfleet_metrics::Metrics;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

use super::*;
use crate::catalog::FleetSettings;
use crate::catalog::tests::MemberBuilder;

/// An upstream proxy named `name`, until the task is aborted.
async fn upstream(name: &'static str) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            tokio::spawn(serve_one(stream, name));
        }
    });
    (addr, task)
}

async fn serve_one(mut stream: TcpStream, name: &str) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte).await.unwrap_or(0) == 0 {
            return;
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let target = head.split(' ').nth(1).unwrap_or_default().to_owned();
    if head.starts_with("CONNECT ") {
        let _ = stream.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").await;
        let (mut read, mut write) = stream.split();
        let _ = tokio::io::copy(&mut read, &mut write).await;
        return;
    }
    let auth = head
        .lines()
        .find_map(|line| {
            line.to_ascii_lowercase().strip_prefix("proxy-authorization: ").map(|_| {
                line.split_once(": ").map(|(_, value)| format!(" {value}")).unwrap_or_default()
            })
        })
        .unwrap_or_default();
    let status = if target.contains("banned") {
        "403 Forbidden"
    } else if target.contains("auth-only") && auth.is_empty() {
        "407 Proxy Authentication Required"
    } else {
        "200 OK"
    };
    let body = format!("{name} {target}{auth}");
    let answer = format!(
        "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(answer.as_bytes()).await;
}

struct Setup {
    fleet: Arc<Fleet>,
    addr: SocketAddr,
    _token_dir: tempfile::TempDir,
}

/// A gateway over a healthy fleet of `members`, with the tokens `s3cret`
/// and `other-token`.
async fn gateway(members: Vec<crate::Member>) -> Setup {
    let settings =
        GatewaySettings { connect_timeout: Duration::from_secs(2), ..GatewaySettings::default() };
    gateway_with(members, settings).await
}

/// The names the tests send requests for, all on loopback, which the
/// tests' gateways allow as a target.
fn resolver() -> Arc<target::tests::Table> {
    let loopback = vec![IpAddr::from([127, 0, 0, 1])];
    Arc::new(target::tests::Table(
        ["site.test", "shop.test", "news.test"]
            .into_iter()
            .map(|name| (name, loopback.clone()))
            .collect(),
    ))
}

/// As [`gateway`], with `settings` (loopback targets allowed).
async fn gateway_with(members: Vec<crate::Member>, mut settings: GatewaySettings) -> Setup {
    settings.targets.allow.push("127.0.0.0/8".parse().unwrap());
    let fleet = Arc::new(Fleet::new(FleetSettings::default(), Arc::new(Metrics::new())));
    fleet.publish(members);
    let results = fleet
        .probe_targets()
        .into_iter()
        .map(|(id, e)| {
            let pass = crate::probe::ProbePass { latency: Duration::from_millis(1), exit_ip: None };
            (id, e, Ok(pass))
        })
        .collect();
    fleet.record_probes(results, 1, 1);
    fleet.set_ready(true);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokens");
    std::fs::write(&file, "s3cret\nother-token\n").unwrap();
    let auth = Arc::new(ApiAuth::from_file(file, false).unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    settings.targets.own = target::OwnAddresses::new(vec![addr], Vec::new());
    let gateway =
        Arc::new(Gateway::new(Arc::clone(&fleet), auth, settings).with_resolver(resolver()));
    tokio::spawn(serve(listener, gateway, std::future::pending()));
    Setup { fleet, addr, _token_dir: dir }
}

/// The first `Some` of `attempt`, tried every 50 ms for at most `budget`.
async fn eventually<T, F: Future<Output = Option<T>>>(
    budget: Duration,
    mut attempt: impl FnMut() -> F,
) -> Option<T> {
    let deadline = tokio::time::Instant::now() + budget;
    loop {
        if let Some(done) = attempt().await {
            return Some(done);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn client(gateway: SocketAddr, username: &str, password: &str) -> reqwest::Client {
    let proxy =
        reqwest::Proxy::all(format!("http://{gateway}")).unwrap().basic_auth(username, password);
    reqwest::Client::builder().proxy(proxy).build().unwrap()
}

async fn get(client: &reqwest::Client, url: &str) -> (u16, String, String) {
    let response = client.get(url).send().await.unwrap();
    let status = response.status().as_u16();
    let proxy = response
        .headers()
        .get(PROXY_HEADER)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (status, proxy, response.text().await.unwrap())
}

#[tokio::test]
async fn a_request_goes_through_a_fleet_proxy_named_in_the_answer() {
    let (a, _a) = upstream("a").await;
    let setup = gateway(vec![MemberBuilder::new(1).endpoint(a).pool("default/web").build()]).await;
    let client = client(setup.addr, "pool=default.web", "s3cret");
    let (status, proxy, body) = get(&client, "http://site.test/page?q=1").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(proxy, "uid-1");
    assert_eq!(body, "a http://127.0.0.1:80/page?q=1", "the credentials stay at the gateway");
    let text = setup.fleet.metrics().encode();
    for line in [
        r#"proxyfleet_gateway_requests_total{pool="default/web",kind="http"} 1"#,
        r#"proxyfleet_gateway_bytes_received_total{pool="default/web"} 30"#,
        "proxyfleet_gateway_added_seconds_count 1",
    ] {
        assert!(text.contains(line), "{line} missing from:\n{text}");
    }
}

#[tokio::test]
async fn missing_or_wrong_credentials_get_407_and_bad_routing_names_the_key() {
    let (a, _a) = upstream("a").await;
    let setup = gateway(vec![MemberBuilder::new(1).endpoint(a).build()]).await;
    let anonymous = reqwest::Client::builder()
        .proxy(reqwest::Proxy::all(format!("http://{}", setup.addr)).unwrap())
        .build()
        .unwrap();
    let response = anonymous.get("http://site.test/").send().await.unwrap();
    assert_eq!(response.status(), 407);
    assert_eq!(response.headers()["proxy-authenticate"], "Basic realm=\"proxyfleet\"");
    assert!(response.text().await.unwrap().contains("API token as the proxy password"));
    let (status, _, body) = get(&client(setup.addr, "", "wrong"), "http://site.test/").await;
    assert_eq!(status, 407);
    assert!(body.contains("not a token from the API token file"), "{body}");
    let (status, _, body) =
        get(&client(setup.addr, "country=us", "s3cret"), "http://site.test/").await;
    assert_eq!(status, 400);
    assert!(body.contains("country: is not a routing key"), "{body}");
    let (status, _, body) =
        get(&client(setup.addr, "pool=default.nope", "s3cret"), "http://site.test/").await;
    assert_eq!(status, 404);
    assert!(body.contains("pool \\\"default/nope\\\" is unknown"), "{body}");
    let text = setup.fleet.metrics().encode();
    assert!(text.contains(r#"proxyfleet_gateway_refused_total{reason="auth"} 2"#), "{text}");
    assert!(text.contains(r#"proxyfleet_gateway_refused_total{reason="routing"} 2"#), "{text}");
}

#[tokio::test]
async fn a_session_sticks_to_its_proxy_and_others_spread() {
    let (a, _a) = upstream("a").await;
    let (b, _b) = upstream("b").await;
    let setup = gateway(vec![
        MemberBuilder::new(1).endpoint(a).build(),
        MemberBuilder::new(2).endpoint(b).build(),
    ])
    .await;
    let sticky = client(setup.addr, "session=crawl-7", "s3cret");
    let (_, first, _) = get(&sticky, "http://site.test/").await;
    for _ in 0..6 {
        assert_eq!(get(&sticky, "http://site.test/").await.1, first);
    }
    let spread = client(setup.addr, "", "s3cret");
    let mut seen = std::collections::HashSet::new();
    for _ in 0..4 {
        seen.insert(get(&spread, "http://site.test/").await.1);
    }
    assert_eq!(seen.len(), 2, "round-robin without a session: {seen:?}");
    // Released, the session may land anywhere, and then sticks again.
    setup.fleet.release("session-crawl-7").await.unwrap();
    assert!(setup.fleet.leases().is_empty(), "released");
    let (_, again, _) = get(&sticky, "http://site.test/").await;
    assert_eq!(get(&sticky, "http://site.test/").await.1, again);
}

#[tokio::test]
async fn a_ban_status_bans_the_proxy_for_that_site_only() {
    let (a, _a) = upstream("a").await;
    let setup = gateway(vec![MemberBuilder::new(1).endpoint(a).build()]).await;
    let client = client(setup.addr, "", "s3cret");
    let (status, proxy, _) = get(&client, "http://shop.test/banned").await;
    assert_eq!((status, proxy.as_str()), (403, "uid-1"), "the site's answer is passed on");
    let (status, _, body) = get(&client, "http://shop.test/other").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("site shop.test"), "{body}");
    let (status, proxy, _) = get(&client, "http://news.test/").await;
    assert_eq!((status, proxy.as_str()), (200, "uid-1"), "other sites keep the proxy");
    let view = setup.fleet.get("uid-1").unwrap();
    assert_eq!(view.banned_sites[0].site, "shop.test");
}

#[tokio::test]
async fn an_unreachable_proxy_is_reported_and_the_request_goes_to_another() {
    let (b, _b) = upstream("b").await;
    // An address nothing listens on.
    let dead = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let setup = gateway(vec![
        MemberBuilder::new(1).endpoint(dead).build(),
        MemberBuilder::new(2).endpoint(b).build(),
    ])
    .await;
    let client = client(setup.addr, "strategy=least-recently-used", "s3cret");
    for _ in 0..4 {
        let (status, proxy, body) = get(&client, "http://site.test/").await;
        assert_eq!((status, proxy.as_str()), (200, "uid-2"), "{body}");
    }
    let health = setup.fleet.health("uid-1").unwrap();
    assert!(health.failures >= 1, "{health:?}");
    let text = setup.fleet.metrics().encode();
    assert!(text.contains(r#"proxyfleet_gateway_upstream_errors_total{pool=""}"#), "{text}");
    let failed = setup.fleet.metrics().gateway().upstream_totals(None, "default/proxy-1");
    assert!(failed.errors >= 1, "the console sees the upstream's errors: {failed:?}");
    assert!(text.contains(r#"proxyfleet_gateway_retries_total{pool=""}"#), "{text}");
}

/// A CONNECT to `site.test:443` through the gateway at `addr` with the
/// token `s3cret`: the connection and the answer's head.
async fn open_tunnel(addr: SocketAddr) -> (TcpStream, String) {
    tunnel_to(addr, "site.test:443", "s3cret").await
}

/// A CONNECT to `target` through the gateway at `addr` with `token`.
async fn tunnel_to(addr: SocketAddr, target: &str, token: &str) -> (TcpStream, String) {
    let credentials = base64::engine::general_purpose::STANDARD.encode(format!(":{token}"));
    let head = format!(
        "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: Basic {credentials}\r\n\r\n"
    );
    raw(addr, &head).await
}

/// Sends `head` on a new connection to `addr`: the connection and the
/// answer's head.
async fn raw(addr: SocketAddr, head: &str) -> (TcpStream, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let mut byte = [0u8; 1];
    while !answer.ends_with(b"\r\n\r\n") {
        assert_eq!(stream.read(&mut byte).await.unwrap(), 1, "closed: {answer:?}");
        answer.push(byte[0]);
    }
    (stream, String::from_utf8(answer).unwrap())
}

#[tokio::test]
async fn a_connect_tunnel_carries_bytes_both_ways() {
    let (a, _a) = upstream("a").await;
    let setup = gateway(vec![MemberBuilder::new(1).endpoint(a).build()]).await;
    let (mut stream, answer) = open_tunnel(setup.addr).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.to_ascii_lowercase().contains("x-proxyfleet-proxy: uid-1"), "{answer}");
    stream.write_all(b"hello through the tunnel").await.unwrap();
    let mut echoed = [0u8; 24];
    stream.read_exact(&mut echoed).await.unwrap();
    assert_eq!(&echoed, b"hello through the tunnel");
    // Counted as the bytes pass: no need for the tunnel to end well.
    let text = setup.fleet.metrics().encode();
    for line in [
        r#"proxyfleet_gateway_requests_total{pool="",kind="connect"} 1"#,
        r#"proxyfleet_gateway_bytes_sent_total{pool=""} 24"#,
        r#"proxyfleet_gateway_bytes_received_total{pool=""} 24"#,
    ] {
        assert!(text.contains(line), "{line} missing from:\n{text}");
    }
    drop(stream);
}

/// A tunnel that carries nothing for the idle timeout is closed; one that
/// keeps talking stays open past it.
#[tokio::test]
async fn an_idle_tunnel_is_closed_and_a_busy_one_is_not() {
    let (a, _a) = upstream("a").await;
    let settings = GatewaySettings {
        connect_timeout: Duration::from_secs(2),
        // Ten times the busy tunnel's pause, so a slow machine does not
        // close that one.
        tunnel_idle_timeout: Duration::from_secs(1),
        ..GatewaySettings::default()
    };
    let setup = gateway_with(vec![MemberBuilder::new(1).endpoint(a).build()], settings).await;
    let (mut busy, _) = open_tunnel(setup.addr).await;
    let (mut idle, _) = open_tunnel(setup.addr).await;
    // Echoes every 100 ms for 2.5 s: two and a half idle timeouts' worth.
    for _ in 0..25 {
        busy.write_all(b"ping").await.unwrap();
        let mut echoed = [0u8; 4];
        busy.read_exact(&mut echoed).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The idle one was closed by the gateway meanwhile: its read ends.
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), idle.read_to_end(&mut rest)).await;
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "the idle tunnel is still open: {read:?}");
    busy.write_all(b"ping").await.unwrap();
    let mut echoed = [0u8; 4];
    busy.read_exact(&mut echoed).await.unwrap();
    assert_eq!(&echoed, b"ping", "the busy tunnel is still open");
}

#[tokio::test]
async fn an_origin_form_request_is_told_this_is_a_proxy() {
    let setup = gateway(Vec::new()).await;
    let credentials = base64::engine::general_purpose::STANDARD.encode(":s3cret");
    let response = reqwest::Client::new()
        .get(format!("http://{}/", setup.addr))
        .header("proxy-authorization", format!("Basic {credentials}"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    assert!(response.text().await.unwrap().contains("this is a proxy"));
}

#[tokio::test]
async fn an_authenticated_upstream_gets_the_proxys_credential_and_never_the_crawlers() {
    let (a, _a) = upstream("a").await;
    let (b, _b) = upstream("b").await;
    let credential = proxyfleet_core::credential::ProxyCredential::parse("up:stream").unwrap();
    let mut with = MemberBuilder::new(1).endpoint(a).pool("default/auth").build();
    with.endpoint = with.endpoint.map(|e| e.with_credential(Some(credential)));
    let without = MemberBuilder::new(2).endpoint(b).pool("default/open").build();
    let setup = gateway(vec![with, without]).await;
    let (status, _, body) =
        get(&client(setup.addr, "pool=default.auth", "s3cret"), "http://site.test/auth-only").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body, "a http://127.0.0.1:80/auth-only Basic dXA6c3RyZWFt",
        "the Proxy's credential"
    );
    // A proxy that wants a credential its Proxy does not name: a 502 for
    // the crawler, not a 407 that would blame the crawler's credentials.
    let (status, proxy, body) =
        get(&client(setup.addr, "pool=default.open", "s3cret"), "http://site.test/auth-only").await;
    assert_eq!((status, proxy.as_str()), (502, "uid-2"), "{body}");
    assert!(body.contains("answered 407"), "{body}");
    let (_, _, body) =
        get(&client(setup.addr, "pool=default.open", "s3cret"), "http://site.test/").await;
    assert_eq!(body, "b http://127.0.0.1:80/", "the crawler's own credentials stay at the gateway");
}

/// An upstream that accepts and then never answers held the request until
/// shutdown: the answer now has a budget, and a request that may be sent
/// again goes to another proxy.
#[tokio::test]
async fn regression_a_stalled_upstream_is_reported_and_the_request_goes_elsewhere() {
    let stalled = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let stalled_addr = stalled.local_addr().unwrap();
    let _held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((stream, _)) = stalled.accept().await {
            open.push(stream);
        }
    });
    let (b, _b) = upstream("b").await;
    let settings = GatewaySettings {
        response_timeout: Duration::from_millis(300),
        ..GatewaySettings::default()
    };
    let setup = gateway_with(
        vec![
            MemberBuilder::new(1).endpoint(stalled_addr).build(),
            MemberBuilder::new(2).endpoint(b).build(),
        ],
        settings,
    )
    .await;
    let client = client(setup.addr, "strategy=least-recently-used", "s3cret");
    for _ in 0..2 {
        let (status, proxy, body) = get(&client, "http://site.test/").await;
        assert_eq!((status, proxy.as_str()), (200, "uid-2"), "{body}");
    }
    assert!(setup.fleet.health("uid-1").unwrap().failures >= 1);
    // A request with a body that was written cannot be sent again: least
    // recently used, the stalled proxy gets it (two failures are not yet
    // the three that make it unhealthy) and the crawler gets a 502.
    let response = client.post("http://site.test/").body("payload").send().await.unwrap();
    assert_eq!(response.headers()[PROXY_HEADER], "uid-1");
    assert_eq!(response.status(), 502);
    assert!(response.text().await.unwrap().contains("did not answer within"));
}

/// Issue 43, item 1: the gateway handed requests for the metadata service
/// (by address, by name, in decimal, over CONNECT), AWS's IPv6 metadata
/// address, Alibaba's 100.100.100.200 and its own address to a proxy of
/// the fleet, which fetched them from inside the provider's network.
#[tokio::test]
async fn issue_43_item_1_targets_no_crawler_may_reach_get_403_and_reach_no_proxy() {
    let (a, _a) = upstream("a").await;
    let setup = gateway(vec![MemberBuilder::new(1).endpoint(a).build()]).await;
    let credentials = base64::engine::general_purpose::STANDARD.encode(":s3cret");
    let own = setup.addr.to_string();
    for target in [
        "169.254.169.254:80",
        "2852039166:80",
        "0xa9fea9fe:80",
        "metadata.google.internal:80",
        "Metadata.Google.Internal.:80",
        "[fd00:ec2::254]:80",
        "[::ffff:169.254.169.254]:80",
        "100.100.100.200:80",
        own.as_str(),
    ] {
        for head in [
            format!(
                "GET http://{target}/latest/meta-data/ HTTP/1.1\r\nHost: {target}\r\n\
                 Proxy-Authorization: Basic {credentials}\r\n\r\n"
            ),
            format!(
                "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\
                 Proxy-Authorization: Basic {credentials}\r\n\r\n"
            ),
        ] {
            let (_, answer) = raw(setup.addr, &head).await;
            let method = &head[..head.find(' ').unwrap()];
            assert!(answer.starts_with("HTTP/1.1 403"), "{method} {target}: {answer}");
            let answer = answer.to_ascii_lowercase();
            assert!(
                answer.contains(
                    "proxy-status: proxyfleet; error=destination_ip_prohibited; details=\""
                ),
                "{method} {target}: {answer}"
            );
            assert!(!answer.contains(PROXY_HEADER), "{method} {target}: no proxy was asked");
        }
    }
    let text = setup.fleet.metrics().encode();
    assert!(text.contains(r#"proxyfleet_gateway_refused_total{reason="target"} 18"#), "{text}");
    assert_eq!(setup.fleet.metrics().gateway().totals().requests, 0, "no request reached a proxy");
    assert!(
        text.contains(r#"proxyfleet_gateway_requests_total{pool="",kind="http"} 0"#),
        "the counters start at zero: {text}"
    );
}

/// Issue 43, item 3: one crawler holding about 500 idle CONNECT tunnels
/// took every descriptor, and every other crawler got 503 from then on.
#[tokio::test]
async fn issue_43_item_3_one_token_holds_at_most_its_share_of_tunnels() {
    let (a, _a) = upstream("a").await;
    let settings = GatewaySettings { max_per_client: 3, ..GatewaySettings::default() };
    let setup = gateway_with(vec![MemberBuilder::new(1).endpoint(a).build()], settings).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        let (stream, answer) = open_tunnel(setup.addr).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        held.push(stream);
    }
    let (_, answer) = open_tunnel(setup.addr).await;
    assert!(answer.starts_with("HTTP/1.1 429"), "a fourth tunnel of the same token: {answer}");
    let (_other, answer) = tunnel_to(setup.addr, "site.test:443", "other-token").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "another token has its own share: {answer}");
    // A tunnel closed gives its slot back.
    drop(held.pop());
    let reopened = eventually(Duration::from_secs(10), || async {
        let (stream, answer) = open_tunnel(setup.addr).await;
        answer.starts_with("HTTP/1.1 200").then_some(stream)
    })
    .await;
    assert!(reopened.is_some(), "the closed tunnel's slot is taken again");
    let text = setup.fleet.metrics().encode();
    assert!(text.contains(r#"proxyfleet_gateway_refused_total{reason="client-limit"}"#), "{text}");
}

/// Issue 43, item 2: idle connections were not counted, so 1,100 of them
/// took every descriptor. Past its bound the listener stops accepting:
/// the next client waits in the backlog, holding nothing of the process,
/// and is served once a slot frees; an idle connection is closed after
/// the header-read timeout.
#[tokio::test]
async fn issue_43_item_2_connections_past_the_bound_wait_and_idle_ones_are_closed() {
    let (a, _a) = upstream("a").await;
    let settings = GatewaySettings {
        connections: crate::api::ConnectionLimits {
            max_connections: 4,
            header_read_timeout: Duration::from_secs(60),
        },
        ..GatewaySettings::default()
    };
    let setup = gateway_with(vec![MemberBuilder::new(1).endpoint(a).build()], settings).await;
    let mut idle = Vec::new();
    for _ in 0..4 {
        idle.push(TcpStream::connect(setup.addr).await.unwrap());
    }
    let client = client(setup.addr, "", "s3cret");
    let waiting = tokio::spawn(async move { get(&client, "http://site.test/").await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "a fifth connection is not served while four are held");
    drop(idle.pop());
    let (status, proxy, _) = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("served once a slot frees")
        .unwrap();
    assert_eq!((status, proxy.as_str()), (200, "uid-1"));

    let (b, _b) = upstream("b").await;
    let settings = GatewaySettings {
        connections: crate::api::ConnectionLimits {
            max_connections: 4,
            header_read_timeout: Duration::from_millis(200),
        },
        ..GatewaySettings::default()
    };
    let setup = gateway_with(vec![MemberBuilder::new(1).endpoint(b).build()], settings).await;
    let mut silent = TcpStream::connect(setup.addr).await.unwrap();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), silent.read_to_end(&mut rest)).await;
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "an idle connection is closed: {read:?}");
}
