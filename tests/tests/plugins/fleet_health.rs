//! The health engine against real tinyproxy processes on loopback, with the
//! operator's own `/v1/echo` as the check target.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use proxyfleet_core::proxy::Phase;
use proxyfleet_fleet::api::{self, Api};
use proxyfleet_fleet::auth::ApiAuth;
use proxyfleet_fleet::{
    CheckTarget, Endpoint, Fleet, FleetSettings, HealthEngine, HealthSettings, Member, ProbeMode,
    Selector, Verdict,
};
use proxyfleet_metrics::Metrics;
use proxyfleet_tests::proxies::Tinyproxy;

/// A catalog with the API (and so the echo target) served on loopback.
async fn fleet_with_echo() -> (Arc<Fleet>, SocketAddr) {
    let fleet = Arc::new(Fleet::new(FleetSettings::default(), Arc::new(Metrics::new())));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let api = Arc::new(Api::new(Arc::clone(&fleet), Arc::new(ApiAuth::open())));
    tokio::spawn(api::serve(
        listener,
        api,
        api::ConnectionLimits::default(),
        std::future::pending(),
    ));
    (fleet, addr)
}

fn member(id: &str, addr: SocketAddr) -> Member {
    Member {
        id: id.to_owned(),
        namespace: "default".into(),
        name: id.to_owned(),
        pool: None,
        provider: "local".into(),
        labels: BTreeMap::new(),
        phase: Phase::Running,
        endpoint: Some(Endpoint::new(addr.ip(), addr.port())),
        created_at: None,
        conditions: Vec::new(),
    }
}

fn engine(fleet: &Arc<Fleet>, echo: SocketAddr, mode: ProbeMode) -> HealthEngine {
    let target = format!("http://{echo}/v1/echo");
    let mut settings = HealthSettings::new(CheckTarget::parse("target", &target).unwrap());
    settings.healthy_after = 2;
    settings.unhealthy_after = 3;
    settings.timeout = Duration::from_secs(2);
    settings.mode = mode;
    HealthEngine::new(settings, Arc::clone(fleet))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_proxy_turns_unhealthy_within_the_failures_and_healthy_after_a_restart() {
    let mut proxy = Tinyproxy::start();
    let (fleet, echo) = fleet_with_echo().await;
    fleet.publish(vec![member("p1", proxy.addr())]);
    let engine = engine(&fleet, echo, ProbeMode::Both);
    let verdict = || fleet.health("p1").map(|h| h.verdict);

    engine.round().await;
    assert_eq!(verdict(), Some(Verdict::Unknown), "one pass is not enough");
    engine.round().await;
    let record = fleet.health("p1").unwrap();
    assert_eq!(record.verdict, Verdict::Healthy, "{record:?}");
    // The echo target saw the proxy's exit address: tinyproxy on loopback.
    assert_eq!(record.exit_ip.as_deref(), Some("127.0.0.1"));
    assert!(record.latency_ms.is_some());
    assert_eq!(fleet.next(&Selector::default(), None).unwrap().0, "p1");

    proxy.kill();
    engine.round().await;
    engine.round().await;
    assert_eq!(verdict(), Some(Verdict::Healthy), "two failures stay under the threshold of three");
    engine.round().await;
    let record = fleet.health("p1").unwrap();
    assert_eq!(record.verdict, Verdict::Unhealthy);
    assert_eq!((record.passes, record.failures), (2, 3));
    let error = record.last_error.unwrap();
    assert!(error.contains("cannot connect to the proxy port"), "{error}");
    assert!(
        fleet.next(&Selector::default(), None).is_err(),
        "an unhealthy proxy is not handed out"
    );

    proxy.restart();
    engine.round().await;
    assert_eq!(verdict(), Some(Verdict::Unhealthy));
    engine.round().await;
    assert_eq!(verdict(), Some(Verdict::Healthy));
    let changes: Vec<Verdict> = fleet
        .take_verdict_changes()
        .into_iter()
        .filter_map(|(_, record)| record.map(|r| r.verdict))
        .collect();
    assert_eq!(changes, [Verdict::Healthy], "the mode sees the latest verdict");
}

#[tokio::test(flavor = "multi_thread")]
async fn get_and_connect_probes_each_pass_through_tinyproxy() {
    let proxy = Tinyproxy::start();
    let (fleet, echo) = fleet_with_echo().await;
    fleet.publish(vec![member("p1", proxy.addr())]);
    for mode in [ProbeMode::Get, ProbeMode::Connect] {
        let report = engine(&fleet, echo, mode).round().await;
        assert_eq!((report.probed, report.passed), (1, 1), "{mode:?}: {:?}", fleet.health("p1"));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_proxy_refusing_connect_fails_the_connect_probe_with_its_status() {
    let proxy = Tinyproxy::start_with("ConnectPort 443\n");
    let (fleet, echo) = fleet_with_echo().await;
    fleet.publish(vec![member("p1", proxy.addr())]);
    let get = engine(&fleet, echo, ProbeMode::Get).round().await;
    assert_eq!(get.passed, 1);
    let connect = engine(&fleet, echo, ProbeMode::Connect).round().await;
    assert_eq!(connect.passed, 0);
    let error = fleet.health("p1").unwrap().last_error.unwrap();
    assert!(error.contains("CONNECT") && error.contains("403"), "{error}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_proxy_that_never_answers_costs_one_timeout_and_others_are_still_probed() {
    let good = Tinyproxy::start();
    // Accepts and then says nothing.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_addr = silent.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = silent.accept().await {
            held.push(stream);
        }
    });
    let (fleet, echo) = fleet_with_echo().await;
    fleet.publish(vec![member("good", good.addr()), member("silent", silent_addr)]);
    let report = engine(&fleet, echo, ProbeMode::Both).round().await;
    assert_eq!((report.probed, report.passed), (2, 1));
    let error = fleet.health("silent").unwrap().last_error.unwrap();
    assert!(error.contains("no answer through the proxy within"), "{error}");
    assert_eq!(fleet.health("good").unwrap().passes, 1);
}

/// The script of `docs/examples/tinyproxy-cloud-init.yaml` (its one
/// runcmd entry) run by `sh` in `dir`: the paths it uses moved into `dir`,
/// `systemctl` recording its calls. Returns whether it succeeded, what it
/// said, and the calls.
fn run_example_script(script: &str, dir: &std::path::Path) -> (bool, String, String) {
    let script = script
        .replace("/etc/proxyfleet/proxy-auth", &dir.join("proxy-auth").display().to_string())
        .replace(
            "/etc/tinyproxy/tinyproxy.conf",
            &dir.join("tinyproxy.conf").display().to_string(),
        );
    let calls = dir.join("systemctl.calls");
    let stub = format!("systemctl() {{ echo \"$*\" >> {}; }}\n", calls.display());
    let out = std::process::Command::new("sh").arg("-c").arg(stub + &script).output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.success(), said, std::fs::read_to_string(calls).unwrap_or_default())
}

/// `docs/examples/tinyproxy-cloud-init.yaml`, the proxy VM example of the
/// VM providers' docs: its script, given the credential file the providers
/// write (`proxyfleet_sdk::cloud_init::PROXY_AUTH_PATH`), turns the
/// tinyproxy configuration it writes into one that the real tinyproxy (on
/// a free loopback port) runs, healthy when the probe carries the
/// credential and refusing one without. Without a credential, or with one
/// tinyproxy cannot read, it leaves tinyproxy stopped instead of open.
#[tokio::test(flavor = "multi_thread")]
async fn the_cloud_init_example_makes_a_proxy_that_passes_probes_with_its_credential() {
    let example = std::fs::read_to_string(
        proxyfleet_tests::workspace_root().join("docs/examples/tinyproxy-cloud-init.yaml"),
    )
    .unwrap();
    assert!(example.starts_with("#cloud-config\n"), "cloud-init reads only #cloud-config files");
    let config: yaml_serde::Value = yaml_serde::from_str(&example).unwrap();
    assert_eq!(config["packages"][0].as_str(), Some("tinyproxy"));
    let conf = config["write_files"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|file| file["path"].as_str() == Some("/etc/tinyproxy/tinyproxy.conf"))
        .and_then(|file| file["content"].as_str())
        .expect("the example writes tinyproxy's configuration")
        .to_owned();
    assert!(
        !conf.lines().any(|line| line.starts_with("BasicAuth")),
        "the credential comes from the provider, not the file"
    );
    let script = config["runcmd"][0].as_str().expect("one runcmd script").to_owned();

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tinyproxy.conf"), &conf).unwrap();
    std::fs::write(dir.path().join("proxy-auth"), "crawler:S3cret-pw.1\n").unwrap();
    let (ok, said, calls) = run_example_script(&script, dir.path());
    assert!(ok, "{said}");
    assert_eq!(calls, "enable tinyproxy\nrestart tinyproxy\n");
    let conf = std::fs::read_to_string(dir.path().join("tinyproxy.conf")).unwrap();
    assert!(conf.ends_with("\nBasicAuth crawler S3cret-pw.1\n"), "{conf}");
    // Run again (a re-run of the script): still one BasicAuth line.
    run_example_script(&script, dir.path());
    let again = std::fs::read_to_string(dir.path().join("tinyproxy.conf")).unwrap();
    assert_eq!(again.lines().filter(|line| line.starts_with("BasicAuth ")).count(), 1, "{again}");

    let credential =
        proxyfleet_core::credential::ProxyCredential::parse("crawler:S3cret-pw.1").unwrap();
    // Loopback instead of a VM: its own port, a user that exists here, and
    // CONNECT to this test's check target's port.
    let (fleet, echo) = fleet_with_echo().await;
    let extra: String = conf
        .lines()
        .filter(|line| {
            !["User ", "Group ", "Port ", "ConnectPort "].iter().any(|key| line.starts_with(key))
        })
        .map(|line| format!("{line}\n"))
        .chain([format!("ConnectPort {}\n", echo.port())])
        .collect();
    let proxy = Tinyproxy::start_with(&extra);
    let with =
        Endpoint::new(proxy.addr().ip(), proxy.addr().port()).with_credential(Some(credential));
    let without = Endpoint::new(proxy.addr().ip(), proxy.addr().port());
    fleet.publish(vec![
        Member { endpoint: Some(with), ..member("with", proxy.addr()) },
        Member { endpoint: Some(without), ..member("without", proxy.addr()) },
    ]);
    let engine = engine(&fleet, echo, ProbeMode::Both);
    engine.round().await;
    engine.round().await;
    assert_eq!(fleet.health("with").map(|h| h.verdict), Some(Verdict::Healthy));
    let refused = fleet.health("without").unwrap();
    assert_ne!(refused.verdict, Verdict::Healthy);
    assert!(refused.last_error.as_deref().unwrap_or_default().contains("407"), "{refused:?}");

    // No credential, or one tinyproxy's parser refuses: stopped, not open.
    for (content, reason) in [
        (None, "give the Proxy a credential"),
        (Some("crawler:p@ss word\n"), "only letters, digits"),
        (Some("crawler:pa:ss\n"), "only letters, digits"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tinyproxy.conf"), "Port 3128\n").unwrap();
        if let Some(content) = content {
            std::fs::write(dir.path().join("proxy-auth"), content).unwrap();
        }
        let (ok, said, calls) = run_example_script(&script, dir.path());
        assert!(!ok && said.contains(reason), "{content:?}: {said}");
        assert_eq!(calls, "stop tinyproxy\n", "{content:?}");
        let conf = std::fs::read_to_string(dir.path().join("tinyproxy.conf")).unwrap();
        assert_eq!(conf, "Port 3128\n", "{content:?}");
    }
}
