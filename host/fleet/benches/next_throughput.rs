//! `GET /v1/proxies/next` requests per second beside a plain hyper
//! hello-world on the same machine, both loaded by `wrk` from a second
//! process over loopback. The goal is a ratio of at least 0.7.
//!
//! Run: `cargo bench -p proxyfleet-fleet --bench next_throughput`
//! (needs `wrk`: `apt-get install wrk`). Prints figures; asserts nothing.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;
use hyper_util::rt::TokioIo;
use proxyfleet_core::proxy::Phase;
use proxyfleet_fleet::api::{self, Api};
use proxyfleet_fleet::auth::ApiAuth;
use proxyfleet_fleet::probe::ProbePass;
use proxyfleet_fleet::{Endpoint, Fleet, FleetSettings, Member};
use proxyfleet_metrics::Metrics;

const SECONDS: &str = "5";
const CONNECTIONS: &str = "64";

#[expect(clippy::print_stdout, reason = "a bench binary reports on stdout")]
fn main() {
    if Command::new("wrk").arg("--version").output().is_err() {
        println!("next_throughput: skipped, `wrk` is not installed (apt-get install wrk)");
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let (hello, discovery) =
        runtime.block_on(async { (hello_world().await, discovery(1000).await) });
    // Let both warm up before measuring, in the same order each time.
    wrk(hello, "/", "1");
    wrk(discovery, "/v1/proxies/next", "1");
    let hello_rps = wrk(hello, "/", SECONDS);
    let next_rps = wrk(discovery, "/v1/proxies/next", SECONDS);
    let pool_rps = wrk(discovery, "/v1/proxies/next?pool=default%2Fcrawl&strategy=random", SECONDS);
    println!("hyper hello-world:          {hello_rps:>10.0} requests/s");
    println!(
        "GET /v1/proxies/next:       {next_rps:>10.0} requests/s ({:.2}x)",
        next_rps / hello_rps
    );
    println!(
        "  ?pool=...&strategy=random {pool_rps:>10.0} requests/s ({:.2}x)",
        pool_rps / hello_rps
    );
    println!(
        "(1000 healthy proxies; wrk -t2 -c{CONNECTIONS} -d{SECONDS}s over loopback; goal >= 0.70x)"
    );
}

/// Requests per second `wrk` measured.
fn wrk(addr: SocketAddr, path: &str, seconds: &str) -> f64 {
    let output = Command::new("wrk")
        .args(["-t2", &format!("-c{CONNECTIONS}"), &format!("-d{seconds}s")])
        .arg(format!("http://{addr}{path}"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(!text.contains("Non-2xx"), "wrk saw errors:\n{text}");
    text.lines()
        .find_map(|line| line.strip_prefix("Requests/sec:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no Requests/sec in:\n{text}"))
}

async fn hello_world() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|_request| async {
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(
                        b"Hello, World!",
                    ))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

async fn discovery(proxies: u16) -> SocketAddr {
    let fleet = Arc::new(Fleet::new(FleetSettings::default(), Arc::new(Metrics::new())));
    fleet.publish(
        (0..proxies)
            .map(|i| Member {
                id: format!("proxy-{i}"),
                namespace: "default".into(),
                name: format!("proxy-{i}"),
                pool: Some("default/crawl".into()),
                provider: "local".into(),
                labels: BTreeMap::new(),
                phase: Phase::Running,
                endpoint: Some(Endpoint::new(
                    IpAddr::from([127, 1, (i >> 8) as u8, i as u8]),
                    3128,
                )),
                created_at: None,
                conditions: Vec::new(),
            })
            .collect(),
    );
    let passes = fleet
        .probe_targets()
        .into_iter()
        .map(|(id, endpoint)| {
            (id, endpoint, Ok(ProbePass { latency: Duration::from_millis(1), exit_ip: None }))
        })
        .collect();
    fleet.record_probes(passes, 1, 1);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let api = Arc::new(Api::new(fleet, Arc::new(ApiAuth::open())));
    tokio::spawn(api::serve(
        listener,
        api,
        api::ConnectionLimits::default(),
        std::future::pending(),
    ));
    addr
}
