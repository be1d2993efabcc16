//! Reads the contract version from `wit/provider.wit`'s package line, so
//! the version the SDK reports is never written a second time.

fn main() {
    let path = "wit/provider.wit";
    println!("cargo::rerun-if-changed={path}");
    let wit = std::fs::read_to_string(path).expect("sdk/wit/provider.wit is readable");
    let version = wit
        .lines()
        .find_map(|line| line.trim().strip_prefix("package proxyfleet:provider@"))
        .and_then(|rest| rest.strip_suffix(';'))
        .expect("sdk/wit/provider.wit declares `package proxyfleet:provider@VERSION;`");
    println!("cargo::rustc-env=PROXYFLEET_CONTRACT_VERSION={version}");
}
