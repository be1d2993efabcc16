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
        "providers:\n  - name: shared\n    plugin: static\n    config: { endpoints: ['192.0.2.1:3128', '192.0.2.2:3128', '192.0.2.3:3128'] }\n    proxyAddresses: ['192.0.2.0/24']\n",
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

/// Discovery leases lived in the leader's memory: a change of leader ended
/// every crawler's sticky session. They live in a ConfigMap now, and the
/// next leader's catalog (another client, another process in production)
/// restores them before it serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_new_leader_honours_the_discovery_leases_the_last_one_granted() {
    use std::time::Duration;

    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::Api;
    use proxyfleet_core::proxy::Phase;
    use proxyfleet_fleet::catalog::CatalogError;
    use proxyfleet_fleet::probe::ProbePass;
    use proxyfleet_fleet::{Endpoint, Fleet, FleetSettings, Member, Selector};
    use proxyfleet_metrics::Metrics;

    let client = kube_admin_client().await;
    let namespace = kube_test_namespace(&client, "pf-leases").await;
    let catalog = || {
        let fleet = Fleet::new(FleetSettings::default(), Arc::new(Metrics::new()))
            .with_lease_store(Arc::new(ConfigMapKv::new(client.clone(), &namespace)));
        let member = Member {
            id: "uid-1".into(),
            namespace: "default".into(),
            name: "proxy-1".into(),
            pool: None,
            provider: "lab".into(),
            labels: Default::default(),
            phase: Phase::Running,
            endpoint: Some(Endpoint::new([127, 0, 0, 1].into(), 3128)),
            created_at: None,
            conditions: Vec::new(),
        };
        fleet.publish(vec![member]);
        let pass = Ok(ProbePass { latency: Duration::from_millis(1), exit_ip: None });
        let results =
            fleet.probe_targets().into_iter().map(|(id, e)| (id, e, pass.clone())).collect();
        fleet.record_probes(results, 1, 1);
        fleet
    };
    let any = Selector::default();
    let leader = catalog();
    assert_eq!(leader.restore_leases().await.unwrap(), 0);
    let held = leader.lease(&any, None, true, Some(Duration::from_secs(600))).await.unwrap();
    drop(leader);

    let next = catalog();
    assert_eq!(next.restore_leases().await.unwrap(), 1);
    assert!(
        matches!(next.lease(&any, None, true, None).await, Err(CatalogError::NoneAvailable(_))),
        "the only proxy is still held"
    );
    next.renew(&held.id, Some(Duration::from_secs(900))).await.unwrap();
    let stored: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    assert!(stored.get_opt("proxyfleet-kv-discovery.leases").await.unwrap().is_some());
    next.release(&held.id).await.unwrap();
    assert_eq!(catalog().restore_leases().await.unwrap(), 0, "a release is kept too");
}

/// A store that answers reads from its watch: its own writes at once, and
/// another replica's once the watch brings them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watched_store_reads_its_own_writes_at_once_and_another_replicas_soon() {
    use std::time::{Duration, Instant};

    let client = kube_admin_client().await;
    let namespace = kube_test_namespace(&client, "pf-kv-watch").await;
    let (store, follow) = ConfigMapKv::watched(kube_admin_client().await, &namespace);
    let follow = tokio::spawn(follow);
    let other = ConfigMapKv::new(client, &namespace);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !store.follows_watch() {
        assert!(Instant::now() < deadline, "the watch lists the store's ConfigMaps");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let mut version = None;
    for round in 0..20u8 {
        let written =
            store.compare_and_swap("lab", "counter", version, Some(vec![round])).await.unwrap();
        let CasOutcome::Applied(v) = written else { panic!("round {round}: {written:?}") };
        let read = store.get("lab", "counter").await.unwrap().unwrap();
        assert_eq!((read.value, read.version), (vec![round], v), "round {round}");
        version = Some(v);
    }
    assert!(store.follows_watch(), "those reads came from the watch");

    other.compare_and_swap("lab", "from/other", None, Some(b"x".to_vec())).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while store.get("lab", "from/other").await.unwrap().is_none() {
        assert!(Instant::now() < deadline, "the other replica's write arrives");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let keys: Vec<_> = store.list("lab", "").await.unwrap().into_iter().map(|e| e.key).collect();
    assert_eq!(keys, ["counter", "from/other"]);
    follow.abort();
}
