//! `proxyfleet plugin inspect`, `validate`, `push` and `pull` on real
//! components (and a real registry: Debian's `docker-registry` on
//! loopback, TLS and htpasswd).

use std::process::{Command, Output};

use proxyfleet_tests::plugin;

fn proxyfleet(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_proxyfleet"))
        .args(["--log-format", "text"])
        .args(args)
        .output()
        .unwrap()
}

fn path(name: &str) -> String {
    plugin(name).display().to_string()
}

#[test]
fn inspect_shows_info_digest_imports_and_exports() {
    let output = proxyfleet(&["plugin", "inspect", &path("static")]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["info"]["name"], "static");
    let version = proxyfleet_runtime::CONTRACT_VERSION;
    assert_eq!(report["info"]["contractVersion"], version);
    assert_eq!(report["sha256"].as_str().map(str::len), Some(64));
    let names = |key: &str| -> Vec<String> {
        report[key].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_owned()).collect()
    };
    assert!(names("exports").contains(&format!("proxyfleet:provider/provider@{version}")));
    assert!(names("imports").contains(&format!("proxyfleet:provider/kv@{version}")));
}

#[test]
fn inspect_refuses_another_contract_version_naming_both() {
    let output = proxyfleet(&["plugin", "inspect", &path("fixtures/wrong-major")]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let host = format!("@{}", proxyfleet_runtime::CONTRACT_VERSION);
    assert!(stderr.contains("@0.1.0") && stderr.contains(&host), "{stderr}");
}

#[test]
fn validate_runs_the_plugins_config_check() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.yaml");
    std::fs::write(
        &good,
        "name: office\nplugin: static\nconfig: { endpoints: ['192.0.2.1:3128'] }\n",
    )
    .unwrap();
    let output =
        proxyfleet(&["plugin", "validate", &path("static"), "--config", good.to_str().unwrap()]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stdout));

    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "name: office\nplugin: static\nconfig: { endpoints: ['192.0.2.1:3128', 'nope'] }\n",
    )
    .unwrap();
    let output =
        proxyfleet(&["plugin", "validate", &path("static"), "--config", bad.to_str().unwrap()]);
    assert!(!output.status.success());
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["valid"], false);
    assert!(report["error"].as_str().unwrap().contains("endpoints[1]"), "{report}");

    let typo = dir.path().join("typo.yaml");
    std::fs::write(&typo, "name: office\nplugin: static\nconfg: {}\n").unwrap();
    let output =
        proxyfleet(&["plugin", "validate", &path("static"), "--config", typo.to_str().unwrap()]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("confg"), "unknown keys are named");
}

#[test]
fn push_and_pull_round_trip_through_a_registry_and_name_bad_flags() {
    use proxyfleet_tests::registry::{OciRegistry, PASSWORD, USER};

    let registry = OciRegistry::start();
    let dir = tempfile::tempdir().unwrap();
    let password = dir.path().join("password");
    std::fs::write(&password, format!("{PASSWORD}\n")).unwrap();
    let access = [
        "--username",
        USER,
        "--password-file",
        password.to_str().unwrap(),
        "--ca-file",
        registry.ca_file.to_str().unwrap(),
    ];
    let tagged = format!("{}/plugins/static:1.0", registry.host);
    let file = path("static");
    let mut push = vec!["plugin", "push", &file, &tagged];
    push.extend(access);
    let output = proxyfleet(&push);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let pushed: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let component = std::fs::read(plugin("static")).unwrap();
    assert_eq!(pushed["sha256"], proxyfleet_runtime::file_digest(&component));
    assert_eq!(pushed["reference"], format!("oci://{tagged}"));
    let pinned = pushed["pinned"].as_str().unwrap().to_owned();

    let out = dir.path().join("pulled.wasm");
    let mut pull = vec!["plugin", "pull", &pinned, "-o", out.to_str().unwrap()];
    pull.extend(access);
    let output = proxyfleet(&pull);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(std::fs::read(&out).unwrap(), component);
    let pulled: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(pulled["manifestDigest"], pushed["manifestDigest"]);

    // A flag error names the flag; a refused login never shows the secret.
    let output = proxyfleet(&["plugin", "pull", &tagged, "--username", USER]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && stderr.contains("--password-file"), "{stderr}");
    std::fs::write(&password, "not-the-password").unwrap();
    let mut denied = vec!["plugin", "pull", &tagged, "-o", out.to_str().unwrap()];
    denied.extend(access);
    let output = proxyfleet(&denied);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("refused access to repository plugins/static"), "{stderr}");
    assert!(!stderr.contains("not-the-password") && !stderr.contains(PASSWORD), "{stderr}");
}
