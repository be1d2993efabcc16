//! `proxyfleet run` as real processes against the real API server: leader
//! handover when the leader dies, a restart after an unrecorded create
//! leaving exactly one instance, the leader label the discovery Service
//! selects on, and a SIGTERM that hands the Lease over at once.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt as _;
use kube::api::{Api, PostParams};
use proxyfleet_core::kv::KvStore as _;
use proxyfleet_core::proxy::ProxyMeta;
use proxyfleet_kube::crd::{Condition, Proxy};
use proxyfleet_kube::kv::ConfigMapKv;
use proxyfleet_kube::operate::LEADER_LABEL;
use proxyfleet_runtime::config::ProvidersConfig;
use proxyfleet_runtime::{Registry, Runtime, RuntimeOptions};
use proxyfleet_tests::operator::terminate;
use proxyfleet_tests::proxies::Tinyproxy;
use proxyfleet_tests::{
    Canned, TestServer, kube_admin_client, kube_install_crds, kube_test_namespace, plugin, wait_for,
};

const PROVIDERS: &str = "providers:\n  - name: lab\n    plugin: static\n    config: { endpoints: ['192.0.2.1:3128', '192.0.2.2:3128', '192.0.2.3:3128'] }\n    proxyAddresses: ['192.0.2.0/24']\n";

const POD: &str = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"NAME","labels":{"app.kubernetes.io/name":"proxyfleet"}},"spec":{"automountServiceAccountToken":false,"containers":[{"name":"proxyfleet","image":"proxyfleet"}]}}"#;

/// An operator process, killed (not stopped) when dropped.
struct Operator(Child);

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn kubeconfig() -> std::path::PathBuf {
    let state = std::env::var_os("PROXYFLEET_KUBE_STATE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::PathBuf::from(std::env::var_os("HOME").unwrap())
                .join(".cache/proxyfleet/kube/state")
        });
    state.join("kubeconfig")
}

fn start(dir: &Path, namespace: &str, identity: &str) -> Operator {
    start_as_pod(dir, namespace, identity, None, "127.0.0.1:0")
}

/// An operator that believes it runs as pod `pod` (its `POD_NAME`), with
/// the discovery API on `api`.
fn start_as_pod(
    dir: &Path,
    namespace: &str,
    identity: &str,
    pod: Option<&str>,
    api: &str,
) -> Operator {
    start_with_lease(dir, namespace, identity, pod, api, "3s")
}

/// As [`start_with_lease`], with `extra` arguments.
fn start_with_args(
    dir: &Path,
    namespace: &str,
    identity: &str,
    api: &str,
    extra: &[&str],
) -> Operator {
    spawn(dir, namespace, identity, None, api, "3s", extra)
}

/// As [`start_as_pod`], holding the Lease for `lease` (e.g. `60s`).
fn start_with_lease(
    dir: &Path,
    namespace: &str,
    identity: &str,
    pod: Option<&str>,
    api: &str,
    lease: &str,
) -> Operator {
    spawn(dir, namespace, identity, pod, api, lease, &[])
}

fn spawn(
    dir: &Path,
    namespace: &str,
    identity: &str,
    pod: Option<&str>,
    api: &str,
    lease: &str,
    extra: &[&str],
) -> Operator {
    let log = std::fs::File::create(dir.join(format!("{identity}.log"))).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_proxyfleet"));
    if let Some(pod) = pod {
        command.env("POD_NAME", pod);
    }
    let child = command
        .args(["--log-format", "text", "run", "--providers"])
        .arg(dir.join("providers.yaml"))
        .arg("--plugin-dir")
        .arg(dir.join("plugins"))
        .args(["--namespace", namespace, "--watch-namespace", namespace, "--identity", identity])
        .args(["--lease-duration", lease, "--gc-interval", "1h", "--provider-check-interval", "1h"])
        .args(["--metrics-addr", "127.0.0.1:0", "--api-addr", api])
        .args(extra)
        .env("KUBECONFIG", kubeconfig())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    Operator(child)
}

fn proxy(name: &str) -> Proxy {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "proxyfleet.io/v1alpha1",
        "kind": "Proxy",
        "metadata": { "name": name },
        "spec": { "provider": "lab" },
    }))
    .unwrap()
}

async fn ready_endpoint(proxies: &Api<Proxy>, name: &str) -> Option<String> {
    wait_for(Duration::from_secs(60), || async {
        let current = proxies.get(name).await.ok()?;
        let status = current.status?;
        let ready = Condition::is_true(&status.conditions, "Ready");
        ready.then_some(status.provider_id).flatten()
    })
    .await
}

async fn holder(leases: &Api<Lease>) -> Option<String> {
    leases.get_opt("proxyfleet-leader").await.ok()??.spec?.holder_identity
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_second_operator_takes_over_and_a_restart_adopts_an_unrecorded_create() {
    let client = kube_admin_client().await;
    kube_install_crds(&client).await;
    let namespace = kube_test_namespace(&client, "pf-run").await;
    let dir = static_site();
    let proxies: Api<Proxy> = Api::namespaced(client.clone(), &namespace);
    let leases: Api<Lease> = Api::namespaced(client.clone(), &namespace);

    let first = start(dir.path(), &namespace, "first");
    proxies.create(&PostParams::default(), &proxy("p1")).await.unwrap();
    let p1 = ready_endpoint(&proxies, "p1").await.expect("the first operator reconciles p1");
    let second = start(dir.path(), &namespace, "second");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(holder(&leases).await.as_deref(), Some("first"));

    // The leader dies without releasing the Lease.
    drop(first);
    let took_over = wait_for(Duration::from_secs(30), || async {
        (holder(&leases).await.as_deref() == Some("second")).then_some(())
    })
    .await;
    assert!(took_over.is_some(), "the second operator takes the Lease after it expires");
    proxies.create(&PostParams::default(), &proxy("p2")).await.unwrap();
    let p2 = ready_endpoint(&proxies, "p2").await.expect("the new leader reconciles p2");
    assert_ne!(p1, p2);

    // No operator runs; p3 is created and its create reaches the backend,
    // but the status never records it (a crash right after the call).
    drop(second);
    let p3 = proxies.create(&PostParams::default(), &proxy("p3")).await.unwrap();
    let kv = Arc::new(ConfigMapKv::new(client.clone(), &namespace));
    let runtime = Runtime::new(RuntimeOptions::default()).unwrap();
    let registry = Registry::load(
        &runtime,
        &ProvidersConfig::parse(PROVIDERS).unwrap(),
        &dir.path().join("plugins"),
        Arc::clone(&kv) as _,
    )
    .await
    .unwrap();
    let meta = ProxyMeta {
        uid: p3.uid().unwrap(),
        namespace: namespace.clone(),
        name: "p3".into(),
        generation: 1,
    };
    let desired = proxyfleet_kube::convert::desired(&p3.spec, Vec::new(), None, None);
    let orphan_of_crash =
        registry.provider("lab").unwrap().create(&desired.to_spec(&meta)).await.unwrap();

    let _restarted = start(dir.path(), &namespace, "restarted");
    let adopted =
        ready_endpoint(&proxies, "p3").await.expect("the restarted operator reconciles p3");
    assert_eq!(adopted, orphan_of_crash.provider_id, "it adopts instead of creating a second");
    let assignments = kv.list("lab", "endpoint/").await.unwrap();
    assert_eq!(assignments.len(), 3, "exactly one instance per Proxy: {assignments:?}");
}

fn free_addr() -> String {
    format!("127.0.0.1:{}", proxyfleet_tests::ports::free_port())
}

async fn readyz(api: &str) -> Option<u16> {
    let base = format!("http://{api}");
    proxyfleet_fleet::client::call(&base, http::Method::GET, "/readyz", None, None)
        .await
        .ok()
        .map(|(status, _)| status)
}

/// The console's Overview page of the operator at `api`.
async fn overview(api: &str) -> String {
    let base = format!("http://{api}");
    proxyfleet_fleet::client::call(&base, http::Method::GET, "/ui/", None, None)
        .await
        .map(|(_, body)| body)
        .unwrap_or_default()
}

/// Pods `op-a` and `op-b` in `namespace`, for operators that believe they
/// run as them (the leader labels its own pod).
async fn operator_pods(client: &kube::Client, namespace: &str) -> Api<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    for name in ["op-a", "op-b"] {
        let pod: Pod = serde_json::from_str(&POD.replace("NAME", name)).unwrap();
        // A new namespace's default ServiceAccount appears a moment after
        // the namespace (the controller-manager makes it): retry until then.
        let created = wait_for(Duration::from_secs(30), || async {
            pods.create(&PostParams::default(), &pod).await.ok()
        })
        .await;
        assert!(created.is_some(), "pod {name} could not be created");
    }
    pods
}

/// A folder with the static plugin and [`PROVIDERS`].
fn static_site() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("plugins")).unwrap();
    std::fs::copy(plugin("static"), dir.path().join("plugins/static.wasm")).unwrap();
    std::fs::write(dir.path().join("providers.yaml"), PROVIDERS).unwrap();
    dir
}

/// The leader labels its pod (so `kubectl get pods -l` names it), and
/// every replica serves a ready catalog: the discovery Service sends to
/// all of them (issue 46, item 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_labels_its_pod_and_every_replica_is_ready() {
    let client = kube_admin_client().await;
    kube_install_crds(&client).await;
    let namespace = kube_test_namespace(&client, "pf-label").await;
    let pods = operator_pods(&client, &namespace).await;
    let dir = static_site();
    let leader_of = |name: &'static str| {
        let pods = pods.clone();
        async move { pods.get(name).await.ok()?.labels().get(LEADER_LABEL).cloned() }
    };
    let wait = Duration::from_secs(60);
    let (api_a, api_b) = (free_addr(), free_addr());
    let a = start_as_pod(dir.path(), &namespace, "op-a", Some("op-a"), &api_a);
    let labelled =
        wait_for(wait, || async { leader_of("op-a").await.filter(|v| v == "true") }).await;
    assert!(labelled.is_some(), "the leader labels its pod");
    let ready =
        wait_for(wait, || async { (readyz(&api_a).await == Some(200)).then_some(()) }).await;
    assert!(ready.is_some(), "the leader's catalog turns ready");
    let _b = start_as_pod(dir.path(), &namespace, "op-b", Some("op-b"), &api_b);
    let up = wait_for(wait, || async { (readyz(&api_b).await == Some(200)).then_some(()) }).await;
    assert!(up.is_some(), "a follower's catalog turns ready too");
    assert_eq!(leader_of("op-b").await, None);
    // The console says which replica serves it and whether it leads.
    let overview_a = overview(&api_a).await;
    assert!(overview_a.contains("<strong>op-a</strong>, the leader."), "{overview_a}");
    let overview_b = overview(&api_b).await;
    assert!(overview_b.contains("<strong>op-b</strong>, a follower"), "{overview_b}");

    drop(a);
    let labelled =
        wait_for(wait, || async { leader_of("op-b").await.filter(|v| v == "true") }).await;
    assert!(labelled.is_some(), "the new leader labels its pod");
    let ready =
        wait_for(wait, || async { (readyz(&api_b).await == Some(200)).then_some(()) }).await;
    assert!(ready.is_some(), "and its catalog turns ready");

    // Issue 46: op-a died leading (killed, as a crashed container) and kept
    // its label; started again in the same pod it stood by with the label,
    // so the Service sent crawlers to a standby too. It clears it at start.
    assert_eq!(leader_of("op-a").await.as_deref(), Some("true"), "the killed leader's label");
    let _a = start_as_pod(dir.path(), &namespace, "op-a", Some("op-a"), &api_a);
    let cleared =
        wait_for(wait, || async { leader_of("op-a").await.is_none().then_some(()) }).await;
    assert!(cleared.is_some(), "a restarted standby clears the label it kept");
    assert_eq!(leader_of("op-b").await.as_deref(), Some("true"), "the leader keeps its own");
}

/// What the kubelet does to a Pod it stops: SIGTERM, then SIGKILL when the
/// grace period ends. The operator must stop leading, release the Lease
/// (so that the standby takes over at once, not after the Lease expires),
/// remove its leader label, drain the API and exit 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_releases_the_lease_and_exits_zero() {
    let client = kube_admin_client().await;
    kube_install_crds(&client).await;
    let namespace = kube_test_namespace(&client, "pf-term").await;
    let pods = operator_pods(&client, &namespace).await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), &namespace);
    let dir = static_site();
    let wait = Duration::from_secs(60);
    // A standby retries every third of the Lease (20 s): a released Lease
    // is taken at its next try, an unreleased one only after 60 s.
    let lease = "60s";
    let (api_a, api_b) = (free_addr(), free_addr());
    let mut a = start_with_lease(dir.path(), &namespace, "op-a", Some("op-a"), &api_a, lease);
    let labelled = wait_for(wait, || async {
        let label = pods.get("op-a").await.ok()?.labels().get(LEADER_LABEL).cloned();
        label.filter(|v| v == "true")
    })
    .await;
    assert!(labelled.is_some(), "op-a leads and labels its pod");
    let _b = start_with_lease(dir.path(), &namespace, "op-b", Some("op-b"), &api_b, lease);
    let follower = wait_for(wait, || async { readyz(&api_b).await }).await;
    assert!(follower.is_some(), "op-b is up as a follower");

    let exited = terminate(&mut a.0, Duration::from_secs(30)).await;
    let status = exited.expect("op-a exits after SIGTERM, inside a Pod's default grace period");
    assert!(status.success(), "op-a exits 0 after SIGTERM, got {status}");
    let label = pods.get("op-a").await.unwrap().labels().get(LEADER_LABEL).cloned();
    assert_eq!(label, None, "op-a removed its leader label");
    assert!(readyz(&api_a).await.is_none(), "op-a's API is closed");
    // Released: nobody holds it, or op-b already took it at its retry,
    // which it could not do before the 60 s Lease expired had op-a kept it
    // (a race the test lost when op-a's drain took long).
    let after_exit = holder(&leases).await;
    assert!(
        after_exit.as_deref().is_none_or(|holder| holder == "op-b"),
        "op-a released the Lease before it exited, got holder {after_exit:?}"
    );

    let took_over = wait_for(Duration::from_secs(45), || async {
        (holder(&leases).await.as_deref() == Some("op-b")).then_some(())
    })
    .await;
    assert!(took_over.is_some(), "op-b takes the released Lease long before it would expire");
}

/// (status, the proxy's ID) of a GET of `url` through the gateway at
/// `gateway` with proxy username `username`; `None` while it does not
/// answer.
async fn through_gateway(gateway: &str, username: &str, url: &str) -> Option<(u16, String)> {
    let proxy = reqwest::Proxy::all(format!("http://{gateway}")).ok()?.basic_auth(username, "");
    let client = reqwest::Client::builder().proxy(proxy).build().ok()?;
    let response = client.get(url).send().await.ok()?;
    let proxy = response
        .headers()
        .get("x-proxyfleet-proxy")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    Some((response.status().as_u16(), proxy))
}

/// The gateway in a cluster: every replica sends requests through the
/// Proxies' real tinyproxies, and a sticky session is kept in the API
/// server, so the follower sends it through the same proxy, before and
/// after the leader goes (issue 46, item 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_replicas_gateway_routes_through_the_fleet_and_a_session_holds_across_them() {
    let client = kube_admin_client().await;
    kube_install_crds(&client).await;
    let namespace = kube_test_namespace(&client, "pf-gateway").await;
    let upstreams: Vec<Tinyproxy> = (0..2).map(|_| Tinyproxy::start()).collect();
    let origin = TestServer::http(Canned { status: 200, body: Bytes::from_static(b"ok") }).await;
    let dir = static_site();
    let endpoints: Vec<String> = upstreams.iter().map(|p| format!("'{}'", p.addr())).collect();
    std::fs::write(
        dir.path().join("providers.yaml"),
        format!(
            "providers:\n  - {{ name: lab, plugin: static, config: {{ endpoints: [{}] }}, proxyAddresses: ['127.0.0.0/8'] }}\n",
            endpoints.join(", ")
        ),
    )
    .unwrap();
    let proxies: Api<Proxy> = Api::namespaced(client.clone(), &namespace);
    for name in ["p1", "p2"] {
        proxies.create(&PostParams::default(), &proxy(name)).await.unwrap();
    }
    let (gateway_a, gateway_b) = (free_addr(), free_addr());
    let wait = Duration::from_secs(90);
    let url = format!("http://{}/", origin.addr);
    let start_gateway = |identity: &str, gateway: &str| {
        let args = [
            "--gateway-addr",
            gateway,
            "--gateway-open",
            "--gateway-allow-targets",
            "127.0.0.0/8",
            "--health-interval",
            "300ms",
            "--health-timeout",
            "300ms",
            "--health-healthy-after",
            "1",
        ];
        start_with_args(dir.path(), &namespace, identity, &free_addr(), &args)
    };
    // The request through `gateway` once it answers 200: its proxy.
    let served = |gateway: String| {
        let url = url.clone();
        async move {
            wait_for(wait, || async {
                through_gateway(&gateway, "session=keep-me", &url)
                    .await
                    .filter(|(status, _)| *status == 200)
                    .map(|(_, proxy)| proxy)
            })
            .await
        }
    };
    let a = start_gateway("gw-a", &gateway_a);
    let held = served(gateway_a.clone())
        .await
        .expect("the leader's gateway sends the request through a Proxy");
    assert!(!held.is_empty());
    assert_eq!(origin.seen().len(), 1, "the request reached the origin once");
    // Sessions reach the store after a health round, off the request's
    // path; from there every replica's table takes them.
    let kv = ConfigMapKv::new(client.clone(), &namespace);
    let stored = wait_for(wait, || async {
        let entries = kv.list(proxyfleet_fleet::leases::SCOPE, "").await.ok()?;
        let value =
            |e: &proxyfleet_core::kv::KvEntry| String::from_utf8_lossy(&e.value).into_owned();
        entries.iter().any(|e| value(e).contains("session-keep-me")).then_some(())
    })
    .await;
    assert!(stored.is_some(), "the session is in the store");
    let _b = start_gateway("gw-b", &gateway_b);
    let follower = served(gateway_b.clone()).await.expect("the follower's gateway serves");
    assert_eq!(follower, held, "the session kept its proxy on the other replica");

    drop(a);
    let after = served(gateway_b.clone()).await.expect("the new leader's gateway serves");
    assert_eq!(after, held, "the session kept its proxy across the change of leader");
}
