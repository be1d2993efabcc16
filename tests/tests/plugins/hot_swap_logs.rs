//! Swaps and refused candidates are logged with entry, plugin, version and
//! digest.

use std::sync::Arc;

use proxyfleet_core::kv::MemoryKv;
use proxyfleet_runtime::config::ProvidersConfig;
use proxyfleet_runtime::{Registry, Runtime, RuntimeOptions, file_digest};
use proxyfleet_tests::{CapturedLogs, plugin, replace_file};

#[tokio::test(flavor = "current_thread")]
async fn swaps_log_at_info_and_refusals_at_warn() {
    let logs = CapturedLogs::default();
    let _guard = logs.install();
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(plugin("fixtures/answer-v1"), dir.path().join("answer.wasm")).unwrap();
    let config = ProvidersConfig::parse(
        "providers:
  - { name: strict, plugin: answer }
  - name: wide
    plugin: answer
    grants: { http: [ { url: 'https://wide.example:8443' } ] }
",
    )
    .unwrap();
    let runtime = Runtime::new(RuntimeOptions::default()).unwrap();
    let registry =
        Registry::load(&runtime, &config, dir.path(), Arc::new(MemoryKv::new())).await.unwrap();

    let wide = plugin("fixtures/answer-wide");
    let digest = file_digest(&std::fs::read(&wide).unwrap());
    replace_file(&wide, &dir.path().join("answer.wasm"));
    registry.rescan().await;

    let text = logs.text();
    let line = |what: &str, entry: &str| {
        text.lines()
            .find(|l| l.contains(what) && l.contains(&format!("entry={entry}")))
            .unwrap_or_else(|| panic!("no {what:?} for {entry} logged:\n{text}"))
            .to_owned()
    };
    let refused = line("rejected a plugin candidate", "strict");
    assert!(refused.contains("WARN"), "{refused}");
    for field in
        ["plugin=answer", "version=3.0.0", &format!("digest={digest}"), "kind=capabilities"]
    {
        assert!(refused.contains(field), "{field} missing: {refused}");
    }
    let swapped = line("activated a new plugin revision", "wide");
    assert!(swapped.contains("INFO"), "{swapped}");
    for field in
        ["plugin=answer", "version=3.0.0", &format!("digest={digest}"), "previous_version=1.0.0"]
    {
        assert!(swapped.contains(field), "{field} missing: {swapped}");
    }
}
