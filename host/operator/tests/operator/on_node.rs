//! The operator as a platform engineer installs it: the Helm chart on a
//! real one-node cluster (`deploy/dev/node`), two replicas from the
//! project's own image, the kubernetes plugin pulled from a registry on the
//! node's bridge (TLS from a test CA, htpasswd auth, the credentials in a
//! Secret; the build signed, its signature checked with a public key from
//! that Secret), proxies as tinyproxy pods of that plugin,
//! probed by the health engine and handed to a crawler on the host through
//! the chart's Service; the leader's pod deleted, the pool scaled, the pool
//! deleted; a ClusterProxyProvider applied beside the chart's entry serves
//! a Proxy and holds its own deletion for it. With the browser tier, the web console through the same
//! Service follows all of it (`on_node/console.rs`).
//!
//! Ignored by plain `cargo test`: it needs the node running, the images
//! imported into its containerd and Helm. `cargo xtask e2e` (part of the
//! README's test command) provides all three and runs it with
//! `PROXYFLEET_NODE_ENV` (the node's env file) and `PROXYFLEET_HELM` set.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Endpoints, Namespace, Pod, Secret, Service};
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use proxyfleet_kube::crd::{Condition, Proxy, ProxyPool};
use proxyfleet_oci::{PluginReference, RawRegistry, Registries};
use proxyfleet_tests::registry::{OciRegistry, PASSWORD, USER};
use proxyfleet_tests::wait_for;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

#[cfg(feature = "browser")]
mod console;

/// Where the chart is installed, and the release's name (its objects are
/// then called `proxyfleet`).
const NAMESPACE: &str = "pf-e2e";
const RELEASE: &str = "proxyfleet";
/// Where the kubernetes entry runs the proxy pods.
const PROXIES: &str = "pf-e2e-proxies";
/// Short, so that a crashed leader's successor would not take long either;
/// a deleted leader releases the Lease at once.
const LEASE: Duration = Duration::from_secs(10);
/// Label the plugin puts on every proxy pod, with the Proxy's UID.
const UID_LABEL: &str = "proxyfleet.io/uid";

/// The node's env file (`deploy/dev/node/start.sh` prints its path).
struct Node {
    vars: HashMap<String, String>,
}

impl Node {
    fn load() -> Self {
        let path = std::env::var_os("PROXYFLEET_NODE_ENV")
            .expect("PROXYFLEET_NODE_ENV names the node's env file: run `cargo xtask e2e`");
        let text = std::fs::read_to_string(&path).expect("the node's env file");
        let vars = text
            .lines()
            .filter_map(|line| line.split_once('='))
            .map(|(key, value)| (key.trim().to_owned(), value.trim().trim_matches('"').to_owned()))
            .collect();
        Self { vars }
    }

    fn var(&self, key: &str) -> &str {
        self.vars.get(key).unwrap_or_else(|| panic!("{key} missing from the node's env file"))
    }

    fn kubeconfig(&self) -> PathBuf {
        PathBuf::from(self.var("KUBECONFIG"))
    }

    async fn client(&self) -> kube::Client {
        let kubeconfig = kube::config::Kubeconfig::read_from(self.kubeconfig()).unwrap();
        let config = kube::Config::from_custom_kubeconfig(
            kubeconfig,
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .unwrap();
        kube::Client::try_from(config).unwrap()
    }

    fn helm(&self, args: &[&str]) -> String {
        self.helm_with_input(args, "")
    }

    /// Helm with `input` on its standard input (a password).
    fn helm_with_input(&self, args: &[&str], input: &str) -> String {
        succeeded("helm", args, &self.helm_outcome(args, input))
    }

    /// Helm's exit status and output, whether or not it succeeded.
    fn helm_outcome(&self, args: &[&str], input: &str) -> std::process::Output {
        use std::io::Write as _;
        let helm = std::env::var_os("PROXYFLEET_HELM").expect("PROXYFLEET_HELM names Helm");
        let mut child = Command::new(helm)
            .args(args)
            .env("KUBECONFIG", self.kubeconfig())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("helm runs");
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        child.wait_with_output().expect("helm runs")
    }

    /// kubectl's output, or `None` when it fails (for polling).
    fn kubectl_output(&self, args: &[&str]) -> Option<String> {
        let output = Command::new("kubectl")
            .args(["--request-timeout", "30s"])
            .args(args)
            .env("KUBECONFIG", self.kubeconfig())
            .output()
            .ok()?;
        output.status.success().then(|| String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// The machine's kubectl against the node, as a user runs it, with a
    /// discovery cache of its own: the cache of an earlier call would not
    /// know the kinds and categories the CRDs applied since brought.
    fn kubectl(&self, args: &[&str]) -> String {
        let cache = tempfile::tempdir().unwrap();
        let output = Command::new("kubectl")
            .args(["--request-timeout", "30s"])
            .arg(format!("--cache-dir={}", cache.path().display()))
            .args(args)
            .env("KUBECONFIG", self.kubeconfig())
            .output()
            .expect("kubectl runs");
        succeeded("kubectl", args, &output)
    }
}

/// What `tool args` printed, stdout then stderr; it must have succeeded.
fn succeeded(tool: &str, args: &[&str], output: &std::process::Output) -> String {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{tool} {args:?} failed:\n{text}");
    text
}

fn chart() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/helm/proxyfleet")
}

/// The Secret mounted as `credentials/registry`: the registry's password
/// and CA, and the public key its builds are signed with.
const REGISTRY_SECRET: &str = "plugin-registry";

/// The chart's values for this cluster: the project's images as imported
/// (never pulled), one kubernetes entry whose plugin is `plugin` (an
/// `oci://` reference into `registry`, which serves only builds signed
/// with the key in the registry's Secret) talking to the API server
/// through the `kubernetes` Service with the pod's token, quick probes.
fn values(api_ip: &str, registry: &str, plugin: &str) -> String {
    format!(
        r#"image:
  pullPolicy: Never
replicaCount: 2
credentials:
  - name: registry
    secretName: {REGISTRY_SECRET}
leaderElection:
  leaseDuration: {lease}s
kubernetesPlugin:
  namespaces: [{PROXIES}]
extraArgs:
  - --health-interval=2s
  - --health-timeout=2s
  - --gc-interval=5s
providers:
  registries:
    - host: "{registry}"
      username: {USER}
      passwordFile: /etc/proxyfleet/credentials/registry/password
      caFile: /etc/proxyfleet/credentials/registry/ca.crt
      verify:
        keys: [/etc/proxyfleet/credentials/registry/signing.pub]
  providers:
    - name: pods
      plugin: "{plugin}"
      config:
        apiServer: https://{api_ip}
        namespace: {PROXIES}
        imagePullPolicy: Never
        # Five tinyproxies and two operators on a 2-CPU node.
        millicpuPerCore: 100
      grants:
        caFile: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt
        http:
          - url: https://{api_ip}
            allowAddresses: [{api_ip}/32]
            credential:
              header: authorization
              valueTemplate: "Bearer {{secret}}"
              secretFile: /var/run/secrets/kubernetes.io/serviceaccount/token
"#,
        lease = LEASE.as_secs()
    )
}

/// A tiny origin web server on the node's bridge address, where the proxy
/// pods can reach it.
async fn origin(node_ip: &str) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind((node_ip, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else { continue };
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buf = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let body = "hello from the origin on the node's bridge\n";
                let response = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(response.as_bytes()).await;
            });
        }
    });
    addr
}

fn pool(replicas: u32) -> ProxyPool {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "proxyfleet.io/v1alpha1",
        "kind": "ProxyPool",
        "metadata": { "name": "crawlers", "namespace": NAMESPACE },
        "spec": { "replicas": replicas, "template": { "spec": { "provider": "pods", "port": 3128 } } },
    }))
    .unwrap()
}

/// Resident memory of each operator process on this host (a node's
/// containers are host processes), in MiB.
fn operator_rss_mib() -> Vec<f64> {
    let processes = std::fs::read_dir("/proc").into_iter().flatten().flatten();
    processes
        .filter_map(|process| {
            let dir = process.path();
            let comm = std::fs::read_to_string(dir.join("comm")).ok()?;
            if comm.trim() != "proxyfleet" {
                return None;
            }
            let status = std::fs::read_to_string(dir.join("status")).ok()?;
            proxyfleet_tests::procfs::status_mib(&status, "VmRSS:")
        })
        .collect()
}

fn has_condition(proxy: &Proxy, kind: &str) -> bool {
    proxy.status.as_ref().is_some_and(|status| Condition::is_true(&status.conditions, kind))
}

fn pod_ready(pod: &Pod) -> bool {
    let status = pod.status.as_ref();
    status.and_then(|s| s.phase.as_deref()) == Some("Running")
        && status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Waits until the pool's Proxies number `count`, each Ready (running and
/// healthy), with as many proxy pods Running and Ready.
async fn settled(proxies: &Api<Proxy>, pods: &Api<Pod>, count: usize, wait: Duration) -> bool {
    wait_for(wait, || async {
        let listed = proxies.list(&ListParams::default()).await.ok()?;
        let ready = listed
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| has_condition(p, "Ready") && has_condition(p, "Healthy"))
            .count();
        let running = pods.list(&ListParams::default()).await.ok()?;
        let running_ready = running.items.iter().filter(|p| pod_ready(p)).count();
        (listed.items.len() == count
            && ready == count
            && running.items.len() == count
            && running_ready == count)
            .then_some(())
    })
    .await
    .is_some()
}

async fn lease_holder(leases: &Api<Lease>) -> Option<String> {
    leases.get_opt(&format!("{RELEASE}-leader")).await.ok()??.spec?.holder_identity
}

/// `GET base+path` with the fleet API client: the status and body.
async fn get(base: &str, path: &str) -> Option<(u16, String)> {
    proxyfleet_fleet::client::call(base, http::Method::GET, path, None, None).await.ok()
}

/// Fetches `url` through the proxy `proxy` with curl, as a crawler would.
fn curl_through(proxy: &str, url: &str) -> Result<String, String> {
    let output = Command::new("curl")
        .args(["-sS", "--max-time", "10", "-x", proxy, url])
        .output()
        .map_err(|err| err.to_string())?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

/// The most proxy pods any one Proxy UID had at once, sampled until the
/// returned handle is stopped.
fn watch_pods_per_proxy(
    pods: Api<Pod>,
) -> (Arc<Mutex<BTreeMap<String, usize>>>, tokio::task::JoinHandle<()>) {
    let most: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
    let record = Arc::clone(&most);
    let task = tokio::spawn(async move {
        loop {
            if let Ok(listed) = pods.list(&ListParams::default()).await {
                let mut now: BTreeMap<String, usize> = BTreeMap::new();
                for pod in listed.items.iter().filter(|p| p.metadata.deletion_timestamp.is_none()) {
                    if let Some(uid) = pod.labels().get(UID_LABEL) {
                        *now.entry(uid.clone()).or_default() += 1;
                    }
                }
                let mut most = record.lock().unwrap();
                for (uid, count) in now {
                    let seen = most.entry(uid).or_default();
                    *seen = (*seen).max(count);
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    (most, task)
}

async fn ensure_namespace(client: &kube::Client, name: &str) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if namespaces.get_opt(name).await.unwrap().is_none() {
        let namespace: Namespace =
            serde_json::from_value(serde_json::json!({ "metadata": { "name": name } })).unwrap();
        namespaces.create(&PostParams::default(), &namespace).await.unwrap();
    }
}

/// A metric's value (summed over its label sets) in a Prometheus text page.
fn metric(page: &str, name: &str) -> f64 {
    page.lines()
        .filter(|line| line.starts_with(name) && !line.starts_with('#'))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the one-node cluster, the images and Helm: run `cargo xtask e2e`"]
async fn the_chart_runs_the_operator_and_its_proxies_on_a_real_node() {
    let node = Node::load();
    let client = node.client().await;
    let wait = Duration::from_secs(180);
    ensure_namespace(&client, NAMESPACE).await;
    ensure_namespace(&client, PROXIES).await;
    let api_ip = Api::<Service>::namespaced(client.clone(), "default")
        .get("kubernetes")
        .await
        .unwrap()
        .spec
        .and_then(|spec| spec.cluster_ip)
        .expect("the kubernetes Service has a ClusterIP");
    // The kubernetes plugin, published to a registry the pods reach.
    let node_ip: std::net::IpAddr = node.var("KUBE_NODE_IP").parse().unwrap();
    let registry = OciRegistry::start_on(node_ip);
    let plugin = registry.reference("proxyfleet/kubernetes", "e2e");
    let component = std::fs::read(proxyfleet_tests::plugin("kubernetes")).unwrap();
    let layer = format!("sha256:{}", proxyfleet_runtime::file_digest(&component));
    let dir = tempfile::tempdir().unwrap();
    let password_file = dir.path().join("password");
    std::fs::write(&password_file, PASSWORD).unwrap();
    let access = Registries::validate(vec![RawRegistry {
        host: registry.host.clone(),
        username: Some(USER.to_owned()),
        password_file: Some(password_file),
        ca_file: Some(registry.ca_file.clone()),
        ..RawRegistry::default()
    }])
    .unwrap();
    let reference = PluginReference::parse(&plugin).unwrap();
    let pushed_manifest = proxyfleet_oci::push(&access, &reference, "kubernetes.wasm", component)
        .await
        .unwrap()
        .manifest_digest;
    // Signed with a key of this run; the replicas verify with its public
    // half, mounted from the registry's Secret.
    let signing = proxyfleet_oci::PrivateKey::generate().unwrap();
    proxyfleet_oci::sign(&access, &reference, &signing).await.unwrap();
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(REGISTRY_SECRET.to_owned()),
            ..Default::default()
        },
        string_data: Some(BTreeMap::from([
            ("password".to_owned(), PASSWORD.to_owned()),
            ("ca.crt".to_owned(), std::fs::read_to_string(&registry.ca_file).unwrap()),
            ("signing.pub".to_owned(), signing.public().to_pem()),
        ])),
        ..Default::default()
    };
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let _ = secrets.delete(REGISTRY_SECRET, &DeleteParams::default()).await;
    secrets.create(&PostParams::default(), &secret).await.unwrap();
    let values_file = dir.path().join("values.yaml");
    std::fs::write(&values_file, values(&api_ip, &registry.host, &plugin)).unwrap();

    // The CRDs of the previous version are installed, as an earlier chart
    // left them: from its crds/ directory, which no release owns.
    let previous =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/operator/on_node/previous-crds.yaml");
    node.kubectl(&["apply", "--server-side", "-f", previous.to_str().unwrap()]);

    // The chart as a release publishes it: packaged, pushed to the registry
    // as an OCI artifact, and installed from there.
    let packaged = dir.path().join("packaged");
    node.helm(&["package", chart().to_str().unwrap(), "--destination", packaged.to_str().unwrap()]);
    let version = env!("CARGO_PKG_VERSION");
    let archive = packaged.join(format!("proxyfleet-{version}.tgz"));
    let logins = dir.path().join("registry.json");
    let (ca, logins) = (registry.ca_file.to_str().unwrap(), logins.to_str().unwrap());
    let login = ["registry", "login", &registry.host, "--username", USER, "--password-stdin"];
    node.helm_with_input(
        &[&login[..], &["--ca-file", ca, "--registry-config", logins]].concat(),
        PASSWORD,
    );
    let charts = format!("oci://{}/proxyfleet/charts", registry.host);
    node.helm(&[
        "push",
        archive.to_str().unwrap(),
        &charts,
        "--ca-file",
        ca,
        "--registry-config",
        logins,
    ]);
    let published = format!("{charts}/proxyfleet");

    // Install, leaving the CRDs as they are (as the earlier chart did), and
    // wait for both replicas to be ready.
    let started = Instant::now();
    let from_registry = [
        &published,
        "--version",
        version,
        "--ca-file",
        ca,
        "--registry-config",
        logins,
        "--namespace",
        NAMESPACE,
        "--values",
        values_file.to_str().unwrap(),
        "--wait",
        "--timeout",
        "5m",
    ];
    node.helm(
        &[&["install", RELEASE][..], &from_registry, &["--set", "crds.enabled=false"]].concat(),
    );
    eprintln!("helm install --wait, from {published}:{version}: {:?}", started.elapsed());
    // Helm resolves the tag, then fetches the chart's layer.
    let log = registry.log();
    let resolved = format!("/v2/proxyfleet/charts/proxyfleet/manifests/{version}");
    assert!(log.contains(&resolved), "the chart's tag was resolved at the registry");
    assert!(log.contains("GET /v2/proxyfleet/charts/proxyfleet/blobs/sha256:"), "its layer pulled");
    let operator_pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let selector = ListParams::default().labels("app.kubernetes.io/name=proxyfleet");
    let running = operator_pods.list(&selector).await.unwrap();
    assert_eq!(running.items.len(), 2, "two replicas");
    assert!(running.items.iter().all(pod_ready), "both replicas Running and Ready");
    let leases: Api<Lease> = Api::namespaced(client.clone(), NAMESPACE);
    // On the old CRDs no replica leads, and each says why and what to run.
    let refused = wait_for(Duration::from_secs(60), || async {
        let logs = node.kubectl_output(&[
            "logs",
            "-n",
            NAMESPACE,
            "-l",
            "app.kubernetes.io/name=proxyfleet",
            "--tail=-1",
        ])?;
        logs.contains("not leading: CustomResourceDefinition").then_some(logs)
    })
    .await
    .expect("the replicas log why they do not lead");
    assert!(refused.contains("kubectl apply --server-side"), "the fix is named: {refused}");
    assert!(refused.contains("--take-ownership"), "the chart's fix is named: {refused}");
    assert!(lease_holder(&leases).await.is_none(), "no replica leads on the old CRDs");
    // The upgrade as docs/kubernetes.md gives it: the chart's CRDs, which
    // Helm refuses to put over CRDs no release owns, then takes them over.
    let upgrade = [&["upgrade", RELEASE][..], &from_registry, &["--reuse-values"]].concat();
    let refusal = node.helm_outcome(&[&upgrade[..], &["--set", "crds.enabled=true"]].concat(), "");
    let said = String::from_utf8_lossy(&refusal.stderr);
    assert!(!refusal.status.success(), "Helm refuses CRDs it does not own");
    assert!(said.contains("invalid ownership metadata"), "as the docs quote it: {said}");
    let upgraded = Instant::now();
    node.helm(&[&upgrade[..], &["--set", "crds.enabled=true", "--take-ownership"]].concat());
    let leader = wait_for(wait, || async { lease_holder(&leases).await }).await;
    eprintln!("a replica leads {:?} after helm upgrade --take-ownership", upgraded.elapsed());
    let owned = node.kubectl(&[
        "get",
        "crd",
        "proxypools.proxyfleet.io",
        "-o",
        "jsonpath={.metadata.annotations.meta\\.helm\\.sh/release-name} \
         {.metadata.annotations.helm\\.sh/resource-policy} \
         {.spec.versions[0].schema.openAPIV3Schema.properties.status.properties.conditions.type}",
    ]);
    assert_eq!(owned, format!("{RELEASE} keep array"), "the release's, kept, and current");
    let leader = leader.expect("one replica holds the Lease");
    assert!(running.items.iter().any(|pod| pod.name_any() == leader), "the leader is one of them");

    // A pool of three proxies: three tinyproxy pods, probed healthy.
    let pools: Api<ProxyPool> = Api::namespaced(client.clone(), NAMESPACE);
    let proxies: Api<Proxy> = Api::namespaced(client.clone(), NAMESPACE);
    let proxy_pods: Api<Pod> = Api::namespaced(client.clone(), PROXIES);
    let (most_pods, watcher) = watch_pods_per_proxy(proxy_pods.clone());
    let started = Instant::now();
    pools.create(&PostParams::default(), &pool(3)).await.unwrap();
    assert!(settled(&proxies, &proxy_pods, 3, wait).await, "3 proxies Running, Ready and healthy");
    eprintln!("pool of 3 Ready and healthy: {:?}", started.elapsed());
    // What a user or a GitOps tool waits on: the standard conditions, read
    // by kubectl itself, and the category that lists every kind at once.
    let waited = Instant::now();
    for (kind, condition) in
        [("proxies", "Ready"), ("proxypools", "Ready"), ("proxypools", "Available")]
    {
        let condition = format!("--for=condition={condition}");
        node.kubectl(&["wait", "-n", NAMESPACE, &condition, "--timeout=60s", kind, "--all"]);
    }
    let listed = node.kubectl(&["get", "proxyfleet", "-n", NAMESPACE, "-o", "wide"]);
    assert!(listed.contains("proxypool.proxyfleet.io/crawlers"), "{listed}");
    assert_eq!(listed.matches("AllReady").count(), 1, "the pool's reason, wide: {listed}");
    assert_eq!(listed.matches("provisioned and not failing").count(), 3, "{listed}");
    eprintln!("kubectl wait --for=condition=Ready on Proxies and the pool: {:?}", waited.elapsed());
    // The chart's own check, as a user runs it after an install.
    let tested =
        node.helm(&["test", RELEASE, "--namespace", NAMESPACE, "--logs", "--timeout", "2m"]);
    assert!(tested.contains("GET /readyz: 200"), "{tested}");
    assert!(tested.contains("GET /v1/proxies: 200 (3 items)"), "{tested}");
    eprintln!("helm test: the API Service answers /readyz and lists the 3 proxies");
    // A figure, not a check: the replicas' memory with every plugin of the
    // image (the five first-party ones) compiled and the pool running.
    eprintln!("operator RSS (MiB), per replica: {:.1?}", operator_rss_mib());

    // A crawler on the host: the chart's Service hands out a proxy, and a
    // page on the node's bridge comes back through it.
    let service = Api::<Service>::namespaced(client.clone(), NAMESPACE).get(RELEASE).await.unwrap();
    let service_ip = service.spec.and_then(|spec| spec.cluster_ip).unwrap();
    let api = format!("http://{service_ip}:8480");

    // The entry serves the build pulled from the registry: both replicas
    // fetched its layer there.
    let (status, providers) = get(&api, "/v1/providers").await.expect("the Service answers");
    assert_eq!(status, 200, "{providers}");
    let providers: serde_json::Value = serde_json::from_str(&providers).unwrap();
    let pods_entry = providers["revisions"]
        .as_array()
        .and_then(|entries| entries.iter().find(|entry| entry["entry"] == "pods"))
        .unwrap_or_else(|| panic!("the pods entry is listed: {providers}"));
    assert_eq!(pods_entry["plugin"], plugin.as_str(), "{pods_entry}");
    assert_eq!(pods_entry["active"]["digest"], layer.trim_start_matches("sha256:"), "{pods_entry}");
    let fetched = format!("GET /v2/proxyfleet/kubernetes/blobs/{layer}");
    let pulls = registry.log().matches(&fetched).count();
    assert!(pulls >= 2, "each replica pulled the plugin from the registry ({pulls} pulls)");
    // And each checked its signature first.
    let signature = proxyfleet_oci::signature_tag(&pushed_manifest);
    let checked = format!("GET /v2/proxyfleet/kubernetes/manifests/{signature}");
    let checks = registry.log().matches(&checked).count();
    assert!(checks >= 2, "each replica checked the build's signature ({checks} checks)");
    let origin = origin(node.var("KUBE_NODE_IP")).await;
    let page = format!("http://{origin}/hello.txt");
    // The Service sends each request to either replica, each with its own
    // round-robin turn: every proxy handed out works; that one replica
    // hands out each proxy once in three is checked below.
    for _ in 0..3 {
        let (status, proxy) =
            get(&api, "/v1/proxies/next?format=url").await.expect("the Service answers");
        assert_eq!(status, 200, "{proxy}");
        let proxy = proxy.trim().to_owned();
        let body =
            curl_through(&proxy, &page).unwrap_or_else(|err| panic!("through {proxy}: {err}"));
        assert!(body.contains("hello from the origin"), "{body}");
    }

    // Issue 46, item 1: both replicas serve and are ready, leader or not,
    // and the Service sends to both. (Leases shared between replicas are
    // tested in the cluster tier: this install has no API tokens, so its
    // API refuses writes.)
    let replicas: Vec<String> = running
        .items
        .iter()
        .filter_map(|pod| pod.status.as_ref()?.pod_ip.clone())
        .map(|ip| format!("http://{ip}:8480"))
        .collect();
    assert_eq!(replicas.len(), 2, "both replicas have a pod IP");
    for replica in &replicas {
        let ready =
            wait_for(wait, || async { (get(replica, "/readyz").await?.0 == 200).then_some(()) })
                .await;
        assert!(ready.is_some(), "{replica} is ready, leader or not");
    }
    let endpoints = wait_for(wait, || async {
        let endpoints = Api::<Endpoints>::namespaced(client.clone(), NAMESPACE);
        let ready: usize = endpoints
            .get(RELEASE)
            .await
            .ok()?
            .subsets?
            .iter()
            .map(|subset| subset.addresses.as_ref().map_or(0, Vec::len))
            .sum();
        (ready == 2).then_some(ready)
    })
    .await;
    assert_eq!(endpoints, Some(2), "the API Service sends to both replicas");
    for replica in &replicas {
        // Each replica's verdicts are its own: once it has probed all
        // three healthy, three turns hand out each proxy once.
        let spread = wait_for(wait, || async {
            let mut handed = Vec::new();
            for _ in 0..3 {
                let (status, proxy) = get(replica, "/v1/proxies/next?format=url").await?;
                (status == 200).then_some(())?;
                handed.push(proxy.trim().to_owned());
            }
            handed.sort();
            handed.dedup();
            (handed.len() == 3).then_some(handed)
        })
        .await;
        assert!(spread.is_some(), "{replica}: round robin hands out each of 3 proxies once");
    }
    eprintln!("both replicas ready, behind the Service, each handing out the 3 proxies");

    // The console through the Service: read-only (no tokens), served by
    // either replica; the Proxies page stays open from here on.
    #[cfg(feature = "browser")]
    let mut replica_names: Vec<String> = running.items.iter().map(|pod| pod.name_any()).collect();
    #[cfg(feature = "browser")]
    let console = {
        let console = console::Console::open(service_ip.parse().unwrap(), &api).await;
        console.overview_served_by_a_replica(&replica_names, 3).await;
        console.providers_show_the_pull(&plugin).await;
        console.refuses_a_forged_post();
        console.proxies_read_only(3).await;
        eprintln!(
            "console through the Service: overview, providers, proxies; read-only, axe clean"
        );
        console
    };

    // The leader's pod is deleted: it releases the Lease on SIGTERM and the
    // other replica takes over well within the lease duration.
    let deleted_at = Instant::now();
    operator_pods.delete(&leader, &DeleteParams::default()).await.unwrap();
    let successor = wait_for(LEASE * 2, || async {
        lease_holder(&leases).await.filter(|holder| *holder != leader)
    })
    .await;
    let successor = successor.expect("another replica takes the Lease");
    eprintln!(
        "takeover by {successor} after the leader's pod was deleted: {:?}",
        deleted_at.elapsed()
    );
    let answering = wait_for(wait, || async {
        let (status, _) = get(&api, "/v1/proxies/next?format=url").await?;
        (status == 200).then_some(())
    })
    .await;
    assert!(answering.is_some(), "next answers again from the new leader");
    eprintln!("next answers again: {:?} after the deletion", deleted_at.elapsed());

    // Scale up and down.
    let scale = |replicas: u32| {
        let pools = pools.clone();
        async move {
            let patch = serde_json::json!({ "spec": { "replicas": replicas } });
            pools.patch("crawlers", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
        }
    };
    scale(5).await;
    assert!(settled(&proxies, &proxy_pods, 5, wait).await, "scaled to 5");
    // The page opened before the takeover shows the new Proxies by itself,
    // and the overview names the new leader.
    #[cfg(feature = "browser")]
    {
        console.proxies_follow(5).await;
        eprintln!("console: the page opened before the takeover shows the 5 Proxies, not reloaded");
        // The deleted leader's pod was replaced by one of a new name.
        let pods = operator_pods.list(&Default::default()).await.unwrap();
        replica_names.extend(pods.items.iter().map(|pod| pod.name_any()));
        console.overview_served_by_a_replica(&replica_names, 5).await;
        console.close().await;
    }
    scale(2).await;
    assert!(settled(&proxies, &proxy_pods, 2, wait).await, "scaled to 2");

    // The pool goes: its Proxies and their pods with it, and collection
    // never had to delete anything.
    pools.delete("crawlers", &DeleteParams::default()).await.unwrap();
    let gone = wait_for(wait, || async {
        let proxies_left = proxies.list(&ListParams::default()).await.ok()?.items.len();
        let pods_left = proxy_pods.list(&ListParams::default()).await.ok()?.items.len();
        (proxies_left == 0 && pods_left == 0).then_some(())
    })
    .await;
    assert!(gone.is_some(), "the pool's Proxies and pods are gone");
    watcher.abort();
    let most = most_pods.lock().unwrap().clone();
    assert!(most.len() >= 5, "the watcher saw every Proxy: {most:?}");
    assert!(most.values().all(|count| *count == 1), "no Proxy ever had a second pod: {most:?}");

    let leader_pod = operator_pods.get(&successor).await.unwrap();
    let leader_ip = leader_pod.status.and_then(|s| s.pod_ip).expect("the leader has a pod IP");
    let metrics = format!("http://{leader_ip}:9464");
    // Let at least one collection round pass after the deletion.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let (_, scraped) = get(&metrics, "/metrics").await.expect("the leader's metrics");
    assert!(
        scraped.contains("proxyfleet_gc_found_total{entry=\"pods\"}"),
        "the new leader collected orphans of the entry: {scraped}"
    );
    assert_eq!(metric(&scraped, "proxyfleet_gc_deleted"), 0.0, "no orphans to delete");
    assert_eq!(metric(&scraped, "proxyfleet_gc_failed"), 0.0);

    authenticated_proxy(&client, &page, wait).await;
    cluster_provider(&node, &client, &api_ip, &plugin, wait).await;

    node.helm(&["uninstall", RELEASE, "--namespace", NAMESPACE, "--wait"]);
    // Kept: deleting them would have deleted every Proxy of the cluster.
    let kept =
        node.kubectl(&["get", "crd", "-l", "app.kubernetes.io/part-of=proxyfleet", "-o", "name"]);
    assert_eq!(
        kept.lines().count(),
        proxyfleet_kube::crd::crds().len(),
        "helm uninstall leaves the CRDs: {kept}"
    );
}

/// A ClusterProxyProvider as the platform team applies one, beside the
/// chart's entry: the same backend (the pulled kubernetes plugin), its
/// token in a Secret of the operator's namespace that the provider names
/// (`secretRef`), served to the Proxies' namespace only. A Proxy on it
/// comes up and is probed healthy; deleting the provider waits for that
/// Proxy. The chart's own entry is listed as a ClusterProxyProvider too.
async fn cluster_provider(
    node: &Node,
    client: &kube::Client,
    api_ip: &str,
    plugin: &str,
    wait: Duration,
) {
    use proxyfleet_kube::crd::ClusterProxyProvider;
    let started = Instant::now();
    // The token of the operator's ServiceAccount, in a Secret the token
    // controller fills (Kubernetes 1.20 still makes such tokens).
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let token: Secret = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": "team-pods-token",
            "annotations": { "kubernetes.io/service-account.name": RELEASE },
        },
        "type": "kubernetes.io/service-account-token",
    }))
    .unwrap();
    secrets.create(&PostParams::default(), &token).await.unwrap();
    let filled = wait_for(wait, || async {
        let secret = secrets.get("team-pods-token").await.ok()?;
        secret.data?.contains_key("token").then_some(())
    })
    .await;
    assert!(filled.is_some(), "the token controller fills the token Secret");
    let declared: ClusterProxyProvider = serde_json::from_value(serde_json::json!({
        "apiVersion": "proxyfleet.io/v1alpha1",
        "kind": "ClusterProxyProvider",
        "metadata": { "name": "team-pods" },
        "spec": {
            "plugin": plugin,
            "config": {
                "apiServer": format!("https://{api_ip}"),
                "namespace": PROXIES,
                "imagePullPolicy": "Never",
                "millicpuPerCore": 100,
            },
            "grants": {
                "caFile": "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
                "http": [{
                    "url": format!("https://{api_ip}"),
                    "allowAddresses": [format!("{api_ip}/32")],
                    "credential": {
                        "header": "authorization",
                        "valueTemplate": "Bearer {secret}",
                        "secretRef": { "name": "team-pods-token", "key": "token" },
                    },
                }],
            },
            "allowedNamespaces": { "matchExpressions": [
                { "key": "kubernetes.io/metadata.name", "operator": "In", "values": [NAMESPACE] }
            ] },
        },
    }))
    .unwrap();
    let providers: Api<ClusterProxyProvider> = Api::all(client.clone());
    providers.create(&PostParams::default(), &declared).await.unwrap();
    let ready = wait_for(wait, || async {
        let status = providers.get("team-pods").await.ok()?.status?;
        Condition::is_true(&status.conditions, "Ready").then_some(())
    })
    .await;
    assert!(
        ready.is_some(),
        "the ClusterProxyProvider serves: {:?}",
        providers.get("team-pods").await
    );
    // What a platform engineer sees.
    let listed = node.kubectl(&["get", "cpxprov", "team-pods"]);
    assert!(listed.contains("True") && listed.contains("Serving"), "{listed}");
    // The chart's entry shows beside it, as the leader applies it from the
    // providers file.
    let file_view = wait_for(wait, || async {
        let status = providers.get("pods").await.ok()?.status?;
        Condition::is_true(&status.conditions, "Ready").then_some(())
    })
    .await;
    assert!(file_view.is_some(), "the chart's entry shows: {:?}", providers.get("pods").await);
    let views = node.kubectl(&["get", "cpxprov", "-l", "proxyfleet.io/providers-file"]);
    assert!(views.contains("pods") && !views.contains("team-pods"), "{views}");

    let proxies: Api<Proxy> = Api::namespaced(client.clone(), NAMESPACE);
    let proxy: Proxy = serde_json::from_value(serde_json::json!({
        "apiVersion": "proxyfleet.io/v1alpha1",
        "kind": "Proxy",
        "metadata": { "name": "team-exit" },
        "spec": { "provider": "team-pods", "port": 3128 },
    }))
    .unwrap();
    proxies.create(&PostParams::default(), &proxy).await.unwrap();
    let healthy = wait_for(wait, || async {
        let proxy = proxies.get("team-exit").await.ok()?;
        (has_condition(&proxy, "Ready") && has_condition(&proxy, "Healthy")).then_some(())
    })
    .await;
    assert!(healthy.is_some(), "the Proxy on the ClusterProxyProvider is Ready and healthy");
    eprintln!("Proxy on a ClusterProxyProvider Ready and healthy: {:?}", started.elapsed());

    providers.delete("team-pods", &DeleteParams::default()).await.unwrap();
    let held = wait_for(wait, || async {
        let status = providers.get("team-pods").await.ok()?.status?;
        Condition::is_true(&status.conditions, "InUse").then_some(())
    })
    .await;
    assert!(held.is_some(), "deletion waits for the Proxy that names it");
    proxies.delete("team-exit", &DeleteParams::default()).await.unwrap();
    let gone = wait_for(wait, || async {
        providers.get_opt("team-pods").await.ok()?.is_none().then_some(())
    })
    .await;
    assert!(gone.is_some(), "the provider goes once its Proxy is gone");
    secrets.delete("team-pods-token", &DeleteParams::default()).await.unwrap();
}

/// The credential Secret of the Proxy `exit`.
fn exit_credential(password: &str) -> Secret {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": { "name": "exit-auth", "labels": { "proxyfleet.io/proxy-auth": "true" } },
        "type": "kubernetes.io/basic-auth",
        "stringData": { "username": "crawler", "password": password },
    }))
    .unwrap()
}

/// The one proxy pod Running and Ready, its Proxy Ready and healthy.
async fn one_ready_pod(proxies: &Api<Proxy>, pods: &Api<Pod>, wait: Duration) -> Pod {
    assert!(settled(proxies, pods, 1, wait).await, "the authenticated Proxy is Ready and healthy");
    pods.list(&ListParams::default()).await.unwrap().items.remove(0)
}

/// A Proxy with a credential: the plugin's pod runs tinyproxy asking for
/// it (from a Secret the pod owns), the health engine sends it (the Proxy
/// turns healthy), a crawler without it gets 407 and one with it the page.
/// A new password gets the Proxy a new pod that asks for the new one.
async fn authenticated_proxy(client: &kube::Client, page: &str, wait: Duration) {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let proxies: Api<Proxy> = Api::namespaced(client.clone(), NAMESPACE);
    let pods: Api<Pod> = Api::namespaced(client.clone(), PROXIES);
    let pod_secrets: Api<Secret> = Api::namespaced(client.clone(), PROXIES);
    secrets.create(&PostParams::default(), &exit_credential("first-pw.1")).await.unwrap();
    let proxy: Proxy = serde_json::from_value(serde_json::json!({
        "apiVersion": "proxyfleet.io/v1alpha1",
        "kind": "Proxy",
        "metadata": { "name": "exit", "namespace": NAMESPACE },
        "spec": { "provider": "pods", "port": 3128, "proxyAuthSecretRef": { "name": "exit-auth" } },
    }))
    .unwrap();
    let started = Instant::now();
    proxies.create(&PostParams::default(), &proxy).await.unwrap();
    let pod = one_ready_pod(&proxies, &pods, wait).await;
    eprintln!("authenticated Proxy Ready and healthy: {:?}", started.elapsed());
    let ip = pod.status.as_ref().and_then(|s| s.pod_ip.clone()).expect("the pod has an IP");
    let refused = curl_through(&format!("http://{ip}:3128"), page).unwrap_or_else(|e| e);
    assert!(refused.contains("407") || refused.contains("Proxy Authentication"), "{refused}");
    let body = curl_through(&format!("http://crawler:first-pw.1@{ip}:3128"), page).unwrap();
    assert!(body.contains("hello from the origin"), "{body}");
    let pod_name = pod.name_any();
    let owned = pod_secrets.get(&format!("{pod_name}-auth")).await.expect("the pod's Secret");
    assert_eq!(owned.owner_references()[0].uid, pod.uid().unwrap(), "owned by its pod");

    // A new password: the instance is replaced (the provider configured
    // the old one with the old password).
    let started = Instant::now();
    secrets
        .replace("exit-auth", &PostParams::default(), &exit_credential("second-pw.2"))
        .await
        .unwrap();
    let first_uid = pod.uid();
    let replaced = wait_for(wait, || async {
        let listed = pods.list(&ListParams::default()).await.ok()?;
        listed.items.iter().any(|pod| pod.uid() != first_uid).then_some(())
    })
    .await;
    assert!(replaced.is_some(), "a new pod for the new credential");
    let pod = one_ready_pod(&proxies, &pods, wait).await;
    eprintln!("replaced for the new credential and healthy: {:?}", started.elapsed());
    let ip = pod.status.as_ref().and_then(|s| s.pod_ip.clone()).expect("the pod has an IP");
    let body = curl_through(&format!("http://crawler:second-pw.2@{ip}:3128"), page).unwrap();
    assert!(body.contains("hello from the origin"), "{body}");
    // tinyproxy answers a wrong credential with 401 (none at all: 407).
    let old =
        curl_through(&format!("http://crawler:first-pw.1@{ip}:3128"), page).unwrap_or_else(|e| e);
    assert!(old.contains("401 Unauthorized"), "the old password no longer works: {old}");

    proxies.delete("exit", &DeleteParams::default()).await.unwrap();
    let gone = wait_for(wait, || async {
        let pods_left = pods.list(&ListParams::default()).await.ok()?.items.len();
        let secrets_left = pod_secrets.list(&ListParams::default()).await.ok()?;
        let ours = secrets_left.items.iter().filter(|s| s.name_any().ends_with("-auth")).count();
        (pods_left == 0 && ours == 0).then_some(())
    })
    .await;
    assert!(gone.is_some(), "the Proxy's pod and its Secret are gone");
    secrets.delete("exit-auth", &DeleteParams::default()).await.unwrap();
}
