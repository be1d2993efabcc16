//! Fleet services in Kubernetes mode against a real API server: probes
//! through real tinyproxy processes become the Proxies' `Healthy` and
//! `Ready` conditions, written by the Proxy controller; a pool member
//! crawlers report too often is deleted and its pool replaces it.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt as _;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
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
    Canned, TestServer, kube_admin_client, kube_install_crds, kube_pool, kube_test_namespace,
    plugin, wait_for,
};

/// `type` → `status` of the Proxy's conditions.
fn condition(proxy: &Proxy, kind: &str) -> Option<String> {
    let status = proxy.status.as_ref()?;
    status.conditions.iter().find(|c| c.type_ == kind).map(|c| format!("{:?}", c.status))
}

/// What probes fetch through the proxies: an echo of the exit IP.
async fn echo() -> TestServer {
    TestServer::http(Canned { status: 200, body: Bytes::from_static(br#"{"ip":"127.0.0.1"}"#) })
        .await
}

/// A providers file with one static entry, `lab`, listing `proxies`.
fn static_lab(proxies: &[std::net::SocketAddr]) -> String {
    let endpoints: Vec<String> = proxies.iter().map(|addr| format!("'{addr}'")).collect();
    format!(
        "providers:\n  - name: lab\n    plugin: static\n    config: {{ endpoints: [{}] }}\n    proxyAddresses: ['127.0.0.0/8']\n",
        endpoints.join(", ")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verdicts_reach_the_proxy_status_and_reported_pool_members_are_replaced() {
    let client = kube_admin_client().await;
    kube_install_crds(&client).await;
    let namespace = kube_test_namespace(&client, "pf-fleet").await;
    let mut tinyproxies = [Tinyproxy::start(), Tinyproxy::start()];
    let echo = echo().await;

    let providers = static_lab(&[tinyproxies[0].addr(), tinyproxies[1].addr()]);
    let fleet = Arc::new(Fleet::new(
        FleetSettings { replace_after: 2, ..FleetSettings::default() },
        Arc::new(Metrics::new()),
    ));
    let running =
        Running::start(&client, &namespace, &providers, &fleet, &echo, Policy::default()).await;
    let pools: Api<ProxyPool> = Api::namespaced(client.clone(), &namespace);
    let proxies: Api<Proxy> = Api::namespaced(client.clone(), &namespace);
    pools.create(&PostParams::default(), &kube_pool(1)).await.unwrap();
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

    running.stop().await;
}

/// The Proxy and ProxyPool controllers and the health engine on
/// `providers` (the static plugin) in `namespace`, probing `echo`.
struct Running {
    stop: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    _plugins: tempfile::TempDir,
}

impl Running {
    async fn start(
        client: &kube::Client,
        namespace: &str,
        providers: &str,
        fleet: &Arc<Fleet>,
        echo: &TestServer,
        policy: Policy,
    ) -> Self {
        let plugins = tempfile::tempdir().unwrap();
        std::fs::copy(plugin("static"), plugins.path().join("static.wasm")).unwrap();
        let kv = Arc::new(proxyfleet_kube::kv::ConfigMapKv::new(client.clone(), namespace));
        let runtime = Runtime::new(RuntimeOptions::default()).unwrap();
        let registry = Arc::new(
            Registry::load(
                &runtime,
                &ProvidersConfig::parse(providers).unwrap(),
                plugins.path(),
                kv,
            )
            .await
            .unwrap(),
        );
        let wakes = Arc::new(proxyfleet_kube::fleet::Wakes::default());
        let credentials = Arc::new(proxyfleet_kube::credentials::Credentials::default());
        let context = Arc::new(
            proxyfleet_kube::controller::Context::new(
                client.clone(),
                registry,
                policy,
                Some("tests".into()),
                proxyfleet_core::spec_key::SpecKey::generate(),
            )
            .with_fleet(
                Arc::clone(fleet),
                Arc::clone(&wakes),
                Arc::clone(&credentials),
            ),
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
                let (ns, rx) = (namespace.to_owned(), stopped.clone());
                async move {
                    proxyfleet_kube::controller::run(context, Some(&ns), until_stopped(rx)).await
                }
            }),
            tokio::spawn({
                let (ns, rx, client) = (namespace.to_owned(), stopped.clone(), client.clone());
                async move {
                    proxyfleet_kube::pool::run(
                        client,
                        Some(&ns),
                        Default::default(),
                        until_stopped(rx),
                    )
                    .await
                }
            }),
            tokio::spawn(proxyfleet_kube::fleet_services::serve(
                client.clone(),
                Some(namespace.to_owned()),
                Arc::clone(fleet),
                HealthEngine::new(health, Arc::clone(fleet)),
                credentials,
                wakes,
                until_stopped(stopped),
            )),
        ];
        Self { stop, tasks, _plugins: plugins }
    }

    async fn stop(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            task.await.unwrap();
        }
    }
}

/// A follower replica: the fleet services alone (watch, credentials,
/// probes), with no controller, over the same lease store as the leader.
struct Follower {
    fleet: Arc<Fleet>,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Follower {
    fn start(client: &kube::Client, namespace: &str, echo: &TestServer) -> Self {
        let fleet = Arc::new(stored_fleet(client, namespace));
        let target = format!("http://{}/", echo.addr);
        let mut health = HealthSettings::new(CheckTarget::parse("target", &target).unwrap());
        health.interval = Duration::from_millis(300);
        health.timeout = Duration::from_millis(300);
        health.healthy_after = 1;
        health.mode = ProbeMode::Get;
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(proxyfleet_kube::fleet_services::serve(
            client.clone(),
            Some(namespace.to_owned()),
            Arc::clone(&fleet),
            HealthEngine::new(health, Arc::clone(&fleet)),
            Arc::default(),
            Arc::default(),
            async move {
                let _ = stopped.wait_for(|stop| *stop).await;
            },
        ));
        Self { fleet, stop, task }
    }

    async fn stop(self) {
        let _ = self.stop.send(true);
        self.task.await.unwrap();
    }
}

/// A catalog whose leases live in `namespace`'s store, as every replica's.
fn stored_fleet(client: &kube::Client, namespace: &str) -> Fleet {
    Fleet::new(FleetSettings::default(), Arc::new(Metrics::new())).with_lease_store(Arc::new(
        proxyfleet_kube::kv::ConfigMapKv::new(client.clone(), namespace),
    ))
}

/// A Proxy naming a labelled basic-auth Secret: probes through a tinyproxy
/// that asks for that credential pass, and the catalog hands out the
/// proxy with it. One naming an unlabelled Secret is refused, by field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credential_from_a_labelled_secret_reaches_probes_and_the_catalog() {
    let client = kube_admin_client().await;
    kube_install_crds(&client).await;
    let namespace = kube_test_namespace(&client, "pf-auth").await;
    let tinyproxy = Tinyproxy::start_with("BasicAuth crawler s3cret-pw\n");
    let echo = echo().await;
    let providers = static_lab(&[tinyproxy.addr()]);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    for (name, labelled) in [("proxy-auth", true), ("unlabelled", false)] {
        let labels = if labelled {
            serde_json::json!({ "proxyfleet.io/proxy-auth": "true" })
        } else {
            serde_json::json!({})
        };
        let secret: Secret = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": { "name": name, "labels": labels },
            "type": "kubernetes.io/basic-auth",
            "stringData": { "username": "crawler", "password": "s3cret-pw" },
        }))
        .unwrap();
        secrets.create(&PostParams::default(), &secret).await.unwrap();
    }
    let fleet = Arc::new(stored_fleet(&client, &namespace));
    let running =
        Running::start(&client, &namespace, &providers, &fleet, &echo, Policy::default()).await;
    let follower = Follower::start(&client, &namespace, &echo);
    let proxies: Api<Proxy> = Api::namespaced(client.clone(), &namespace);
    for (name, secret) in [("authed", "proxy-auth"), ("refused", "unlabelled")] {
        let proxy: Proxy = serde_json::from_value(serde_json::json!({
            "apiVersion": "proxyfleet.io/v1alpha1",
            "kind": "Proxy",
            "metadata": { "name": name },
            "spec": { "provider": "lab", "proxyAuthSecretRef": { "name": secret } },
        }))
        .unwrap();
        proxies.create(&PostParams::default(), &proxy).await.unwrap();
    }
    let wait = Duration::from_secs(60);
    let healthy = wait_for(wait, || async {
        let proxy = proxies.get("authed").await.ok()?;
        (condition(&proxy, "Healthy").as_deref() == Some("True")).then_some(proxy)
    })
    .await
    .expect("probes with the Secret's credential pass");
    let picked = fleet.next_picked(&Default::default(), None).unwrap();
    assert_eq!(Some(picked.id), healthy.uid());
    assert_eq!(
        picked.endpoint.url_with_credential(),
        format!("http://crawler:s3cret-pw@{}", tinyproxy.addr())
    );
    let refused = wait_for(wait, || async {
        let proxy = proxies.get("refused").await.ok()?;
        let status = proxy.status?;
        status
            .conditions
            .into_iter()
            .filter_map(|c| c.message)
            .find(|message| message.contains("spec.proxyAuthSecretRef"))
    })
    .await
    .expect("a Proxy naming an unlabelled Secret is refused");
    assert!(refused.contains("proxyfleet.io/proxy-auth"), "{refused}");
    assert!(!refused.contains("s3cret"), "{refused}");

    // Issue 46, item 1: a follower serves the same fleet. It reads the
    // credential itself, probes with it, and turns ready; the refused
    // Proxy is no member it hands out.
    let served = wait_for(wait, || async {
        let picked = follower.fleet.next_picked(&Default::default(), None).ok()?;
        follower.fleet.is_ready().then_some(picked)
    })
    .await
    .expect("the follower hands the proxy out, with its credential");
    assert_eq!(Some(served.id.clone()), healthy.uid());
    assert_eq!(
        served.endpoint.url_with_credential(),
        format!("http://crawler:s3cret-pw@{}", tinyproxy.addr())
    );
    // Leases are shared: one the follower grants holds on the leader.
    let held = follower.fleet.lease(&Default::default(), None, true, None).await.unwrap();
    assert!(
        matches!(
            fleet.lease(&Default::default(), None, false, None).await,
            Err(proxyfleet_fleet::catalog::CatalogError::NoneAvailable(_))
        ),
        "the leader hands out no proxy the follower leased exclusively"
    );
    fleet.release(&held.id).await.unwrap();
    fleet.lease(&Default::default(), None, false, None).await.unwrap();
    follower.stop().await;
    running.stop().await;
}

/// Regression: a rotated credential Secret used to reach the instance, the
/// probes and the catalog only at the Proxy's next resync (a minute). The
/// controller watches labelled Secrets now; with the resync an hour away,
/// only that watch can bring the new password in. The tinyproxy accepts
/// both passwords, so the proxy stays healthy throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_rotated_credential_secret_reaches_the_catalog_without_waiting_for_a_resync() {
    let client = kube_admin_client().await;
    kube_install_crds(&client).await;
    let namespace = kube_test_namespace(&client, "pf-rotate").await;
    let tinyproxy = Tinyproxy::start_with("BasicAuth crawler old-pw\nBasicAuth crawler n3w-pw\n");
    let echo = echo().await;
    let providers = static_lab(&[tinyproxy.addr()]);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": { "name": "exit-auth", "labels": { "proxyfleet.io/proxy-auth": "true" } },
        "type": "kubernetes.io/basic-auth",
        "stringData": { "username": "crawler", "password": "old-pw" },
    }))
    .unwrap();
    secrets.create(&PostParams::default(), &secret).await.unwrap();
    let fleet = Arc::new(Fleet::new(FleetSettings::default(), Arc::new(Metrics::new())));
    let policy = Policy { resync: Duration::from_secs(3600), ..Policy::default() };
    let running = Running::start(&client, &namespace, &providers, &fleet, &echo, policy).await;
    // A follower, which runs no passes, follows the Secret by its own watch.
    let follower = Follower::start(&client, &namespace, &echo);
    let proxies: Api<Proxy> = Api::namespaced(client.clone(), &namespace);
    let proxy: Proxy = serde_json::from_value(serde_json::json!({
        "apiVersion": "proxyfleet.io/v1alpha1",
        "kind": "Proxy",
        "metadata": { "name": "exit" },
        "spec": { "provider": "lab", "proxyAuthSecretRef": { "name": "exit-auth" } },
    }))
    .unwrap();
    proxies.create(&PostParams::default(), &proxy).await.unwrap();
    let handed_out = |fleet: &Arc<Fleet>, password: &'static str| {
        let fleet = Arc::clone(fleet);
        let url = format!("http://crawler:{password}@{}", tinyproxy.addr());
        move || {
            let fleet = Arc::clone(&fleet);
            let url = url.clone();
            async move {
                let picked = fleet.next_picked(&Default::default(), None).ok()?;
                (picked.endpoint.url_with_credential() == url).then_some(())
            }
        }
    };
    let wait = Duration::from_secs(60);
    wait_for(wait, handed_out(&fleet, "old-pw")).await.expect("the first password is handed out");
    wait_for(wait, handed_out(&follower.fleet, "old-pw")).await.expect("by the follower too");
    // The verdict's own pass (which writes `Healthy`) reads the Secret too:
    // it must be over before the rotation, or it would bring the new
    // password in without any watch.
    wait_for(wait, || async {
        let proxy = proxies.get("exit").await.ok()?;
        (condition(&proxy, "Healthy").as_deref() == Some("True")).then_some(())
    })
    .await
    .expect("the Proxy's status says Healthy");

    let rotated = serde_json::json!({ "stringData": { "password": "n3w-pw" } });
    secrets.patch("exit-auth", &PatchParams::default(), &Patch::Merge(&rotated)).await.unwrap();
    wait_for(wait, handed_out(&fleet, "n3w-pw"))
        .await
        .expect("the rotated password is handed out long before the hour's resync");
    wait_for(wait, handed_out(&follower.fleet, "n3w-pw"))
        .await
        .expect("the follower hands out the rotated password too");
    follower.stop().await;
    running.stop().await;
}
