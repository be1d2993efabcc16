//! `proxyfleet plugin inspect` and `proxyfleet plugin validate` on real
//! components.

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
    assert_eq!(report["info"]["contractVersion"], "0.1.0");
    assert_eq!(report["sha256"].as_str().map(str::len), Some(64));
    let names = |key: &str| -> Vec<String> {
        report[key].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_owned()).collect()
    };
    assert!(names("exports").contains(&"proxyfleet:provider/provider@0.1.0".to_owned()));
    assert!(names("imports").contains(&"proxyfleet:provider/kv@0.1.0".to_owned()));
}

#[test]
fn inspect_refuses_another_contract_version_naming_both() {
    let output = proxyfleet(&["plugin", "inspect", &path("fixtures/wrong-major")]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("@0.2.0") && stderr.contains("@0.1.0"), "{stderr}");
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
