//! Reads the contract version from `wit/provider.wit`'s package line, so
//! the version the host checks plugins against (and the range it names in
//! refusals) is never written a second time.

fn main() {
    let path = "../../wit/provider.wit";
    println!("cargo::rerun-if-changed={path}");
    let wit = std::fs::read_to_string(path).expect("wit/provider.wit is readable");
    let version = wit
        .lines()
        .find_map(|line| line.trim().strip_prefix("package proxyfleet:provider@"))
        .and_then(|rest| rest.strip_suffix(';'))
        .expect("wit/provider.wit declares `package proxyfleet:provider@VERSION;`");
    println!("cargo::rustc-env=PROXYFLEET_CONTRACT_VERSION={version}");
    // Below 1.0 the minor version is the breaking one, from 1.0 the major.
    let mut parts = version.split('.');
    let (major, minor) = (parts.next().unwrap_or("0"), parts.next().unwrap_or("0"));
    let range = if major == "0" { format!("0.{minor}.x") } else { format!("{major}.x") };
    println!("cargo::rustc-env=PROXYFLEET_CONTRACT_RANGE={range}");
}
