//! `proxyfleet standalone` as a real process: the static plugin hands out
//! a real tinyproxy, the health engine probes it through its port, and the
//! discovery API hands it to a crawler whose request really goes through.

use std::io::{Read as _, Write as _};
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http::Method;
use proxyfleet_fleet::client;
use proxyfleet_tests::operator::{Site, proxy_manifest, terminate};
use proxyfleet_tests::ports::free_port;
use proxyfleet_tests::proxies::Tinyproxy;
use proxyfleet_tests::{Canned, TestServer, wait_for};

/// `GET path` on `addr`: (status, body), or `None` while nothing listens.
fn get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut stream = std::net::TcpStream::connect(addr).ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let status = response.get(9..12)?.parse().ok()?;
    Some((status, response.split_once("\r\n\r\n")?.1.to_owned()))
}

/// `METHOD path` with a JSON `body` through the API client: (status,
/// body), or `None` while nothing answers.
async fn call(addr: &str, method: Method, path: &str, body: &str) -> Option<(u16, String)> {
    client::call(&format!("http://{addr}"), method, path, Some(body), None).await.ok()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crawler_gets_a_healthy_proxy_from_the_api_and_loses_it_when_it_dies() {
    let mut proxy = Tinyproxy::start();
    let origin =
        TestServer::http(Canned { status: 200, body: Bytes::from_static(b"hello via proxy") })
            .await;
    let site = Site::new(
        &format!(
            "providers:\n  - {{ name: local, plugin: static, config: {{ endpoints: ['{}'] }}, proxyAddresses: ['127.0.0.0/8'] }}\n",
            proxy.addr()
        ),
        &[("static", "static")],
        &proxy_manifest("a", "local"),
    );
    let api = format!("127.0.0.1:{}", free_port());
    let _operator = site.standalone(
        Path::new(env!("CARGO_BIN_EXE_proxyfleet")),
        &[
            "--metrics-addr",
            "127.0.0.1:0",
            "--api-addr",
            &api,
            "--health-interval",
            "300ms",
            "--health-timeout",
            "300ms",
            "--health-healthy-after",
            "1",
            "--health-unhealthy-after",
            "2",
        ],
    );
    let wait = Duration::from_secs(60);
    let url = wait_for(wait, || async {
        let (status, body) = get(&api, "/v1/proxies/next?format=url")?;
        (status == 200).then(|| body.trim().to_owned())
    })
    .await
    .expect("the API hands out the proxy once it is healthy");
    assert_eq!(url, format!("http://{}", proxy.addr()));

    // The crawler's request goes through the handed-out proxy to the origin.
    let through =
        get(url.trim_start_matches("http://"), &format!("http://{}/page", origin.addr)).unwrap();
    assert_eq!(through, (200, "hello via proxy".to_owned()));
    assert_eq!(origin.seen().last().unwrap().path, "/page");

    let (status, list) = get(&api, "/v1/proxies").unwrap();
    assert_eq!(status, 200);
    let list: serde_json::Value = serde_json::from_str(&list).unwrap();
    let item = &list["items"][0];
    assert_eq!(item["healthy"], true, "{item}");
    assert_eq!(item["health"]["exitIp"], "127.0.0.1", "{item}");
    assert_eq!(get(&api, "/readyz").unwrap().0, 200);
    // Counted (the series itself exists from the start, at zero).
    let metrics = get(&api, "/metrics").unwrap().1;
    assert!(
        metrics.lines().any(|line| line
            .strip_prefix("proxyfleet_health_probes_total{outcome=\"passed\"} ")
            .is_some_and(|count| count != "0")),
        "{metrics}"
    );

    proxy.kill();
    let gone = wait_for(wait, || async {
        let (status, _) = get(&api, "/v1/proxies/next")?;
        (status == 503).then_some(())
    })
    .await;
    assert!(gone.is_some(), "a dead proxy is no longer handed out");
    proxy.restart();
    let back = wait_for(wait, || async {
        let (status, _) = get(&api, "/v1/proxies/next")?;
        (status == 200).then_some(())
    })
    .await;
    assert!(back.is_some(), "a restarted proxy is handed out again");
}

/// A service manager (or the kubelet) stops the standalone operator with
/// SIGTERM: it stops reconciling, drains the API and exits 0; before,
/// only Ctrl-C stopped it and SIGTERM killed it mid-turn.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_stops_the_standalone_operator_with_exit_zero() {
    let site = Site::new(
        "providers:\n  - { name: local, plugin: static, config: { endpoints: ['127.0.0.1:9'] }, proxyAddresses: ['127.0.0.0/8'] }\n",
        &[("static", "static")],
        &proxy_manifest("a", "local"),
    );
    let api = format!("127.0.0.1:{}", free_port());
    let mut operator = site.standalone(
        Path::new(env!("CARGO_BIN_EXE_proxyfleet")),
        &["--metrics-addr", "127.0.0.1:0", "--api-addr", &api],
    );
    let wait = Duration::from_secs(60);
    let up = wait_for(wait, || async { (get(&api, "/healthz")?.0 == 200).then_some(()) }).await;
    assert!(up.is_some(), "the API comes up");
    // An idle keep-alive connection must not hold the drain open.
    let mut idle = std::net::TcpStream::connect(&api).unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n").unwrap();

    let exited = terminate(&mut operator.0, Duration::from_secs(30)).await;
    let status = exited.expect("the operator exits after SIGTERM");
    assert!(status.success(), "exit 0 after SIGTERM, got {status}");
    assert!(get(&api, "/healthz").is_none(), "the API is closed");
    let mut answer = String::new();
    let _ = idle.read_to_string(&mut answer);
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "the request on the idle connection was answered: {answer:?}"
    );
}

/// Discovery leases lived in memory: a restart of the operator ended every
/// crawler's sticky session (the renewal answered 404). They live in the
/// state database now, and a process killed without warning keeps them.
#[tokio::test(flavor = "multi_thread")]
async fn regression_a_killed_and_restarted_operator_keeps_discovery_leases() {
    let proxy = Tinyproxy::start();
    let site = Site::new(
        &format!(
            "providers:\n  - {{ name: local, plugin: static, config: {{ endpoints: ['{}'] }}, proxyAddresses: ['127.0.0.0/8'] }}\n",
            proxy.addr()
        ),
        &[("static", "static")],
        &proxy_manifest("a", "local"),
    );
    let api = format!("127.0.0.1:{}", free_port());
    let args = [
        "--metrics-addr",
        "127.0.0.1:0",
        "--api-addr",
        &api,
        "--api-open-writes",
        "--health-interval",
        "300ms",
        "--health-timeout",
        "300ms",
        "--health-healthy-after",
        "1",
    ];
    let binary = Path::new(env!("CARGO_BIN_EXE_proxyfleet"));
    let wait = Duration::from_secs(60);
    let mut operator = site.standalone(binary, &args);
    let lease = wait_for(wait, || async {
        let (status, body) =
            call(&api, Method::POST, "/v1/leases", r#"{"ttlSeconds":600}"#).await?;
        (status == 201).then_some(body)
    })
    .await
    .expect("a lease is granted once the proxy is healthy");
    let lease: serde_json::Value = serde_json::from_str(&lease).unwrap();
    let id = lease["id"].as_str().unwrap().to_owned();

    // SIGKILL: nothing is written on the way out.
    operator.0.kill().unwrap();
    operator.0.wait().unwrap();
    let _operator = site.standalone(binary, &args);
    let ready = wait_for(wait, || async { (get(&api, "/readyz")?.0 == 200).then_some(()) }).await;
    assert!(ready.is_some(), "the restarted operator turns ready");

    let (status, renewed) =
        call(&api, Method::POST, &format!("/v1/leases/{id}/renew"), r#"{"ttlSeconds":900}"#)
            .await
            .unwrap();
    assert_eq!(status, 200, "the lease outlived the restart: {renewed}");
    let renewed: serde_json::Value = serde_json::from_str(&renewed).unwrap();
    assert_eq!(renewed["proxyId"], lease["proxyId"]);
    assert!(renewed["expiresAt"].as_u64() >= lease["expiresAt"].as_u64());
    // The exclusive lease still keeps the only proxy from everyone else.
    let (status, _) = call(&api, Method::POST, "/v1/leases", r#"{"ttlSeconds":60}"#).await.unwrap();
    assert_eq!(status, 503);
    let released = call(&api, Method::DELETE, &format!("/v1/leases/{id}"), "").await.unwrap();
    assert_eq!(released.0, 204);
    let (status, again) =
        call(&api, Method::POST, "/v1/leases", r#"{"ttlSeconds":60}"#).await.unwrap();
    assert_eq!(status, 201, "released, the proxy is free again: {again}");
}

/// An installation keeps the ID its first start settled; a later start
/// naming another one is refused with both IDs and the fix, before any
/// instance could be marked with it.
#[tokio::test(flavor = "multi_thread")]
async fn a_start_naming_another_installation_id_is_refused() {
    let site = Site::new(
        "providers:\n  - { name: local, plugin: static, config: { endpoints: ['127.0.0.1:9'] }, proxyAddresses: ['127.0.0.0/8'] }\n",
        &[("static", "static")],
        &proxy_manifest("a", "local"),
    );
    let api = format!("127.0.0.1:{}", free_port());
    let binary = Path::new(env!("CARGO_BIN_EXE_proxyfleet"));
    let mut first = site.standalone(
        binary,
        &["--metrics-addr", "127.0.0.1:0", "--api-addr", &api, "--installation-id", "prod-eu"],
    );
    let up = wait_for(Duration::from_secs(60), || async {
        (get(&api, "/healthz")?.0 == 200).then_some(())
    })
    .await;
    assert!(up.is_some(), "the first start comes up");
    terminate(&mut first.0, Duration::from_secs(30)).await.expect("stops");

    let second = site
        .command(binary, &["--metrics-addr", "127.0.0.1:0", "--api-addr", "127.0.0.1:0"])
        .args(["--installation-id", "staging"])
        .output()
        .unwrap();
    assert!(!second.status.success());
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(
        stderr.contains("--installation-id staging differs from this installation's ID prod-eu")
            && stderr.contains("set --installation-id prod-eu or leave the flag out"),
        "{stderr}"
    );
}

/// A plugin's log fields reached the JSON logs as one string
/// (`"fields":"endpoint=\"…\""`); log pipelines could not query them.
/// They are an object now, beside the host's own fields, and every field
/// (the message too) sits at the top level of the line.
#[tokio::test(flavor = "multi_thread")]
async fn regression_plugin_log_fields_are_json_fields() {
    let site = Site::new(
        "providers:\n  - { name: local, plugin: static, config: { endpoints: ['127.0.0.1:9'] }, proxyAddresses: ['127.0.0.0/8'] }\n",
        &[("static", "static")],
        &proxy_manifest("a", "local"),
    );
    let log = site.path("operator.log");
    let child = site
        .command(
            Path::new(env!("CARGO_BIN_EXE_proxyfleet")),
            &["--metrics-addr", "127.0.0.1:0", "--api-addr", "127.0.0.1:0"],
        )
        .args(["--log-format", "json"])
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let _operator = proxyfleet_tests::operator::Running(child);
    let line = wait_for(Duration::from_secs(60), || async {
        let text = std::fs::read_to_string(&log).ok()?;
        text.lines().find(|line| line.contains("endpoint assigned")).map(str::to_owned)
    })
    .await
    .expect("the plugin logs the assignment");
    let line: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(line["plugin_fields"], serde_json::json!({ "endpoint": "127.0.0.1:9" }), "{line}");
    assert_eq!(line["entry"], "local", "{line}");
    assert_eq!(line["operation"], "create", "{line}");
    assert_eq!(line["target"], "proxyfleet::plugin", "{line}");
    assert!(line["message"].as_str().is_some_and(|m| m.contains("endpoint assigned")), "{line}");
    assert!(line.get("fields").is_none(), "the fields are not nested: {line}");
}
