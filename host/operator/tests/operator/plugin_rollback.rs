//! A running `proxyfleet standalone` swaps a plugin when a new build lands
//! in its plugin directory, shows the revisions on its API and metrics, and
//! `proxyfleet plugin rollback` brings the previous one back.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use proxyfleet_tests::operator::Site;
use proxyfleet_tests::ports::free_port;
use proxyfleet_tests::{plugin, replace_file, wait_for};

async fn active_version(api: &str) -> Option<String> {
    let (status, body) =
        proxyfleet_fleet::client::call(api, http::Method::GET, "/v1/providers", None, None)
            .await
            .ok()?;
    if status != 200 {
        return None;
    }
    let value: serde_json::Value = serde_json::from_str(&body).ok()?;
    value["revisions"][0]["active"]["version"].as_str().map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dropped_in_build_is_swapped_in_and_rolled_back_from_the_command_line() {
    let site = Site::new(
        "providers:\n  - { name: lab, plugin: answer }\n",
        &[("answer", "fixtures/answer-v1")],
        "",
    );
    let plugins = site.path("plugins");
    let api = format!("http://127.0.0.1:{}", free_port());
    let _operator = site.standalone(
        Path::new(env!("CARGO_BIN_EXE_proxyfleet")),
        // A rollback changes state: without tokens it has to be opened.
        &[
            "--metrics-addr",
            "127.0.0.1:0",
            "--api-addr",
            api.trim_start_matches("http://"),
            "--api-open-writes",
        ],
    );
    let wait = Duration::from_secs(60);
    let version = |want: &'static str| {
        let api = api.clone();
        async move {
            wait_for(wait, || async { active_version(&api).await.filter(|v| v == want) }).await
        }
    };
    assert!(version("1.0.0").await.is_some(), "build 1 serves at start");

    replace_file(&plugin("fixtures/answer-v2"), &plugins.join("answer.wasm"));
    assert!(version("2.0.0").await.is_some(), "build 2 is swapped in without a restart");

    let output = Command::new(env!("CARGO_BIN_EXE_proxyfleet"))
        .args(["plugin", "rollback", "lab", "--api", &api])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout} {}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("\"version\":\"1.0.0\""), "{stdout}");
    assert_eq!(active_version(&api).await.as_deref(), Some("1.0.0"));

    let metrics = wait_for(wait, || async {
        let (_, text) =
            proxyfleet_fleet::client::call(&api, http::Method::GET, "/metrics", None, None)
                .await
                .ok()?;
        text.contains("proxyfleet_plugin_swaps_total{entry=\"lab\"} 2").then_some(())
    })
    .await;
    assert!(metrics.is_some(), "both activations are counted");

    let unknown = Command::new(env!("CARGO_BIN_EXE_proxyfleet"))
        .args(["plugin", "rollback", "nope", "--api", &api])
        .output()
        .unwrap();
    assert!(!unknown.status.success());
    assert!(String::from_utf8_lossy(&unknown.stdout).contains("nope"));
}
