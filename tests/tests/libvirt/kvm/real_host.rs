//! The kvm plugin on a real QEMU/KVM host over SSH, with a real image.
//! Runs when `KVM_TEST_HOST` names the host, and skips (saying so)
//! otherwise. With the host set:
//!
//! - `KVM_TEST_USER`, `KVM_TEST_KEY` (private key file) and
//!   `KVM_TEST_KNOWN_HOSTS` (a known_hosts file listing the host's key) are
//!   required; a missing known_hosts fails the test rather than trusting
//!   whatever key the host shows;
//! - `KVM_TEST_IMAGE_URL` and `KVM_TEST_IMAGE_SHA256` name a cloud image
//!   (qcow2) with cloud-init and the QEMU guest agent, e.g. Debian's
//!   `genericcloud` image;
//! - optional: `KVM_TEST_PORT` (22), `KVM_TEST_POOL` (`default`),
//!   `KVM_TEST_NETWORK` (`default`) or `KVM_TEST_BRIDGE`, `KVM_TEST_URI`
//!   (`qemu:///system`), `KVM_TEST_SOCKET`.

use std::time::{Duration, Instant};

use proxyfleet_core::kv::{KvStore, MemoryKv};
use proxyfleet_core::{ErrorClass, InstanceState};
use proxyfleet_harness::SpecBuilder;
use proxyfleet_runtime::config::ProvidersConfig;
use proxyfleet_runtime::{Registry, Runtime};

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|value| !value.trim().is_empty())
}

fn required(name: &str) -> String {
    var(name).unwrap_or_else(|| panic!("KVM_TEST_HOST is set, so {name} is required"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_proxy_on_a_real_hypervisor() {
    let Some(host) = var("KVM_TEST_HOST") else {
        eprintln!(
            "skipped: set KVM_TEST_HOST, KVM_TEST_USER, KVM_TEST_KEY, KVM_TEST_KNOWN_HOSTS, \
             KVM_TEST_IMAGE_URL and KVM_TEST_IMAGE_SHA256 to run the kvm plugin on a real host"
        );
        return;
    };
    let Some(known_hosts) = var("KVM_TEST_KNOWN_HOSTS") else {
        panic!(
            "KVM_TEST_KNOWN_HOSTS is not set: name a known_hosts file with {host}'s key (e.g. \
             from `ssh-keyscan`, checked out of band); host keys are never trusted on first use"
        );
    };
    let (user, key, url, sha256) = (
        required("KVM_TEST_USER"),
        required("KVM_TEST_KEY"),
        required("KVM_TEST_IMAGE_URL"),
        required("KVM_TEST_IMAGE_SHA256"),
    );
    let port = var("KVM_TEST_PORT").map_or(22, |p| p.parse::<u16>().expect("KVM_TEST_PORT"));
    let pool = var("KVM_TEST_POOL").unwrap_or_else(|| "default".to_owned());
    let (interface, attachment) = match (var("KVM_TEST_BRIDGE"), var("KVM_TEST_NETWORK")) {
        (Some(bridge), _) => {
            (format!("{{ bridge: '{bridge}' }}"), format!("bridges: ['{bridge}']"))
        }
        (None, network) => {
            let network = network.as_deref().unwrap_or("default").to_owned();
            (format!("{{ network: '{network}' }}"), format!("networks: ['{network}']"))
        }
    };
    let uri = var("KVM_TEST_URI").unwrap_or_else(|| "qemu:///system".to_owned());
    let socket = var("KVM_TEST_SOCKET").map(|s| format!(", socket: '{s}'")).unwrap_or_default();
    let origin = url.split('/').take(3).collect::<Vec<_>>().join("/");

    let dir = tempfile::tempdir().expect("temp dir");
    let plugins = dir.path().join("plugins");
    std::fs::create_dir_all(&plugins).expect("plugin dir");
    std::fs::copy(proxyfleet_tests::plugin("kvm"), plugins.join("kvm.wasm")).expect("copy");
    let yaml = format!(
        "providers:\n  - name: kvm-test\n    plugin: kvm\n    config:\n      \
         hosts: [{{ name: '{host}' }}]\n      pool: '{pool}'\n      \
         images: {{ debian-12: {{ url: '{url}', sha256: '{sha256}' }} }}\n      \
         interface: {interface}\n    limits: {{ timeout: 900s }}\n    grants:\n      \
         http: [{{ url: '{origin}' }}]\n      libvirt:\n        - {{ host: '{host}', \
         port: {port}, user: '{user}', keyFile: '{key}', knownHostsFile: '{known_hosts}', \
         pools: ['{pool}'], {attachment}, uri: '{uri}'{socket}, callTimeout: 60s }}\n"
    );
    let config = ProvidersConfig::parse(&yaml).expect("providers config");
    let runtime = Runtime::new(super::runtime_options()).expect("runtime");
    let kv: std::sync::Arc<dyn KvStore> = std::sync::Arc::new(MemoryKv::new());
    let registry = Registry::load(&runtime, &config, &plugins, kv).await.expect("registry");
    let provider = registry.provider("kvm-test").expect("entry");

    let health = provider.check().await;
    assert!(health.healthy, "{health:?}");
    let uid = format!("kvm-real-{}", std::process::id());
    let spec = SpecBuilder::new("kvm-real").uid(&uid).build();
    let created = provider.create(&spec).await.expect("create");
    let started = Instant::now();
    let mut instance = created.clone();
    while instance.addresses.is_empty() && started.elapsed() < Duration::from_secs(300) {
        tokio::time::sleep(Duration::from_secs(5)).await;
        instance = provider.get(&created.provider_id).await.expect("get");
    }
    eprintln!(
        "{} running with {:?} after {:?}",
        instance.name,
        instance.addresses,
        started.elapsed()
    );
    let listed = provider.list().await.expect("list");
    let addresses = instance.addresses.clone();
    provider.delete(&created.provider_id).await.expect("delete");
    assert_eq!(instance.state, InstanceState::Running, "{instance:?}");
    assert!(!addresses.is_empty(), "no address within 5 minutes: {instance:?}");
    assert!(listed.iter().any(|i| i.provider_id == created.provider_id), "{listed:?}");
    let err = provider.get(&created.provider_id).await.expect_err("deleted");
    assert_eq!(err.class, ErrorClass::NotFound, "{err}");
}
