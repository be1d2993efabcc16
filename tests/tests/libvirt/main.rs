//! The libvirt tier: the libvirt capability and the kvm plugin against a
//! private `sshd` and `libvirtd` the tests start (Debian's packages). A
//! binary of its own because libvirtd's storage driver takes a host-wide
//! lock: one daemon per process.
//!
//! Needs the `libvirt` feature: `cargo test -p proxyfleet-tests --features
//! libvirt --test libvirt` (the README's test command runs every tier).

mod kvm;
