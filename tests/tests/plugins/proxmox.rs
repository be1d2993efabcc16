//! The `proxmox` plugin through the real host runtime against the PVE API
//! simulator (`tools/pve-sim`): HTTPS with a test CA, the token injected by
//! the host from a secret file, real forward proxies in the started VMs.
//! `real_cluster_lifecycle` runs the same lifecycle against a real cluster
//! when `PROXMOX_TEST_*` names one (see docs/providers/proxmox.md).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use proxyfleet_core::kv::{KvStore, MemoryKv};
use proxyfleet_core::{ErrorClass, HealthReason, Instance, InstanceState, Provider, ProxySpec};
use proxyfleet_harness::SpecBuilder;
use proxyfleet_pve_sim::{Faults, SimOptions, Simulator, vm_address};
use proxyfleet_runtime::config::ProvidersConfig;
use proxyfleet_runtime::{Registry, Runtime, RuntimeOptions};
use proxyfleet_tests::{localhost_tls, plugin};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TOKEN: &str = "root@pam!proxyfleet=4f8a2c1e-0b6d-4e59-9a3f-7c2d1e0b9a88";
const TEMPLATE: u32 = 9000;
const NODE: &str = "pve1";

struct Fixture {
    sim: Simulator,
    provider: Arc<dyn Provider>,
    kv: Arc<MemoryKv>,
    variant: Variant,
    _registry: Registry,
    dir: tempfile::TempDir,
}

#[derive(Clone, Copy)]
struct Setup {
    first: u32,
    last: u32,
    timeout_secs: u32,
    clone_ms: u64,
}

impl Setup {
    fn range(first: u32, last: u32) -> Self {
        Self { first, last, timeout_secs: 30, clone_ms: 400 }
    }
}

/// What a fixture gets wrong on purpose, or does differently.
#[derive(Clone, Copy)]
struct Variant {
    token_in_file: Option<&'static str>,
    iso_storage: &'static str,
    trust_another_ca: bool,
    /// The cluster's nodes, all in the entry's `nodes`; the template is on
    /// the first.
    nodes: &'static [&'static str],
    /// More lines for the entry's config, indented as its keys.
    extra_config: &'static str,
    /// The PVE version the simulator answers as.
    version: &'static str,
}

const CORRECT: Variant = Variant {
    token_in_file: Some(TOKEN),
    iso_storage: "local",
    trust_another_ca: false,
    nodes: &[NODE],
    extra_config: "",
    version: "8.4.1",
};

async fn fixture(setup: Setup) -> Fixture {
    fixture_with(setup, CORRECT).await
}

async fn fixture_with(setup: Setup, variant: Variant) -> Fixture {
    let (ca, cert, key) = localhost_tls();
    let ca = if variant.trust_another_ca { localhost_tls().0 } else { ca };
    let options = SimOptions {
        token: TOKEN.to_owned(),
        nodes: variant.nodes.iter().map(|node| (*node).to_owned()).collect(),
        iso_storages: vec!["local".to_owned()],
        version: variant.version.to_owned(),
        clone_duration: Duration::from_millis(setup.clone_ms),
        task_duration: Duration::from_millis(50),
        agent_delay: Duration::from_millis(200),
        ..SimOptions::default()
    };
    let sim = Simulator::start(options, &cert, &key).await.expect("simulator starts");
    sim.add_template(variant.nodes[0], TEMPLATE, "debian-12", 8);

    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(plugin("proxmox"), dir.path().join("proxmox.wasm")).unwrap();
    std::fs::write(dir.path().join("pve-ca.pem"), ca).unwrap();
    if let Some(token) = variant.token_in_file {
        std::fs::write(dir.path().join("pve-token"), format!("{token}\n")).unwrap();
    }
    let kv = Arc::new(MemoryKv::new());
    let (registry, provider) = load(&sim, &kv, dir.path(), setup, variant).await;
    Fixture { sim, provider, kv, variant, _registry: registry, dir }
}

/// Loads the `pve` entry for `setup` against `sim`, its CA and token files
/// in `dir`.
async fn load(
    sim: &Simulator,
    kv: &Arc<MemoryKv>,
    dir: &std::path::Path,
    setup: Setup,
    variant: Variant,
) -> (Registry, Arc<dyn Provider>) {
    let port = sim.addr().port();
    let yaml = format!(
        "providers:
  - name: pve
    plugin: proxmox
    proxyAddresses: ['127.0.0.0/8']
    config:
      url: https://localhost:{port}
      nodes: [{nodes}]
      templates: {{ debian-12: {TEMPLATE} }}
      isoStorage: {iso_storage}
      vmidRange: {{ first: {first}, last: {last} }}
      taskPollMs: 50
{extra}    limits: {{ timeout: {timeout}s, concurrency: 20 }}
    grants:
      caFile: {ca}
      http:
        - url: https://localhost:{port}
          allowAddresses: [127.0.0.1, '::1']
          credential: {{ header: Authorization, valueTemplate: 'PVEAPIToken={{secret}}', secretFile: {token} }}
",
        nodes = variant.nodes.join(", "),
        iso_storage = variant.iso_storage,
        extra = variant.extra_config,
        first = setup.first,
        last = setup.last,
        timeout = setup.timeout_secs,
        ca = dir.join("pve-ca.pem").display(),
        token = dir.join("pve-token").display(),
    );
    let config = ProvidersConfig::parse(&yaml).expect("valid providers file");
    let runtime = Runtime::new(RuntimeOptions::default()).unwrap();
    let registry = Registry::load(&runtime, &config, dir, Arc::clone(kv) as Arc<dyn KvStore>)
        .await
        .expect("plugin directory readable");
    let provider = registry.provider("pve").expect("the pve entry is ready");
    (registry, provider)
}

impl Fixture {
    /// Loads the entry again with `setup` (a `vmidRange` edit, say), over
    /// the same cluster and key-value store.
    async fn reload(&mut self, setup: Setup) {
        let (registry, provider) =
            load(&self.sim, &self.kv, self.dir.path(), setup, self.variant).await;
        self._registry = registry;
        self.provider = provider;
    }

    fn spec(&self, name: &str) -> ProxySpec {
        SpecBuilder::new(name).port(self.sim.proxy_port()).build()
    }

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

    /// VMIDs of every VM but the template.
    fn vm_ids(&self) -> BTreeSet<u32> {
        self.sim.vms().into_iter().map(|vm| vm.vmid).filter(|vmid| *vmid != TEMPLATE).collect()
    }

    async fn claims(&self) -> usize {
        self.kv.list("pve", "vmid/").await.expect("kv list").len()
    }

    /// Deletes `provider_id` and asserts nothing of it is left.
    async fn delete_and_assert_gone(&self, provider_id: &str) {
        self.provider.delete(provider_id).await.expect("delete");
        let gone = self.provider.get(provider_id).await.unwrap_err();
        assert_eq!(gone.class, ErrorClass::NotFound, "{gone}");
        let vmid: u32 = provider_id.parse().unwrap();
        assert!(self.sim.vm(vmid).is_none(), "VM {vmid} left behind");
        assert!(
            !self.sim.isos(NODE, "local").contains(&format!("proxyfleet-{vmid}-cidata.iso")),
            "seed ISO of {vmid} left behind"
        );
    }

    /// Creates until it succeeds, as the reconciler retries, at most `tries`.
    async fn create_converges(&self, spec: &ProxySpec, tries: usize) -> Instance {
        for _ in 0..tries {
            if let Ok(instance) = self.provider.create(spec).await {
                return instance;
            }
        }
        panic!("create did not converge in {tries} tries")
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_create_runs_with_an_address_and_delete_leaves_nothing() {
    let f = fixture(Setup::range(100_000, 100_999)).await;
    let mut spec = f.spec("web");
    spec.disk_gib = 12;
    spec.cores = 2;
    spec.memory_mib = 1024;
    spec.vlan_tag = Some(42);
    spec.user_data = b"#cloud-config\npackages: [squid]\n".to_vec();

    let created = f.provider.create(&spec).await.expect("create");
    let vmid: u32 = created.provider_id.parse().expect("the provider id is the VMID");
    assert!((100_000..=100_999).contains(&vmid));
    assert!(matches!(created.state, InstanceState::Running | InstanceState::Provisioning));
    let running = f.wait_running(&created.provider_id).await;
    assert_eq!(running.addresses, [vm_address(vmid).to_string()]);
    let mark = running.mark.clone().expect("our mark");
    assert_eq!(
        (mark.uid.as_str(), mark.namespace.as_str(), mark.name.as_str()),
        ("uid-web", "default", "web")
    );

    let vm = f.sim.vm(vmid).expect("the VM exists");
    let config = |key: &str| vm.config.get(key).cloned().unwrap_or_default();
    assert_eq!(
        (config("cores"), config("memory"), config("agent")),
        ("2".into(), "1024".into(), "1".into())
    );
    assert_eq!(config("net0"), "virtio,bridge=vmbr0,tag=42");
    assert_eq!(config("ide2"), format!("local:iso/proxyfleet-{vmid}-cidata.iso,media=cdrom"));
    assert_eq!(config("tags"), "proxyfleet");
    assert!(config("scsi0").ends_with("size=12G"), "the boot disk grew: {}", config("scsi0"));
    assert!(config("description").contains("proxyfleet.io/uid: uid-web"));
    let seed =
        f.sim.iso(NODE, "local", &format!("proxyfleet-{vmid}-cidata.iso")).expect("seed uploaded");
    assert_eq!(&seed[16 * 2048 + 40..16 * 2048 + 46], b"cidata");

    // The VM's proxy is real: it tunnels to the API's port.
    let proxy = vm.proxy.expect("a started VM runs a proxy");
    assert_eq!(proxy.port(), spec.port);
    assert!(connect_through(proxy, f.sim.addr()).await.contains(" 200 "));

    let listed = f.provider.list().await.expect("list");
    assert_eq!(
        listed.iter().map(|i| i.provider_id.as_str()).collect::<Vec<_>>(),
        [created.provider_id.as_str()]
    );
    let health = f.provider.check().await;
    assert!(health.healthy, "{health:?}");

    f.delete_and_assert_gone(&created.provider_id).await;
    f.provider.delete(&created.provider_id).await.expect("deleting what is gone succeeds");
    assert!(f.sim.isos(NODE, "local").is_empty());
    assert_eq!(f.claims().await, 0, "the VMID claim is released");
    assert!(f.provider.list().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_create_adopts_during_and_after_the_clone_lock() {
    let f = Arc::new(fixture(Setup { clone_ms: 1500, ..Setup::range(110_000, 110_999) }).await);
    let spec = f.spec("retry");
    let first = {
        let (f, spec) = (Arc::clone(&f), spec.clone());
        tokio::spawn(async move { f.provider.create(&spec).await })
    };
    // Wait for the clone to hold its lock, then retry as if the first call
    // had been lost.
    let started = Instant::now();
    while !f.sim.vms().iter().any(|vm| vm.lock.as_deref() == Some("clone")) {
        assert!(started.elapsed() < Duration::from_secs(10), "the clone never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let locked = f.sim.vms().into_iter().find(|vm| vm.lock.is_some()).expect("locked VM").vmid;
    let seen = f.provider.get(&locked.to_string()).await.expect("get during the clone");
    assert_eq!(seen.state, InstanceState::Provisioning, "a VM being cloned is provisioning");
    let during = f.provider.create(&spec).await.expect("a create during the clone lock adopts");
    let first = first.await.unwrap().expect("the first create finishes");
    assert_eq!(during.provider_id, first.provider_id);
    let after = f.provider.create(&spec).await.expect("a create after the clone adopts");
    assert_eq!(after.provider_id, first.provider_id);
    assert_eq!(f.sim.clones_started(), 1, "never clones twice for one UID");
    assert_eq!(f.vm_ids().len(), 1);
    f.delete_and_assert_gone(&first.provider_id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creates_for_20_uids_land_on_20_distinct_vmids() {
    // A range of 60 makes the UIDs' candidate sequences collide often.
    let f = Arc::new(fixture(Setup { timeout_secs: 60, ..Setup::range(120_000, 120_059) }).await);
    let calls: Vec<_> = (0..20)
        .map(|i| {
            let f = Arc::clone(&f);
            tokio::spawn(async move { f.provider.create(&f.spec(&format!("p{i}"))).await })
        })
        .collect();
    let mut ids = BTreeSet::new();
    for call in calls {
        let instance = call.await.unwrap().expect("create");
        ids.insert(instance.provider_id);
    }
    assert_eq!(ids.len(), 20, "{ids:?}");
    assert_eq!(f.sim.clones_started(), 20);
    assert_eq!(f.vm_ids().len(), 20);
    let uids: BTreeSet<String> = f
        .provider
        .list()
        .await
        .unwrap()
        .into_iter()
        .filter_map(|i| i.mark.map(|m| m.uid))
        .collect();
    assert_eq!(uids.len(), 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_vms_at_candidate_vmids_are_skipped_and_never_touched() {
    // Five VMIDs, four of them someone else's: whatever order the UID's
    // candidates take, only 130004 is free.
    let f = fixture(Setup::range(130_000, 130_004)).await;
    f.sim.add_foreign_vm(NODE, 130_000, "db-1", "", "");
    f.sim.add_foreign_vm(NODE, 130_001, "tagged", "not ours", "proxyfleet");
    let other_mark = "proxyfleet.io/uid: someone-else\nproxyfleet.io/owner: default/x\nproxyfleet.io/created-at: 1";
    f.sim.add_foreign_vm(NODE, 130_002, "pf-other", other_mark, "proxyfleet");
    f.sim.add_foreign_vm(NODE, 130_003, "being-made", "", "");
    f.sim.set_lock(130_003, Some("clone"));
    let before: Vec<_> = f.sim.vms();

    let instance = f.provider.create(&f.spec("lonely")).await.expect("create");
    assert_eq!(instance.provider_id, "130004");
    let listed = f.provider.list().await.unwrap();
    assert_eq!(listed.len(), 1, "foreign VMs are never listed: {listed:?}");
    f.delete_and_assert_gone("130004").await;

    for foreign in ["130000", "130001", "130002", "130003"] {
        f.provider.delete(foreign).await.expect("a foreign VMID counts as gone");
    }
    for foreign in ["130000", "130001", "130002"] {
        let err = f.provider.get(foreign).await.unwrap_err();
        assert_eq!(err.class, ErrorClass::NotFound, "{foreign}: {err}");
    }
    let after: Vec<_> = f.sim.vms();
    assert_eq!(before, after, "foreign VMs were changed");
    let touched: Vec<String> = f
        .sim
        .requests()
        .into_iter()
        .filter(|line| {
            !line.starts_with("GET")
                && ["130000", "130001", "130002", "130003"].iter().any(|id| line.contains(id))
        })
        .collect();
    assert!(touched.is_empty(), "mutating requests on foreign VMs: {touched:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_faults_end_in_their_class_and_converge_without_leaks() {
    let f = fixture(Setup { timeout_secs: 8, ..Setup::range(140_000, 140_999) }).await;

    // Lock timeouts: a conflict.
    f.sim.set_faults(Faults { lock_timeout: true, ..Faults::default() });
    let err = f.provider.create(&f.spec("locks")).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::Conflict, "{err}");
    f.sim.set_faults(Faults::default());
    let locks = f.create_converges(&f.spec("locks"), 3).await;

    // A failing clone task: transient, PVE cleans up, the retry clones again.
    f.sim.set_faults(Faults { failing_tasks: true, ..Faults::default() });
    let err = f.provider.create(&f.spec("tasks")).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::Transient, "{err}");
    assert!(err.message.contains("failed"), "{err}");
    f.sim.set_faults(Faults::default());
    let tasks = f.create_converges(&f.spec("tasks"), 3).await;

    // Server errors: transient.
    f.sim.set_faults(Faults { server_error_every: 2, ..Faults::default() });
    let err = f.provider.create(&f.spec("flaky")).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::Transient, "{err}");
    f.sim.set_faults(Faults::default());
    let flaky = f.create_converges(&f.spec("flaky"), 3).await;

    // A connection dropped mid-upload: transient.
    f.sim.set_faults(Faults { drop_upload: true, ..Faults::default() });
    let err = f.provider.create(&f.spec("upload")).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::Transient, "{err}");
    f.sim.set_faults(Faults::default());
    let upload = f.create_converges(&f.spec("upload"), 3).await;

    // Tasks ending in warnings count as success.
    f.sim.set_faults(Faults { task_warnings: 2, ..Faults::default() });
    let warned = f.provider.create(&f.spec("warned")).await.expect("WARNINGS: n succeeds");
    f.sim.set_faults(Faults::default());

    // A clone that leaves a locked VM: the task fails, then the retry finds
    // our VM still locked and reports the conflict, naming the fix.
    f.sim.set_faults(Faults { clone_leaves_locked_vm: true, ..Faults::default() });
    let err = f.provider.create(&f.spec("stuck")).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::Transient, "{err}");
    f.sim.set_faults(Faults::default());
    let err = f.provider.create(&f.spec("stuck")).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::Conflict, "{err}");
    assert!(err.message.contains("qm unlock"), "{err}");
    let stuck_vmid =
        f.sim.vms().into_iter().find(|vm| vm.lock.is_some()).expect("the locked VM").vmid;
    f.sim.remove_vm(stuck_vmid);
    let stuck = f.create_converges(&f.spec("stuck"), 3).await;
    assert_eq!(stuck.provider_id, stuck_vmid.to_string(), "the claimed VMID is reused");

    let all = [locks, tasks, flaky, upload, warned, stuck];
    assert_eq!(f.vm_ids().len(), all.len(), "one VM per Proxy: {:?}", f.vm_ids());
    for instance in &all {
        f.wait_running(&instance.provider_id).await;
        f.delete_and_assert_gone(&instance.provider_id).await;
    }
    assert!(f.vm_ids().is_empty());
    assert!(f.sim.isos(NODE, "local").is_empty(), "{:?}", f.sim.isos(NODE, "local"));
    assert_eq!(f.claims().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credential_certificate_storage_and_template_problems_are_reported() {
    let wrong_token = Variant { token_in_file: Some("root@pam!proxyfleet=wrong"), ..CORRECT };
    let f = fixture_with(Setup::range(150_000, 150_999), wrong_token).await;
    let err = f.provider.create(&f.spec("a")).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::Unauthorized, "{err}");
    assert!(!err.message.contains("wrong"), "the token leaks: {err}");
    let health = f.provider.check().await;
    assert!(!health.healthy);
    assert_eq!(health.issues[0].reason, HealthReason::Unauthorized, "{health:?}");

    let no_secret = Variant { token_in_file: None, ..CORRECT };
    let health =
        fixture_with(Setup::range(150_000, 150_999), no_secret).await.provider.check().await;
    assert_eq!(health.issues[0].reason, HealthReason::CredentialsUnavailable, "{health:?}");

    let other_ca = Variant { trust_another_ca: true, ..CORRECT };
    let health =
        fixture_with(Setup::range(150_000, 150_999), other_ca).await.provider.check().await;
    assert_eq!(health.issues[0].reason, HealthReason::CertificateInvalid, "{health:?}");

    let missing_storage = Variant { iso_storage: "isos", ..CORRECT };
    let f = fixture_with(Setup::range(150_000, 150_999), missing_storage).await;
    let health = f.provider.check().await;
    assert!(!health.healthy);
    assert!(
        health.issues.iter().any(|issue| issue.reason == HealthReason::StorageNotFound),
        "{health:?}"
    );
    let err = f.provider.create(&f.spec("a")).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::InvalidConfig, "{err}");
    assert!(err.message.contains("isoStorage"), "{err}");
    assert!(f.vm_ids().is_empty(), "nothing is cloned onto a storage that is not there");

    f.sim.remove_vm(TEMPLATE);
    let health = f.provider.check().await;
    assert!(
        health.issues.iter().any(|issue| issue.reason == HealthReason::TemplateNotFound),
        "{health:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_seed_delete_leaves_the_vm_for_the_next_delete() {
    let f = fixture(Setup::range(160_000, 160_999)).await;
    let instance = f.provider.create(&f.spec("seedy")).await.expect("create");
    let vmid: u32 = instance.provider_id.parse().unwrap();
    f.sim.set_faults(Faults { failing_volume_deletes: true, ..Faults::default() });
    let err = f.provider.delete(&instance.provider_id).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::Transient, "{err}");
    assert!(f.sim.vm(vmid).is_some(), "the VM stays while its seed does");
    assert_eq!(f.sim.isos(NODE, "local"), [format!("proxyfleet-{vmid}-cidata.iso")]);
    f.sim.set_faults(Faults::default());
    f.delete_and_assert_gone(&instance.provider_id).await;
    assert_eq!(f.claims().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_cluster_times_out_and_the_retry_converges() {
    let f = fixture(Setup { timeout_secs: 3, ..Setup::range(170_000, 170_999) }).await;
    f.sim.set_faults(Faults { latency: Duration::from_millis(700), ..Faults::default() });
    let err = f.provider.create(&f.spec("slow")).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::Timeout, "{err}");
    f.sim.set_faults(Faults::default());
    let instance = f.create_converges(&f.spec("slow"), 5).await;
    assert_eq!(f.vm_ids().len(), 1, "the cut-off create left no second VM");
    assert!(f.sim.clones_started() <= 1);
    f.wait_running(&instance.provider_id).await;
    f.delete_and_assert_gone(&instance.provider_id).await;
    assert!(f.sim.isos(NODE, "local").is_empty());
    assert_eq!(f.claims().await, 0);
}

/// Requests that change something (anything but `GET`) naming `vmid`.
fn mutations_on(f: &Fixture, vmid: u32) -> Vec<String> {
    f.sim
        .requests()
        .into_iter()
        .filter(|line| !line.starts_with("GET") && line.contains(&format!("/{vmid}")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_our_hibernated_vm_is_a_permanent_error_and_not_a_conflict_forever() {
    let f = fixture(Setup::range(180_000, 180_999)).await;
    let spec = f.spec("sleeper");
    let instance = f.provider.create(&spec).await.expect("create");
    let vmid: u32 = instance.provider_id.parse().unwrap();
    f.sim.hibernate(vmid);
    let before = mutations_on(&f, vmid).len();
    for _ in 0..2 {
        let err = f.provider.create(&spec).await.unwrap_err();
        assert_eq!(err.class, ErrorClass::Permanent, "{err}");
        assert!(err.message.contains("hibernated") && err.message.contains("qm start"), "{err}");
    }
    assert_eq!(mutations_on(&f, vmid).len(), before, "a hibernated VM is left as it is");
    assert_eq!(f.sim.vm(vmid).unwrap().lock.as_deref(), Some("suspended"));
    assert_eq!(f.sim.clones_started(), 1, "and never replaced by a second clone");
    // PVE destroys no locked VM: the delete resumes it first.
    f.delete_and_assert_gone(&instance.provider_id).await;
    assert_eq!(f.claims().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_template_without_the_boot_disk_is_refused_before_any_clone() {
    let virtio = Variant { extra_config: "      bootDisk: virtio0\n", ..CORRECT };
    let f = fixture_with(Setup::range(181_000, 181_999), virtio).await;
    for _ in 0..2 {
        let err = f.provider.create(&f.spec("shapeless")).await.unwrap_err();
        assert_eq!(err.class, ErrorClass::InvalidConfig, "{err}");
        assert!(err.message.contains("`bootDisk`") && err.message.contains("virtio0"), "{err}");
    }
    assert_eq!(f.sim.clones_started(), 0, "nothing is cloned from a template of the wrong shape");
    assert!(f.vm_ids().is_empty());
    assert_eq!(f.claims().await, 0, "no VMID is claimed for it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_adopting_our_vm_needs_no_template() {
    let f = fixture(Setup::range(182_000, 182_999)).await;
    let spec = f.spec("kept");
    let instance = f.provider.create(&spec).await.expect("create");
    f.sim.remove_vm(TEMPLATE);
    let again = f.provider.create(&spec).await.expect("a retry adopts with the template gone");
    assert_eq!(again.provider_id, instance.provider_id);
    // A new Proxy does need it, and nothing is claimed or cloned for it.
    let err = f.provider.create(&f.spec("new")).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::InvalidConfig, "{err}");
    assert!(err.message.contains("templates.debian-12"), "{err}");
    assert_eq!(f.sim.clones_started(), 1);
    assert_eq!(f.claims().await, 1);
    f.delete_and_assert_gone(&instance.provider_id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_an_offline_node_fails_neither_list_nor_deleting_a_proxy_whose_vm_is_gone() {
    let two_nodes = Variant { nodes: &[NODE, "pve2"], ..CORRECT };
    let f = fixture_with(Setup::range(183_000, 183_999), two_nodes).await;
    let create_on = |name: &'static str, node: &'static str| {
        let spec = SpecBuilder::new(name).port(f.sim.proxy_port()).placement("node", node).build();
        let provider = Arc::clone(&f.provider);
        async move { provider.create(&spec).await.expect("create") }
    };
    let here = create_on("here", NODE).await;
    let gone = create_on("gone", NODE).await;
    let away = create_on("away", "pve2").await;
    let gone_vmid: u32 = gone.provider_id.parse().unwrap();
    f.sim.remove_vm(gone_vmid);

    f.sim.set_faults(Faults { offline_nodes: vec!["pve2".to_owned()], ..Faults::default() });
    let listed = f.provider.list().await.expect("list works with a node offline");
    let ids: BTreeSet<String> = listed.iter().map(|i| i.provider_id.clone()).collect();
    assert_eq!(ids, BTreeSet::from([here.provider_id.clone(), away.provider_id.clone()]));
    let on_pve2 = listed.iter().find(|i| i.provider_id == away.provider_id).unwrap();
    assert_eq!(
        on_pve2.mark.as_ref().map(|m| m.uid.as_str()),
        away.mark.as_ref().map(|m| m.uid.as_str()),
        "our VM on the offline node is known by its claim"
    );

    // A VM there that looks like ours but that no claim names cannot be
    // told apart: the list waits rather than leave it out.
    let unclaimed = 183_900;
    f.sim.add_foreign_vm("pve2", unclaimed, "pf-00c0ffee00c0ffee", "", "proxyfleet");
    let err = f.provider.list().await.unwrap_err();
    assert_eq!(err.class, ErrorClass::Transient, "{err}");
    assert!(err.message.contains("no claim"), "{err}");
    f.sim.remove_vm(unclaimed);

    // pveproxy's 595 carries its reason only in the status line.
    let health = f.provider.check().await;
    assert!(
        health.issues.iter().any(|issue| issue.message.contains("pve2")
            && issue.message.contains("HTTP 595 No route to host")),
        "{health:?}"
    );

    f.provider.delete(&gone.provider_id).await.expect("a VM already gone is deleted");
    f.delete_and_assert_gone(&here.provider_id).await;
    let err = f.provider.delete(&away.provider_id).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::Transient, "{err}");
    assert!(err.message.contains("offline"), "{err}");

    f.sim.set_faults(Faults::default());
    f.provider.delete(&away.provider_id).await.expect("deleted once its node is back");
    assert!(f.vm_ids().is_empty());
    for node in [NODE, "pve2"] {
        assert!(f.sim.isos(node, "local").is_empty(), "{node}: {:?}", f.sim.isos(node, "local"));
    }
    assert_eq!(f.claims().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_half_made_vm_is_adopted_after_a_vmid_range_edit() {
    let mut f = fixture(Setup::range(184_000, 184_999)).await;
    let spec = f.spec("halfway");
    // The clone lands, then the upload of its seed fails: the VM has our
    // name and mark, but no tag and no seed.
    f.sim.set_faults(Faults { drop_upload: true, ..Faults::default() });
    let err = f.provider.create(&spec).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::Transient, "{err}");
    f.sim.set_faults(Faults::default());
    let half_made = *f.vm_ids().first().expect("the clone landed");

    f.reload(Setup::range(185_000, 185_999)).await;
    let listed = f.provider.list().await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].provider_id, half_made.to_string());
    let instance = f.provider.create(&spec).await.expect("the retry adopts");
    assert_eq!(instance.provider_id, half_made.to_string());
    assert_eq!(f.sim.clones_started(), 1, "no duplicate is cloned");
    f.wait_running(&instance.provider_id).await;
    f.delete_and_assert_gone(&instance.provider_id).await;
    assert_eq!(f.claims().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_clone_still_running_is_adopted_after_a_vmid_range_edit() {
    let mut f = fixture(Setup { clone_ms: 1500, ..Setup::range(186_000, 186_999) }).await;
    let spec = f.spec("inflight");
    let first = {
        let (provider, spec) = (Arc::clone(&f.provider), spec.clone());
        tokio::spawn(async move { provider.create(&spec).await })
    };
    let started = Instant::now();
    while !f.sim.vms().iter().any(|vm| vm.lock.as_deref() == Some("clone")) {
        assert!(started.elapsed() < Duration::from_secs(10), "the clone never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    f.reload(Setup::range(187_000, 187_999)).await;
    let during = f.provider.create(&spec).await.expect("a create during the clone adopts");
    let first = first.await.unwrap().expect("the first create finishes");
    assert_eq!(during.provider_id, first.provider_id);
    assert_eq!(f.sim.clones_started(), 1, "no duplicate is cloned");
    f.delete_and_assert_gone(&first.provider_id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pve_error_texts_are_recognised_in_the_reason_phrase_and_in_the_body() {
    // Before 8.4 the text is only in the status line's reason phrase.
    for version in ["8.3.2", "8.4.1", "9.0.3"] {
        let variant = Variant { version, ..CORRECT };
        let f = fixture_with(Setup::range(188_000, 188_999), variant).await;
        // Right after the start the guest agent is not running yet: that is
        // provisioning, not a failed create.
        let instance = f.provider.create(&f.spec("texts")).await.expect(version);
        let vmid: u32 = instance.provider_id.parse().unwrap();

        f.sim.set_faults(Faults { lock_timeout: true, ..Faults::default() });
        let err = f.provider.create(&f.spec("lock-timeout")).await.unwrap_err();
        assert_eq!(err.class, ErrorClass::Conflict, "{version}: {err}");
        assert!(err.message.contains("got timeout"), "{version}: {err}");
        f.sim.set_faults(Faults::default());

        f.sim.set_lock(vmid, Some("backup"));
        let err = f.provider.delete(&instance.provider_id).await.unwrap_err();
        assert_eq!(err.class, ErrorClass::Conflict, "{version}: {err}");
        assert!(err.message.contains("is locked (backup)"), "{version}: {err}");
        f.sim.set_lock(vmid, None);
        f.delete_and_assert_gone(&instance.provider_id).await;
    }
}

/// The lifecycle against a real cluster. Needs `PROXMOX_TEST_URL`
/// (`https://host:8006`), `PROXMOX_TEST_TOKEN` (`USER@REALM!TOKENID=SECRET`),
/// `PROXMOX_TEST_NODE`, `PROXMOX_TEST_TEMPLATE` (VMID) and
/// `PROXMOX_TEST_STORAGE` (ISO storage); optional `PROXMOX_TEST_CA_FILE`,
/// `PROXMOX_TEST_BRIDGE`, `PROXMOX_TEST_VMID_FIRST` (default 990000),
/// `PROXMOX_TEST_ALLOW` (CIDRs the host may resolve to, default the private
/// ranges).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_cluster_lifecycle() {
    let var = |name: &str| std::env::var(name).ok().filter(|value| !value.is_empty());
    let (Some(url), Some(token), Some(node), Some(template), Some(storage)) = (
        var("PROXMOX_TEST_URL"),
        var("PROXMOX_TEST_TOKEN"),
        var("PROXMOX_TEST_NODE"),
        var("PROXMOX_TEST_TEMPLATE"),
        var("PROXMOX_TEST_STORAGE"),
    ) else {
        eprintln!(
            "real_cluster_lifecycle skipped: set PROXMOX_TEST_URL, PROXMOX_TEST_TOKEN, PROXMOX_TEST_NODE, \
             PROXMOX_TEST_TEMPLATE and PROXMOX_TEST_STORAGE to run it (docs/providers/proxmox.md)"
        );
        return;
    };
    let first: u32 = var("PROXMOX_TEST_VMID_FIRST")
        .map_or(990_000, |v| v.parse().expect("PROXMOX_TEST_VMID_FIRST is a VMID"));
    let bridge = var("PROXMOX_TEST_BRIDGE").unwrap_or_else(|| "vmbr0".to_owned());
    let allow = var("PROXMOX_TEST_ALLOW")
        .unwrap_or_else(|| "10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16".to_owned());
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(plugin("proxmox"), dir.path().join("proxmox.wasm")).unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, token).unwrap();
    let ca = var("PROXMOX_TEST_CA_FILE")
        .map(|file| format!("      caFile: {file}\n"))
        .unwrap_or_default();
    let yaml = format!(
        "providers:
  - name: pve
    plugin: proxmox
    proxyAddresses: ['127.0.0.0/8']
    config: {{ url: '{url}', nodes: [{node}], templates: {{ test: {template} }}, isoStorage: {storage}, bridge: {bridge}, vmidRange: {{ first: {first}, last: {last} }} }}
    limits: {{ timeout: 300s }}
    grants:
{ca}      http:
        - url: '{url}'
          allowAddresses: [{allow}]
          credential: {{ header: Authorization, valueTemplate: 'PVEAPIToken={{secret}}', secretFile: {token} }}
",
        last = first + 999,
        token = token_file.display(),
    );
    let config = ProvidersConfig::parse(&yaml).expect("valid providers file");
    let runtime = Runtime::new(RuntimeOptions::default()).unwrap();
    let registry =
        Registry::load(&runtime, &config, dir.path(), Arc::new(MemoryKv::new())).await.unwrap();
    let provider = registry.provider("pve").expect("entry ready");
    let health = provider.check().await;
    assert!(health.healthy, "{health:?}");

    let mut spec = SpecBuilder::new("pf-real-test").build();
    spec.image = "test".to_owned();
    let deadline = Instant::now() + Duration::from_secs(900);
    let created = loop {
        match provider.create(&spec).await {
            Ok(instance) => break instance,
            Err(err) if err.class.is_retryable() && Instant::now() < deadline => {
                eprintln!("create: {err}; retrying");
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
            Err(err) => panic!("create failed: {err}"),
        }
    };
    let running = loop {
        let instance = provider.get(&created.provider_id).await.expect("get");
        if instance.state == InstanceState::Running && !instance.addresses.is_empty() {
            break instance;
        }
        assert!(Instant::now() < deadline, "never running with an address: {instance:?}");
        tokio::time::sleep(Duration::from_secs(5)).await;
    };
    eprintln!("running at {:?}", running.addresses);
    provider.delete(&created.provider_id).await.expect("delete");
    let gone = provider.get(&created.provider_id).await.unwrap_err();
    assert_eq!(gone.class, ErrorClass::NotFound, "{gone}");
}
