//! Issue 15, item 10: libvirt grants named hosts only, so a plugin could
//! define a domain with `qemu:commandline`, host devices or host files as
//! disks, and reach every pool and every other entry's domains on a
//! granted host. The `hostile` fixture tries each through the WIT import,
//! against the private `sshd` and `libvirtd`: domains on the test driver,
//! volumes on the storage driver in directory pools.

use std::sync::Arc;

use proxyfleet_core::Provider;
use proxyfleet_tests::fixture_provider_with;
use proxyfleet_tests::kvm::{Libvirtd, STORAGE_URI, Sshd, TEST_URI};
use serde_json::Value;
use virt::domain::Domain;

/// The hostile entry, granted the test's host with one pool, `granted`.
struct Attacker {
    provider: Arc<dyn Provider>,
    granted: String,
    granted_dir: std::path::PathBuf,
    _sshd: Sshd,
    _dir: tempfile::TempDir,
}

impl Attacker {
    async fn new(prefix: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let sshd = Sshd::start(&dir.path().join("sshd"));
        let (granted, granted_dir) = Libvirtd::shared().dir_pool(prefix);
        let plugins = dir.path().join("plugins");
        std::fs::create_dir_all(&plugins).expect("plugin dir");
        let grants = format!(
            "      libvirt:\n        - {{ host: 127.0.0.1, port: {port}, user: root, \
             keyFile: '{key}', knownHostsFile: '{known}', socket: '{socket}', \
             pools: [{granted}], networks: [default], uri: '{TEST_URI}', storageUri: '{STORAGE_URI}', \
             callTimeout: 10s }}\n",
            port = sshd.port,
            key = sshd.user_key.display(),
            known = sshd.known_hosts.display(),
            socket = Libvirtd::shared().socket.display(),
        );
        let provider = fixture_provider_with(
            super::runtime_options(),
            &plugins,
            "hostile",
            &grants,
            "timeout: 30s",
        )
        .await;
        Self { provider, granted, granted_dir, _sshd: sshd, _dir: dir }
    }

    /// One libvirt call through the fixture: its report.
    async fn libvirt(&self, call: &str) -> Value {
        let command = format!("libvirt {call}");
        let instance = self.provider.get(&command).await.unwrap_or_else(|e| panic!("{call}: {e}"));
        serde_json::from_str(&instance.name).expect("a JSON report")
    }
}

/// A domain of the test driver named `name` with `devices`.
fn domain(name: &str, head: &str, devices: &str) -> String {
    format!(
        "<domain type='test'><name>{name}</name>{head}<memory unit='MiB'>128</memory>\
         <vcpu>1</vcpu><os><type>hvm</type></os><devices>{devices}</devices></domain>"
    )
}

fn file_disk(path: &str) -> String {
    format!(
        "<disk type='file' device='disk'><driver name='qemu' type='qcow2'/>\
         <source file='{path}'/><target dev='vda' bus='virtio'/></disk>"
    )
}

fn exists_on_host(name: &str) -> bool {
    let mut conn = Libvirtd::shared().direct(TEST_URI);
    let found = Domain::lookup_by_name(&conn, name).is_ok();
    let _ = conn.close();
    found
}

fn assert_refused(report: &Value, outcome: &str, says: &str) {
    assert_eq!(report["outcome"], outcome, "{report}");
    let message = report["message"].as_str().unwrap_or_default();
    assert!(message.contains(says), "{says:?} not in {report}");
}

#[tokio::test(flavor = "multi_thread")]
async fn hypervisor_power_in_domain_xml_is_refused_before_libvirt_sees_it() {
    let attacker = Attacker::new("pf-hostile-xml").await;
    let name = format!("hostile-xml-{}", std::process::id());
    for (head, devices, says) in [
        (
            "<qemu:commandline xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>\
             <qemu:arg value='-fw_cfg'/><qemu:arg value='name=opt/x,file=/etc/shadow'/>\
             </qemu:commandline>",
            "",
            "/domain/commandline",
        ),
        (
            "",
            "<hostdev mode='subsystem' type='pci'><source><address bus='0'/></source></hostdev>",
            "hostdev",
        ),
        (
            "",
            "<filesystem type='mount'><source dir='/'/><target dir='root'/></filesystem>",
            "filesystem",
        ),
        ("", "<emulator>/bin/sh</emulator>", "emulator"),
        ("", "<serial type='file'><source path='/etc/cron.d/x'/></serial>", "serial"),
        ("<sysinfo type='fwcfg'><entry name='opt/x' file='/etc/shadow'/></sysinfo>", "", "sysinfo"),
    ] {
        let report =
            attacker.libvirt(&format!("define 127.0.0.1 {}", domain(&name, head, devices))).await;
        assert_refused(&report, "invalid", says);
        assert!(!exists_on_host(&name), "{says}: nothing was defined");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn disks_come_only_from_the_granted_pools() {
    let attacker = Attacker::new("pf-hostile-disk").await;
    let (other, other_dir) = Libvirtd::shared().dir_pool("pf-hostile-other");
    let name = format!("hostile-disk-{}", std::process::id());

    // A host file that is no volume at all.
    let report = attacker
        .libvirt(&format!("define 127.0.0.1 {}", domain(&name, "", &file_disk("/etc/shadow"))))
        .await;
    assert_refused(&report, "invalid", "not a volume");

    // A volume of a pool the entry is not granted.
    let image = other_dir.join("foreign.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2"], &image, None);
    refresh(&other);
    let path = image.display().to_string();
    let report = attacker
        .libvirt(&format!("define 127.0.0.1 {}", domain(&name, "", &file_disk(&path))))
        .await;
    assert_refused(&report, "not-granted", &other);
    let volume_disk = format!(
        "<disk type='volume'><driver name='qemu' type='qcow2'/><source pool='{other}' volume='foreign.qcow2'/><target dev='vda'/></disk>"
    );
    let report =
        attacker.libvirt(&format!("define 127.0.0.1 {}", domain(&name, "", &volume_disk))).await;
    assert_refused(&report, "not-granted", &other);

    // Nor can it make volumes there.
    let volume = "<volume><name>v.raw</name><capacity>1</capacity></volume>";
    let report = attacker.libvirt(&format!("volume 127.0.0.1 {other} {volume}")).await;
    assert_refused(&report, "not-granted", &other);
    assert!(!exists_on_host(&name));

    // A volume of the granted pool is a disk like any other.
    let own = attacker.granted_dir.join("own.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2"], &own, None);
    refresh(&attacker.granted);
    let report = attacker
        .libvirt(&format!(
            "define 127.0.0.1 {}",
            domain(&name, "", &file_disk(&own.display().to_string()))
        ))
        .await;
    assert_eq!(report["outcome"], "ok", "{report}");
    // The host wrote the checked chain (here: nothing below the image)
    // into the definition, so QEMU follows no header of its own accord.
    let mut conn = Libvirtd::shared().direct(TEST_URI);
    let desc = Domain::lookup_by_name(&conn, &name).unwrap().get_xml_desc(0).unwrap();
    let _ = conn.close();
    assert!(desc.contains("<backingStore/>"), "{desc}");
    assert_eq!(attacker.libvirt(&format!("undefine 127.0.0.1 {name}")).await["outcome"], "ok");
    Libvirtd::shared().remove_pool(&other);
    Libvirtd::shared().remove_pool(&attacker.granted);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_image_whose_header_backs_onto_a_host_file_is_refused() {
    let attacker = Attacker::new("pf-hostile-chain").await;
    let name = format!("hostile-chain-{}", std::process::id());
    // Uploaded bytes are any image the plugin likes, including a qcow2
    // whose header names a host file as its backing file.
    let image = attacker.granted_dir.join("sneaky.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", "-u"], &image, Some("/etc/hostname"));
    refresh(&attacker.granted);
    let path = image.display().to_string();
    let report = attacker
        .libvirt(&format!("define 127.0.0.1 {}", domain(&name, "", &file_disk(&path))))
        .await;
    assert_refused(&report, "invalid", "/etc/hostname");
    assert!(!exists_on_host(&name));

    // Nor may a new overlay name one.
    let pool = &attacker.granted;
    let overlay = "<volume><name>o.qcow2</name><capacity>1048576</capacity><target>\
        <format type='qcow2'/></target><backingStore><path>/etc/hostname</path>\
        <format type='raw'/></backingStore></volume>";
    let report = attacker.libvirt(&format!("volume 127.0.0.1 {pool} {overlay}")).await;
    assert_refused(&report, "invalid", "/etc/hostname");
    assert!(!attacker.granted_dir.join("o.qcow2").exists());

    // Nor can a clone flatten it into a plain copy: the source's header
    // is read afresh. The storage driver knows the volume as a plain raw
    // image; then an upload (here: qemu-img) gives it the header.
    let late = attacker.granted_dir.join("late.qcow2");
    qemu_img(&["create", "-q", "-f", "raw"], &late, None);
    refresh(pool);
    std::fs::remove_file(&late).unwrap();
    qemu_img(&["create", "-q", "-f", "qcow2", "-u"], &late, Some("/etc/hostname"));
    let copy = "<volume><name>copy.raw</name><capacity>1048576</capacity><target>\
        <format type='raw'/></target></volume>";
    let report = attacker.libvirt(&format!("clone 127.0.0.1 {pool} late.qcow2 {copy}")).await;
    assert_refused(&report, "invalid", "/etc/hostname");
    assert!(!attacker.granted_dir.join("copy.raw").exists());
    Libvirtd::shared().remove_pool(pool);
}

#[tokio::test(flavor = "multi_thread")]
async fn other_domains_on_a_granted_host_are_out_of_reach() {
    let attacker = Attacker::new("pf-hostile-owner").await;
    let pid = std::process::id();
    // A domain somebody else defined on the same host.
    let stranger = format!("stranger-{pid}");
    let mut conn = Libvirtd::shared().direct(TEST_URI);
    Domain::define_xml(&conn, &domain(&stranger, "", "")).expect("defined directly");

    for call in [
        format!("get 127.0.0.1 {stranger}"),
        format!("start 127.0.0.1 {stranger}"),
        format!("undefine 127.0.0.1 {stranger}"),
        format!("set-metadata 127.0.0.1 {stranger} urn:x"),
    ] {
        assert_refused(&attacker.libvirt(&call).await, "not-found", &stranger);
    }
    let replace =
        attacker.libvirt(&format!("define 127.0.0.1 {}", domain(&stranger, "", ""))).await;
    assert_refused(&replace, "exists", &stranger);
    let names = &attacker.libvirt("list 127.0.0.1").await["names"];
    assert!(!names.as_array().unwrap().iter().any(|n| n == stranger.as_str()), "{names}");
    assert!(Domain::lookup_by_name(&conn, &stranger).is_ok(), "the stranger is untouched");

    // Its own domain: visible, and marked by the host, not by the plugin.
    let own = format!("own-{pid}");
    assert_eq!(
        attacker.libvirt(&format!("define 127.0.0.1 {}", domain(&own, "", ""))).await["outcome"],
        "ok"
    );
    let names = &attacker.libvirt("list 127.0.0.1").await["names"];
    assert_eq!(
        names.as_array().unwrap().iter().filter(|n| *n == own.as_str()).count(),
        1,
        "{names}"
    );
    let desc = Domain::lookup_by_name(&conn, &own).unwrap().get_xml_desc(0).unwrap();
    assert!(
        desc.contains("https://proxyfleet.io/xmlns/host/1") && desc.contains("entry=\"fetch\""),
        "{desc}"
    );
    let forge = attacker
        .libvirt(&format!("set-metadata 127.0.0.1 {own} https://proxyfleet.io/xmlns/host/1"))
        .await;
    assert_refused(&forge, "invalid", "the host's own");
    let uuid = Domain::lookup_by_name(&conn, &stranger).unwrap().get_uuid_string().unwrap();
    let stolen = attacker
        .libvirt(&format!("define 127.0.0.1 {}", domain(&own, &format!("<uuid>{uuid}</uuid>"), "")))
        .await;
    assert_refused(&stolen, "exists", &stranger);
    assert_eq!(attacker.libvirt(&format!("undefine 127.0.0.1 {own}")).await["outcome"], "ok");

    Domain::lookup_by_name(&conn, &stranger).unwrap().undefine().unwrap();
    let _ = conn.close();
    Libvirtd::shared().remove_pool(&attacker.granted);
}

/// Runs `qemu-img` on `image`, with `backing` as a raw backing file.
fn qemu_img(args: &[&str], image: &std::path::Path, backing: Option<&str>) {
    let mut command = std::process::Command::new("qemu-img");
    command.args(args);
    if let Some(backing) = backing {
        command.args(["-b", backing, "-F", "raw"]);
    }
    let status = command.arg(image).arg("1M").status().expect("qemu-img runs");
    assert!(status.success(), "qemu-img failed");
}

/// Lets the storage driver see files made behind its back.
fn refresh(pool: &str) {
    let mut conn = Libvirtd::shared().direct(STORAGE_URI);
    virt::storage_pool::StoragePool::lookup_by_name(&conn, pool).unwrap().refresh(0).unwrap();
    let _ = conn.close();
}
