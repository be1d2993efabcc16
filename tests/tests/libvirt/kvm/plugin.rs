//! The `kvm` plugin through the host runtime, against the same private
//! `sshd` and `libvirtd`: domains on libvirt's test driver, pools and
//! volumes (base images, overlays, seeds) on the real storage driver in a
//! directory pool, base images downloaded from a server on loopback.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use proxyfleet_core::kv::KvStore;
use proxyfleet_core::kv::MemoryKv;
use proxyfleet_core::{ErrorClass, HealthReason, InstanceState, Provider};
use proxyfleet_harness::SpecBuilder;
use proxyfleet_runtime::config::ProvidersConfig;
use proxyfleet_runtime::{Registry, Runtime};
use proxyfleet_tests::kvm::{Libvirtd, STORAGE_URI, Sshd, TEST_URI};
use proxyfleet_tests::{Canned, TestServer};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A small but real qcow2 image (made by `qemu-img`), and its digest.
fn qcow2_image(dir: &Path, name: &str, megabytes: u32) -> (Bytes, String) {
    let path = dir.join(name);
    let status = std::process::Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2"])
        .arg(&path)
        .arg(format!("{megabytes}M"))
        .status()
        .expect("qemu-img runs (apt-get install qemu-utils)");
    assert!(status.success(), "qemu-img create failed");
    let bytes = std::fs::read(&path).expect("the image");
    let digest = hex::encode(Sha256::digest(&bytes));
    (Bytes::from(bytes), digest)
}

/// What a test's entry points at.
struct Site {
    sshd: Sshd,
    pool: String,
    pool_dir: std::path::PathBuf,
    kv: Arc<MemoryKv>,
    dir: tempfile::TempDir,
}

impl Site {
    fn new(prefix: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let sshd = Sshd::start(&dir.path().join("sshd"));
        let (pool, pool_dir) = Libvirtd::shared().dir_pool(prefix);
        Self { sshd, pool, pool_dir, kv: Arc::new(MemoryKv::new()), dir }
    }

    /// The entry `entry` with the kvm plugin, its image `debian-12` at
    /// `image_url` with digest `sha256`.
    async fn provider(
        &self,
        entry: &str,
        image_url: &str,
        sha256: &str,
        known_hosts: &Path,
    ) -> Arc<dyn Provider> {
        self.provider_limited(entry, image_url, sha256, known_hosts, "").await
    }

    /// [`Site::provider`] with more `limits` (`, key: value` pairs).
    async fn provider_limited(
        &self,
        entry: &str,
        image_url: &str,
        sha256: &str,
        known_hosts: &Path,
        limits: &str,
    ) -> Arc<dyn Provider> {
        let plugins = self.dir.path().join("plugins");
        std::fs::create_dir_all(&plugins).expect("plugin dir");
        std::fs::copy(proxyfleet_tests::plugin("kvm"), plugins.join("kvm.wasm")).expect("copy");
        let yaml = self.providers(entry, image_url, sha256, known_hosts, limits);
        let config = ProvidersConfig::parse(&yaml).expect("providers config");
        let runtime = Runtime::new(super::runtime_options()).expect("runtime");
        let kv: Arc<dyn KvStore> = self.kv.clone();
        let registry = Registry::load(&runtime, &config, &plugins, kv).await.expect("registry");
        registry.provider(entry).expect("the entry loads")
    }

    /// A providers file with the entry `entry` of the kvm plugin, as
    /// [`Site::provider_limited`] loads it.
    fn providers(
        &self,
        entry: &str,
        image_url: &str,
        sha256: &str,
        known_hosts: &Path,
        limits: &str,
    ) -> String {
        let origin = image_url.split('/').take(3).collect::<Vec<_>>().join("/");
        format!(
            "providers:\n  - name: {entry}\n    plugin: kvm\n    config:\n      \
             hosts: [{{ name: 127.0.0.1 }}]\n      pool: {pool}\n      \
             images: {{ debian-12: {{ url: '{image_url}', sha256: '{sha256}' }} }}\n      \
             domainType: test\n      addressSources: [agent, lease]\n    \
             limits: {{ timeout: 60s{limits} }}\n    grants:\n      http:\n        \
             - {{ url: '{origin}', allowAddresses: [127.0.0.1] }}\n      libvirt:\n        \
             - {{ host: 127.0.0.1, port: {port}, user: root, keyFile: '{key}', \
             knownHostsFile: '{known}', socket: '{socket}', uri: '{TEST_URI}', \
             pools: [{pool}], networks: [default], storageUri: '{STORAGE_URI}', callTimeout: 10s }}\n",
            pool = self.pool,
            port = self.sshd.port,
            key = self.sshd.user_key.display(),
            known = known_hosts.display(),
            socket = Libvirtd::shared().socket.display(),
        )
    }

    /// The files in the pool's directory, sorted.
    fn volumes(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.pool_dir)
            .expect("pool dir")
            .map(|entry| entry.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }
}

impl Drop for Site {
    fn drop(&mut self) {
        Libvirtd::shared().remove_pool(&self.pool);
    }
}

/// A domain defined behind the plugin's back, with `metadata` (or none).
fn define_foreign(name: &str, metadata: &str) {
    let conn = Libvirtd::shared().direct(TEST_URI);
    let xml = format!(
        "<domain type='test'><name>{name}</name><metadata>{metadata}</metadata>\
         <memory>131072</memory><os><type>hvm</type></os></domain>"
    );
    virt::domain::Domain::define_xml(&conn, &xml).expect("a foreign domain");
}

fn domain_names() -> Vec<String> {
    let conn = Libvirtd::shared().direct(TEST_URI);
    let domains = conn.list_all_domains(0).expect("domains");
    domains.iter().map(|d| d.get_name().expect("name")).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_full_lifecycle_through_the_runtime() {
    let site = Site::new("kvm-life");
    let (image, sha256) = qcow2_image(site.dir.path(), "base.qcow2", 64);
    let server = TestServer::http(Canned { status: 200, body: image }).await;
    let url = format!("http://{}/images/debian-12.qcow2", server.addr);
    let provider = site.provider("lab", &url, &sha256, &site.sshd.known_hosts).await;

    let health = provider.check().await;
    assert!(health.healthy, "{health:?}");
    assert!(
        health.issues.iter().any(
            |i| i.reason == HealthReason::TemplateNotFound && i.message.contains("not in pool")
        ),
        "a missing base is a warning: {health:?}"
    );

    let spec = SpecBuilder::new("kvm-a").uid("uid-kvm-life-a").build();
    let created = provider.create(&spec).await.expect("create");
    assert_eq!(created.state, InstanceState::Running, "{created:?}");
    assert!(!created.addresses.is_empty(), "the agent answers on the test driver: {created:?}");
    assert_eq!(created.mark.as_ref().expect("mark").uid, "uid-kvm-life-a");
    let (host, name) = created.provider_id.split_once('/').expect("host/name");
    assert_eq!(host, "127.0.0.1");
    assert_eq!(
        site.volumes(),
        [
            "base-lab-debian-12.qcow2".to_owned(),
            format!("{name}-seed.iso"),
            format!("{name}.qcow2"),
        ],
        "a verified base, the overlay and the seed; no temporary volume"
    );
    // The overlay really sits on the base.
    let info = std::process::Command::new("qemu-img")
        .args(["info", "--output=json"])
        .arg(site.pool_dir.join(format!("{name}.qcow2")))
        .output()
        .expect("qemu-img info");
    let info: serde_json::Value = serde_json::from_slice(&info.stdout).expect("json");
    assert!(
        info["backing-filename"].as_str().unwrap_or("").ends_with("base-lab-debian-12.qcow2"),
        "{info}"
    );
    // The seed is a NoCloud ISO with the Proxy's instance ID.
    let seed = std::fs::read(site.pool_dir.join(format!("{name}-seed.iso"))).expect("seed");
    assert_eq!(&seed[0x8001..0x8006], b"CD001", "an ISO 9660 image");
    assert!(String::from_utf8_lossy(&seed).contains(&format!("instance-id: {name}")));

    // A second Proxy reuses the base: one download in all.
    let other = SpecBuilder::new("kvm-b").uid("uid-kvm-life-b").build();
    let second = provider.create(&other).await.expect("second create");
    assert_ne!(second.provider_id, created.provider_id);
    assert_eq!(server.seen().len(), 1, "the base is downloaded once");

    // A retried create (its answer lost) adopts.
    let again = provider.create(&spec).await.expect("retried create");
    assert_eq!(again.provider_id, created.provider_id);
    let got = provider.get(&created.provider_id).await.expect("get");
    assert_eq!(
        (got.state, got.mark.as_ref().map(|m| m.uid.as_str())),
        (InstanceState::Running, Some("uid-kvm-life-a"))
    );

    // Domains without our mark, or with another entry's, are not listed.
    define_foreign("kvm-life-stranger", "");
    define_foreign(
        "kvm-life-other-entry",
        "<o:owner xmlns:o='https://proxyfleet.io/xmlns/kvm/1' entry='elsewhere' uid='u' \
         namespace='n' name='x' created-at='1'/>",
    );
    let listed = provider.list().await.expect("list");
    let mut ids: Vec<&str> = listed.iter().map(|i| i.provider_id.as_str()).collect();
    ids.sort_unstable();
    let mut expected = vec![created.provider_id.as_str(), second.provider_id.as_str()];
    expected.sort_unstable();
    assert_eq!(ids, expected);
    // ... nor deleted through a forged provider ID: the host shows the
    // plugin no domain of that name, so there is nothing of its own to
    // delete.
    provider.delete("127.0.0.1/kvm-life-stranger").await.expect("nothing of ours to delete");
    assert!(domain_names().contains(&"kvm-life-stranger".to_owned()));

    for id in [&created.provider_id, &second.provider_id] {
        provider.delete(id).await.expect("delete");
        provider.delete(id).await.expect("a second delete finds nothing to do");
        let err = provider.get(id).await.expect_err("gone");
        assert_eq!(err.class, ErrorClass::NotFound, "{err}");
    }
    assert_eq!(site.volumes(), ["base-lab-debian-12.qcow2"], "the base stays for later overlays");
    assert!(provider.check().await.healthy);

    // The same image key with another digest: the base is not replaced.
    let (newer, newer_sha) = qcow2_image(site.dir.path(), "newer.qcow2", 32);
    server.set_canned(Canned { status: 200, body: newer });
    let changed = site.provider("lab", &url, &newer_sha, &site.sshd.known_hosts).await;
    let err = changed.create(&spec).await.expect_err("digest mismatch");
    assert_eq!(err.class, ErrorClass::Permanent, "{err}");
    assert!(err.message.contains(&sha256) && err.message.contains(&newer_sha), "{err}");
    assert_eq!(site.volumes(), ["base-lab-debian-12.qcow2"]);
    let health = changed.check().await;
    assert!(!health.healthy, "{health:?}");

    for name in ["kvm-life-stranger", "kvm-life-other-entry"] {
        let conn = Libvirtd::shared().direct(TEST_URI);
        let domain = virt::domain::Domain::lookup_by_name(&conn, name).expect("domain");
        domain.undefine().expect("undefine");
    }
}

/// Serves `length` announced bytes but sends only the first half of
/// `body`, then closes: a download that breaks off part way.
async fn breaking_server(body: Bytes) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else { return };
            let body = body.clone();
            tokio::spawn(async move {
                let mut request = [0_u8; 4096];
                let _ = stream.read(&mut request).await;
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\ncontent-type: application/octet-stream\r\n\r\n",
                    body.len()
                );
                let _ = stream.write_all(head.as_bytes()).await;
                let _ = stream.write_all(&body[..body.len() / 2]).await;
                let _ = stream.flush().await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread")]
async fn a_download_that_breaks_off_leaves_no_base_and_no_stuck_upload() {
    let site = Site::new("kvm-broken");
    let (image, sha256) = qcow2_image(site.dir.path(), "base.qcow2", 64);
    let broken = breaking_server(image.clone()).await;
    let provider = site
        .provider(
            "broken",
            &format!("http://{broken}/debian-12.qcow2"),
            &sha256,
            &site.sshd.known_hosts,
        )
        .await;
    let spec = SpecBuilder::new("kvm-broken").uid("uid-kvm-broken").build();
    let err = provider.create(&spec).await.expect_err("the download breaks");
    assert_eq!(err.class, ErrorClass::Transient, "{err}");
    assert!(site.volumes().is_empty(), "no base, no half-base: {:?}", site.volumes());
    assert!(provider.list().await.expect("list").is_empty());

    // A digest that does not match is refused before anything is published.
    let server = TestServer::http(Canned { status: 200, body: image.clone() }).await;
    let url = format!("http://{}/debian-12.qcow2", server.addr);
    let wrong = "0".repeat(64);
    let provider = site.provider("broken", &url, &wrong, &site.sshd.known_hosts).await;
    let err = provider.create(&spec).await.expect_err("digest mismatch");
    assert_eq!(err.class, ErrorClass::Permanent, "{err}");
    assert!(err.message.contains(&sha256) && err.message.contains(&wrong), "{err}");
    assert!(site.volumes().is_empty(), "{:?}", site.volumes());

    // An image over the entry's response cap: the error names the limit.
    let large = Bytes::from(vec![7_u8; 2 << 20]);
    let large_sha = hex::encode(Sha256::digest(&large));
    server.set_canned(Canned { status: 200, body: large });
    let provider = site
        .provider_limited(
            "broken",
            &url,
            &large_sha,
            &site.sshd.known_hosts,
            ", httpResponseMiB: 1",
        )
        .await;
    let err = provider.create(&spec).await.expect_err("over the response cap");
    assert_eq!(err.class, ErrorClass::Permanent, "{err}");
    assert!(err.message.contains("limits.httpResponseMiB"), "{err}");
    assert!(site.volumes().is_empty(), "{:?}", site.volumes());

    // A redirect is not the image, and says where it points.
    server.set_canned(Canned { status: 302, body: Bytes::from_static(b"moved") });
    let err = provider.create(&spec).await.expect_err("a redirect");
    assert_eq!(err.class, ErrorClass::Permanent, "{err}");
    assert!(err.message.contains("HTTP 302"), "{err}");
    assert!(site.volumes().is_empty(), "{:?}", site.volumes());
    server.set_canned(Canned { status: 200, body: image });

    // Nothing is left holding the pool: the same create now succeeds.
    let provider = site.provider("broken", &url, &sha256, &site.sshd.known_hosts).await;
    let created = provider.create(&spec).await.expect("create after the failures");
    assert_eq!(created.state, InstanceState::Running);
    provider.delete(&created.provider_id).await.expect("delete");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_create_interrupted_at_any_step_is_adopted_or_redone() {
    let site = Site::new("kvm-adopt");
    let (image, sha256) = qcow2_image(site.dir.path(), "base.qcow2", 16);
    let server = TestServer::http(Canned { status: 200, body: image }).await;
    let url = format!("http://{}/debian-12.qcow2", server.addr);
    let provider = site.provider("adopt", &url, &sha256, &site.sshd.known_hosts).await;
    let spec = SpecBuilder::new("kvm-adopt").uid("uid-kvm-adopt").build();
    let created = provider.create(&spec).await.expect("create");
    let (_, name) = created.provider_id.split_once('/').expect("host/name");

    // The crash came after define, before start: the retry starts it.
    let conn = Libvirtd::shared().direct(TEST_URI);
    let domain = virt::domain::Domain::lookup_by_name(&conn, name).expect("our domain");
    domain.destroy().expect("stop it");
    assert_eq!(
        provider.get(&created.provider_id).await.expect("get").state,
        InstanceState::Stopped
    );
    let adopted = provider.create(&spec).await.expect("retried create");
    assert_eq!(adopted.provider_id, created.provider_id);
    assert_eq!(adopted.state, InstanceState::Running);
    assert_eq!(domain_names().iter().filter(|n| *n == name).count(), 1);

    // The crash came before define: overlay and seed are left, no domain.
    domain.destroy().expect("stop");
    domain.undefine().expect("undefine");
    let leftovers = site.volumes();
    assert!(leftovers.contains(&format!("{name}.qcow2")), "{leftovers:?}");
    let health = provider.check().await;
    assert!(health.healthy, "{health:?}");
    assert!(
        health.issues.iter().any(|issue| issue.message.contains(&format!("{name}-seed.iso"))),
        "check names the volumes without a domain: {health:?}"
    );
    let redone = provider.create(&spec).await.expect("create over the leftovers");
    assert_eq!(redone.provider_id, created.provider_id);
    assert_eq!(redone.state, InstanceState::Running);
    assert_eq!(site.volumes(), leftovers, "the leftovers were replaced, not doubled");

    // A domain of our name without our mark is someone else's.
    provider.delete(&created.provider_id).await.expect("delete");
    define_foreign(name, "");
    let err = provider.create(&spec).await.expect_err("a foreign domain of our name");
    assert_eq!(err.class, ErrorClass::Conflict, "{err}");
    virt::domain::Domain::lookup_by_name(&conn, name)
        .expect("theirs")
        .undefine()
        .expect("undefine");

    // The base's copy to its final name was cut off (its call ran out of
    // budget mid-copy): the store says the copy never completed, and the
    // file is torn. The next create removes it and publishes anew rather
    // than putting an overlay on it.
    let base = "base-adopt-debian-12.qcow2";
    let key = format!("base/127.0.0.1/{}/{base}", site.pool);
    let record = site.kv.get("adopt", &key).await.expect("kv").expect("a record of the base");
    let cut_off = serde_json::json!({ "sha256": sha256, "published": false });
    site.kv
        .compare_and_swap("adopt", &key, Some(record.version), Some(cut_off.to_string().into()))
        .await
        .expect("kv write");
    std::fs::write(site.pool_dir.join(base), b"torn").expect("tear the base");
    let other = SpecBuilder::new("kvm-adopt-2").uid("uid-kvm-adopt-2").build();
    let created = provider.create(&other).await.expect("create over a cut-off base");
    assert_eq!(server.seen().len(), 2, "the base was downloaded again");
    let info = std::process::Command::new("qemu-img")
        .args(["info", "--output=json"])
        .arg(site.pool_dir.join(base))
        .output()
        .expect("qemu-img info");
    let info: serde_json::Value = serde_json::from_slice(&info.stdout).expect("json");
    assert_eq!(info["format"], "qcow2", "a whole base again: {info}");
    provider.delete(&created.provider_id).await.expect("delete");

    // Two creates of one Proxy at once (a retry overlapping the first
    // attempt): one domain, one set of disks, and neither attempt removes
    // what the other made.
    let twice = SpecBuilder::new("kvm-adopt-3").uid("uid-kvm-adopt-3").build();
    let (first, second) = tokio::join!(provider.create(&twice), provider.create(&twice));
    let mut made = Vec::new();
    for outcome in [first, second] {
        match outcome {
            Ok(instance) => made.push(instance.provider_id),
            Err(err) => assert_eq!(err.class, ErrorClass::Transient, "{err}"),
        }
    }
    assert!(!made.is_empty() && made.iter().all(|id| *id == made[0]), "{made:?}");
    let (_, name) = made[0].split_once('/').expect("host/name");
    assert_eq!(domain_names().iter().filter(|n| *n == name).count(), 1);
    let volumes = site.volumes();
    assert!(volumes.contains(&format!("{name}.qcow2")), "{volumes:?}");
    assert!(volumes.contains(&format!("{name}-seed.iso")), "{volumes:?}");
    let instance = provider.create(&twice).await.expect("a later retry adopts");
    assert_eq!(instance.state, InstanceState::Running);
    provider.delete(&made[0]).await.expect("delete");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_plugin_behind_a_wrong_host_key_is_unauthorized() {
    let site = Site::new("kvm-hostkey");
    let wrong = site.sshd.wrong_known_hosts();
    let provider =
        site.provider("hostkey", "http://127.0.0.1:9/x.qcow2", &"0".repeat(64), &wrong).await;
    let health = provider.check().await;
    assert!(!health.healthy);
    assert_eq!(health.issues[0].reason, HealthReason::Unauthorized, "{health:?}");
    let spec = SpecBuilder::new("kvm-hostkey").uid("uid-kvm-hostkey").build();
    let err = provider.create(&spec).await.expect_err("refused host key");
    assert_eq!(err.class, ErrorClass::Unauthorized, "{err}");
}

/// Runs the conformance suite on the one entry of `yaml` served by the
/// component `plugin`, storing into the site's key-value store, and fails
/// the test with its report when a case failed.
async fn assert_conformance(site: &Site, yaml: &str, plugin: &Path) {
    let entry = ProvidersConfig::parse(yaml).expect("providers config").entries.remove(0);
    let runtime = Runtime::new(super::runtime_options()).expect("runtime");
    let revision = runtime.load_plugin(plugin).await.expect("loads");
    let spec = SpecBuilder::new("conformance").build();
    let mut options = proxyfleet_conformance::Options::new(entry.config.clone(), spec);
    options.call_timeout = entry.limits.call_timeout;
    let kv: Arc<dyn KvStore> = site.kv.clone();
    let binder = proxyfleet_harness::EntryBinder::new(runtime, entry, revision, kv);
    let provider = binder.bind_own().await.expect("the entry binds");
    let report = proxyfleet_conformance::run(provider, &binder, &options).await;
    assert!(report.passed(), "{}", report.text());
}

/// The plugin passes the conformance suite (`proxyfleet plugin test`'s) on
/// the private libvirtd, and leaves no domain and no volume of its own.
#[tokio::test(flavor = "multi_thread")]
async fn the_plugin_passes_the_conformance_suite() {
    let site = Site::new("kvm-conformance");
    let (image, sha256) = qcow2_image(site.dir.path(), "base.qcow2", 64);
    let server = TestServer::http(Canned { status: 200, body: image }).await;
    let url = format!("http://{}/images/debian-12.qcow2", server.addr);
    // A short call timeout: a lock the suite's stopped create left lasts
    // that long. A name prefix of its own, to find what it leaves among
    // the other tests' domains.
    let yaml = site
        .providers("lab", &url, &sha256, &site.sshd.known_hosts, "")
        .replace("timeout: 60s", "timeout: 10s")
        .replace("domainType: test", "domainType: test\n      namePrefix: kvmconf");
    assert_conformance(&site, &yaml, &proxyfleet_tests::plugin("kvm")).await;
    let ours: Vec<String> =
        domain_names().into_iter().filter(|name| name.starts_with("kvmconf-")).collect();
    assert!(ours.is_empty(), "domains left behind: {ours:?}");
    let volumes: Vec<String> =
        site.volumes().into_iter().filter(|name| !name.starts_with("base-")).collect();
    assert!(volumes.is_empty(), "volumes left behind: {volumes:?}");
}

/// The project `proxyfleet plugin new --backend libvirt` makes passes the
/// conformance suite on the private libvirtd as made, and leaves only the
/// base volume it was given (`cargo xtask plugin-template` builds it).
#[tokio::test(flavor = "multi_thread")]
async fn the_libvirt_template_passes_the_conformance_suite() {
    let site = Site::new("template");
    qcow2_image(&site.pool_dir, "template-base.qcow2", 16);
    let mut conn = Libvirtd::shared().direct(STORAGE_URI);
    virt::storage_pool::StoragePool::lookup_by_name(&conn, &site.pool)
        .expect("the site's pool")
        .refresh(0)
        .expect("refreshed");
    let _ = conn.close();
    // A short call timeout: what a stopped create was doing ends within it.
    let yaml = format!(
        "providers:\n  - name: lab\n    plugin: example-libvirt\n    config:\n      \
         host: 127.0.0.1\n      pool: {pool}\n      \
         images: {{ debian-12: template-base.qcow2 }}\n      domainType: test\n      \
         namePrefix: tmpl\n    \
         limits: {{ timeout: 10s }}\n    grants:\n      libvirt:\n        \
         - {{ host: 127.0.0.1, port: {port}, user: root, keyFile: '{key}', \
         knownHostsFile: '{known}', socket: '{socket}', uri: '{TEST_URI}', \
         pools: [{pool}], networks: [default], storageUri: '{STORAGE_URI}', callTimeout: 10s }}\n",
        pool = site.pool,
        port = site.sshd.port,
        key = site.sshd.user_key.display(),
        known = site.sshd.known_hosts.display(),
        socket = Libvirtd::shared().socket.display(),
    );
    let template = proxyfleet_tests::plugin("examples/template-libvirt");
    assert_conformance(&site, &yaml, &template).await;
    let ours: Vec<String> =
        domain_names().into_iter().filter(|name| name.starts_with("tmpl-")).collect();
    assert!(ours.is_empty(), "domains left behind: {ours:?}");
    assert_eq!(site.volumes(), ["template-base.qcow2"], "volumes left behind");
}
