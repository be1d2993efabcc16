//! Fleet services in Kubernetes mode against a real API server: probes
//! through real tinyproxy processes become the Proxies' `Healthy` and
//! `Ready` conditions, written by the Proxy controller; a pool member
//! crawlers report too often is deleted and its pool replaces it.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kube::ResourceExt as _;
use kube::api::{Api, ListParams, PostParams};
use proxyfleet_core::reconcile::Policy;
use proxyfleet_fleet::catalog::ReportKind;
use proxyfleet_fleet::{
    CheckTarget, Fleet, FleetSettings, HealthEngine, HealthSettings, ProbeMode,
};
use proxyfleet_kube::crd::{Proxy, ProxyPool};
use proxyfleet_metrics::Metrics;
use proxyfleet_runtime::config::ProvidersConfig;
use proxyfleet_runtime::{Registry, Runtime, RuntimeOptions};
use proxyfleet_tests::proxies::Tinyproxy;
use proxyfleet_tests::{
    Canned, TestServer, kube_admin_client, kube_install_crds, kube_test_namespace, plugin, wait_for,
};

/// `type` → `status` of the Proxy's conditions.
fn condition(proxy: &Proxy, kind: &str) -> Option<String> {
    let status = proxy.status.as_ref()?;
    status.conditions.iter().find(|c| c.type_ == kind).map(|c| c.status.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verdicts_reach_the_proxy_status_and_reported_pool_members_are_replaced() {
    let client = kube_admin_client().await;
    kube_install_crds(&client).await;
    let namespace = kube_test_namespace(&client, "pf-fleet").await;
    let mut tinyproxies = [Tinyproxy::start(), Tinyproxy::start()];
    let echo = TestServer::http(Canned {
        status: 200,
        body: Bytes::from_static(br#"{"ip":"127.0.0.1"}"#),
    })
    .await;

    let plugins = tempfile::tempdir().unwrap();
    std::fs::copy(plugin("static"), plugins.path().join("static.wasm")).unwrap();
    let providers = format!(
        "providers:\n  - name: lab\n    plugin: static\n    config: {{ endpoints: ['{}', '{}'] }}\n    proxyAddresses: ['127.0.0.0/8']\n",
        tinyproxies[0].addr(),
        tinyproxies[1].addr()
    );
    let kv = Arc::new(proxyfleet_kube::kv::ConfigMapKv::new(client.clone(), &namespace));
    let runtime = Runtime::new(RuntimeOptions::default()).unwrap();
    let registry = Arc::new(
        Registry::load(&runtime, &ProvidersConfig::parse(&providers).unwrap(), plugins.path(), kv)
            .await
            .unwrap(),
    );
    let fleet = Arc::new(Fleet::new(
        FleetSettings { replace_after: 2, ..FleetSettings::default() },
        Arc::new(Metrics::new()),
    ));
    let context = Arc::new(
        proxyfleet_kube::controller::Context::new(
            client.clone(),
            registry,
            Policy::default(),
            Some("tests".into()),
        )
        .with_fleet(Arc::clone(&fleet)),
    );
    let target = format!("http://{}/", echo.addr);
    let mut health = HealthSettings::new(CheckTarget::parse("target", &target).unwrap());
    health.interval = Duration::from_millis(300);
    health.timeout = Duration::from_millis(300);
    health.healthy_after = 1;
    health.unhealthy_after = 2;
    health.mode = ProbeMode::Get;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let until_stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let tasks = vec![
        tokio::spawn({
            let (ns, rx) = (namespace.clone(), stopped.clone());
            async move { proxyfleet_kube::controller::run(context, Some(&ns), until_stopped(rx)).await }
        }),
        tokio::spawn({
            let (ns, rx, client) = (namespace.clone(), stopped.clone(), client.clone());
            async move { proxyfleet_kube::pool::run(client, Some(&ns), until_stopped(rx)).await }
        }),
        tokio::spawn(HealthEngine::new(health, Arc::clone(&fleet)).run(until_stopped(stopped))),
    ];

    let pools: Api<ProxyPool> = Api::namespaced(client.clone(), &namespace);
    let proxies: Api<Proxy> = Api::namespaced(client.clone(), &namespace);
    let pool: ProxyPool = serde_json::from_value(serde_json::json!({
        "apiVersion": "proxyfleet.io/v1alpha1",
        "kind": "ProxyPool",
        "metadata": { "name": "crawl" },
        "spec": { "replicas": 1, "template": { "spec": { "provider": "lab" } } },
    }))
    .unwrap();
    pools.create(&PostParams::default(), &pool).await.unwrap();
    let wait = Duration::from_secs(60);
    let member_where = |want_healthy: &'static str, not_uid: Option<String>| {
        let proxies = proxies.clone();
        async move {
            wait_for(wait, || async {
                let list = proxies.list(&ListParams::default()).await.ok()?;
                list.items.into_iter().find(|p| {
                    condition(p, "Healthy").as_deref() == Some(want_healthy)
                        && p.metadata.deletion_timestamp.is_none()
                        && not_uid.as_deref() != p.uid().as_deref()
                })
            })
            .await
        }
    };
    let member = member_where("True", None).await.expect("the member turns Healthy");
    assert_eq!(condition(&member, "Ready").as_deref(), Some("True"));
    let uid = member.uid().unwrap();
    assert_eq!(fleet.next(&Default::default(), None).unwrap().0, uid);

    let port = member.status.as_ref().unwrap().port.unwrap();
    let serving = tinyproxies.iter().position(|t| t.addr().port() == port).unwrap();
    tinyproxies[serving].kill();
    let sick = member_where("False", None).await.expect("the member turns unhealthy");
    assert_eq!(sick.uid().unwrap(), uid);
    assert_eq!(condition(&sick, "Ready").as_deref(), Some("False"));
    tinyproxies[serving].restart();
    member_where("True", None).await.expect("healthy again after a restart");

    assert!(!fleet.report(&uid, ReportKind::Ban, "403").unwrap().replacing);
    assert!(fleet.report(&uid, ReportKind::Ban, "403").unwrap().replacing);
    let replacement = member_where("True", Some(uid.clone()))
        .await
        .expect("the pool makes a healthy replacement");
    assert_ne!(replacement.uid().unwrap(), uid);
    let gone = wait_for(wait, || async {
        proxies
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .iter()
            .all(|p| p.uid().as_deref() != Some(uid.as_str()))
            .then_some(())
    })
    .await;
    assert!(gone.is_some(), "the reported member is deleted");

    let _ = stop.send(true);
    for task in tasks {
        task.await.unwrap();
    }
}
