//! Shared pieces of the end-to-end tests: where the built plugins are, and
//! small real servers on loopback that record what reaches them.

pub mod browser;
pub mod gcp;
pub mod kvm;
pub mod operator;
pub mod ports;
pub mod procfs;
pub mod proxies;
pub mod registry;
pub mod standalone;
pub mod stub_registry;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use proxyfleet_core::Provider;
use proxyfleet_core::kv::MemoryKv;
use proxyfleet_runtime::config::ProvidersConfig;
use proxyfleet_runtime::{Registry, Runtime, RuntimeOptions};
use tokio::net::TcpListener;

/// The workspace's root folder.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ sits in the workspace").to_owned()
}

/// The folder `cargo xtask plugins` writes components to.
pub fn plugin_dir() -> PathBuf {
    std::env::var_os("PROXYFLEET_PLUGIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/plugins"))
}

/// The built component `name` (e.g. `static`, `fixtures/spin`).
///
/// # Panics
/// When it has not been built: these tests need the real components.
pub fn plugin(name: &str) -> PathBuf {
    let path = plugin_dir().join(format!("{name}.wasm"));
    let build = if name.starts_with("examples/template-") {
        "plugin-template"
    } else if name.starts_with("examples/") {
        "python-provider"
    } else {
        "plugins"
    };
    assert!(
        path.is_file(),
        "{} is missing: run `cargo xtask {build}` (or the README's test command) first",
        path.display()
    );
    path
}

/// A request a [`TestServer`] received.
#[derive(Debug, Clone)]
pub struct SeenRequest {
    /// Method.
    pub method: String,
    /// Path and query.
    pub path: String,
    /// Headers, names lower case.
    pub headers: Vec<(String, String)>,
}

impl SeenRequest {
    /// The first value of header `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

/// What a [`TestServer`] answers every request with.
#[derive(Debug, Clone)]
pub struct Canned {
    /// Status code.
    pub status: u16,
    /// Body.
    pub body: Bytes,
}

/// An HTTP or HTTPS server on 127.0.0.1 that records requests and answers
/// each with a canned response.
#[derive(Debug)]
pub struct TestServer {
    /// Where it listens.
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<SeenRequest>>>,
    canned: Arc<Mutex<Canned>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TestServer {
    /// A plain HTTP server.
    pub async fn http(canned: Canned) -> Self {
        Self::start(canned, None).await
    }

    /// An HTTPS server presenting `cert` (PEM chain) with `key` (PEM).
    pub async fn https(canned: Canned, cert_pem: &str, key_pem: &str) -> Self {
        let certs: Vec<_> = rustls::pki_types::pem::PemObject::pem_slice_iter(cert_pem.as_bytes())
            .collect::<Result<_, _>>()
            .expect("certificate PEM");
        let key =
            rustls::pki_types::pem::PemObject::from_pem_slice(key_pem.as_bytes()).expect("key PEM");
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .expect("server certificate");
        Self::start(canned, Some(tokio_rustls::TlsAcceptor::from(Arc::new(config)))).await
    }

    async fn start(canned: Canned, tls: Option<tokio_rustls::TlsAcceptor>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let canned = Arc::new(Mutex::new(canned));
        let (seen_task, canned_task) = (Arc::clone(&seen), Arc::clone(&canned));
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { return };
                let (seen, canned, tls) =
                    (Arc::clone(&seen_task), Arc::clone(&canned_task), tls.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let (seen, canned) = (Arc::clone(&seen), Arc::clone(&canned));
                        async move { Ok::<_, Infallible>(answer(&req, &seen, &canned)) }
                    });
                    let builder = hyper::server::conn::http1::Builder::new();
                    match tls {
                        Some(acceptor) => {
                            if let Ok(stream) = acceptor.accept(stream).await {
                                let _ =
                                    builder.serve_connection(TokioIo::new(stream), service).await;
                            }
                        }
                        None => {
                            let _ = builder.serve_connection(TokioIo::new(stream), service).await;
                        }
                    }
                });
            }
        });
        Self { addr, seen, canned, task }
    }

    /// Every request received so far.
    pub fn seen(&self) -> Vec<SeenRequest> {
        self.seen.lock().expect("lock").clone()
    }

    /// Changes the canned answer.
    pub fn set_canned(&self, canned: Canned) {
        *self.canned.lock().expect("lock") = canned;
    }
}

fn answer(
    req: &Request<Incoming>,
    seen: &Mutex<Vec<SeenRequest>>,
    canned: &Mutex<Canned>,
) -> Response<Full<Bytes>> {
    seen.lock().expect("lock").push(SeenRequest {
        method: req.method().to_string(),
        path: req.uri().path_and_query().map(|p| p.to_string()).unwrap_or_default(),
        headers: req
            .headers()
            .iter()
            .map(|(k, v)| {
                (k.as_str().to_owned(), String::from_utf8_lossy(v.as_bytes()).into_owned())
            })
            .collect(),
    });
    let canned = canned.lock().expect("lock").clone();
    Response::builder().status(canned.status).body(Full::new(canned.body)).expect("valid response")
}

/// A CA and a server certificate for `localhost` signed by it, as PEM:
/// (ca certificate, server certificate, server key).
pub fn localhost_tls() -> (String, String, String) {
    tls_for("localhost")
}

/// [`localhost_tls`] for `name`, a DNS name or an IP address.
pub fn tls_for(name: &str) -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca_params.self_signed(&ca_key).expect("CA certificate");
    let issuer = Issuer::new(ca_params, ca_key);
    let server_key = KeyPair::generate().expect("server key");
    let server_cert = CertificateParams::new(vec![name.to_owned()])
        .expect("server params")
        .signed_by(&server_key, &issuer)
        .expect("server certificate");
    (ca_cert.pem(), server_cert.pem(), server_key.serialize_pem())
}

/// A `tracing` writer that keeps everything in memory, to assert on logs.
#[derive(Debug, Clone, Default)]
pub struct CapturedLogs(Arc<Mutex<Vec<u8>>>);

impl CapturedLogs {
    /// Everything logged so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("lock")).into_owned()
    }

    /// Installs a subscriber that writes every event (trace level and up)
    /// here, for the current thread, until the guard drops.
    pub fn install(&self) -> tracing::subscriber::DefaultGuard {
        keep_callsites_dynamic();
        let writer = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::set_default(subscriber)
    }
}

/// Makes every `tracing` callsite ask the current thread's subscriber each
/// time, so that a test's own subscriber (`set_default`) sees every event
/// although other tests in the same binary run without one.
///
/// `tracing` caches per callsite whether anyone is interested, process-wide,
/// and combines the answers of the global and all scoped subscribers at
/// registration. A callsite first reached while no scoped subscriber
/// existed is cached as "never" and a test's subscriber installed a moment
/// later may not be consulted. A global subscriber that answers
/// "sometimes" for every callsite (and is enabled for nothing itself) keeps
/// the combined answer "sometimes" forever: each event asks its thread's
/// subscriber.
///
/// Call it before installing a scoped subscriber that asserts on what it
/// captures; [`CapturedLogs::install`] does.
pub fn keep_callsites_dynamic() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Another global subscriber already set (none is, in these tests)
        // would answer for itself; ignoring the error keeps that one.
        let _ = tracing::subscriber::set_global_default(AskEveryTime);
    });
}

/// The global subscriber of [`keep_callsites_dynamic`]: interested
/// "sometimes" in every callsite, enabled for no event or span.
#[derive(Debug)]
struct AskEveryTime;

impl tracing::Subscriber for AskEveryTime {
    fn register_callsite(
        &self,
        _: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        tracing::subscriber::Interest::sometimes()
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::TRACE)
    }

    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        false
    }

    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        // Never called: `enabled` is false for every span.
        tracing::span::Id::from_u64(1)
    }

    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, _: &tracing::Event<'_>) {}

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}

impl std::io::Write for CapturedLogs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// An entry `fetch` served by the `http-fetch` fixture (copied into `dir`),
/// with `grants` (YAML indented under `grants:`) and `limits` (YAML flow
/// mapping body) spliced into its providers file.
pub async fn fetch_provider(dir: &Path, grants: &str, limits: &str) -> Arc<dyn Provider> {
    fixture_provider(dir, "http-fetch", grants, limits).await
}

/// Entry `fetch` on the fixture component `fixture` (e.g. `hostile`), with
/// `grants` (YAML lines under `grants:`) and `limits` (the inside of a flow
/// mapping), loaded from `dir`.
///
/// # Panics
/// When the fixture is not built or the entry does not come up.
pub async fn fixture_provider(
    dir: &Path,
    fixture: &str,
    grants: &str,
    limits: &str,
) -> Arc<dyn Provider> {
    fixture_provider_with(RuntimeOptions::default(), dir, fixture, grants, limits).await
}

/// [`fixture_provider`] on a runtime set up with `options` (e.g. the
/// libvirt helper to start).
///
/// # Panics
/// When the fixture is not built or the entry does not come up.
pub async fn fixture_provider_with(
    options: RuntimeOptions,
    dir: &Path,
    fixture: &str,
    grants: &str,
    limits: &str,
) -> Arc<dyn Provider> {
    fixture_registry_with(options, dir, fixture, grants, limits)
        .await
        .provider("fetch")
        .expect("the fetch entry is ready")
}

/// The providers file of [`fixture_registry_with`]: entry `fetch` on
/// `fixture` with `grants` and `limits`.
pub fn fixture_providers(fixture: &str, grants: &str, limits: &str) -> String {
    format!(
        "providers:\n  - name: fetch\n    plugin: {fixture}\n    limits: {{ {limits} }}\n    grants:\n{grants}"
    )
}

/// The registry of [`fixture_provider_with`], whose entry `fetch` may
/// have been refused.
///
/// # Panics
/// When the fixture is not built or the providers file does not parse.
pub async fn fixture_registry_with(
    options: RuntimeOptions,
    dir: &Path,
    fixture: &str,
    grants: &str,
    limits: &str,
) -> Registry {
    std::fs::copy(plugin(&format!("fixtures/{fixture}")), dir.join(format!("{fixture}.wasm")))
        .expect("copy fixture");
    let config = ProvidersConfig::parse(&fixture_providers(fixture, grants, limits))
        .expect("valid providers file");
    let runtime = Runtime::new(options).expect("runtime");
    Registry::load(&runtime, &config, dir, Arc::new(MemoryKv::new()))
        .await
        .expect("plugin directory readable")
}

/// What the `http-fetch` fixture observed of a response (its instance name).
pub fn observed(name: &str) -> serde_json::Value {
    serde_json::from_str(name).expect("http-fetch reports JSON")
}

/// A client for the test API server that `deploy/dev/kube-apiserver/start.sh`
/// runs on loopback, as its admin.
///
/// # Panics
/// When the server has not been started: these tests need the real one.
pub async fn kube_admin_client() -> kube::Client {
    kube_client_from("kubeconfig").await
}

/// A client for the test API server as [`KUBE_TEST_USER`], who has no
/// permissions until a test binds some.
pub async fn kube_user_client() -> kube::Client {
    kube_client_from("kubeconfig-user").await
}

/// The user name behind [`kube_user_client`].
pub const KUBE_TEST_USER: &str = "proxyfleet-user";

/// The state folder of the test API server (`PROXYFLEET_KUBE_STATE`, or
/// `~/.cache/proxyfleet/kube/state`): its kubeconfigs live there.
pub fn kube_state_dir() -> PathBuf {
    std::env::var_os("PROXYFLEET_KUBE_STATE").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var_os("HOME").expect("HOME is set"))
            .join(".cache/proxyfleet/kube/state")
    })
}

/// A client for the current CRD-only API server (`apiextensions-apiserver`
/// 1.36 or later) that `deploy/dev/current-apiserver/start.sh` runs on
/// loopback, as its admin. It serves no core API: see
/// [`kube_unique_namespace`].
///
/// # Panics
/// When the server has not been started.
pub async fn kube_current_client() -> kube::Client {
    let state = std::env::var_os("PROXYFLEET_KUBE_CURRENT_STATE").map_or_else(
        || {
            PathBuf::from(std::env::var_os("HOME").expect("HOME is set"))
                .join(".cache/proxyfleet/kube-current/state")
        },
        PathBuf::from,
    );
    kube_client_at(&state.join("kubeconfig"), "deploy/dev/current-apiserver/start.sh").await
}

async fn kube_client_from(file: &str) -> kube::Client {
    kube_client_at(&kube_state_dir().join(file), "deploy/dev/kube-apiserver/start.sh").await
}

async fn kube_client_at(kubeconfig: &Path, start: &str) -> kube::Client {
    assert!(
        kubeconfig.is_file(),
        "{} is missing: start the test API server with {start} (the README's test command does)",
        kubeconfig.display()
    );
    let kubeconfig = kube::config::Kubeconfig::read_from(kubeconfig).expect("readable kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .expect("usable kubeconfig");
    kube::Client::try_from(config).expect("client")
}

/// Creates a namespace with a unique name for one test.
pub async fn kube_test_namespace(client: &kube::Client, prefix: &str) -> String {
    use k8s_openapi::api::core::v1::Namespace;
    let name = kube_unique_namespace(prefix);
    let namespaces: kube::Api<Namespace> = kube::Api::all(client.clone());
    let namespace: Namespace =
        serde_json::from_value(serde_json::json!({ "metadata": { "name": name } }))
            .expect("namespace");
    namespaces
        .create(&kube::api::PostParams::default(), &namespace)
        .await
        .expect("create namespace");
    name
}

/// A unique namespace name for one test, not created: on a server without
/// the Namespace API (the current CRD-only one, whose namespace admission
/// is off) custom resources live in any namespace named.
pub fn kube_unique_namespace(prefix: &str) -> String {
    format!("{prefix}-{}", std::process::id() ^ rand_suffix())
}

fn rand_suffix() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
}

/// A ProxyPool `crawl` of `replicas` Proxies on the provider entry `lab`.
pub fn kube_pool(replicas: u32) -> proxyfleet_kube::crd::ProxyPool {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "proxyfleet.io/v1alpha1",
        "kind": "ProxyPool",
        "metadata": { "name": "crawl" },
        "spec": { "replicas": replicas, "template": { "spec": { "provider": "lab" } } },
    }))
    .expect("a valid ProxyPool")
}

/// Installs (server-side applies) the CRDs, as this server takes them, and
/// waits until the API server serves them.
pub async fn kube_install_crds(client: &kube::Client) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::ResourceExt as _;
    let crds: kube::Api<CustomResourceDefinition> = kube::Api::all(client.clone());
    let params = kube::api::PatchParams::apply("proxyfleet-tests").force();
    // A server before 1.25 refuses the CEL rules: it gets the CRDs without.
    let info = client.apiserver_version().await.expect("the API server's version");
    let version = proxyfleet_kube::kube_version::KubeVersion::of_server(&info);
    for crd in proxyfleet_kube::kube_version::crds_for(proxyfleet_kube::crd::crds(), version) {
        let name = crd.name_any();
        crds.patch(&name, &params, &kube::api::Patch::Apply(&crd))
            .await
            .unwrap_or_else(|e| panic!("installing {name}: {e}"));
        let established = wait_for(std::time::Duration::from_secs(20), || async {
            let current = crds.get(&name).await.ok()?;
            current
                .status?
                .conditions?
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
                .then_some(())
        })
        .await;
        assert!(established.is_some(), "{name} was not established in time");
    }
}

/// Polls `probe` every 100 ms until it returns `Some`, or `timeout` passes.
pub async fn wait_for<T, F, Fut>(timeout: std::time::Duration, mut probe: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Some(value) = probe().await {
            return Some(value);
        }
        if std::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// The Proxy controller (and, when asked, the ProxyPool controller) running
/// in-process over one namespace, as `client`, with the built plugins and
/// the ConfigMap store. Stop it with [`Controllers::stop`].
#[derive(Debug)]
pub struct Controllers<K: proxyfleet_core::kv::KvStore + 'static = proxyfleet_kube::kv::ConfigMapKv>
{
    /// The plugins' store the controllers use.
    pub kv: Arc<K>,
    /// Their provider entries.
    pub registry: Arc<Registry>,
    stop: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// The store's watch, which runs until aborted.
    follow: Option<tokio::task::JoinHandle<()>>,
    _plugins: tempfile::TempDir,
}

impl Controllers {
    /// Starts them with the plugins' store in ConfigMaps, as in a cluster;
    /// `providers` is a providers file served by `static`.
    pub async fn start(
        client: &kube::Client,
        namespace: &str,
        providers: &str,
        policy: proxyfleet_core::reconcile::Policy,
        with_pools: bool,
    ) -> Self {
        let (kv, follow) = proxyfleet_kube::kv::ConfigMapKv::watched(client.clone(), namespace);
        let follow = tokio::spawn(follow);
        Controllers::start_on(client, namespace, providers, policy, with_pools, kv, Some(follow))
            .await
    }
}

impl Controllers<proxyfleet_core::kv::MemoryKv> {
    /// Starts them with the plugins' store in memory: for an API server
    /// without ConfigMaps (the current CRD-only one).
    pub async fn start_in_memory(
        client: &kube::Client,
        namespace: &str,
        providers: &str,
        policy: proxyfleet_core::reconcile::Policy,
        with_pools: bool,
    ) -> Self {
        let kv = proxyfleet_core::kv::MemoryKv::default();
        Controllers::start_on(client, namespace, providers, policy, with_pools, kv, None).await
    }
}

impl<K: proxyfleet_core::kv::KvStore + 'static> Controllers<K> {
    async fn start_on(
        client: &kube::Client,
        namespace: &str,
        providers: &str,
        policy: proxyfleet_core::reconcile::Policy,
        with_pools: bool,
        kv: K,
        follow: Option<tokio::task::JoinHandle<()>>,
    ) -> Self {
        let plugins = tempfile::tempdir().expect("temp dir");
        std::fs::copy(plugin("static"), plugins.path().join("static.wasm")).expect("copy plugin");
        let kv = Arc::new(kv);
        let runtime = Runtime::new(RuntimeOptions::default()).expect("runtime");
        let config = ProvidersConfig::parse(providers).expect("valid providers file");
        let registry = Arc::new(
            Registry::load(&runtime, &config, plugins.path(), Arc::clone(&kv) as _)
                .await
                .expect("plugins load"),
        );
        let mut context = proxyfleet_kube::controller::Context::new(
            client.clone(),
            Arc::clone(&registry) as _,
            policy,
            Some("tests".into()),
            proxyfleet_core::spec_key::SpecKey::generate(),
        );
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let until_stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|stop| *stop).await;
        };
        let mut tasks = Vec::new();
        // A server that serves the store's ConfigMaps serves Namespaces
        // too (the CRD-only one serves neither): there, the controller
        // checks ClusterProxyProviders' allowedNamespaces.
        if follow.is_some() {
            let (gate, caches) = proxyfleet_kube::namespace_gate::NamespaceGate::watching(client);
            context = context.with_namespace_gate(gate);
            let rx = stopped.clone();
            tasks.push(tokio::spawn(async move {
                tokio::select! {
                    () = caches => {}
                    () = until_stopped(rx) => {}
                }
            }));
        }
        let context = Arc::new(context);
        let (ns, rx) = (namespace.to_owned(), stopped.clone());
        tasks.push(tokio::spawn(async move {
            proxyfleet_kube::controller::run(context, Some(&ns), until_stopped(rx)).await;
        }));
        if with_pools {
            let (ns, rx, client) = (namespace.to_owned(), stopped, client.clone());
            tasks.push(tokio::spawn(async move {
                proxyfleet_kube::pool::run(
                    client,
                    Some(&ns),
                    Default::default(),
                    until_stopped(rx),
                )
                .await;
            }));
        }
        Self { kv, registry, stop, tasks, follow, _plugins: plugins }
    }

    /// Stops the controllers and waits for them.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            task.await.expect("controller task");
        }
        if let Some(follow) = self.follow {
            follow.abort();
        }
    }
}

/// Replaces `dest` with a copy of `source` the way a careful deployer does:
/// written beside it under another name, then renamed over it, so a reader
/// sees the old file or the new one, never part of one.
pub fn replace_file(source: &Path, dest: &Path) {
    let staged = dest.with_extension("staged");
    std::fs::copy(source, &staged).expect("stage the new file");
    std::fs::rename(&staged, dest).expect("rename it into place");
}

/// A directory laid out like a mounted ConfigMap: each file is a link
/// `<name> -> ..data/<name>`, and `..data` links to a timestamped
/// directory holding the content. [`ConfigMapDir::update`] changes the
/// content the way the kubelet does, so the files' links never change and
/// only `..data` is swapped.
#[derive(Debug)]
pub struct ConfigMapDir {
    root: PathBuf,
    generation: u32,
}

impl ConfigMapDir {
    /// Lays out `root` (an existing, empty directory) with `files`, each a
    /// name in the ConfigMap and the file whose content it gets.
    pub fn create(root: &Path, files: &[(&str, &Path)]) -> Self {
        let mut dir = Self { root: root.to_owned(), generation: 0 };
        dir.update(files);
        for (name, _) in files {
            std::os::unix::fs::symlink(Path::new("..data").join(name), root.join(name))
                .expect("link the file to ..data");
        }
        dir
    }

    /// Writes `files` into a new timestamped directory, points `..data` at
    /// it by renaming a fresh link over it, and removes the old directory.
    pub fn update(&mut self, files: &[(&str, &Path)]) {
        let previous = self.data_dir();
        self.generation += 1;
        let next = self.data_dir();
        std::fs::create_dir(self.root.join(&next)).expect("create the data directory");
        for (name, source) in files {
            std::fs::copy(source, self.root.join(&next).join(name)).expect("copy into ..data");
        }
        let staged = self.root.join("..data_tmp");
        std::os::unix::fs::symlink(&next, &staged).expect("link ..data_tmp");
        std::fs::rename(&staged, self.root.join("..data")).expect("swap ..data");
        if self.generation > 1 {
            std::fs::remove_dir_all(self.root.join(previous)).expect("remove the old data");
        }
    }

    fn data_dir(&self) -> String {
        format!("..2026_01_01_00_00_00.{:04}", self.generation)
    }
}
