//! A runtime given the metrics as its call observer counts every provider
//! call by entry, operation and outcome, and every plugin fault.

use std::sync::Arc;

use proxyfleet_core::kv::MemoryKv;
use proxyfleet_harness::SpecBuilder;
use proxyfleet_metrics::Metrics;
use proxyfleet_runtime::config::ProvidersConfig;
use proxyfleet_runtime::{Registry, Runtime, RuntimeOptions};
use proxyfleet_tests::plugin;

#[tokio::test]
async fn calls_and_faults_are_counted_by_entry_operation_and_outcome() {
    let metrics = Arc::new(Metrics::new());
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(plugin("static"), dir.path().join("static.wasm")).unwrap();
    std::fs::copy(plugin("fixtures/panic"), dir.path().join("panic.wasm")).unwrap();
    let config = ProvidersConfig::parse(
        "providers:\n  - name: office\n    plugin: static\n    config: { endpoints: ['192.0.2.1:3128'] }\n    proxyAddresses: ['192.0.2.0/24']\n  - name: broken\n    plugin: panic\n",
    )
    .unwrap();
    let runtime = Runtime::new(RuntimeOptions {
        observer: Some(Arc::clone(&metrics) as _),
        ..RuntimeOptions::default()
    })
    .unwrap();
    let registry =
        Registry::load(&runtime, &config, dir.path(), Arc::new(MemoryKv::new())).await.unwrap();
    let office = registry.provider("office").unwrap();
    let broken = registry.provider("broken").unwrap();

    let instance = office.create(&SpecBuilder::new("web-1").build()).await.unwrap();
    office.get(&instance.provider_id).await.unwrap();
    office.get("no-such-instance").await.unwrap_err();
    assert!(office.check().await.healthy);
    broken.create(&SpecBuilder::new("web-2").build()).await.unwrap_err();
    broken.list().await.unwrap();

    let text = metrics.encode();
    for line in [
        "proxyfleet_provider_calls_total{entry=\"office\",operation=\"validate-config\",outcome=\"ok\"} 1",
        "proxyfleet_provider_calls_total{entry=\"office\",operation=\"create\",outcome=\"ok\"} 1",
        "proxyfleet_provider_calls_total{entry=\"office\",operation=\"get\",outcome=\"ok\"} 1",
        "proxyfleet_provider_calls_total{entry=\"office\",operation=\"get\",outcome=\"not-found\"} 1",
        "proxyfleet_provider_calls_total{entry=\"office\",operation=\"check\",outcome=\"ok\"} 1",
        "proxyfleet_provider_calls_total{entry=\"broken\",operation=\"create\",outcome=\"plugin-fault\"} 1",
        "proxyfleet_provider_calls_total{entry=\"broken\",operation=\"list\",outcome=\"ok\"} 1",
        "proxyfleet_provider_call_seconds_count{entry=\"office\",operation=\"create\"} 1",
        "proxyfleet_provider_call_seconds_count{entry=\"broken\",operation=\"create\"} 1",
        "proxyfleet_provider_call_seconds_count{entry=\"office\",operation=\"get\"} 2",
        "proxyfleet_plugin_faults_total{entry=\"broken\"} 1",
    ] {
        assert!(text.contains(line), "{line} missing from:\n{text}");
    }
    assert!(
        !text.contains("proxyfleet_plugin_faults_total{entry=\"office\"}"),
        "an error the plugin answered with is no fault:\n{text}"
    );
}
