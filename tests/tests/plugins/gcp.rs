//! The `gcp` plugin through the real host runtime against the Compute Engine
//! simulator (`tools/gce-sim`): HTTPS with a test CA, the access token got
//! by the host from a service-account key and injected by it, real forward
//! proxies in the running instances. `real_project_lifecycle` runs the
//! lifecycle against a real project when `GCP_TEST_*` names one (see
//! docs/providers/gcp.md).

use std::sync::Arc;
use std::time::{Duration, Instant};

use proxyfleet_core::gc::collect_orphans;
use proxyfleet_core::installation::InstallationId;
use proxyfleet_core::kv::{KvStore, MemoryKv};
use proxyfleet_core::{ErrorClass, HealthReason, Instance, InstanceState, Provider, ProxySpec};
use proxyfleet_gce_sim::{Faults, SimOptions, Simulator};
use proxyfleet_harness::SpecBuilder;
use proxyfleet_runtime::config::ProvidersConfig;
use proxyfleet_runtime::{Registry, Runtime, RuntimeOptions};
use proxyfleet_tests::{localhost_tls, plugin};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const PROJECT: &str = "proxyfleet-test";
const ZONES: [&str; 2] = ["europe-west1-b", "europe-west1-c"];
const EMAIL: &str = "proxyfleet@proxyfleet-test.iam.gserviceaccount.com";
const ENTRY: &str = "gcp-lab";

struct Fixture {
    sim: Simulator,
    provider: Arc<dyn Provider>,
    key_id: String,
    registry: Registry,
    /// The providers file, for a second installation on the same project.
    config: ProvidersConfig,
    dir: tempfile::TempDir,
}

/// The config of the entry, as YAML lines under `config:`.
fn entry_config(endpoint: &str, extra: &str) -> String {
    format!(
        "      endpoint: {endpoint}
      project: {PROJECT}
      zones: [{}]
      images: {{ debian-12: projects/debian-cloud/global/images/family/debian-12 }}
      operationPollMs: 50
{extra}",
        ZONES.join(", ")
    )
}

async fn fixture(token_lifetime: Duration) -> Fixture {
    fixture_with(token_lifetime, "").await
}

/// Where the entry's tokens come from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Tokens {
    /// A service-account key file.
    Key,
    /// The metadata server (Workload Identity): no key anywhere.
    Metadata,
}

async fn fixture_with(token_lifetime: Duration, extra_config: &str) -> Fixture {
    fixture_on(token_lifetime, extra_config, Tokens::Key).await
}

async fn fixture_on(token_lifetime: Duration, extra_config: &str, tokens: Tokens) -> Fixture {
    let (ca, cert, key) = localhost_tls();
    let options = SimOptions {
        projects: vec![PROJECT.to_owned()],
        zones: ZONES.iter().map(|z| (*z).to_owned()).collect(),
        token_lifetime,
        operation_duration: Duration::from_millis(300),
        boot_duration: Duration::from_millis(200),
        ..SimOptions::default()
    };
    let sim = Simulator::start(options, &cert, &key).await.expect("simulator starts");
    let sa_key = sim.create_key(EMAIL).expect("a key");

    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(plugin("gcp"), dir.path().join("gcp.wasm")).unwrap();
    let ca_file = dir.path().join("gce-ca.pem");
    std::fs::write(&ca_file, ca).unwrap();
    let key_file = dir.path().join("gcp-key.json");
    let credential = match tokens {
        Tokens::Key => {
            std::fs::write(&key_file, &sa_key.json).unwrap();
            format!(
                "kind: google-service-account
            keyFile: {}
            scopes: [https://www.googleapis.com/auth/compute]",
                key_file.display()
            )
        }
        Tokens::Metadata => {
            let metadata = sim.serve_metadata(EMAIL).await.expect("a metadata server");
            format!(
                "kind: google-metadata
            metadataHost: '{metadata}'
            scopes: [https://www.googleapis.com/auth/compute]"
            )
        }
    };
    let endpoint = sim.endpoint();
    let yaml = format!(
        "providers:
  - name: {ENTRY}
    plugin: gcp
    proxyAddresses: ['127.0.0.0/8']
    config:
{config}
    limits: {{ timeout: 20s, concurrency: 8 }}
    grants:
      caFile: {ca}
      http:
        - url: {endpoint}
          allowAddresses: [127.0.0.1, '::1']
          credential:
            {credential}
",
        config = entry_config(&endpoint, extra_config),
        ca = ca_file.display(),
    );
    let config = ProvidersConfig::parse(&yaml).expect("valid providers file");
    let (registry, provider) = installation(&config, dir.path(), "lab").await;
    Fixture { sim, provider, key_id: sa_key.private_key_id, registry, config, dir }
}

/// The entry of `config` as installation `id` runs it, with its own store.
async fn installation(
    config: &ProvidersConfig,
    plugin_dir: &std::path::Path,
    id: &str,
) -> (Registry, Arc<dyn Provider>) {
    let installation = InstallationId::parse("test", id).unwrap();
    let runtime = Runtime::new(RuntimeOptions { installation, ..RuntimeOptions::default() });
    let kv = Arc::new(MemoryKv::new());
    let registry = Registry::load(&runtime.unwrap(), config, plugin_dir, kv as Arc<dyn KvStore>)
        .await
        .expect("plugin directory readable");
    let provider = registry.provider(ENTRY).expect("the gcp entry is ready");
    (registry, provider)
}

impl Fixture {
    /// Polls `get` until the instance runs with an address.
    async fn wait_running(&self, provider_id: &str) -> Instance {
        let started = Instant::now();
        loop {
            let instance = self.provider.get(provider_id).await.expect("get");
            if instance.state == InstanceState::Running && !instance.addresses.is_empty() {
                return instance;
            }
            assert!(started.elapsed() < Duration::from_secs(20), "never running: {instance:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn insert_request_ids(&self) -> Vec<String> {
        self.sim
            .requests()
            .iter()
            .filter(|line| line.starts_with("POST ") && line.contains("/instances?"))
            .filter_map(|line| line.split("requestId=").nth(1).map(|id| id[..36].to_owned()))
            .collect()
    }
}

/// Sends `CONNECT` through the proxy at `proxy` to `target` and returns the
/// status line.
async fn connect_through(proxy: std::net::SocketAddr, target: std::net::SocketAddr) -> String {
    let mut stream = tokio::net::TcpStream::connect(proxy).await.expect("proxy reachable");
    stream
        .write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = [0u8; 256];
    let read = stream.read(&mut buf).await.unwrap();
    String::from_utf8_lossy(&buf[..read]).lines().next().unwrap_or_default().to_owned()
}

fn spec(name: &str) -> ProxySpec {
    SpecBuilder::new(name).build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_create_runs_with_an_address_and_delete_leaves_nothing() {
    let f = fixture(Duration::from_secs(3600)).await;
    let mut spec = spec("web");
    spec.cores = 2;
    spec.memory_mib = 3000;
    spec.user_data = b"#cloud-config\npackages: [squid]\n".to_vec();

    let created = f.provider.create(&spec).await.expect("create");
    let (zone, name) = created.provider_id.split_once('/').expect("zone/name");
    assert!(ZONES.contains(&zone), "{zone}");
    assert!(name.starts_with("pf-") && name.len() <= 63, "{name}");
    assert_ne!(created.state, InstanceState::Failed);

    let running = f.wait_running(&created.provider_id).await;
    assert_eq!(running.addresses, ["127.0.0.1"]);
    let mark = running.mark.clone().expect("our mark");
    assert_eq!((mark.uid.as_str(), mark.name.as_str()), ("uid-web", "web"));

    let instance = f.sim.instance(zone, name).expect("the instance exists");
    assert_eq!(instance.machine_type, "e2-custom-2-3072", "rounded up to 256 MiB steps");
    assert_eq!(instance.labels.get("proxyfleet").map(String::as_str), Some(ENTRY));
    assert_eq!(instance.labels.get("proxyfleet-uid").map(String::as_str), Some("uid-web"));
    assert_eq!(instance.tags, ["proxyfleet-proxy"]);
    assert_eq!(
        instance.metadata.get("user-data").map(String::as_str),
        Some("#cloud-config\npackages: [squid]\n")
    );
    // The instance's proxy is real, and its port comes from the simulator's
    // metadata item.
    let proxy = instance.proxy.expect("a running instance runs a proxy");
    assert_eq!(running.port, Some(proxy.port()));
    assert!(connect_through(proxy, f.sim.addr()).await.contains(" 200 "));

    let again = f.provider.create(&spec).await.expect("a repeated create adopts");
    assert_eq!(again.provider_id, created.provider_id);
    assert_eq!(f.sim.instances().len(), 1);
    let listed = f.provider.list().await.expect("list");
    assert_eq!(
        listed.iter().map(|i| i.provider_id.as_str()).collect::<Vec<_>>(),
        [created.provider_id.as_str()]
    );
    let health = f.provider.check().await;
    assert!(health.healthy, "{health:?}");

    f.provider.delete(&created.provider_id).await.expect("delete");
    let gone = f.provider.get(&created.provider_id).await.unwrap_err();
    assert_eq!(gone.class, ErrorClass::NotFound, "{gone}");
    assert!(f.sim.instances().is_empty());
    f.provider.delete(&created.provider_id).await.expect("deleting what is gone succeeds");
    assert!(f.provider.list().await.unwrap().is_empty());

    // A new instance of the same Proxy after the delete: the earlier
    // insert's requestId must not bring back its finished operation.
    let recreated = f.provider.create(&spec).await.expect("create after delete");
    assert_eq!(recreated.provider_id, created.provider_id);
    f.wait_running(&recreated.provider_id).await;
    f.provider.delete(&recreated.provider_id).await.unwrap();
}

/// Issue 45, item 7: on GKE the operator's pod is bound to a Google
/// service account by Workload Identity, and the entry's tokens come from
/// the metadata server: no key file exists anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plugin_runs_on_tokens_from_the_metadata_server() {
    let f = fixture_on(Duration::from_secs(3600), "", Tokens::Metadata).await;
    let created = f.provider.create(&spec("web")).await.expect("create");
    f.wait_running(&created.provider_id).await;
    f.provider.delete(&created.provider_id).await.expect("delete");
    assert!(f.sim.instances().is_empty());

    let issued = f.sim.tokens_issued();
    assert_eq!(issued.len(), 1, "{issued:?}");
    assert_eq!(issued[0].client_email, EMAIL);
    assert_eq!(issued[0].private_key_id, "", "from the metadata server, not a key");
    assert_eq!(issued[0].scopes, ["https://www.googleapis.com/auth/compute"]);
    let requests = f.sim.requests();
    assert!(
        requests.contains(
            &"metadata GET /computeMetadata/v1/instance/service-accounts/default/token\
              ?scopes=https%3A%2F%2Fwww%2Egoogleapis%2Ecom%2Fauth%2Fcompute"
                .to_owned()
        ),
        "{requests:#?}"
    );
    let asked = requests.iter().filter(|line| line.starts_with("metadata GET")).count();
    assert_eq!(asked, 1, "the host keeps the token for its life: {requests:#?}");
    assert!(!requests.iter().any(|line| line.starts_with("POST /token")), "{requests:#?}");
    assert!(!f.dir.path().join("gcp-key.json").exists(), "no key file was written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_lost_insert_response_adopts_the_same_instance() {
    let f = fixture(Duration::from_secs(3600)).await;
    let spec = spec("lost");
    f.sim.set_faults(Faults { lose_insert_responses: 1, ..Faults::default() });
    let err = f.provider.create(&spec).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::Transient, "{err}");
    assert_eq!(f.sim.instances().len(), 1, "the insert was carried out");

    let adopted = f.provider.create(&spec).await.expect("the retry adopts");
    f.wait_running(&adopted.provider_id).await;
    assert_eq!(f.sim.instances().len(), 1, "one instance for one UID");
    let inserts = f.sim.operations().iter().filter(|op| op.operation_type == "insert").count();
    assert_eq!(inserts, 1, "one insert operation");
    let ids = f.insert_request_ids();
    assert!(!ids.is_empty() && ids.iter().all(|id| *id == ids[0]), "{ids:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_and_capacity_failures_are_told_apart() {
    let f = fixture(Duration::from_secs(3600)).await;
    f.sim.set_faults(Faults { quota_exceeded: true, ..Faults::default() });
    let err = f.provider.create(&spec("quota")).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::QuotaExceeded, "{err}");
    assert!(err.message.contains("QUOTA_EXCEEDED"), "{err}");
    assert!(f.sim.instances().is_empty());

    let exhausted = ZONES.iter().map(|z| (*z).to_owned()).collect();
    f.sim.set_faults(Faults { exhausted_zones: exhausted, ..Faults::default() });
    let err = f.provider.create(&spec("capacity")).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::Transient, "capacity is retried: {err}");
    assert!(
        err.message.contains("no capacity") && err.message.contains("ZONE_RESOURCE_POOL_EXHAUSTED"),
        "{err}"
    );
    assert!(f.sim.instances().is_empty());

    // One zone without capacity: the create moves on to the other.
    let pinned = SpecBuilder::new("elsewhere").placement("zone", ZONES[0]).build();
    f.sim.set_faults(Faults { exhausted_zones: vec![ZONES[0].to_owned()], ..Faults::default() });
    let err = f.provider.create(&pinned).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::Transient, "{err}");
    let moved = f.provider.create(&spec("elsewhere")).await.expect("another zone has room");
    assert!(moved.provider_id.starts_with(ZONES[1]), "{}", moved.provider_id);

    // Once the quota is back, the same Proxy gets its instance: the failed
    // attempt's requestId is not reused.
    f.sim.set_faults(Faults::default());
    let created = f.provider.create(&spec("quota")).await.expect("create after the quota is back");
    f.wait_running(&created.provider_id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_token_is_renewed_by_the_host() {
    let f = fixture(Duration::from_secs(2)).await;
    let created = f.provider.create(&spec("renew")).await.expect("create");
    let before = f.sim.tokens_issued().len();
    assert_eq!(before, 1, "one token for the whole create");
    tokio::time::sleep(Duration::from_millis(2100)).await;
    f.provider.get(&created.provider_id).await.expect("get with a renewed token");
    let grants = f.sim.tokens_issued();
    assert_eq!(grants.len(), 2, "renewed once");
    assert_ne!(grants[0].access_token, grants[1].access_token);
    assert!(grants.iter().all(|g| g.private_key_id == f.key_id && g.client_email == EMAIL));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_key_is_unauthorized_with_a_reason() {
    let f = fixture(Duration::from_secs(3600)).await;
    let created = f.provider.create(&spec("revoked")).await.expect("create");
    f.sim.revoke_key(&f.key_id);
    // The cached token dies with the key: the API refuses it, and the host
    // drops it.
    let err = f.provider.get(&created.provider_id).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::Unauthorized, "{err}");
    // The next request needs a new token, which the key no longer earns.
    let err = f.provider.get(&created.provider_id).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::Unauthorized, "{err}");
    assert!(err.message.contains("could not get an access token"), "{err}");
    assert!(err.message.contains("Invalid JWT Signature"), "{err}");
    let health = f.provider.check().await;
    assert!(!health.healthy);
    assert_eq!(health.issues[0].reason, HealthReason::CredentialsUnavailable, "{health:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_ignores_instances_without_our_labels() {
    let f = fixture(Duration::from_secs(3600)).await;
    let ours = f.provider.create(&spec("ours")).await.expect("create");
    f.sim.add_foreign_instance(PROJECT, ZONES[0], "db-1", &[("team", "data")]);
    // Another entry's instance, fully marked.
    f.sim.add_foreign_instance(
        PROJECT,
        ZONES[1],
        "pf-other",
        &[
            ("proxyfleet", "other-entry"),
            ("proxyfleet-uid", "someone-else"),
            ("proxyfleet-namespace", "default"),
            ("proxyfleet-name", "x"),
            ("proxyfleet-created-at", "1"),
        ],
    );
    // Our fleet label, but no mark.
    f.sim.add_foreign_instance(PROJECT, ZONES[1], "pf-half", &[("proxyfleet", ENTRY)]);
    let listed = f.provider.list().await.expect("list");
    assert_eq!(
        listed.iter().map(|i| i.provider_id.as_str()).collect::<Vec<_>>(),
        [ours.provider_id.as_str()]
    );
    for foreign in [format!("{}/db-1", ZONES[0]), format!("{}/pf-half", ZONES[1])] {
        f.provider.delete(&foreign).await.expect("a foreign instance counts as gone");
        let err = f.provider.get(&foreign).await.unwrap_err();
        assert_eq!(err.class, ErrorClass::NotFound, "{foreign}: {err}");
    }
    assert_eq!(f.sim.instances().len(), 4, "foreign instances are never deleted");
}

/// Two installations with an entry of the same name on one project
/// collected each other's instances: the mark named no installation, so
/// each took the other's marked instances for orphans of Proxies it did
/// not have.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_two_installations_on_one_project_collect_only_their_own() {
    let a = fixture(Duration::from_secs(3600)).await;
    let (b_registry, b) = installation(&a.config, a.dir.path(), "other-lab").await;
    let ours = a.provider.create(&spec("a-1")).await.expect("create in a");
    let theirs = b.create(&spec("b-1")).await.expect("create in b");
    let listed = a.provider.list().await.expect("list");
    let mut marks: Vec<(String, String)> = listed
        .iter()
        .map(|i| (i.provider_id.clone(), i.mark.as_ref().expect("marked").installation.clone()))
        .collect();
    marks.sort();
    let mut expected = vec![
        (ours.provider_id.clone(), "lab".to_owned()),
        (theirs.provider_id.clone(), "other-lab".to_owned()),
    ];
    expected.sort();
    assert_eq!(marks, expected, "each mark names its installation, read back from labels");

    // Neither installation has a live Proxy: each may take only its own.
    let now = u64::MAX / 2;
    let none = std::collections::HashSet::new();
    let report =
        collect_orphans(b.as_ref(), b_registry.installation(), &none, Duration::ZERO, now, false)
            .await
            .expect("b collects");
    assert_eq!(report.deleted, std::slice::from_ref(&theirs.provider_id));
    assert_eq!(report.skipped_other_installation, 1);
    a.provider.get(&ours.provider_id).await.expect("a's instance is still there");
    let report = collect_orphans(
        a.provider.as_ref(),
        a.registry.installation(),
        &none,
        Duration::ZERO,
        now,
        false,
    )
    .await
    .expect("a collects");
    assert_eq!(report.deleted, std::slice::from_ref(&ours.provider_id));
    assert_eq!(report.skipped_other_installation, 0, "b's instance is gone already");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_names_a_missing_instance_template() {
    let f = fixture_with(
        Duration::from_secs(3600),
        "      instanceTemplates: { gone: projects/proxyfleet-test/global/instanceTemplates/gone }\n",
    )
    .await;
    let health = f.provider.check().await;
    assert!(!health.healthy);
    assert_eq!(health.issues.len(), 1, "{health:?}");
    assert_eq!(health.issues[0].reason, HealthReason::TemplateNotFound);
    assert!(health.issues[0].message.contains("instanceTemplates.gone"), "{health:?}");
}

/// The lifecycle against a real project, when `GCP_TEST_PROJECT`,
/// `GCP_TEST_ZONE`, `GCP_TEST_IMAGE` (e.g.
/// `projects/debian-cloud/global/images/family/debian-12`) and
/// `GCP_TEST_KEY_FILE` name one. It creates one e2 instance and deletes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_project_lifecycle() {
    let vars: Vec<Option<String>> =
        ["GCP_TEST_PROJECT", "GCP_TEST_ZONE", "GCP_TEST_IMAGE", "GCP_TEST_KEY_FILE"]
            .iter()
            .map(|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
            .collect();
    let [Some(project), Some(zone), Some(image), Some(key_file)] = vars.as_slice() else {
        eprintln!(
            "skipped: set GCP_TEST_PROJECT, GCP_TEST_ZONE, GCP_TEST_IMAGE and GCP_TEST_KEY_FILE \
             to run the lifecycle against a real Google Cloud project"
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(plugin("gcp"), dir.path().join("gcp.wasm")).unwrap();
    let yaml = format!(
        "providers:
  - name: gcp-real
    plugin: gcp
    proxyAddresses: ['127.0.0.0/8']
    config: {{ project: {project}, zones: [{zone}], images: {{ debian-12: '{image}' }}, machineType: e2-micro }}
    limits: {{ timeout: 120s }}
    grants:
      http:
        - url: https://compute.googleapis.com
          credential: {{ kind: google-service-account, keyFile: '{key_file}', scopes: [https://www.googleapis.com/auth/compute] }}
"
    );
    let config = ProvidersConfig::parse(&yaml).expect("valid providers file");
    let runtime = Runtime::new(RuntimeOptions::default()).unwrap();
    let registry =
        Registry::load(&runtime, &config, dir.path(), Arc::new(MemoryKv::new())).await.unwrap();
    let provider = registry.provider("gcp-real").expect("entry ready");
    let health = provider.check().await;
    assert!(health.healthy, "{health:?}");
    let uid = format!("real-{}", std::process::id());
    let spec = SpecBuilder::new("gcp-real-test").uid(&uid).build();
    let created = provider.create(&spec).await.expect("create");
    let started = Instant::now();
    loop {
        let instance = provider.get(&created.provider_id).await.expect("get");
        if instance.state == InstanceState::Running && !instance.addresses.is_empty() {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(300), "never running: {instance:?}");
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    assert!(provider.list().await.unwrap().iter().any(|i| i.provider_id == created.provider_id));
    loop {
        match provider.delete(&created.provider_id).await {
            Ok(()) => break,
            Err(err) if err.class == ErrorClass::Transient => {
                assert!(started.elapsed() < Duration::from_secs(600), "delete never ended: {err}");
            }
            Err(err) => panic!("delete: {err}"),
        }
    }
    let gone = provider.get(&created.provider_id).await.unwrap_err();
    assert_eq!(gone.class, ErrorClass::NotFound, "{gone}");
}
