//! One health round over 10,000 proxies: does it fit in the 10 s interval
//! on this machine? The proxies are real tinyproxy processes on loopback
//! (10,000 members spread over a few of them), the check target is the
//! operator's own `/v1/echo`, and every probe sends both requests (an
//! absolute-form GET and a CONNECT tunnel), as by default.
//!
//! Run: `cargo bench -p proxyfleet-fleet --bench health_round`
//! (needs tinyproxy). Prints figures; asserts nothing.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use proxyfleet_core::proxy::Phase;
use proxyfleet_fleet::api::{self, Api};
use proxyfleet_fleet::auth::ApiAuth;
use proxyfleet_fleet::{
    CheckTarget, Endpoint, Fleet, FleetSettings, HealthEngine, HealthSettings, Member,
};
use proxyfleet_metrics::Metrics;

const MEMBERS: usize = 10_000;
const TINYPROXIES: usize = 8;

#[expect(clippy::print_stdout, reason = "a bench binary reports on stdout")]
fn main() {
    let dir = tempfile::tempdir().unwrap();
    let mut children: Vec<Child> = Vec::new();
    let mut addrs = Vec::new();
    for i in 0..TINYPROXIES {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let config = dir.path().join(format!("tinyproxy-{i}.conf"));
        std::fs::write(
            &config,
            format!(
                "User nobody\nGroup nogroup\nPort {port}\nListen 127.0.0.1\nTimeout 30\n\
                 MaxClients 1000\nAllow 127.0.0.1\nLogLevel Critical\n"
            ),
        )
        .unwrap();
        match Command::new("tinyproxy")
            .arg("-d")
            .arg("-c")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
        {
            Ok(child) => children.push(child),
            Err(_) => {
                println!("health_round: skipped, tinyproxy is not installed");
                return;
            }
        }
        addrs.push(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    for addr in &addrs {
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(addr).is_err() {
            assert!(Instant::now() < deadline, "tinyproxy did not start on {addr}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let fleet = Arc::new(Fleet::new(FleetSettings::default(), Arc::new(Metrics::new())));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let echo = listener.local_addr().unwrap();
        let api_server = Arc::new(Api::new(Arc::clone(&fleet), Arc::new(ApiAuth::open())));
        tokio::spawn(api::serve(listener, api_server, api::ConnectionLimits::default(), std::future::pending()));
        fleet.publish(
            (0..MEMBERS)
                .map(|i| {
                    let addr = addrs[i % addrs.len()];
                    Member {
                        id: format!("proxy-{i}"),
                        namespace: "default".into(),
                        name: format!("proxy-{i}"),
                        pool: None,
                        provider: "local".into(),
                        labels: BTreeMap::new(),
                        phase: Phase::Running,
                        endpoint: Some(Endpoint::new(addr.ip(), addr.port())),
                        created_at: None,
                        conditions: Vec::new(),
                    }
                })
                .collect(),
        );
        let target = CheckTarget::parse("target", &format!("http://{echo}/v1/echo")).unwrap();
        let engine = HealthEngine::new(HealthSettings::new(target), Arc::clone(&fleet));
        println!(
            "{MEMBERS} proxies over {TINYPROXIES} tinyproxy processes; GET + CONNECT per probe; \
             {} probes at once",
            engine.settings().concurrency
        );
        for round in 1..=3 {
            let (own_before, proxies_before) = (cpu_seconds("self"), proxies_cpu(&children));
            let report = engine.round().await;
            let own = cpu_seconds("self") - own_before;
            let proxies = proxies_cpu(&children) - proxies_before;
            println!(
                "round {round}: {} probed, {} passed in {:.2} s ({:.0} probes/s); CPU: operator {own:.2} s, tinyproxies {proxies:.2} s",
                report.probed,
                report.passed,
                report.elapsed.as_secs_f64(),
                report.probed as f64 / report.elapsed.as_secs_f64(),
            );
        }
    });
    for mut child in children {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// User + system CPU seconds of a process, from /proc (clock ticks of 1/100 s).
fn cpu_seconds(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name, which may hold spaces, end with ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 here.
    (ticks(11) + ticks(12)) / 100.0
}

fn proxies_cpu(children: &[Child]) -> f64 {
    children.iter().map(|c| cpu_seconds(&c.id().to_string())).sum()
}
