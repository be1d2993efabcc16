//! What the shipped binaries link: libvirt's C client only in the helper.

use std::process::Command;

/// The shared libraries `binary` loads, as the dynamic loader resolves
/// them (`ldd`, from Debian's libc-bin).
fn loaded(binary: &str) -> String {
    let out = Command::new("ldd").arg(binary).output().expect("ldd runs");
    assert!(out.status.success(), "ldd {binary}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("ldd prints text")
}

/// `proxyfleet` used to link libvirt's client, which loaded 50-odd shared
/// libraries (about 8 MiB resident) into every operator, kvm entries or
/// not.
#[test]
fn regression_the_operator_does_not_load_libvirt_and_its_helper_does() {
    let operator = loaded(env!("CARGO_BIN_EXE_proxyfleet"));
    assert!(!operator.contains("libvirt"), "proxyfleet loads libvirt:\n{operator}");
    let helper = loaded(env!("CARGO_BIN_EXE_proxyfleet-libvirt"));
    assert!(helper.contains("libvirt.so"), "the helper does not load libvirt:\n{helper}");
}
