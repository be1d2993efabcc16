//! `proxyfleet-libvirt`: the libvirt helper. `proxyfleet` starts it the
//! first time an entry with a libvirt grant connects to a host and talks
//! to it over its stdin and stdout; it is not meant to be run by hand.
//! Only this binary links libvirt's C client.

fn main() -> std::process::ExitCode {
    proxyfleet_libvirt_helper::main("proxyfleet-libvirt")
}
