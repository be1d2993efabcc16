//! `proxyfleet standalone --gateway-addr` as a real process in front of
//! real tinyproxy upstreams: curl and reqwest through the gateway, plain
//! and through CONNECT tunnels, bad and missing credentials, an unknown
//! pool, sticky sessions that hold and are released, a per-site ban that
//! leaves the proxy serving other sites, and an upstream killed mid-run
//! that loses no request.

use std::collections::HashSet;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
use http::Method;
use proxyfleet_fleet::client;
use proxyfleet_tests::operator::{Running, Site};
use proxyfleet_tests::ports::free_port;
use proxyfleet_tests::proxies::Tinyproxy;
use proxyfleet_tests::{Canned, TestServer, wait_for};

const TOKEN: &str = "gateway-token";

/// Starts the operator on `site` with API tokens, the gateway and quick
/// health rounds: (API address, gateway address, the process).
fn launch(site: &Site) -> (String, String, Running) {
    std::fs::write(site.path("tokens"), format!("{TOKEN}\n")).unwrap();
    let api = format!("127.0.0.1:{}", free_port());
    let gateway = format!("127.0.0.1:{}", free_port());
    let tokens = site.path("tokens").display().to_string();
    let operator = site.standalone(
        Path::new(env!("CARGO_BIN_EXE_proxyfleet")),
        &[
            "--metrics-addr",
            "127.0.0.1:0",
            "--api-addr",
            &api,
            "--api-token-file",
            &tokens,
            "--gateway-addr",
            &gateway,
            // The origins are on loopback.
            "--gateway-allow-targets",
            "127.0.0.0/8",
            "--health-interval",
            "300ms",
            "--health-timeout",
            "300ms",
            "--health-healthy-after",
            "1",
            "--health-unhealthy-after",
            "1",
        ],
    );
    (api, gateway, operator)
}

struct Gateway {
    proxies: Vec<Tinyproxy>,
    _site: Site,
    api: String,
    gateway: String,
    _operator: Running,
}

impl Gateway {
    /// The operator with a pool of `n` Proxies on `n` tinyproxies, once the
    /// gateway routes through every one of them.
    async fn start(n: usize) -> Self {
        let proxies: Vec<Tinyproxy> = (0..n).map(|_| Tinyproxy::start()).collect();
        let endpoints: Vec<String> = proxies.iter().map(|p| format!("'{}'", p.addr())).collect();
        let manifests = format!(
            "apiVersion: proxyfleet.io/v1alpha1\nkind: ProxyPool\nmetadata: {{ name: web }}\n\
             spec: {{ replicas: {n}, template: {{ spec: {{ provider: local }} }} }}\n"
        );
        let site = Site::new(
            &format!(
                "providers:\n  - {{ name: local, plugin: static, config: {{ endpoints: [{}] }}, proxyAddresses: ['127.0.0.0/8'] }}\n",
                endpoints.join(", ")
            ),
            &[("static", "static")],
            &manifests,
        );
        let (api, gateway, operator) = launch(&site);
        let this = Self { proxies, _site: site, api, gateway, _operator: operator };
        let available = wait_for(Duration::from_secs(90), || async {
            let (status, body) = this.api(Method::GET, "/v1/proxies?healthy=true", "").await?;
            let list: serde_json::Value = serde_json::from_str(&body).ok()?;
            (status == 200 && list["items"].as_array()?.len() == n).then_some(())
        })
        .await;
        assert!(available.is_some(), "every Proxy turns healthy");
        this
    }

    async fn api(&self, method: Method, path: &str, body: &str) -> Option<(u16, String)> {
        client::call(&format!("http://{}", self.api), method, path, Some(body), Some(TOKEN))
            .await
            .ok()
    }

    /// A reqwest client whose proxy is the gateway, with `username`.
    fn client(&self, username: &str) -> reqwest::Client {
        let proxy = reqwest::Proxy::all(format!("http://{}", self.gateway))
            .unwrap()
            .basic_auth(username, TOKEN);
        reqwest::Client::builder().proxy(proxy).build().unwrap()
    }

    /// curl through the gateway with `extra` arguments: (status, body).
    fn curl(&self, proxy_user: &str, extra: &[&str], url: &str) -> (u16, String) {
        let output = Command::new("curl")
            .args(["-sS", "--max-time", "20", "-w", "\n%{http_code}", "--proxy"])
            .arg(format!("http://{}", self.gateway))
            .args(["--proxy-user", proxy_user])
            .args(extra)
            .arg(url)
            .output()
            .expect("curl runs (the README's test command installs it)");
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        (code.trim().parse().unwrap_or(0), body.to_owned())
    }
}

/// (status, the proxy's ID) of a GET through `client`.
async fn through(client: &reqwest::Client, url: &str) -> (u16, String) {
    let response = client.get(url).send().await.expect("the gateway answers");
    let proxy = response
        .headers()
        .get("x-proxyfleet-proxy")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (response.status().as_u16(), proxy)
}

#[tokio::test(flavor = "multi_thread")]
async fn curl_and_reqwest_go_through_the_pool_with_tokens_routes_and_sessions() {
    let origin =
        TestServer::http(Canned { status: 200, body: Bytes::from_static(b"hello via gateway") })
            .await;
    let gateway = Gateway::start(3).await;
    let url = format!("http://{}/page", origin.addr);
    let user = format!("pool=default.web:{TOKEN}");

    // curl: absolute-form, then a CONNECT tunnel (-p) to the same origin.
    assert_eq!(gateway.curl(&user, &[], &url), (200, "hello via gateway".to_owned()));
    assert_eq!(gateway.curl(&user, &["-p"], &url), (200, "hello via gateway".to_owned()));
    assert_eq!(origin.seen().last().unwrap().path, "/page");

    // Missing and wrong credentials, a bad key, an unknown pool.
    let output = Command::new("curl")
        .args(["-sS", "-o", "/dev/null", "-w", "%{http_code}", "--proxy"])
        .arg(format!("http://{}", gateway.gateway))
        .arg(&url)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&output.stdout), "407");
    let (status, body) = gateway.curl("pool=default.web:wrong", &[], &url);
    assert_eq!(status, 407, "{body}");
    assert!(body.contains("not a token"), "{body}");
    let (status, body) = gateway.curl(&format!("country=us:{TOKEN}"), &[], &url);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("country"), "{body}");
    let (status, body) = gateway.curl(&format!("pool=default.nope:{TOKEN}"), &[], &url);
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("default/nope"), "{body}");

    // Without a session requests spread over the pool; with one they stay.
    let spread = gateway.client("pool=default.web");
    let mut seen = HashSet::new();
    for _ in 0..6 {
        let (status, proxy) = through(&spread, &url).await;
        assert_eq!(status, 200);
        seen.insert(proxy);
    }
    assert_eq!(seen.len(), 3, "round-robin over the pool: {seen:?}");
    let sticky = gateway.client("pool=default.web,session=crawl-1");
    let (_, held) = through(&sticky, &url).await;
    for _ in 0..5 {
        assert_eq!(through(&sticky, &url).await, (200, held.clone()));
    }
    // The session is a lease: listed, and released through the API.
    let (_, leases) = gateway.api(Method::GET, "/v1/leases", "").await.unwrap();
    assert!(leases.contains("session-crawl-1") && leases.contains(&held), "{leases}");
    let (status, _) = gateway.api(Method::DELETE, "/v1/leases/session-crawl-1", "").await.unwrap();
    assert_eq!(status, 204);

    let (_, metrics) = gateway.api(Method::GET, "/metrics", "").await.unwrap();
    for needle in [
        "proxyfleet_gateway_requests_total{pool=\"default/web\"",
        "kind=\"connect\"",
        "proxyfleet_gateway_bytes_received_total{pool=\"default/web\"",
        "proxyfleet_gateway_refused_total{reason=\"auth\"} 2",
        "proxyfleet_gateway_added_seconds_bucket",
    ] {
        assert!(metrics.contains(needle), "{needle} missing from:\n{metrics}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_site_ban_and_a_killed_upstream_lose_no_request() {
    let good = TestServer::http(Canned { status: 200, body: Bytes::from_static(b"ok") }).await;
    let banning =
        TestServer::http(Canned { status: 403, body: Bytes::from_static(b"go away") }).await;
    let mut gateway = Gateway::start(3).await;
    let client = gateway.client("pool=default.web");
    // `localhost` and `127.0.0.1` are two sites to the gateway.
    let banned_url = format!("http://localhost:{}/", banning.addr.port());
    let good_url = format!("http://127.0.0.1:{}/", good.addr.port());

    let (status, banned) = through(&client, &banned_url).await;
    assert_eq!(status, 403, "the site's answer is passed on");
    let (_, view) = gateway.api(Method::GET, &format!("/v1/proxies/{banned}"), "").await.unwrap();
    let view: serde_json::Value = serde_json::from_str(&view).unwrap();
    assert_eq!(view["bannedSites"][0]["site"], "localhost", "{view}");
    assert_eq!(view["available"], true, "{view}");
    // The site turns every proxy away: each gets one more request for it,
    // never a second, and then none is left for that site.
    let mut turned_away = HashSet::from([banned.clone()]);
    for _ in 1..3 {
        let (status, proxy) = through(&client, &banned_url).await;
        assert_eq!(status, 403);
        assert!(turned_away.insert(proxy), "a banned proxy got another request for that site");
    }
    let (status, proxy) = through(&client, &banned_url).await;
    assert_eq!((status, proxy.as_str()), (503, ""), "every proxy is banned for localhost");
    // All three still serve every other site.
    let mut for_others = HashSet::new();
    for _ in 0..6 {
        let (status, proxy) = through(&client, &good_url).await;
        assert_eq!(status, 200);
        for_others.insert(proxy);
    }
    assert_eq!(for_others, turned_away, "the banned proxies still serve other sites");

    // One upstream dies mid-run: every request still gets its answer.
    for i in 0..60 {
        if i == 10 {
            gateway.proxies[0].kill();
        }
        let (status, _) = through(&client, &good_url).await;
        assert_eq!(status, 200, "request {i} lost");
    }
    let (_, metrics) = gateway.api(Method::GET, "/metrics", "").await.unwrap();
    assert!(
        metrics.contains("proxyfleet_gateway_retries_total{pool=\"default/web\"}"),
        "{metrics}"
    );
}

/// A proxy that asks for a credential: its Proxy names it in a file, the
/// health engine probes with it, the gateway sends it, and the discovery
/// API hands it out only in the URL a token holder gets.
#[tokio::test(flavor = "multi_thread")]
async fn an_authenticated_tinyproxy_is_probed_routed_to_and_handed_out_with_its_credential() {
    let origin =
        TestServer::http(Canned { status: 200, body: Bytes::from_static(b"behind auth") }).await;
    let proxy = Tinyproxy::start_with("BasicAuth crawler s3cret-pw\n");
    let site = Site::new(
        &format!(
            "providers:\n  - {{ name: local, plugin: static, config: {{ endpoints: ['{}'] }}, proxyAddresses: ['127.0.0.0/8'] }}\n",
            proxy.addr()
        ),
        &[("static", "static")],
        "apiVersion: proxyfleet.io/v1alpha1\nkind: Proxy\nmetadata: { name: a }\n\
         spec: { provider: local, proxyAuthFile: a.credential }\n",
    );
    std::fs::write(site.path("proxies/a.credential"), "crawler:s3cret-pw\n").unwrap();
    let (api, gateway, _operator) = launch(&site);
    let call = |method: Method, path: &'static str| {
        let base = format!("http://{api}");
        async move { client::call(&base, method, path, None, Some(TOKEN)).await.ok() }
    };
    let healthy = wait_for(Duration::from_secs(90), || async {
        let (_, body) = call(Method::GET, "/v1/proxies?healthy=true").await?;
        body.contains("\"authenticated\":true").then_some(body)
    })
    .await
    .expect("probes that send the credential pass");
    assert!(!healthy.contains("s3cret"), "the list shows the credential: {healthy}");

    let (status, next) = call(Method::GET, "/v1/proxies/next?format=url").await.unwrap();
    assert_eq!(status, 200, "{next}");
    let url = next.trim();
    assert_eq!(url, format!("http://crawler:s3cret-pw@{}", proxy.addr()));
    let output = Command::new("curl")
        .args(["-sS", "--max-time", "20", "-x", url])
        .arg(format!("http://{}/direct", origin.addr))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&output.stdout), "behind auth", "the handed-out URL works");

    let through = reqwest::Client::builder()
        .proxy(reqwest::Proxy::all(format!("http://{gateway}")).unwrap().basic_auth("", TOKEN))
        .build()
        .unwrap()
        .get(format!("http://{}/gateway", origin.addr))
        .send()
        .await
        .unwrap();
    assert_eq!(through.status(), 200);
    assert_eq!(through.text().await.unwrap(), "behind auth");
    assert_eq!(origin.seen().last().unwrap().path, "/gateway");
}

/// Issue 43, item 1, with real tinyproxy upstreams: the metadata service
/// (by address, in decimal, by name, over CONNECT), the operator's own API
/// and a loopback address outside the allowed ranges are refused before
/// any proxy is asked; a name is resolved by the gateway and the proxy is
/// asked for the address.
#[tokio::test(flavor = "multi_thread")]
async fn issue_43_item_1_the_gateway_refuses_what_no_crawler_may_reach() {
    let origin =
        TestServer::http(Canned { status: 200, body: Bytes::from_static(b"origin") }).await;
    let gateway = Gateway::start(1).await;
    let user = format!("pool=default.web:{TOKEN}");
    for (url, extra) in [
        ("http://169.254.169.254/latest/meta-data/".to_owned(), &[][..]),
        ("http://169.254.169.254/latest/meta-data/".to_owned(), &["-p"][..]),
        ("http://2852039166/".to_owned(), &[][..]),
        ("http://metadata.google.internal/computeMetadata/v1/".to_owned(), &[][..]),
        ("http://metadata.google.internal/computeMetadata/v1/".to_owned(), &["-p"][..]),
        ("http://100.100.100.200/latest/meta-data/".to_owned(), &[][..]),
        (format!("http://{}/v1/proxies", gateway.api), &[][..]),
        (format!("http://{}/v1/proxies", gateway.api), &["-p"][..]),
    ] {
        let output = Command::new("curl")
            .args(["-sS", "--max-time", "20", "-D", "-", "-o", "/dev/null", "--proxy"])
            .arg(format!("http://{}", gateway.gateway))
            .args(["--proxy-user", &user])
            .args(extra)
            .arg(&url)
            .output()
            .unwrap();
        let head = String::from_utf8_lossy(&output.stdout).to_ascii_lowercase();
        assert!(head.contains(" 403"), "{url} {extra:?}: {head}");
        assert!(
            head.contains("proxy-status: proxyfleet; error=destination_ip_prohibited"),
            "{url} {extra:?}: {head}"
        );
        assert!(!head.contains("x-proxyfleet-proxy"), "{url} {extra:?}: no proxy was asked");
    }
    let (_, metrics) = gateway.api(Method::GET, "/metrics", "").await.unwrap();
    assert!(metrics.contains("proxyfleet_gateway_refused_total{reason=\"target\"} 8"), "{metrics}");
    // No request reached a proxy: every request counter is still at zero.
    let requests = metrics
        .lines()
        .filter(|line| line.starts_with("proxyfleet_gateway_requests_total{"))
        .collect::<Vec<_>>();
    assert!(requests.iter().all(|line| line.ends_with(" 0")), "{requests:?}");

    // A name: resolved by the gateway, the proxy asked for the address. The
    // crawler's Host header travels; tinyproxy writes its own from the
    // request line, so the origin sees the address.
    let by_name = format!("http://localhost:{}/named", origin.addr.port());
    assert_eq!(gateway.curl(&user, &[], &by_name), (200, "origin".to_owned()));
    assert_eq!(gateway.curl(&user, &["-p"], &by_name), (200, "origin".to_owned()));
    let seen = origin.seen();
    let port = origin.addr.port();
    assert_eq!(seen[0].header("host"), Some(format!("127.0.0.1:{port}").as_str()), "tinyproxy");
    assert_eq!(
        seen[1].header("host"),
        Some(format!("localhost:{port}").as_str()),
        "through a tunnel the crawler's own request arrives as it was sent"
    );
    assert_eq!(gateway.proxies.len(), 1);
}

/// `n` idle connections to `addr`, opened as fast as the listener's
/// backlog takes them (a connection the kernel does not take within
/// 500 ms is not counted).
fn idle_flood(addr: &str, n: usize) -> Vec<std::net::TcpStream> {
    let addr: std::net::SocketAddr = addr.parse().unwrap();
    (0..n)
        .filter_map(|_| {
            std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()
        })
        .collect()
}

/// Issue 43, item 2, as a process under `nofile` 1024: 1,100 idle
/// unauthenticated connections left the discovery API and the gateway
/// answering nobody. Now each listener holds at most its bound, fitted to
/// the limit with descriptors to spare, closes idle connections after
/// the header-read timeout, and a flood of one listener leaves the other
/// and the health probes working.
#[tokio::test(flavor = "multi_thread")]
async fn issue_43_item_2_idle_floods_under_nofile_1024_leave_the_operator_answering() {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    // This test process holds the flood's client ends.
    let limit = getrlimit(Resource::Nofile);
    let _ = setrlimit(Resource::Nofile, Rlimit { current: limit.maximum, maximum: limit.maximum });
    let origin =
        TestServer::http(Canned { status: 200, body: Bytes::from_static(b"origin") }).await;
    let proxy = Tinyproxy::start();
    let site = Site::new(
        &format!(
            "providers:\n  - {{ name: local, plugin: static, config: {{ endpoints: ['{}'] }}, proxyAddresses: ['127.0.0.0/8'] }}\n",
            proxy.addr()
        ),
        &[("static", "static")],
        "apiVersion: proxyfleet.io/v1alpha1\nkind: Proxy\nmetadata: { name: one }\nspec: { provider: local }\n",
    );
    let api = format!("127.0.0.1:{}", free_port());
    let gateway = format!("127.0.0.1:{}", free_port());
    // Probes fetch the origin, not the API's /v1/echo: the API is flooded
    // below, and the probes are to show the rest of the process working.
    let health_target = format!("http://{}/", origin.addr);
    let operator = site.command(
        Path::new(env!("CARGO_BIN_EXE_proxyfleet")),
        &[
            "--log-format",
            "text",
            "--metrics-addr",
            "127.0.0.1:0",
            "--api-addr",
            &api,
            "--gateway-addr",
            &gateway,
            "--gateway-open",
            "--gateway-allow-targets",
            "127.0.0.0/8",
            "--header-read-timeout",
            "2s",
            "--health-target",
            &health_target,
            "--health-interval",
            "1s",
            "--health-timeout",
            "1s",
            "--health-healthy-after",
            "1",
        ],
    );
    let _operator = proxyfleet_tests::operator::Running(
        Command::new("prlimit")
            .arg("--nofile=1024:1024")
            .arg("--")
            .arg(operator.get_program())
            .args(operator.get_args())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(site.path("operator.log")).unwrap())
            .spawn()
            .expect("prlimit (util-linux) starts the operator"),
    );
    let healthy = || async {
        let (status, body) = client::call(
            &format!("http://{api}"),
            Method::GET,
            "/v1/proxies?healthy=true",
            None,
            None,
        )
        .await
        .ok()?;
        let list: serde_json::Value = serde_json::from_str(&body).ok()?;
        (status == 200 && list["items"].as_array()?.len() == 1).then_some(())
    };
    assert!(
        wait_for(Duration::from_secs(90), healthy).await.is_some(),
        "the Proxy turns healthy; the operator wrote:\n{}",
        std::fs::read_to_string(site.path("operator.log")).unwrap_or_default()
    );
    let url = format!("http://{}/", origin.addr);
    let through_gateway = || {
        let proxy = reqwest::Proxy::all(format!("http://{gateway}")).unwrap();
        let client = reqwest::Client::builder()
            .proxy(proxy)
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        let url = url.clone();
        async move {
            let response = client.get(&url).send().await.ok()?;
            (response.status() == 200).then_some(())
        }
    };

    // The gateway flooded: the API and the probes go on.
    let flood = idle_flood(&gateway, 1100);
    assert!(flood.len() >= 1000, "the flood opened {} connections", flood.len());
    for _ in 0..3 {
        assert!(
            wait_for(Duration::from_secs(10), healthy).await.is_some(),
            "the API and probes answer"
        );
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    // Idle connections are closed after the header-read timeout, and the
    // gateway serves again.
    assert!(
        wait_for(Duration::from_secs(120), through_gateway).await.is_some(),
        "the gateway serves once the idle connections are closed"
    );
    drop(flood);

    // The API flooded: the gateway goes on.
    let flood = idle_flood(&api, 1100);
    assert!(flood.len() >= 1000, "the flood opened {} connections", flood.len());
    assert!(
        wait_for(Duration::from_secs(10), through_gateway).await.is_some(),
        "the gateway answers"
    );
    drop(flood);
    assert!(wait_for(Duration::from_secs(120), healthy).await.is_some(), "the API answers again");
}
