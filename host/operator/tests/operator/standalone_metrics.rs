//! `proxyfleet standalone` as a real process serves its metrics.

use std::io::{Read as _, Write as _};
use std::path::Path;
use std::time::Duration;

use proxyfleet_tests::operator::{Site, proxy_manifest};
use proxyfleet_tests::ports::free_port;
use proxyfleet_tests::wait_for;

fn scrape(port: u16) -> Option<String> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n").ok()?;
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
        (text.contains("proxyfleet_reconciles_total{outcome=\"ok\"}")
            && text.contains("proxyfleet_provider_healthy{entry=\"local\"} 1"))
        .then_some(text)
    })
    .await;
    assert!(scraped.is_some(), "the endpoint shows the reconcile and the check");
}
