//! Scale figures of one standalone installation, in one process: N Proxies
//! on one entry, the static plugin or the gcp plugin against
//! `tools/gce-sim` with injected latency, run by the operator's own loop
//! (`Standalone::run`) with health probes off.
//!
//! ```text
//! cargo xtask plugins
//! cargo bench -p proxyfleet-tests --bench scale -- \
//!     [--entry static|gcp] [--proxies N] [--latency-ms MS] [--concurrency C] [--idle-secs S]
//! ```
//!
//! It prints the time until every Proxy is Running (and until the first
//! was), provider calls per Proxy, operator CPU per Proxy, the process's
//! RSS and high-water mark, and the CPU an idle installation uses once
//! settled, with the record reads and writes it makes meanwhile. Operator
//! CPU is the process's minus the simulator's threads (named `sim`); the
//! process's memory includes the simulator's. A figure, not a test: the
//! machines that run it are shared.

#![allow(clippy::print_stdout, reason = "a bench binary prints its figures")]

use std::error::Error;
use std::sync::Arc;
use std::time::{Duration, Instant};

use proxyfleet_core::proxy::Phase;
use proxyfleet_gce_sim::{Faults, SimOptions, Simulator};
use proxyfleet_runtime::config::ProvidersConfig;
use proxyfleet_standalone::Settings;
use proxyfleet_tests::{localhost_tls, plugin};

/// What to run, from the command line.
#[derive(Debug)]
struct Options {
    entry: String,
    proxies: usize,
    latency: Duration,
    concurrency: usize,
    idle: Duration,
}

impl Options {
    fn parse() -> Result<Self, Box<dyn Error>> {
        let mut options = Self {
            entry: "static".to_owned(),
            proxies: 1000,
            latency: Duration::from_millis(50),
            concurrency: 1024,
            idle: Duration::from_secs(60),
        };
        let mut args = std::env::args().skip(1).filter(|arg| arg != "--bench");
        while let Some(flag) = args.next() {
            let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
            match flag.as_str() {
                "--entry" => options.entry = value()?,
                "--proxies" => options.proxies = value()?.parse()?,
                "--latency-ms" => options.latency = Duration::from_millis(value()?.parse()?),
                "--concurrency" => options.concurrency = value()?.parse()?,
                "--idle-secs" => options.idle = Duration::from_secs(value()?.parse()?),
                other => return Err(format!("unknown flag {other}").into()),
            }
        }
        if !matches!(options.entry.as_str(), "static" | "gcp") {
            return Err(format!("--entry {}: use static or gcp", options.entry).into());
        }
        Ok(options)
    }
}

/// CPU seconds of this process, and of its threads named `sim`.
fn cpu_seconds() -> (f64, f64) {
    // Linux reports times in USER_HZ, 100 a second on every architecture
    // it supports.
    let ticks = |stat: &str| -> f64 {
        let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        let fields: Vec<&str> = after.split_whitespace().collect();
        let utime: f64 = fields.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0);
        let stime: f64 = fields.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
        (utime + stime) / 100.0
    };
    let process = std::fs::read_to_string("/proc/self/stat").map_or(0.0, |s| ticks(&s));
    let mut sim = 0.0;
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for task in tasks.flatten() {
            let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            if comm.trim() == "sim" {
                sim += std::fs::read_to_string(task.path().join("stat")).map_or(0.0, |s| ticks(&s));
            }
        }
    }
    (process, sim)
}

fn operator_cpu() -> f64 {
    let (process, sim) = cpu_seconds();
    process - sim
}

/// `VmRSS` and `VmHWM` in MiB.
fn memory_mib() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map_or(0.0, |kib| kib / 1024.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// The sum of the samples of `name` in the metrics text.
fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|line| line.starts_with(name) && !line.starts_with('#'))
        .filter(|line| line[name.len()..].starts_with(['{', ' ']))
        .filter_map(|line| line.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
        .sum()
}

fn manifests(count: usize, provider: &str) -> String {
    (0..count)
        .map(|i| {
            format!(
                "apiVersion: proxyfleet.io/v1alpha1\nkind: Proxy\nmetadata: {{ name: p{i:05} }}\n\
                 spec: {{ provider: {provider}, image: debian-12 }}\n---\n"
            )
        })
        .collect()
}

fn limits(options: &Options) -> String {
    // Two keys and about 200 bytes a static assignment.
    let kv_kib = (options.proxies * 400 / 1024).max(512);
    format!(
        "    limits: {{ concurrency: {c}, mutations: {c}, kvKeys: {keys}, kvTotalKiB: {kv_kib} }}\n",
        c = options.concurrency,
        keys = (options.proxies * 2 + 16).max(1000),
    )
}

fn main() -> Result<(), Box<dyn Error>> {
    let options = Options::parse()?;
    let dir = tempfile::tempdir()?;
    let site = dir.path();
    for sub in ["plugins", "proxies", "state"] {
        std::fs::create_dir_all(site.join(sub))?;
    }
    std::fs::copy(plugin(&options.entry), site.join(format!("plugins/{}.wasm", options.entry)))?;

    // The simulator runs on threads of its own, so its CPU can be told
    // apart from the operator's.
    let sim_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("sim")
        .enable_all()
        .build()?;
    let mut sim = None;
    let providers = match options.entry.as_str() {
        "static" => {
            let endpoints: Vec<String> = (0..options.proxies)
                .map(|i| format!("'127.0.{}.{}:3128'", 1 + i / 250, 1 + i % 250))
                .collect();
            format!(
                "providers:\n  - name: bench\n    plugin: static\n    proxyAddresses: ['127.0.0.0/8']\n    \
                 config: {{ endpoints: [{}] }}\n{}",
                endpoints.join(", "),
                limits(&options)
            )
        }
        _ => {
            let (ca, cert, key) = localhost_tls();
            let started = sim_runtime.block_on(Simulator::start(
                SimOptions {
                    zones: vec!["europe-west1-b".into()],
                    operation_duration: Duration::from_millis(100),
                    boot_duration: Duration::from_millis(100),
                    ..SimOptions::default()
                },
                &cert,
                &key,
            ))?;
            started.set_faults(Faults { latency: options.latency, ..Faults::default() });
            let sa_key = started.create_key("bench@proxyfleet-test.iam.gserviceaccount.com")?;
            std::fs::write(site.join("ca.pem"), ca)?;
            std::fs::write(site.join("key.json"), &sa_key.json)?;
            let entry = proxyfleet_tests::gcp::sim_entry(
                "bench",
                &started.endpoint(),
                "proxyfleet-test",
                &site.join("ca.pem"),
                &site.join("key.json"),
            );
            sim = Some(started);
            format!("providers:\n{entry}{}", limits(&options))
        }
    };
    std::fs::write(site.join("proxies/proxies.yaml"), manifests(options.proxies, "bench"))?;

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("operator")
        .enable_all()
        .build()?;
    let mut settings = Settings::new(site.join("proxies"));
    settings.gc_interval = Duration::from_secs(3600);
    let providers = ProvidersConfig::parse(&providers)?;
    let cpu_before = operator_cpu();
    let started = Instant::now();
    let standalone = Arc::new(runtime.block_on(proxyfleet_tests::standalone::open(
        settings,
        &site.join("state/state.redb"),
        &providers,
        &site.join("plugins"),
    )));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let loop_runtime = runtime.handle().clone();
    let running = {
        let standalone = Arc::clone(&standalone);
        std::thread::spawn(move || {
            loop_runtime.block_on(standalone.run(async {
                let _ = stopped.await;
            }))
        })
    };

    let mut first_running = None;
    let converged = loop {
        std::thread::sleep(Duration::from_millis(250));
        let records = standalone.records()?;
        let running = records.iter().filter(|r| r.status.phase == Phase::Running).count();
        if running > 0 && first_running.is_none() {
            first_running = Some(started.elapsed());
        }
        if running == options.proxies {
            break started.elapsed();
        }
        if started.elapsed() > Duration::from_secs(1800) {
            return Err(format!("{running} of {} Running after 30 min", options.proxies).into());
        }
    };
    let converge_cpu = operator_cpu() - cpu_before;
    let (rss, hwm) = memory_mib();
    let calls = metric_sum(&standalone.metrics().encode(), "proxyfleet_provider_calls_total");

    // Settled: nothing but resyncs should run from here.
    let (scans, writes) = (standalone.record_scans(), standalone.record_writes());
    let idle_before = operator_cpu();
    std::thread::sleep(options.idle);
    let idle_cpu = (operator_cpu() - idle_before) / options.idle.as_secs_f64();
    let (idle_scans, idle_writes) =
        (standalone.record_scans() - scans, standalone.record_writes() - writes);
    let (_, idle_hwm) = memory_mib();

    let count = options.proxies as f64;
    println!(
        "scale: {} Proxies on the {} plugin, concurrency {}{}",
        options.proxies,
        options.entry,
        options.concurrency,
        if sim.is_some() { format!(", API latency {:?}", options.latency) } else { String::new() }
    );
    println!("  converged (all Running)   {:>10.2} s", converged.as_secs_f64());
    println!(
        "  first Running             {:>10.2} s",
        first_running.unwrap_or_default().as_secs_f64()
    );
    println!("  provider calls per Proxy  {:>10.2}", calls / count);
    println!("  operator CPU per Proxy    {:>10.2} ms", converge_cpu / count * 1000.0);
    println!("  RSS after converging      {:>10.1} MiB (high-water {hwm:.1} MiB)", rss);
    println!(
        "  idle CPU over {:>3} s       {:>10.2} % of a core ({idle_scans} record scans, {idle_writes} record writes)",
        options.idle.as_secs(),
        idle_cpu * 100.0
    );
    println!("  high-water after idling   {idle_hwm:>10.1} MiB");

    let _ = stop.send(());
    running.join().map_err(|_| "the run loop panicked")??;
    drop(sim);
    Ok(())
}
