//! The service-account key and the access tokens the host gets with it
//! appear in no log line and no error.

use std::sync::Arc;
use std::time::{Duration, Instant};

use proxyfleet_core::kv::MemoryKv;
use proxyfleet_core::{ErrorClass, InstanceState};
use proxyfleet_gce_sim::{SimOptions, Simulator};
use proxyfleet_harness::SpecBuilder;
use proxyfleet_runtime::config::ProvidersConfig;
use proxyfleet_runtime::{Registry, Runtime, RuntimeOptions};
use proxyfleet_tests::{CapturedLogs, localhost_tls, plugin};

#[tokio::test(flavor = "current_thread")]
async fn the_key_and_the_tokens_are_never_logged() {
    let logs = CapturedLogs::default();
    let _guard = logs.install();
    let (ca, cert, key) = localhost_tls();
    let options = SimOptions {
        token_lifetime: Duration::from_secs(2),
        operation_duration: Duration::from_millis(200),
        boot_duration: Duration::from_millis(100),
        ..SimOptions::default()
    };
    let sim = Simulator::start(options, &cert, &key).await.expect("simulator starts");
    let sa_key = sim.create_key("proxyfleet@proxyfleet-test.iam.gserviceaccount.com").unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(plugin("gcp"), dir.path().join("gcp.wasm")).unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca).unwrap();
    let key_file = dir.path().join("key.json");
    std::fs::write(&key_file, &sa_key.json).unwrap();
    let yaml = format!(
        "providers:\n{}",
        proxyfleet_tests::gcp::sim_entry(
            "gcp-logs",
            &sim.endpoint(),
            "proxyfleet-test",
            &ca_file,
            &key_file
        )
    );
    let config = ProvidersConfig::parse(&yaml).expect("valid providers file");
    let runtime = Runtime::new(RuntimeOptions::default()).unwrap();
    let registry =
        Registry::load(&runtime, &config, dir.path(), Arc::new(MemoryKv::new())).await.unwrap();
    let provider = registry.provider("gcp-logs").expect("entry ready");

    let created = provider.create(&SpecBuilder::new("quiet").build()).await.expect("create");
    let started = Instant::now();
    while provider.get(&created.provider_id).await.expect("get").state != InstanceState::Running {
        assert!(started.elapsed() < Duration::from_secs(20), "never running");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Past the token's renewal, so a second token is got and logged about.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(provider.check().await.healthy);
    provider.delete(&created.provider_id).await.expect("delete");
    sim.revoke_key(&sa_key.private_key_id);
    let mut errors = Vec::new();
    for _ in 0..2 {
        let err = provider.list().await.unwrap_err();
        assert_eq!(err.class, ErrorClass::Unauthorized, "{err}");
        errors.push(err.to_string());
    }
    let health = provider.check().await;
    errors.extend(health.issues.iter().map(|issue| issue.message.clone()));

    let tokens = sim.tokens_issued();
    assert!(tokens.len() >= 2, "the token was renewed: {tokens:?}");
    let pem = sa_key.private_key_pem();
    let key_body: Vec<&str> =
        pem.lines().filter(|line| !line.starts_with("-----") && line.len() > 20).collect();
    let logged = logs.text();
    assert!(logged.contains("obtained an access token"), "token exchanges are logged:\n{logged}");
    assert!(logged.contains("no access token"), "the refused exchange is logged:\n{logged}");
    for text in std::iter::once(&logged).chain(&errors) {
        for token in &tokens {
            assert!(!text.contains(&token.access_token), "a token leaked:\n{text}");
        }
        assert!(!text.contains("PRIVATE KEY"), "the key leaked:\n{text}");
        for line in &key_body {
            assert!(!text.contains(line), "the key leaked:\n{text}");
        }
    }
}
