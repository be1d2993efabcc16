//! The libvirt helper as the libvirt tier's tests start it (the operator
//! ships the same as `proxyfleet-libvirt`); a binary of this package so
//! that building the tests builds it.

fn main() -> std::process::ExitCode {
    proxyfleet_libvirt_helper::main("libvirt-helper")
}
