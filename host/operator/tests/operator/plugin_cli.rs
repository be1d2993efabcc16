//! `proxyfleet plugin inspect`, `validate`, `push`, `pull`, `keygen`,
//! `sign` and `verify` on real components (and a real registry: Debian's
//! `docker-registry` on loopback, TLS and htpasswd).

use std::process::{Command, Output};

use proxyfleet_tests::plugin;

/// The CLI, its compile cache (the user's cache directory by default) in
/// the build's target directory rather than the user's.
fn proxyfleet(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_proxyfleet"))
        .env("XDG_CACHE_HOME", proxyfleet_tests::workspace_root().join("target/test-cli-cache"))
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
    assert_eq!(report["minHostVersion"], serde_json::Value::Null, "static declares none");
}

/// A build made with the SDK's `min_host_version!` carries the
/// declaration through the toolchain; one needing a newer host is refused
/// by `inspect` naming both versions.
#[test]
fn issue_47_a_declared_minimum_host_version_is_shown_and_a_newer_one_refused() {
    let output = proxyfleet(&["plugin", "inspect", &path("fixtures/answer-v2"), "--no-cache"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["minHostVersion"], "0.1.0");

    let dir = tempfile::tempdir().unwrap();
    let newer = dir.path().join("newer.wasm");
    let built = std::fs::read(plugin("static")).unwrap();
    let needs = semver::Version::new(99, 0, 0);
    std::fs::write(&newer, proxyfleet_runtime::min_host::declare(&built, &needs)).unwrap();
    let output = proxyfleet(&["plugin", "inspect", newer.to_str().unwrap(), "--no-cache"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    let host = env!("CARGO_PKG_VERSION");
    assert!(stderr.contains("needs proxyfleet 99.0.0") && stderr.contains(host), "{stderr}");
}

/// Issue 47, item 5: `inspect`, `validate` and `test` compiled the
/// component from scratch on every call (19 s for an 18 MB Python one).
/// They keep it in the compile cache: the second look is read from it.
#[test]
fn issue_47_item_5_a_second_inspect_is_read_from_the_compile_cache() {
    let cache = tempfile::tempdir().unwrap();
    let dir = cache.path().to_str().unwrap();
    let file = path("static");
    let from_cache = |extra: &[&str]| {
        let mut args = vec!["plugin", "inspect", file.as_str()];
        args.extend_from_slice(extra);
        let output = proxyfleet(&args);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        report["fromCache"].as_bool().expect("fromCache is shown")
    };
    assert!(!from_cache(&["--cache-dir", dir]), "the first look compiles");
    assert!(from_cache(&["--cache-dir", dir]), "the second reads the cache");
    assert!(!from_cache(&["--no-cache"]), "--no-cache compiles every time");
    let entry = cache.path().join("entry.yaml");
    std::fs::write(
        &entry,
        "name: office\nplugin: static\nconfig: { endpoints: ['192.0.2.1:3128'] }\n",
    )
    .unwrap();
    let output = proxyfleet(&[
        "plugin",
        "validate",
        &path("static"),
        "--config",
        entry.to_str().unwrap(),
        "--cache-dir",
        dir,
    ]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stdout));
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

/// A registry on loopback (TLS from a test CA, htpasswd), and a folder
/// holding the file with its password.
fn registry_with_password()
-> (proxyfleet_tests::registry::OciRegistry, tempfile::TempDir, std::path::PathBuf) {
    let registry = proxyfleet_tests::registry::OciRegistry::start();
    let dir = tempfile::tempdir().unwrap();
    let password = dir.path().join("password");
    std::fs::write(&password, format!("{}\n", proxyfleet_tests::registry::PASSWORD)).unwrap();
    (registry, dir, password)
}

/// The flags that reach `registry` with the password in `password`.
fn access<'a>(
    registry: &'a proxyfleet_tests::registry::OciRegistry,
    password: &'a std::path::Path,
) -> [&'a str; 6] {
    [
        "--username",
        proxyfleet_tests::registry::USER,
        "--password-file",
        password.to_str().unwrap(),
        "--ca-file",
        registry.ca_file.to_str().unwrap(),
    ]
}

#[test]
fn push_and_pull_round_trip_through_a_registry_and_name_bad_flags() {
    use proxyfleet_tests::registry::PASSWORD;

    let (registry, dir, password) = registry_with_password();
    let access = access(&registry, &password);
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

    // A look before installing: what the build says and imports, by tag.
    let reference = format!("oci://{tagged}");
    let mut inspect = vec!["plugin", "inspect", reference.as_str(), "--no-cache"];
    inspect.extend(access);
    let output = proxyfleet(&inspect);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let seen: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(seen["reference"], reference);
    assert_eq!(seen["manifestDigest"], pushed["manifestDigest"]);
    assert_eq!(seen["sha256"], pushed["sha256"]);
    assert_eq!(seen["info"]["name"], "static");
    assert!(seen["imports"].as_array().is_some_and(|imports| !imports.is_empty()), "{seen}");

    // A flag error names the flag; a refused login never shows the secret.
    let output =
        proxyfleet(&["plugin", "pull", &tagged, "--username", proxyfleet_tests::registry::USER]);
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

fn json(output: &Output) -> serde_json::Value {
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap()
}

#[test]
fn keygen_sign_and_verify_a_pushed_build_and_inspect_shows_its_signatures() {
    let (registry, dir, password) = registry_with_password();
    let access = access(&registry, &password);
    let key_password = dir.path().join("key-password");
    std::fs::write(&key_password, "correct horse\n").unwrap();
    let prefix = dir.path().join("release");
    let keygen = ["plugin", "keygen", "--output-prefix", prefix.to_str().unwrap()];
    let with_password = ["--key-password-file", key_password.to_str().unwrap()];
    let made = json(&proxyfleet(&[&keygen[..], &with_password[..]].concat()));
    let (private, public) = (dir.path().join("release.key"), dir.path().join("release.pub"));
    assert_eq!(made["publicKey"], public.to_str().unwrap());
    let mode = std::os::unix::fs::PermissionsExt::mode(&private.metadata().unwrap().permissions());
    assert_eq!(mode & 0o077, 0, "the private key is the owner's only");
    let again = proxyfleet(&[&keygen[..], &with_password[..]].concat());
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(!again.status.success() && stderr.contains("never replaced"), "{stderr}");

    let tagged = format!("{}/plugins/static:signed", registry.host);
    let file = path("static");
    let pushed =
        json(&proxyfleet(&[&["plugin", "push", &file, &tagged][..], &access[..]].concat()));
    let public = public.to_str().unwrap();
    let verify = [&["plugin", "verify", &tagged, "--key", public][..], &access[..]].concat();
    let unsigned = proxyfleet(&verify);
    let stderr = String::from_utf8_lossy(&unsigned.stderr);
    assert!(!unsigned.status.success() && stderr.contains("is not signed"), "{stderr}");
    let reference = format!("oci://{tagged}");
    let inspect = [&["plugin", "inspect", &reference, "--no-cache"][..], &access[..]].concat();
    assert_eq!(json(&proxyfleet(&inspect))["signature"]["signatures"], 0);

    // A wrong password is named as such and signs nothing.
    let private = private.to_str().unwrap();
    let sign = [&["plugin", "sign", &tagged, "--key", private][..], &access[..]].concat();
    std::fs::write(dir.path().join("wrong"), "battery staple").unwrap();
    let wrong = dir.path().join("wrong");
    let output =
        proxyfleet(&[&sign[..], &["--key-password-file", wrong.to_str().unwrap()]].concat());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && stderr.contains("does not decrypt"), "{stderr}");
    assert!(!stderr.contains("battery staple"), "{stderr}");

    let signed = json(&proxyfleet(&[&sign[..], &with_password[..]].concat()));
    assert_eq!(signed["manifestDigest"], pushed["manifestDigest"]);
    assert_eq!((signed["added"].as_bool(), signed["signatures"].as_u64()), (Some(true), Some(1)));
    let twice = json(&proxyfleet(&[&sign[..], &with_password[..]].concat()));
    assert_eq!(twice["added"], false, "signing again adds nothing");
    let verified = json(&proxyfleet(&verify));
    assert_eq!(verified["verified"], true);
    assert_eq!(verified["by"][0]["key"], made["fingerprint"]);
    let seen = json(&proxyfleet(&[&inspect[..], &["--key", public]].concat()));
    assert_eq!(seen["signature"]["verified"], true, "{seen}");
    assert_eq!(json(&proxyfleet(&inspect))["signature"]["signatures"], 1);

    // Another key does not verify it, and says what it found.
    let other = dir.path().join("other");
    json(&proxyfleet(
        &[
            &["plugin", "keygen", "--output-prefix", other.to_str().unwrap()][..],
            &with_password[..],
        ]
        .concat(),
    ));
    let other = dir.path().join("other.pub");
    let output = proxyfleet(
        &[&["plugin", "verify", &tagged, "--key", other.to_str().unwrap()][..], &access[..]]
            .concat(),
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && stderr.contains("a key the policy does not name"),
        "{stderr}"
    );
}

/// `proxyfleet plugin test` with the entry in `entry` (YAML), in `dir`,
/// the suite's Proxies asking for `image` when given: its exit status and
/// report.
async fn conformance(
    dir: &std::path::Path,
    plugin_name: &str,
    entry: &str,
    image: Option<&str>,
) -> Output {
    let entry_file = dir.join("entry.yaml");
    std::fs::write(&entry_file, entry).unwrap();
    let spec_file = dir.join("spec.yaml");
    let image = image.map(|image| format!(", image: {image}")).unwrap_or_default();
    std::fs::write(
        &spec_file,
        format!(
            "apiVersion: proxyfleet.io/v1alpha1\nkind: Proxy\nmetadata: {{ name: suite }}\n\
             spec: {{ provider: suite{image} }}\n"
        ),
    )
    .unwrap();
    let junit = dir.join("junit.xml");
    let args = [
        "plugin".to_owned(),
        "test".to_owned(),
        path(plugin_name),
        "--config".to_owned(),
        entry_file.display().to_string(),
        "--spec".to_owned(),
        spec_file.display().to_string(),
        "--junit".to_owned(),
        junit.display().to_string(),
        "--delete-wait".to_owned(),
        "3s".to_owned(),
    ];
    // The simulators run on this test's runtime: the CLI must not block it.
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        proxyfleet(&args)
    })
    .await
    .unwrap()
}

fn report(output: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The one entry of a providers file's `providers:` list, as an entry file.
fn only_entry(providers_list: &str) -> String {
    let entries: Vec<serde_json::Value> = yaml_serde::from_str(providers_list).unwrap();
    yaml_serde::to_string(&entries[0]).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_test_passes_the_static_plugin_and_writes_junit() {
    let dir = tempfile::tempdir().unwrap();
    let entry = "name: office\nplugin: static\nconfig: { endpoints: ['192.0.2.1:3128', '192.0.2.2:3128', '192.0.2.3:3128', '192.0.2.4:3128'] }\n";
    let output = conformance(dir.path(), "static", entry, None).await;
    assert!(output.status.success(), "{}", report(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.starts_with("conformance of static "), "{stdout}");
    assert!(stdout.ends_with("14 passed, 0 failed, 0 skipped\n"), "{stdout}");
    let xml = std::fs::read_to_string(dir.path().join("junit.xml")).unwrap();
    assert!(xml.contains("tests=\"14\"") && xml.contains("failures=\"0\""), "{xml}");
}

/// A backend file is checked before anything runs, naming the field.
#[test]
fn plugin_test_refuses_a_bad_backend_file_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let entry = dir.path().join("entry.yaml");
    std::fs::write(
        &entry,
        "name: office\nplugin: static\nconfig: { endpoints: ['192.0.2.1:3128'] }\n",
    )
    .unwrap();
    let backend = dir.path().join("backend.yaml");
    std::fs::write(&backend, "resources:\n  - { path: v1/instances, key: name }\n").unwrap();
    let output = proxyfleet(&[
        "plugin",
        "test",
        &path("static"),
        "--config",
        entry.to_str().unwrap(),
        "--backend",
        backend.to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--backend") && stderr.contains("resources[0].path"), "{stderr}");
}

/// `noop` keeps nothing: it takes any config, answers every `get` without
/// a mark and lists nothing. The suite names each rule it breaks and
/// fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_test_names_the_rules_a_plugin_breaks() {
    let dir = tempfile::tempdir().unwrap();
    let entry = "name: lab\nplugin: noop\nconfig: {}\n";
    let output = conformance(dir.path(), "fixtures/noop", entry, None).await;
    assert_eq!(output.status.code(), Some(1), "{}", report(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("  FAIL  validate-config refuses an unknown key, naming it"),
        "{stdout}"
    );
    assert!(stdout.contains("  FAIL  get of an unknown id is not-found"), "{stdout}");
    assert!(stdout.contains("rule: get MUST answer not-found"), "{stdout}");
    let xml = std::fs::read_to_string(dir.path().join("junit.xml")).unwrap();
    assert!(stdout.contains("  FAIL  list returns the marked instances"), "{stdout}");
    assert!(stdout.ends_with("7 passed, 6 failed, 1 skipped\n"), "{stdout}");
    assert!(xml.contains("failures=\"6\""), "{xml}");
}

/// The first-party plugins with a backend here pass against their
/// simulators: gcp against `tools/gce-sim`, proxmox against
/// `tools/pve-sim`, and leave nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_test_passes_gcp_and_proxmox_against_their_simulators() {
    use std::time::Duration;

    const TOKEN: &str = "root@pam!proxyfleet=0c7e4a9b-1f2d-4e3a-9b8c-7d6e5f4a3b2c";
    let (ca, cert, key) = proxyfleet_tests::localhost_tls();
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca).unwrap();

    let gce = proxyfleet_gce_sim::Simulator::start(
        proxyfleet_gce_sim::SimOptions {
            projects: vec!["lab".to_owned()],
            zones: vec!["europe-west1-b".to_owned()],
            token_lifetime: Duration::from_secs(3600),
            operation_duration: Duration::from_millis(200),
            boot_duration: Duration::from_millis(100),
            ..proxyfleet_gce_sim::SimOptions::default()
        },
        &cert,
        &key,
    )
    .await
    .unwrap();
    let key_file = dir.path().join("gcp-key.json");
    std::fs::write(&key_file, gce.create_key("pf@lab.iam.gserviceaccount.com").unwrap().json)
        .unwrap();
    let entry = only_entry(&proxyfleet_tests::gcp::sim_entry(
        "gcp",
        &gce.endpoint(),
        "lab",
        &ca_file,
        &key_file,
    ));
    let output = conformance(dir.path(), "gcp", &entry, Some("debian-12")).await;
    assert!(output.status.success(), "{}", report(&output));
    assert!(gce.instances().is_empty(), "left behind: {:?}", gce.instances());

    let pve = proxyfleet_pve_sim::Simulator::start(
        proxyfleet_pve_sim::SimOptions {
            token: TOKEN.to_owned(),
            clone_duration: Duration::from_millis(200),
            task_duration: Duration::from_millis(50),
            agent_delay: Duration::from_millis(100),
            ..proxyfleet_pve_sim::SimOptions::default()
        },
        &cert,
        &key,
    )
    .await
    .unwrap();
    pve.add_template("pve1", 100, "debian-12", 8);
    let token_file = dir.path().join("pve-token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let port = pve.addr().port();
    let entry = format!(
        "name: pve
plugin: proxmox
proxyAddresses: ['127.0.0.0/8']
config:
  url: https://localhost:{port}
  nodes: [pve1]
  templates: {{ debian-12: 100 }}
  isoStorage: local
  vmidRange: {{ first: 1000, last: 1999 }}
  taskPollMs: 50
grants:
  caFile: {ca}
  http:
    - url: https://localhost:{port}
      allowAddresses: [127.0.0.1, '::1']
      credential: {{ header: Authorization, valueTemplate: 'PVEAPIToken={{secret}}', secretFile: {token} }}
",
        ca = ca_file.display(),
        token = token_file.display(),
    );
    let output = conformance(dir.path(), "proxmox", &entry, Some("debian-12")).await;
    assert!(output.status.success(), "{}", report(&output));
    let left: Vec<u32> = pve.vms().iter().map(|vm| vm.vmid).filter(|vmid| *vmid != 100).collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// The provider written in Python (`examples/python-provider`, built with
/// componentize-py) loads in the host and keeps the contract.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_test_passes_the_provider_written_in_python() {
    let dir = tempfile::tempdir().unwrap();
    let entry = "name: office\nplugin: python-static\nconfig: { endpoints: ['192.0.2.1:3128', '192.0.2.2:3128', '192.0.2.3:3128', '192.0.2.4:3128'] }\n";
    let output = conformance(dir.path(), "examples/python-static", entry, None).await;
    assert!(output.status.success(), "{}", report(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.starts_with("conformance of python-static 0.1.0 (contract "), "{stdout}");
    assert!(stdout.ends_with("14 passed, 0 failed, 0 skipped\n"), "{stdout}");
}

/// Issue 47, an author's loop: `plugin watch` builds the project when a
/// file changes, runs the suite, and installs only a build that passes;
/// a failed build or a build that fails the suite leaves the installed one.
#[test]
fn issue_47_plugin_watch_installs_only_builds_that_pass_the_suite() {
    use std::io::Read as _;

    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("project");
    let plugins = dir.path().join("plugins");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::create_dir_all(&plugins).unwrap();
    let entry = dir.path().join("entry.yaml");
    std::fs::write(
        &entry,
        "name: office\nplugin: static\nconfig: { endpoints: ['192.0.2.1:3128', '192.0.2.2:3128', '192.0.2.3:3128', '192.0.2.4:3128'] }\n",
    )
    .unwrap();
    // The project's "build" copies a built component to its output.
    let build = project.join("build.sh");
    let copying = |name: &str| format!("mkdir -p out && cp '{}' out/plugin.wasm\n", path(name));
    std::fs::write(&build, copying("static")).unwrap();

    // Once: the build passes and is installed; the exit status says so.
    let once = [
        "plugin",
        "watch",
        project.to_str().unwrap(),
        "--config",
        entry.to_str().unwrap(),
        "--build",
        "sh build.sh",
        "--output",
        "out/plugin.wasm",
        "--install-to",
        plugins.to_str().unwrap(),
        "--delete-wait",
        "3s",
    ];
    let output = proxyfleet(&[&once[..], &["--once"]].concat());
    assert!(output.status.success(), "{}", report(&output));
    let installed = plugins.join("static.wasm");
    assert_eq!(std::fs::read(&installed).unwrap(), std::fs::read(plugin("static")).unwrap());

    // Watching: each change is built and tested; failures install nothing.
    std::fs::remove_file(&installed).unwrap();
    let log = dir.path().join("watch.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_proxyfleet"))
        .env("XDG_CACHE_HOME", proxyfleet_tests::workspace_root().join("target/test-cli-cache"))
        .args(["--log-format", "text"])
        .args(once)
        .args(["--interval", "100ms"])
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let said = |text: &str, times: usize| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        loop {
            let mut seen = String::new();
            std::fs::File::open(&log).unwrap().read_to_string(&mut seen).unwrap();
            if seen.matches(text).count() >= times {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "no {text:?} ({times}x) in:\n{seen}");
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    };
    said("watch: installed as", 1);
    let good = std::fs::read(&installed).unwrap();
    std::fs::write(&build, "echo broken >&2; exit 3\n").unwrap();
    said("the build failed", 1);
    std::fs::write(&build, copying("fixtures/answer-v1")).unwrap();
    said("the suite failed; nothing is installed", 1);
    assert_eq!(std::fs::read(&installed).unwrap(), good, "the passing build stays installed");
    std::fs::write(&build, format!("# again\n{}", copying("static"))).unwrap();
    said("watch: installed as", 2);
    let _ = child.kill();
    let _ = child.wait();
}
