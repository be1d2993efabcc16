//! `proxyfleet standalone` as a real process serves its metrics.

use std::io::{Read as _, Write as _};
use std::process::{Command, Stdio};
use std::time::Duration;

use proxyfleet_tests::{plugin, wait_for};

struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn scrape(port: u16) -> Option<String> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    Some(response)
}

#[tokio::test]
async fn the_metrics_endpoint_shows_reconciles_and_checks() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("plugins")).unwrap();
    std::fs::copy(plugin("static"), dir.path().join("plugins/static.wasm")).unwrap();
    std::fs::write(
        dir.path().join("providers.yaml"),
        "providers:\n  - { name: local, plugin: static, config: { endpoints: ['127.0.0.1:18001'] } }\n",
    )
    .unwrap();
    std::fs::create_dir(dir.path().join("proxies")).unwrap();
    std::fs::write(
        dir.path().join("proxies/a.yaml"),
        "apiVersion: proxyfleet.io/v1alpha1\nkind: Proxy\nmetadata: { name: a }\nspec: { provider: local }\n",
    )
    .unwrap();
    // A free port: bind, note it, release it for the operator.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let _operator = Killed(
        Command::new(env!("CARGO_BIN_EXE_proxyfleet"))
            .args(["--log-format", "text", "standalone", "--providers"])
            .arg(dir.path().join("providers.yaml"))
            .arg("--plugin-dir")
            .arg(dir.path().join("plugins"))
            .arg("--proxies")
            .arg(dir.path().join("proxies"))
            .arg("--state")
            .arg(dir.path().join("state.redb"))
            .args(["--metrics-addr", &format!("127.0.0.1:{port}"), "--api-addr", "127.0.0.1:0"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
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
