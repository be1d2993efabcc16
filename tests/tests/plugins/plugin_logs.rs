//! Plugin logs reach the host's `tracing` with the call's context.

use proxyfleet_core::Provider as _;
use proxyfleet_harness::{Harness, SpecBuilder};
use proxyfleet_tests::{CapturedLogs, plugin};

#[tokio::test(flavor = "current_thread")]
async fn plugin_logs_carry_plugin_entry_operation_and_proxy() {
    let logs = CapturedLogs::default();
    let _guard = logs.install();
    let harness = Harness::builder(plugin("static"))
        .entry("office")
        .config(serde_json::json!({ "endpoints": ["192.0.2.1:3128"] }))
        .build()
        .await
        .unwrap();
    harness.provider().create(&SpecBuilder::new("web-1").namespace("crawl").build()).await.unwrap();

    let logged = logs.text();
    let line = logged
        .lines()
        .find(|line| line.contains("endpoint assigned"))
        .unwrap_or_else(|| panic!("the plugin's log line is missing:\n{logged}"));
    for field in [
        "plugin=\"static\"",
        "entry=\"office\"",
        "operation=\"create\"",
        "proxy=\"crawl/web-1\"",
        "endpoint",
        "192.0.2.1:3128",
    ] {
        assert!(line.contains(field), "{field} missing from: {line}");
    }
}
