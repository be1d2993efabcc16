//! The static plugin through the real runtime: the whole contract, and the
//! assignment guarantees under concurrency.

use std::collections::BTreeSet;
use std::sync::Arc;

use proxyfleet_core::kv::MemoryKv;
use proxyfleet_core::{ErrorClass, InstanceState};
use proxyfleet_harness::SpecBuilder;
use proxyfleet_runtime::config::ProvidersConfig;
use proxyfleet_runtime::{Registry, Runtime, RuntimeOptions};
use proxyfleet_tests::plugin;

async fn registry_with(endpoints: &[&str]) -> (Registry, tempfile::TempDir) {
    registry_taking(endpoints, "['127.0.0.0/8']").await
}

/// With `ranges` as the entry's `proxyAddresses`.
async fn registry_taking(endpoints: &[&str], ranges: &str) -> (Registry, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(plugin("static"), dir.path().join("static.wasm")).unwrap();
    let list = endpoints.iter().map(|e| format!("\"{e}\"")).collect::<Vec<_>>().join(", ");
    let config = ProvidersConfig::parse(&format!(
        "providers:\n  - name: mine\n    plugin: static\n    config: {{ endpoints: [{list}] }}\n    proxyAddresses: {ranges}\n"
    ))
    .unwrap();
    let runtime = Runtime::new(RuntimeOptions::default()).unwrap();
    let registry =
        Registry::load(&runtime, &config, dir.path(), Arc::new(MemoryKv::new())).await.unwrap();
    (registry, dir)
}

/// Issue 15, item 8: the addresses a plugin reported were probed and
/// handed out unchecked, so an entry could point the health engine and
/// crawlers at the metadata service or at the operator's own loopback.
/// Issue 43, item 5: a `proxyAddresses` range around the metadata address
/// let it through.
#[tokio::test]
async fn reported_addresses_outside_the_entry_rule_are_dropped() {
    let endpoints = ["169.254.169.254:80", "127.0.0.1:3128", "10.1.2.3:3128", "[::1]:3128"];
    let kept = |ranges: &'static str| async move {
        let (registry, _dir) = registry_taking(&endpoints, ranges).await;
        let provider = registry.provider("mine").unwrap();
        let mut kept = Vec::new();
        for name in ["a", "b", "c", "d"] {
            kept.extend(provider.create(&SpecBuilder::new(name).build()).await.unwrap().addresses);
        }
        kept
    };
    assert_eq!(kept("[]").await, ["10.1.2.3"], "private networks are taken, the rest dropped");
    assert_eq!(
        kept("['127.0.0.0/8', '169.254.0.0/16']").await,
        ["127.0.0.1"],
        "with proxyAddresses, exactly those ranges, never the metadata address inside them"
    );
}

#[tokio::test]
async fn static_plugin_serves_the_whole_contract() {
    let (registry, _dir) = registry_with(&["127.0.0.1:3128", "127.0.0.1:3129"]).await;
    let provider = registry.provider("mine").unwrap();
    assert_eq!(provider.info().name, "static");
    assert_eq!(provider.info().contract_version, proxyfleet_runtime::CONTRACT_VERSION);

    let a = provider.create(&SpecBuilder::new("a").build()).await.unwrap();
    let b = provider.create(&SpecBuilder::new("b").build()).await.unwrap();
    assert_ne!(a.provider_id, b.provider_id, "two proxies must get two endpoints");
    assert_eq!(a.state, InstanceState::Running);
    assert_eq!(a.addresses, ["127.0.0.1"]);
    assert!(matches!(a.port, Some(3128 | 3129)));
    let mark = a.mark.clone().expect("the assignment carries our mark");
    assert_eq!(
        (mark.uid.as_str(), mark.namespace.as_str(), mark.name.as_str()),
        ("uid-a", "default", "a")
    );

    let retried = provider.create(&SpecBuilder::new("a").build()).await.unwrap();
    assert_eq!(retried.provider_id, a.provider_id, "a retried create adopts the same endpoint");

    let full = provider.create(&SpecBuilder::new("c").build()).await.unwrap_err();
    assert_eq!(full.class, ErrorClass::QuotaExceeded, "{full}");

    assert_eq!(provider.get(&a.provider_id).await.unwrap().provider_id, a.provider_id);
    let listed: BTreeSet<_> =
        provider.list().await.unwrap().into_iter().map(|i| i.provider_id).collect();
    assert_eq!(listed, BTreeSet::from([a.provider_id.clone(), b.provider_id.clone()]));

    provider.delete(&a.provider_id).await.unwrap();
    let gone = provider.get(&a.provider_id).await.unwrap_err();
    assert_eq!(gone.class, ErrorClass::NotFound, "{gone}");
    provider.delete(&a.provider_id).await.expect("deleting what is gone succeeds");

    let c = provider.create(&SpecBuilder::new("c").build()).await.unwrap();
    assert_eq!(c.provider_id, a.provider_id, "a released endpoint is handed out again");
    assert!(provider.check().await.healthy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creates_never_share_an_endpoint() {
    let endpoints: Vec<String> = (0..5).map(|i| format!("127.0.0.1:{}", 3200 + i)).collect();
    let endpoints: Vec<&str> = endpoints.iter().map(String::as_str).collect();
    let (registry, _dir) = registry_with(&endpoints).await;
    let provider = registry.provider("mine").unwrap();
    let calls = (0..12).map(|i| {
        let provider = Arc::clone(&provider);
        tokio::spawn(
            async move { provider.create(&SpecBuilder::new(&format!("p{i}")).build()).await },
        )
    });
    let mut granted = Vec::new();
    let mut refused = 0;
    for call in calls {
        match call.await.unwrap() {
            Ok(instance) => granted.push(instance.provider_id),
            Err(err) => {
                assert_eq!(err.class, ErrorClass::QuotaExceeded, "{err}");
                refused += 1;
            }
        }
    }
    let unique: BTreeSet<_> = granted.iter().collect();
    assert_eq!(unique.len(), granted.len(), "an endpoint was granted twice: {granted:?}");
    assert_eq!((granted.len(), refused), (5, 7));
}

#[tokio::test]
async fn no_endpoints_is_reported_by_check() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(plugin("static"), dir.path().join("static.wasm")).unwrap();
    let config = ProvidersConfig::parse(
        "providers:\n  - { name: empty, plugin: static, config: { endpoints: [] } }\n",
    )
    .unwrap();
    let runtime = Runtime::new(RuntimeOptions::default()).unwrap();
    let registry =
        Registry::load(&runtime, &config, dir.path(), Arc::new(MemoryKv::new())).await.unwrap();
    let health = registry.provider("empty").unwrap().check().await;
    assert!(!health.healthy);
    assert_eq!(health.issues[0].reason, proxyfleet_core::HealthReason::Unreachable);
}

#[tokio::test]
async fn a_bad_config_names_the_key_and_the_entry_stays_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(plugin("static"), dir.path().join("static.wasm")).unwrap();
    let config = ProvidersConfig::parse(
        "providers:\n  - { name: bad, plugin: static, config: { endpoints: ['1.2.3.4:80', 'nope'] } }\n  - { name: good, plugin: static, config: { endpoints: ['1.2.3.4:80'] } }\n",
    )
    .unwrap();
    let runtime = Runtime::new(RuntimeOptions::default()).unwrap();
    let registry =
        Registry::load(&runtime, &config, dir.path(), Arc::new(MemoryKv::new())).await.unwrap();
    let err = registry.provider("bad").err().expect("the bad entry is unavailable");
    assert_eq!(err.class, ErrorClass::Unavailable);
    assert!(err.message.contains("endpoints[1]"), "{err}");
    registry.provider("good").expect("the good entry still works");
}
