//! `proxyfleet standalone` as a real process serves its metrics and a
//! liveness probe that fails while the operator is stuck.

use std::io::{Read as _, Write as _};
use std::path::Path;
use std::time::Duration;

use proxyfleet_tests::operator::{Site, proxy_manifest};
use proxyfleet_tests::ports::free_port;
use proxyfleet_tests::wait_for;

fn scrape(port: u16) -> Option<String> {
    get(port, "/metrics")
}

fn get(port: u16, path: &str) -> Option<String> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    Some(response)
}

#[tokio::test]
async fn the_metrics_endpoint_shows_reconciles_and_checks() {
    let site = Site::new(
        "providers:\n  - { name: local, plugin: static, config: { endpoints: ['127.0.0.1:18001'] }, proxyAddresses: ['127.0.0.0/8'] }\n",
        &[("static", "static")],
        &proxy_manifest("a", "local"),
    );
    let port = free_port();
    let _operator = site.standalone(
        Path::new(env!("CARGO_BIN_EXE_proxyfleet")),
        &["--metrics-addr", &format!("127.0.0.1:{port}"), "--api-addr", "127.0.0.1:0"],
    );
    let scraped = wait_for(Duration::from_secs(30), || async {
        let text = scrape(port)?;
        // The series exists from the start, at zero: wait for a count.
        (text.contains("proxyfleet_reconciles_total{outcome=\"ok\"} ")
            && !text.contains("proxyfleet_reconciles_total{outcome=\"ok\"} 0\n")
            && text.contains("proxyfleet_provider_healthy{entry=\"local\"} 1"))
        .then_some(text)
    })
    .await;
    assert!(scraped.is_some(), "the endpoint shows the reconcile and the check");
}

/// A pass stuck in a provider call for longer than `--stall-after` fails
/// `/livez` (so the kubelet would restart the pod), naming the reconciler;
/// once the entry's call timeout ends the call, the probe passes again.
#[tokio::test]
async fn livez_fails_while_a_pass_is_stuck_and_recovers_when_it_ends() {
    let site = Site::new(
        "providers:\n  - { name: stuck, plugin: spin, limits: { timeout: 20s } }\n",
        &[("spin", "fixtures/spin")],
        &proxy_manifest("a", "stuck"),
    );
    let port = free_port();
    let _operator = site.standalone(
        Path::new(env!("CARGO_BIN_EXE_proxyfleet")),
        &[
            "--metrics-addr",
            &format!("127.0.0.1:{port}"),
            "--api-addr",
            "127.0.0.1:0",
            "--stall-after",
            "10s",
        ],
    );
    let live = wait_for(Duration::from_secs(30), || async {
        get(port, "/livez").filter(|answer| answer.starts_with("HTTP/1.1 200"))
    })
    .await
    .unwrap_or_else(|| panic!("/livez never passed; log:\n{}", site.log(50)));
    for part in
        ["proxy reconciler", "run loop", "provider checks", "health engine", "plugin watcher"]
    {
        assert!(live.contains(part), "/livez watches {part}: {live}");
    }
    let stalled = wait_for(Duration::from_secs(60), || async {
        get(port, "/livez").filter(|answer| answer.starts_with("HTTP/1.1 503"))
    })
    .await
    .unwrap_or_else(|| panic!("/livez never failed; log:\n{}", site.log(50)));
    assert!(
        stalled.contains("- proxy reconciler: a pass has been running for"),
        "the answer names the stuck part: {stalled}"
    );
    assert!(!stalled.contains("run loop"), "only the stuck part is named: {stalled}");
    let recovered = wait_for(Duration::from_secs(60), || async {
        get(port, "/livez").filter(|answer| answer.starts_with("HTTP/1.1 200"))
    })
    .await;
    assert!(recovered.is_some(), "/livez passes again once the call timed out");
}
