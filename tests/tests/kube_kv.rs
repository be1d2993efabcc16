//! The plugins' key-value store on ConfigMaps, against a real API server:
//! compare-and-swap holds across clients, so two operator replicas never
//! hand out the same allocation.

use std::collections::BTreeSet;
use std::sync::Arc;

use proxyfleet_core::kv::{CasOutcome, KvStore};
use proxyfleet_harness::SpecBuilder;
use proxyfleet_kube::kv::ConfigMapKv;
use proxyfleet_runtime::config::ProvidersConfig;
use proxyfleet_runtime::{Registry, Runtime, RuntimeOptions};
use proxyfleet_tests::{kube_admin_client, kube_test_namespace, plugin};

#[tokio::test]
async fn compare_and_swap_semantics_hold_on_configmaps() {
    let client = kube_admin_client().await;
    let namespace = kube_test_namespace(&client, "pf-kv").await;
    let store = ConfigMapKv::new(client, &namespace);

    let CasOutcome::Applied(v1) =
        store.compare_and_swap("lab", "endpoint/a", None, Some(b"uid-1".to_vec())).await.unwrap()
    else {
        panic!("the first create applies")
    };
    let lost =
        store.compare_and_swap("lab", "endpoint/a", None, Some(b"uid-2".to_vec())).await.unwrap();
    assert!(
        matches!(lost, CasOutcome::Conflict(Some(ref e)) if e.value == b"uid-1" && e.version == v1)
    );
    store.compare_and_swap("lab", "endpoint/a", Some(v1), None).await.unwrap();
    store.compare_and_swap("lab", "endpoint/a", None, Some(vec![])).await.unwrap();
    let stale = store.compare_and_swap("lab", "endpoint/a", Some(v1), None).await.unwrap();
    assert!(matches!(stale, CasOutcome::Conflict(Some(_))), "a version is never handed out twice");

    store.compare_and_swap("lab", "other/x", None, Some(vec![1])).await.unwrap();
    store.compare_and_swap("elsewhere", "endpoint/z", None, Some(vec![1])).await.unwrap();
    let keys: Vec<_> =
        store.list("lab", "endpoint/").await.unwrap().into_iter().map(|e| e.key).collect();
    assert_eq!(keys, ["endpoint/a"]);
    assert_eq!(store.get("elsewhere", "endpoint/a").await.unwrap(), None, "scopes are separate");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_writers_from_two_clients_each_win_a_key_once() {
    let client = kube_admin_client().await;
    let namespace = kube_test_namespace(&client, "pf-kv-race").await;
    let replicas = [
        ConfigMapKv::new(kube_admin_client().await, &namespace),
        ConfigMapKv::new(kube_admin_client().await, &namespace),
    ];
    let mut attempts = Vec::new();
    for writer in 0..16u8 {
        let store = replicas[usize::from(writer % 2)].clone();
        attempts.push(tokio::spawn(async move {
            let key = format!("slot/{}", writer % 4);
            let outcome =
                store.compare_and_swap("race", &key, None, Some(vec![writer])).await.unwrap();
            (key, matches!(outcome, CasOutcome::Applied(_)))
        }));
    }
    let mut winners = Vec::new();
    for attempt in attempts {
        let (key, won) = attempt.await.unwrap();
        if won {
            winners.push(key);
        }
    }
    winners.sort();
    assert_eq!(winners, ["slot/0", "slot/1", "slot/2", "slot/3"], "each key is won exactly once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_operators_on_one_store_never_share_a_static_endpoint() {
    let client = kube_admin_client().await;
    let namespace = kube_test_namespace(&client, "pf-kv-static").await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(plugin("static"), dir.path().join("static.wasm")).unwrap();
    let config = ProvidersConfig::parse(
        "providers:\n  - name: shared\n    plugin: static\n    config: { endpoints: ['192.0.2.1:3128', '192.0.2.2:3128', '192.0.2.3:3128'] }\n",
    )
    .unwrap();
    let mut operators = Vec::new();
    for _ in 0..2 {
        let runtime = Runtime::new(RuntimeOptions::default()).unwrap();
        let kv = Arc::new(ConfigMapKv::new(kube_admin_client().await, &namespace));
        operators.push(
            Registry::load(&runtime, &config, dir.path(), kv)
                .await
                .unwrap()
                .provider("shared")
                .unwrap(),
        );
    }
    let calls = (0..8).map(|i| {
        let provider = Arc::clone(&operators[i % 2]);
        tokio::spawn(
            async move { provider.create(&SpecBuilder::new(&format!("p{i}")).build()).await },
        )
    });
    let mut granted = Vec::new();
    for call in calls {
        if let Ok(instance) = call.await.unwrap() {
            granted.push(instance.provider_id);
        }
    }
    let unique: BTreeSet<_> = granted.iter().collect();
    assert_eq!(unique.len(), granted.len(), "an endpoint was handed out twice: {granted:?}");
    assert_eq!(granted.len(), 3);
}
