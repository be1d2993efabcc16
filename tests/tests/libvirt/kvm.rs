//! The libvirt capability and the kvm plugin against real parts: a private `sshd` on loopback
//! and a private `libvirtd` (test driver and storage driver), with real
//! SSH carrying real libvirt RPC (`proxyfleet_tests::kvm`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use proxyfleet_runtime::capabilities::libvirt::{
    AddressSource, DomainState, EntryLibvirt, HostPool, LibvirtError, LibvirtHelper,
};
use proxyfleet_runtime::config::LibvirtGrant;
use proxyfleet_tests::kvm::{Libvirtd, STORAGE_URI, Sshd, TEST_POOL, TEST_URI};

/// The `hostile` fixture against the libvirt grant's bounds.
mod hostile;
/// The kvm plugin on the same daemons (one libvirtd per process: the
/// storage driver takes a host-wide lock).
mod plugin;
/// The kvm plugin on a real hypervisor named by `KVM_TEST_*`.
mod real_host;

/// The libvirt helper this package builds, as the operator ships it.
fn helper_program() -> std::path::PathBuf {
    env!("CARGO_BIN_EXE_libvirt-helper").into()
}

/// One helper for the whole test process, as one operator has.
fn helper() -> Arc<LibvirtHelper> {
    static HELPER: std::sync::OnceLock<Arc<LibvirtHelper>> = std::sync::OnceLock::new();
    Arc::clone(HELPER.get_or_init(|| Arc::new(LibvirtHelper::new(helper_program()))))
}

/// A runtime whose libvirt calls go to that helper.
fn runtime_options() -> proxyfleet_runtime::RuntimeOptions {
    proxyfleet_runtime::RuntimeOptions {
        libvirt_helper: Some(helper_program()),
        ..proxyfleet_runtime::RuntimeOptions::default()
    }
}

fn grant(sshd: &Sshd, uri: &str, call_timeout: Duration) -> LibvirtGrant {
    LibvirtGrant {
        host: "127.0.0.1".into(),
        port: sshd.port,
        user: "root".into(),
        key_file: sshd.user_key.clone(),
        known_hosts_file: sshd.known_hosts.clone(),
        pools: vec![TEST_POOL.into()],
        networks: vec!["default".into()],
        bridges: Vec::new(),
        socket: Libvirtd::shared().socket.to_string_lossy().into_owned(),
        uri: uri.into(),
        storage_uri: uri.into(),
        call_timeout,
    }
}

fn pool(sshd: &Sshd, uri: &str) -> Arc<HostPool> {
    Arc::new(HostPool::new(grant(sshd, uri, Duration::from_secs(10)), "direct", helper()))
}

fn domain_xml(name: &str) -> String {
    format!(
        "<domain type='test'><name>{name}</name><memory unit='MiB'>128</memory><vcpu>1</vcpu>\
         <os><type>hvm</type></os><devices><interface type='network'>\
         <source network='default'/></interface></devices></domain>"
    )
}

/// A helper killed under a pooled connection costs one `transient` call;
/// the next call starts a new helper and redials.
#[tokio::test(flavor = "multi_thread")]
async fn a_helper_that_dies_is_started_again_and_the_host_redialled() {
    let dir = tempfile::tempdir().unwrap();
    let sshd = Sshd::start(dir.path());
    // A helper of its own: the other tests share theirs.
    let helper = Arc::new(LibvirtHelper::new(helper_program()));
    let host = HostPool::new(
        grant(&sshd, TEST_URI, Duration::from_secs(10)),
        "direct",
        Arc::clone(&helper),
    );
    assert_eq!(helper.pid(), None, "nothing starts before the first connection");
    assert!(!host.ping().await.unwrap().is_empty());
    let first = helper.pid().expect("the first call started the helper");

    let pid = rustix::process::Pid::from_raw(i32::try_from(first).unwrap()).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).unwrap();
    let err = host.ping().await.unwrap_err();
    assert!(matches!(err, LibvirtError::Transient(_)), "{err:?}");

    assert!(!host.ping().await.unwrap().is_empty());
    let second = helper.pid().expect("running again");
    assert_ne!(second, first);
}

#[tokio::test(flavor = "multi_thread")]
async fn ssh_carries_libvirt_rpc_for_every_operation() {
    let dir = tempfile::tempdir().unwrap();
    let sshd = Sshd::start(dir.path());
    let host = pool(&sshd, TEST_URI);

    assert!(!host.ping().await.unwrap().is_empty());
    let info = host.pool_info(TEST_POOL).await.unwrap();
    assert!(info.active && info.capacity > 0, "{info:?}");

    let volume = host
        .create_volume(
            TEST_POOL,
            "<volume><name>rpc-vol.qcow2</name><capacity unit='MiB'>8</capacity>\
             <target><format type='qcow2'/></target></volume>",
        )
        .await
        .unwrap();
    assert_eq!(volume.name, "rpc-vol.qcow2");
    assert!(host.list_volumes(TEST_POOL).await.unwrap().iter().any(|v| v.name == volume.name));
    let err = host
        .create_volume(
            TEST_POOL,
            "<volume><name>rpc-vol.qcow2</name><capacity>1</capacity></volume>",
        )
        .await
        .unwrap_err();
    assert!(matches!(err, LibvirtError::Exists(_) | LibvirtError::Failed(_)), "{err:?}");
    host.delete_volume(TEST_POOL, "rpc-vol.qcow2").await.unwrap();
    let err = host.volume(TEST_POOL, "rpc-vol.qcow2").await.unwrap_err();
    assert!(matches!(err, LibvirtError::NotFound(_)), "{err:?}");

    let defined = host.define_domain(&domain_xml("rpc-dom")).await.unwrap();
    assert_eq!((defined.name.as_str(), defined.state), ("rpc-dom", DomainState::Shutoff));
    let ns = "https://proxyfleet.io/test-mark";
    let err = host.metadata("rpc-dom", ns).await.unwrap_err();
    assert!(matches!(err, LibvirtError::NotFound(_)), "{err:?}");
    host.set_metadata("rpc-dom", ns, "pf", Some("<mark uid='u-1'/>")).await.unwrap();
    host.start_domain("rpc-dom").await.unwrap();
    assert_eq!(host.domain("rpc-dom").await.unwrap().state, DomainState::Running);
    let mark = host.metadata("rpc-dom", ns).await.unwrap();
    assert!(mark.contains("u-1"), "{mark}");
    let addresses = host.interface_addresses("rpc-dom", AddressSource::Agent).await.unwrap();
    assert!(addresses.iter().all(|a| !a.address.is_empty()), "{addresses:?}");
    assert!(host.list_domains().await.unwrap().iter().any(|d| d.name == "rpc-dom"));
    host.destroy_domain("rpc-dom").await.unwrap();
    let err = host.destroy_domain("rpc-dom").await.unwrap_err();
    assert!(matches!(err, LibvirtError::InvalidState(_)), "{err:?}");
    host.undefine_domain("rpc-dom").await.unwrap();
    let err = host.domain("rpc-dom").await.unwrap_err();
    assert!(matches!(err, LibvirtError::NotFound(_)), "{err:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_host_key_not_in_known_hosts_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let sshd = Sshd::start(dir.path());

    let mut wrong = grant(&sshd, TEST_URI, Duration::from_secs(10));
    wrong.known_hosts_file = sshd.wrong_known_hosts();
    let err = HostPool::new(wrong, "direct", helper()).ping().await.unwrap_err();
    assert!(
        matches!(&err, LibvirtError::Unauthorized(m) if m.contains("does not match")),
        "{err:?}"
    );

    let mut unlisted = grant(&sshd, TEST_URI, Duration::from_secs(10));
    unlisted.known_hosts_file = dir.path().join("empty_known_hosts");
    std::fs::write(&unlisted.known_hosts_file, "").unwrap();
    let err = HostPool::new(unlisted, "direct", helper()).ping().await.unwrap_err();
    assert!(matches!(&err, LibvirtError::Unauthorized(m) if m.contains("not listed")), "{err:?}");

    let mut missing = grant(&sshd, TEST_URI, Duration::from_secs(10));
    missing.known_hosts_file = dir.path().join("no_such_file");
    let err = HostPool::new(missing, "direct", helper()).ping().await.unwrap_err();
    assert!(matches!(&err, LibvirtError::Unauthorized(m) if m.contains("cannot read")), "{err:?}");

    let mut bad_key = grant(&sshd, TEST_URI, Duration::from_secs(10));
    bad_key.key_file = dir.path().join("host_key");
    let err = HostPool::new(bad_key, "direct", helper()).ping().await.unwrap_err();
    assert!(
        matches!(&err, LibvirtError::Unauthorized(m) if m.contains("refused the key")),
        "{err:?}"
    );
    assert!(!err.to_string().contains("PRIVATE KEY"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_sshd_mid_call_is_transient_and_the_next_call_redials() {
    let dir = tempfile::tempdir().unwrap();
    let mut sshd = Sshd::start(dir.path());
    let host = pool(&sshd, TEST_URI);
    host.define_domain(&domain_xml("kill-dom")).await.unwrap();
    host.start_domain("kill-dom").await.unwrap();

    // The peer stalls, a call is in flight, then the peer dies: the call
    // ends at once with transient, not with an empty answer.
    sshd.stall_sessions();
    let call = tokio::spawn({
        let host = Arc::clone(&host);
        async move { host.interface_addresses("kill-dom", AddressSource::Agent).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    sshd.kill_sessions();
    let outcome = call.await.unwrap();
    let err = outcome.unwrap_err();
    assert!(matches!(err, LibvirtError::Transient(_)), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());

    // The next call dials a new connection.
    assert_eq!(host.domain("kill-dom").await.unwrap().state, DomainState::Running);

    // With the daemon gone, calls are transient; back, they work again.
    sshd.kill();
    let err = host.domain("kill-dom").await.unwrap_err();
    assert!(matches!(err, LibvirtError::Transient(_)), "{err:?}");
    sshd.restart();
    host.destroy_domain("kill-dom").await.unwrap();
    host.undefine_domain("kill-dom").await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_call_over_its_budget_kills_only_its_connection() {
    let dir = tempfile::tempdir().unwrap();
    let sshd_a = Sshd::start(&dir.path().join("a"));
    let sshd_b = Sshd::start(&dir.path().join("b"));
    let a = Arc::new(HostPool::new(
        grant(&sshd_a, TEST_URI, Duration::from_millis(800)),
        "direct",
        helper(),
    ));
    let b = pool(&sshd_b, TEST_URI);
    a.ping().await.unwrap();
    b.ping().await.unwrap();
    let b_sessions = sshd_b.sessions();
    assert!(!b_sessions.is_empty());

    sshd_a.stall_sessions();
    let started = Instant::now();
    let err = a.list_domains().await.unwrap_err();
    let elapsed = started.elapsed();
    assert!(matches!(&err, LibvirtError::Timeout(m) if m.contains("budget")), "{err:?}");
    assert!(
        elapsed >= Duration::from_millis(800) && elapsed < Duration::from_secs(3),
        "{elapsed:?}"
    );

    // The other host's connection is untouched and still serves.
    b.ping().await.unwrap();
    assert_eq!(sshd_b.sessions(), b_sessions, "b kept its connection");

    // The stalled connection is gone for good; the next call redials.
    sshd_a.kill_sessions();
    a.ping().await.unwrap();
}

/// Issue 15, item 11: a provider check is cut off at min(15 s, interval)
/// by dropping it, and a dropped call killed the shared connection that
/// the entry's creates and uploads were using.
#[tokio::test(flavor = "multi_thread")]
async fn a_cut_off_call_leaves_the_shared_connection_to_the_other_calls() {
    let dir = tempfile::tempdir().unwrap();
    let sshd = Sshd::start(dir.path());
    let host = pool(&sshd, TEST_URI);
    host.ping().await.unwrap();
    let sessions = sshd.sessions();
    // The peer stalls, so the RPC is surely under way when the call is
    // dropped; then it answers (to nobody).
    sshd.stall_sessions();
    let cut_off = tokio::time::timeout(Duration::from_millis(300), host.list_domains()).await;
    assert!(cut_off.is_err(), "the call was cut off: {cut_off:?}");
    sshd.resume_sessions();
    host.ping().await.unwrap();
    host.list_domains().await.unwrap();
    assert_eq!(sshd.sessions(), sessions, "the same connection serves on");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_connection_that_dies_after_a_cancelled_call_is_redialled() {
    let dir = tempfile::tempdir().unwrap();
    let sshd = Sshd::start(dir.path());
    let host = pool(&sshd, TEST_URI);
    host.ping().await.unwrap();
    sshd.stall_sessions();
    let cancelled = tokio::time::timeout(Duration::from_millis(300), host.list_domains()).await;
    assert!(cancelled.is_err(), "the stalled call was still waiting");
    sshd.kill_sessions();
    // The cancelled call left the connection in the pool: the first call
    // may still find it and fail transient; the one after has redialled.
    if let Err(err) = host.ping().await {
        assert!(matches!(err, LibvirtError::Transient(_)), "{err:?}");
    }
    host.ping().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn uploads_stream_into_a_volume_and_a_broken_one_fails_transient() {
    let daemon = Libvirtd::shared();
    let (pool_name, pool_dir) = daemon.dir_pool("pf-upload");
    let pool_name = pool_name.as_str();
    let dir = tempfile::tempdir().unwrap();
    let sshd = Sshd::start(dir.path());
    let mut granted = grant(&sshd, STORAGE_URI, Duration::from_secs(10));
    granted.pools = vec![pool_name.to_owned()];
    let host = Arc::new(HostPool::new(granted, "direct", helper()));

    let data: Vec<u8> = (0..3u32 << 20).map(|i| (i % 251) as u8).collect();
    let volume_xml = |name: &str| {
        format!(
            "<volume><name>{name}</name><capacity unit='bytes'>{}</capacity>\
             <target><format type='raw'/></target></volume>",
            data.len()
        )
    };
    host.create_volume(pool_name, &volume_xml("whole.raw")).await.unwrap();
    let mut upload = host.begin_upload(pool_name, "whole.raw", data.len() as u64).await.unwrap();
    for chunk in data.chunks(256 << 10) {
        upload.write(chunk.to_vec()).await.unwrap();
    }
    upload.finish().await.unwrap();
    assert_eq!(std::fs::read(pool_dir.join("whole.raw")).unwrap(), data);

    let volumes = host.list_volumes(pool_name).await.unwrap();
    assert_eq!(volumes.len(), 1, "{volumes:?}");
    let published =
        host.clone_volume(pool_name, &volume_xml("published.raw"), "whole.raw").await.unwrap();
    assert_eq!(std::fs::read(&published.path).unwrap(), data);

    // An upload whose connection dies part way fails transient, and the
    // next call redials (the caller deletes what it had begun).
    host.create_volume(pool_name, &volume_xml("broken.raw")).await.unwrap();
    let mut upload = host.begin_upload(pool_name, "broken.raw", data.len() as u64).await.unwrap();
    upload.write(data[..1 << 20].to_vec()).await.unwrap();
    sshd.kill_sessions();
    let mut failed = None;
    for chunk in data[1 << 20..].chunks(256 << 10) {
        if let Err(err) = upload.write(chunk.to_vec()).await {
            failed = Some(err);
            break;
        }
    }
    let err = match failed {
        Some(err) => err,
        None => upload.finish().await.unwrap_err(),
    };
    assert!(matches!(err, LibvirtError::Transient(_)), "{err:?}");
    host.delete_volume(pool_name, "broken.raw").await.unwrap();
    host.delete_volume(pool_name, "published.raw").await.unwrap();
    host.delete_volume(pool_name, "whole.raw").await.unwrap();
    assert!(host.list_volumes(pool_name).await.unwrap().is_empty());
    daemon.remove_pool(pool_name);
}

#[test]
fn hosts_outside_the_grant_are_refused() {
    let entry = EntryLibvirt::new(
        "a",
        &[LibvirtGrant {
            host: "kvm1.lan".into(),
            port: 22,
            user: "pf".into(),
            key_file: "/nonexistent".into(),
            known_hosts_file: "/nonexistent".into(),
            pools: vec!["default".into()],
            networks: Vec::new(),
            bridges: Vec::new(),
            socket: "/var/run/libvirt/libvirt-sock".into(),
            uri: "qemu:///system".into(),
            storage_uri: "qemu:///system".into(),
            call_timeout: Duration::from_secs(1),
        }],
        &helper(),
    );
    assert_eq!(entry.hosts(), vec!["kvm1.lan".to_owned()]);
    assert!(entry.host("KVM1.lan").is_ok());
    let err = entry.host("kvm2.lan").unwrap_err();
    assert!(matches!(&err, LibvirtError::NotGranted(m) if m.contains("grants.libvirt")), "{err:?}");
}

/// An entry served by the `libvirt-probe` fixture with one libvirt grant.
async fn probe_entry(
    dir: &std::path::Path,
    sshd: &Sshd,
    known_hosts: &std::path::Path,
) -> Result<Arc<dyn proxyfleet_core::Provider>, String> {
    use proxyfleet_core::kv::MemoryKv;
    use proxyfleet_runtime::config::ProvidersConfig;
    use proxyfleet_runtime::{Registry, Runtime};
    let plugins = dir.join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    std::fs::copy(
        proxyfleet_tests::plugin("fixtures/libvirt-probe"),
        plugins.join("libvirt-probe.wasm"),
    )
    .unwrap();
    let yaml = format!(
        "providers:\n  - name: probe\n    plugin: libvirt-probe\n    \
         config: {{ host: 127.0.0.1, pool: {TEST_POOL} }}\n    limits: {{ timeout: 20s }}\n    \
         grants:\n      libvirt:\n        - {{ host: 127.0.0.1, port: {port}, user: root, \
         keyFile: '{key}', knownHostsFile: '{known}', socket: '{socket}', uri: '{TEST_URI}', \
         pools: [{TEST_POOL}], networks: [default], callTimeout: 5s }}\n",
        port = sshd.port,
        key = sshd.user_key.display(),
        known = known_hosts.display(),
        socket = Libvirtd::shared().socket.display(),
    );
    let config = ProvidersConfig::parse(&yaml).unwrap();
    let runtime = Runtime::new(runtime_options()).unwrap();
    let registry =
        Registry::load(&runtime, &config, &plugins, Arc::new(MemoryKv::new())).await.unwrap();
    registry.provider("probe").map_err(|err| err.to_string())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_plugin_drives_libvirt_through_the_runtime() {
    use proxyfleet_core::{ErrorClass, InstanceState};
    let dir = tempfile::tempdir().unwrap();
    let sshd = Sshd::start(&dir.path().join("sshd"));
    let provider = probe_entry(dir.path(), &sshd, &sshd.known_hosts).await.unwrap();
    assert!(provider.check().await.healthy, "{:?}", provider.check().await);

    // A domain without our mark, defined behind the plugin's back.
    let direct = pool(&sshd, TEST_URI);
    direct.define_domain(&domain_xml("probe-stranger")).await.unwrap();

    let spec = proxyfleet_harness::SpecBuilder::new("probe-a").uid("uid-probe-a").build();
    let created = provider.create(&spec).await.unwrap();
    assert_eq!(created.state, InstanceState::Running);
    assert!(!created.addresses.is_empty(), "{created:?}");
    assert_eq!(created.mark.as_ref().unwrap().uid, "uid-probe-a");
    // A retried create adopts.
    let again = provider.create(&spec).await.unwrap();
    assert_eq!(again.provider_id, created.provider_id);

    let listed = provider.list().await.unwrap();
    let names: Vec<&str> = listed.iter().map(|i| i.provider_id.as_str()).collect();
    assert!(names.contains(&created.provider_id.as_str()), "{names:?}");
    assert!(!names.contains(&"probe-stranger"), "unmarked domains are not ours: {names:?}");

    assert_eq!(provider.get(&created.provider_id).await.unwrap().state, InstanceState::Running);
    provider.delete(&created.provider_id).await.unwrap();
    provider.delete(&created.provider_id).await.unwrap();
    let err = provider.get(&created.provider_id).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::NotFound, "{err}");

    // The peer's side dies: a call that finds the connection dead is
    // transient (the check says unreachable), and the next one redials.
    sshd.kill_sessions();
    let first = provider.check().await;
    if !first.healthy {
        assert_eq!(first.issues[0].reason, proxyfleet_core::HealthReason::Unreachable, "{first:?}");
        assert!(provider.check().await.healthy);
    }
    if let Err(err) = direct.undefine_domain("probe-stranger").await {
        assert!(matches!(err, LibvirtError::Transient(_)), "{err:?}");
        direct.undefine_domain("probe-stranger").await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_plugin_behind_a_wrong_host_key_is_unauthorized() {
    use proxyfleet_core::HealthReason;
    let dir = tempfile::tempdir().unwrap();
    let sshd = Sshd::start(&dir.path().join("sshd"));
    let wrong = sshd.wrong_known_hosts();
    let provider = probe_entry(dir.path(), &sshd, &wrong).await.unwrap();
    let health = provider.check().await;
    assert!(!health.healthy);
    assert_eq!(health.issues[0].reason, HealthReason::Unauthorized, "{health:?}");
    assert!(health.issues[0].message.contains("does not match"), "{health:?}");
}

#[tokio::test]
async fn only_plugins_that_call_libvirt_import_it() {
    use proxyfleet_runtime::Runtime;
    let runtime = Runtime::new(runtime_options()).unwrap();
    let imports_libvirt =
        |imports: &[String]| imports.iter().any(|i| i.starts_with("proxyfleet:provider/libvirt"));
    let probe =
        runtime.load_plugin(&proxyfleet_tests::plugin("fixtures/libvirt-probe")).await.unwrap();
    assert!(imports_libvirt(&probe.imports), "{:?}", probe.imports);
    for name in ["proxmox", "static", "fixtures/noop"] {
        let revision = runtime.load_plugin(&proxyfleet_tests::plugin(name)).await.unwrap();
        assert!(!imports_libvirt(&revision.imports), "{name}: {:?}", revision.imports);
    }
}
