//! `proxyfleet standalone` as a real process: the static plugin hands out
//! a real tinyproxy, the health engine probes it through its port, and the
//! discovery API hands it to a crawler whose request really goes through.

use std::io::{Read as _, Write as _};
use std::process::{Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use proxyfleet_tests::proxies::Tinyproxy;
use proxyfleet_tests::{Canned, TestServer, plugin, wait_for};

struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

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

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crawler_gets_a_healthy_proxy_from_the_api_and_loses_it_when_it_dies() {
    let mut proxy = Tinyproxy::start();
    let origin =
        TestServer::http(Canned { status: 200, body: Bytes::from_static(b"hello via proxy") })
            .await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("plugins")).unwrap();
    std::fs::copy(plugin("static"), dir.path().join("plugins/static.wasm")).unwrap();
    std::fs::write(
        dir.path().join("providers.yaml"),
        format!(
            "providers:\n  - {{ name: local, plugin: static, config: {{ endpoints: ['{}'] }} }}\n",
            proxy.addr()
        ),
    )
    .unwrap();
    std::fs::create_dir(dir.path().join("proxies")).unwrap();
    std::fs::write(
        dir.path().join("proxies/a.yaml"),
        "apiVersion: proxyfleet.io/v1alpha1\nkind: Proxy\nmetadata: { name: a }\nspec: { provider: local }\n",
    )
    .unwrap();
    let api = format!("127.0.0.1:{}", free_port());
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
            .args(["--metrics-addr", "127.0.0.1:0", "--api-addr", &api])
            .args(["--health-interval", "300ms", "--health-timeout", "300ms"])
            .args(["--health-healthy-after", "1", "--health-unhealthy-after", "2"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
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
    assert!(
        get(&api, "/metrics")
            .unwrap()
            .1
            .contains("proxyfleet_health_probes_total{outcome=\"passed\"}")
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
