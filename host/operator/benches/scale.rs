//! Scale figures of the operator as it ships: the `proxyfleet` binary of
//! this build (`cargo bench` builds it optimised) run as its own process,
//! N Proxies on one entry, beside entries of the other first-party plugins
//! that are loaded and hold nothing, as an installation with several
//! backends has them (four plugins in all: gcp, static, proxmox,
//! kubernetes). Health probes, orphan collection and provider checks run
//! at their defaults.
//!
//! ```text
//! cargo xtask plugins
//! cargo bench -p proxyfleet-operator --bench scale -- \
//!     [--mode standalone|kube] [--entry gcp|static] [--proxies N] [--latency-ms MS] \
//!     [--concurrency C] [--idle-secs S] [--keep-logs DIR] [--create-first] [--pool] \
//!     [--consoles N]
//! ```
//!
//! `--entry gcp` (the default) runs the gcp plugin against `tools/gce-sim`
//! (operations take 100 ms, instances boot in 100 ms, every API answer
//! waits `--latency-ms`); each Proxy's port is one of eight tinyproxy
//! processes on loopback, so every probe goes through a real proxy.
//! `--entry static` lists N endpoints on 127.0.x.y, where nothing listens:
//! its probes are refused. `--concurrency` is the entry's
//! `limits.concurrency`, `mutations` and `httpInFlight` (each call of the
//! gcp plugin holds one request open at a time: with fewer requests than
//! calls allowed, calls would wait for a request slot). `--mode kube`
//! runs `proxyfleet run` against the test API server
//! (`deploy/dev/kube-apiserver/start.sh`) with the Proxies as objects
//! there. `--create-first` (Kubernetes mode) makes the N−1 Proxies while
//! the operator is stopped and then starts it, as a new leader finds a
//! fleet that was scaled up meanwhile: the time counts from its start.
//! `--pool` declares one ProxyPool instead of single Proxies (replicas 1,
//! then N; its members share the template's port): what the pool
//! controller adds on top of the Proxies' own work. `--consoles N` (needs
//! Debian's `chromium` and `chromium-driver`) times the web console's
//! Proxies page over the settled fleet in headless Chromium (its first
//! contentful paint, five loads) and then idles once more with N consoles
//! open (one Chromium each, on the Overview, Proxies, Providers and
//! Gateway pages in turn, each listening for changes): the difference to
//! the idle CPU before is what open consoles cost.
//!
//! The run: start the operator on no Proxies and wait for `/readyz`; add
//! one Proxy and time it to Running, and the provider calls that brought
//! it up (`t1`, from the operator's call histogram: what this entry and its
//! backend need for one Proxy); add the other N-1 and time them all to
//! Running. The bound the entry's limits set is
//! `ceil((N-1) / concurrency) × t1`, and the figure to watch is the ratio
//! to it. Then the settled operator idles for `--idle-secs`; then it
//! restarts with probes an hour apart and, once its start-up calls are
//! over, idles as long again: the difference is what probing costs, the
//! rest is what an idle operator spends on anything else. It prints the
//! operator process's own figures (CPU and memory from `/proc`, calls and
//! the probe round from its `/metrics`), never the simulator's or this
//! process's; only the line on the machine while converging says how busy
//! the rest of it was. A figure, not a test.

#![allow(clippy::print_stdout, reason = "a bench binary prints its figures")]

use std::error::Error;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use http::Method;
use proxyfleet_fleet::client;
use proxyfleet_gce_sim as gce;
use proxyfleet_kube::crd::{Proxy, ProxyPool};
use proxyfleet_tests::ports::free_port;
use proxyfleet_tests::procfs;
use proxyfleet_tests::proxies::Tinyproxy;
use proxyfleet_tests::{localhost_tls, plugin};

const PROJECT: &str = "scale";
const EMAIL: &str = "scale@scale.iam.gserviceaccount.com";
const TINYPROXIES: usize = 8;
const LEASE: &str = "scale-leader";

/// What to run, from the command line.
#[derive(Debug)]
struct Options {
    kube: bool,
    gcp: bool,
    proxies: usize,
    latency: Duration,
    concurrency: usize,
    idle: Duration,
    keep_logs: Option<PathBuf>,
    create_first: bool,
    pool: bool,
    /// Kube: the operator's `--api-in-flight`, when not its default.
    api_in_flight: Option<usize>,
    /// Consoles to open in headless Chromium once the fleet is settled.
    consoles: usize,
}

impl Options {
    fn parse() -> Result<Self, Box<dyn Error>> {
        let mut options = Self {
            kube: false,
            gcp: true,
            proxies: 1000,
            latency: Duration::from_millis(50),
            concurrency: 64,
            idle: Duration::from_secs(60),
            keep_logs: None,
            create_first: false,
            pool: false,
            api_in_flight: None,
            consoles: 0,
        };
        let mut args = std::env::args().skip(1).filter(|arg| arg != "--bench");
        while let Some(flag) = args.next() {
            let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
            match flag.as_str() {
                "--mode" => {
                    options.kube = match value()?.as_str() {
                        "standalone" => false,
                        "kube" => true,
                        other => {
                            return Err(format!("--mode {other}: use standalone or kube").into());
                        }
                    }
                }
                "--entry" => {
                    options.gcp = match value()?.as_str() {
                        "gcp" => true,
                        "static" => false,
                        other => return Err(format!("--entry {other}: use gcp or static").into()),
                    }
                }
                "--proxies" => options.proxies = value()?.parse()?,
                "--latency-ms" => options.latency = Duration::from_millis(value()?.parse()?),
                "--concurrency" => options.concurrency = value()?.parse()?,
                "--idle-secs" => options.idle = Duration::from_secs(value()?.parse()?),
                "--keep-logs" => options.keep_logs = Some(value()?.into()),
                "--create-first" => options.create_first = true,
                "--pool" => options.pool = true,
                "--api-in-flight" => options.api_in_flight = Some(value()?.parse()?),
                "--consoles" => options.consoles = value()?.parse()?,
                other => return Err(format!("unknown flag {other}").into()),
            }
        }
        if options.proxies < 2 {
            return Err("--proxies: at least 2 (one times a single create)".into());
        }
        if options.create_first && !options.kube {
            return Err("--create-first: only with --mode kube".into());
        }
        if options.api_in_flight.is_some() && !options.kube {
            return Err("--api-in-flight: only with --mode kube".into());
        }
        if options.concurrency == 0 {
            return Err("--concurrency: at least 1".into());
        }
        Ok(options)
    }

    fn entry(&self) -> &'static str {
        if self.gcp { "gcp" } else { "static" }
    }
}

/// The backends and the files the entries name.
struct Backends {
    gce: gce::Simulator,
    tinyproxies: Vec<Tinyproxy>,
    dir: tempfile::TempDir,
}

impl Backends {
    async fn start(options: &Options) -> Result<Self, Box<dyn Error>> {
        let (ca, cert, key) = localhost_tls();
        let gce = gce::Simulator::start(
            gce::SimOptions {
                projects: vec![PROJECT.to_owned()],
                zones: vec!["europe-west1-b".to_owned()],
                token_lifetime: Duration::from_secs(3600),
                operation_duration: Duration::from_millis(100),
                boot_duration: Duration::from_millis(100),
                ..gce::SimOptions::default()
            },
            &cert,
            &key,
        )
        .await?;
        gce.set_faults(gce::Faults { latency: options.latency, ..gce::Faults::default() });
        let sa_key = gce.create_key(EMAIL)?;
        let tinyproxies =
            (0..TINYPROXIES).map(|_| Tinyproxy::start_with("MaxClients 1000\n")).collect();
        let dir = tempfile::tempdir()?;
        std::fs::create_dir(dir.path().join("plugins"))?;
        for name in ["gcp", "static", "proxmox", "kubernetes"] {
            std::fs::copy(plugin(name), dir.path().join(format!("plugins/{name}.wasm")))?;
        }
        std::fs::write(dir.path().join("ca.pem"), ca)?;
        std::fs::write(dir.path().join("gcp-key.json"), &sa_key.json)?;
        std::fs::write(dir.path().join("token"), "not-a-real-token\n")?;
        Ok(Self { gce, tinyproxies, dir })
    }

    /// The bench's entry `bench` on `options.entry()`, and one idle entry
    /// of each other first-party plugin but kvm (whose libvirt client
    /// needs a host to connect to).
    fn providers(&self, options: &Options) -> String {
        let dir = self.dir.path();
        let ca = dir.join("ca.pem");
        let limits = |keys: usize| {
            format!(
                "    limits: {{ concurrency: {c}, mutations: {c}, httpInFlight: {c}, kvKeys: {keys}, kvTotalKiB: {kib} }}\n",
                c = options.concurrency,
                kib = (keys * 200 / 1024).max(512),
            )
        };
        let gcp = |name: &str| {
            proxyfleet_tests::gcp::sim_entry(
                name,
                &self.gce.endpoint(),
                PROJECT,
                &ca,
                &dir.join("gcp-key.json"),
            )
        };
        let statics = |name: &str, count: usize| {
            let endpoints: Vec<String> = (0..count)
                .map(|i| format!("'127.0.{}.{}:3128'", 1 + i / 250, 1 + i % 250))
                .collect();
            format!(
                "  - name: {name}\n    plugin: static\n    proxyAddresses: ['127.0.0.0/8']\n    \
                 config: {{ endpoints: [{}] }}\n",
                endpoints.join(", ")
            )
        };
        // Two keys a static assignment.
        let (bench, idle) = if options.gcp {
            (gcp("bench") + &limits(1000), statics("idle-static", 4))
        } else {
            (statics("bench", options.proxies) + &limits(options.proxies * 2 + 16), gcp("idle-gcp"))
        };
        // Nothing listens on these: the entries load, and their checks fail.
        let closed = free_port();
        format!(
            "providers:
{bench}{idle}  - name: idle-pve
    plugin: proxmox
    config:
      url: https://localhost:{closed}
      nodes: [pve1]
      templates: {{ debian-12: 100 }}
      isoStorage: local
    grants:
      caFile: {ca}
      http:
        - url: https://localhost:{closed}
          allowAddresses: [127.0.0.1, '::1']
          credential: {{ header: Authorization, valueTemplate: 'PVEAPIToken={{secret}}', secretFile: {token} }}
  - name: idle-kube
    plugin: kubernetes
    config:
      apiServer: https://localhost:{closed}
      namespace: proxies
    grants:
      caFile: {ca}
      http:
        - url: https://localhost:{closed}
          allowAddresses: [127.0.0.1, '::1']
          credential: {{ header: authorization, valueTemplate: 'Bearer {{secret}}', secretFile: {token} }}
",
            ca = ca.display(),
            token = dir.join("token").display(),
        )
    }

    /// Proxy `index`'s port: the static plugin's endpoint carries its own;
    /// a gcp instance's address is loopback, so the port picks a tinyproxy.
    fn port(&self, index: usize) -> u16 {
        self.tinyproxies[index % self.tinyproxies.len()].addr().port()
    }
}

/// One operator process and where to reach it.
struct Operator {
    /// What starts it (again).
    command: Command,
    child: Option<Child>,
    api: String,
    metrics: String,
    log: PathBuf,
    /// Standalone: the manifests folder. Kube: the Proxies' namespace.
    proxies: Place,
    /// One ProxyPool instead of single Proxies.
    pool: bool,
}

enum Place {
    Folder(PathBuf),
    /// The Proxies' and pools' namespace, and both namespaces the run made.
    Namespace(Box<kube::Api<Proxy>>, Box<kube::Api<ProxyPool>>, [String; 2]),
}

impl Operator {
    /// An operator of this run's mode, not started yet.
    async fn prepare(
        options: &Options,
        backends: &Backends,
        dir: &Path,
    ) -> Result<Self, Box<dyn Error>> {
        let providers = dir.join("providers.yaml");
        std::fs::write(&providers, backends.providers(options))?;
        let log = dir.join("operator.log");
        let api = format!("127.0.0.1:{}", free_port());
        let metrics = format!("127.0.0.1:{}", free_port());
        let plugins = backends.dir.path().join("plugins");
        let mut command = Command::new(env!("CARGO_BIN_EXE_proxyfleet"));
        command.args(["--log-format", "text"]);
        let place = if options.kube {
            let client = proxyfleet_tests::kube_admin_client().await;
            proxyfleet_tests::kube_install_crds(&client).await;
            let namespace = proxyfleet_tests::kube_test_namespace(&client, "scale-operator").await;
            let watch = proxyfleet_tests::kube_test_namespace(&client, "scale-proxies").await;
            command
                .env("KUBECONFIG", proxyfleet_tests::kube_state_dir().join("kubeconfig"))
                .env_remove("POD_NAME")
                .env_remove("POD_NAMESPACE")
                .arg("run")
                .args(["--namespace", &namespace, "--watch-namespace", &watch])
                .args(["--identity", "scale-0", "--lease-name", LEASE]);
            if let Some(in_flight) = options.api_in_flight {
                command.args(["--api-in-flight", &in_flight.to_string()]);
            }
            Place::Namespace(
                Box::new(kube::Api::namespaced(client.clone(), &watch)),
                Box::new(kube::Api::namespaced(client, &watch)),
                [namespace, watch],
            )
        } else {
            let folder = dir.join("proxies");
            std::fs::create_dir_all(&folder)?;
            command
                .arg("standalone")
                .arg("--proxies")
                .arg(&folder)
                .arg("--state")
                .arg(dir.join("state.redb"));
            Place::Folder(folder)
        };
        command
            .arg("--providers")
            .arg(&providers)
            .arg("--plugin-dir")
            .arg(&plugins)
            // A cache of its own: the first start compiles every plugin it
            // uses, a restart finds them compiled.
            .arg("--cache-dir")
            .arg(dir.join("cache"))
            .args(["--installation-id", "scale", "--api-addr", &api, "--metrics-addr", &metrics])
            .stdout(Stdio::null());
        Ok(Self { command, child: None, api, metrics, log, proxies: place, pool: options.pool })
    }

    /// Starts it (again, when it ran) and waits for `/readyz`; the time
    /// that took.
    async fn start(&mut self) -> Result<Duration, Box<dyn Error>> {
        self.stop();
        let begun = Instant::now();
        let log = OpenOptions::new().create(true).append(true).open(&self.log)?;
        self.child = Some(self.command.stderr(log).spawn()?);
        while !self.ready().await {
            self.check_alive()?;
            if begun.elapsed() > Duration::from_secs(300) {
                return Err("the operator was not ready within 5 min".into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(begun.elapsed())
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn check_alive(&mut self) -> Result<(), Box<dyn Error>> {
        let child = self.child.as_mut().ok_or("the operator is not running")?;
        match child.try_wait()? {
            Some(status) => {
                Err(format!("the operator exited ({status}); see {}", self.log.display()).into())
            }
            None => Ok(()),
        }
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Adds Proxies `from..to`: the standalone manifest is written whole
    /// (all of them), the cluster gets one object each. With `--pool`, the
    /// pool's replicas become `to`.
    async fn add(&self, backends: &Backends, from: usize, to: usize) -> Result<(), Box<dyn Error>> {
        if self.pool {
            return self.scale_pool(backends, from, to).await;
        }
        match &self.proxies {
            Place::Folder(folder) => {
                let yaml: String = (0..to)
                    .map(|i| {
                        format!(
                            "apiVersion: proxyfleet.io/v1alpha1\nkind: Proxy\nmetadata: {{ name: p{i:05} }}\n\
                             spec: {{ provider: bench, image: debian-12, port: {} }}\n---\n",
                            backends.port(i)
                        )
                    })
                    .collect();
                write_manifests(folder, &yaml)?;
            }
            Place::Namespace(api, _, _) => {
                let post = kube::api::PostParams::default();
                let results: Vec<_> = futures::stream::iter(from..to)
                    .map(|i| {
                        let proxy: Result<Proxy, Box<dyn Error>> = serde_json::from_value(serde_json::json!({
                            "apiVersion": "proxyfleet.io/v1alpha1",
                            "kind": "Proxy",
                            "metadata": { "name": format!("p{i:05}") },
                            "spec": { "provider": "bench", "image": "debian-12", "port": backends.port(i) },
                        }))
                        .map_err(Into::into);
                        let post = &post;
                        async move {
                            api.create(post, &proxy?).await?;
                            Ok::<_, Box<dyn Error>>(())
                        }
                    })
                    .buffer_unordered(ADD_IN_FLIGHT)
                    .collect()
                    .await;
                for result in results {
                    result?;
                }
            }
        }
        Ok(())
    }

    /// Declares the pool `bench` with `to` replicas: made when `from` is
    /// 0, scaled after.
    async fn scale_pool(
        &self,
        backends: &Backends,
        from: usize,
        to: usize,
    ) -> Result<(), Box<dyn Error>> {
        let pool = serde_json::json!({
            "apiVersion": "proxyfleet.io/v1alpha1",
            "kind": "ProxyPool",
            "metadata": { "name": "bench" },
            "spec": {
                "replicas": to,
                "template": { "spec": { "provider": "bench", "image": "debian-12", "port": backends.port(0) } },
            },
        });
        match &self.proxies {
            Place::Folder(folder) => {
                write_manifests(folder, &serde_json::to_string(&pool)?)?;
            }
            Place::Namespace(_, pools, _) if from == 0 => {
                pools
                    .create(&kube::api::PostParams::default(), &serde_json::from_value(pool)?)
                    .await?;
            }
            Place::Namespace(_, pools, _) => {
                let patch = serde_json::json!({ "spec": { "replicas": to } });
                pools
                    .patch(
                        "bench",
                        &kube::api::PatchParams::default(),
                        &kube::api::Patch::Merge(&patch),
                    )
                    .await?;
            }
        }
        Ok(())
    }

    /// Kubernetes mode: stops the operator and removes what the run left
    /// in the test cluster. Its Proxies keep the operator's finalizer, and
    /// a cluster that kept every run's thousand of them would slow the
    /// runs after it (the controller manager lists them all).
    async fn clean_up(&mut self) -> Result<(), Box<dyn Error>> {
        self.stop();
        let Place::Namespace(proxies, _, namespaces) = &self.proxies else {
            return Ok(());
        };
        let strip = serde_json::json!({ "metadata": { "finalizers": null } });
        let (params, patch) = (kube::api::PatchParams::default(), kube::api::Patch::Merge(&strip));
        let names: Vec<String> = proxies
            .list(&kube::api::ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|p| !p.metadata.finalizers.as_deref().unwrap_or_default().is_empty())
            .filter_map(|p| p.metadata.name)
            .collect();
        let stripped: Vec<_> = futures::stream::iter(&names)
            .map(|name| proxies.patch(name, &params, &patch))
            .buffer_unordered(ADD_IN_FLIGHT)
            .collect()
            .await;
        for result in stripped {
            result?;
        }
        let api: kube::Api<k8s_openapi::api::core::v1::Namespace> =
            kube::Api::all(proxies.as_ref().clone().into_client());
        for namespace in namespaces {
            api.delete(namespace, &kube::api::DeleteParams::default()).await?;
        }
        Ok(())
    }

    async fn metrics_text(&self) -> Option<String> {
        let base = format!("http://{}", self.metrics);
        let (status, body) = client::call(&base, Method::GET, "/metrics", None, None).await.ok()?;
        (status == 200).then_some(body)
    }

    async fn ready(&self) -> bool {
        let base = format!("http://{}", self.api);
        matches!(client::call(&base, Method::GET, "/readyz", None, None).await, Ok((200, _)))
    }

    /// Proxies the operator knows, and of those Running.
    async fn counts(&self) -> Option<(u64, u64)> {
        let text = self.metrics_text().await?;
        let all = metric_sum(&text, "proxyfleet_proxies", None);
        let running = metric_sum(&text, "proxyfleet_proxies", Some("state=\"Running\""));
        Some((all as u64, running as u64))
    }

    /// Polls until `want` Proxies are known and Running; the time from
    /// `since` or, without it, from the first poll that saw more than
    /// `known_before` of them (a manifest is read every 2 s: that wait is
    /// not the provider's).
    async fn time_to_running(
        &mut self,
        known_before: u64,
        want: u64,
        within: Duration,
        since: Option<Instant>,
    ) -> Result<(Duration, Duration), Box<dyn Error>> {
        let started = Instant::now();
        let mut seen = since;
        let mut first_new_running = None;
        let mut said = Instant::now();
        loop {
            self.check_alive()?;
            if let Some((all, running)) = self.counts().await {
                if all > known_before && seen.is_none() {
                    seen = Some(Instant::now());
                }
                if running > known_before && first_new_running.is_none() {
                    first_new_running = seen.map(|seen| seen.elapsed());
                }
                if all >= want && running >= want {
                    let seen = seen.unwrap_or(started);
                    return Ok((seen.elapsed(), first_new_running.unwrap_or_default()));
                }
                if said.elapsed() > Duration::from_secs(15) {
                    eprintln!("scale: {running} of {want} Running ({all} known)");
                    said = Instant::now();
                }
            }
            if started.elapsed() > within {
                return Err(format!("not all {want} Running within {within:?}").into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until the bench entry has made no provider call for 3 s;
    /// the time from now until its last call.
    async fn settle(&mut self, within: Duration) -> Result<Duration, Box<dyn Error>> {
        let started = Instant::now();
        let mut last = (f64::NAN, Instant::now());
        loop {
            self.check_alive()?;
            let calls = self.metrics_text().await.map_or(f64::NAN, |text| bench_calls(&text));
            if calls != last.0 {
                last = (calls, Instant::now());
            } else if last.1.elapsed() >= Duration::from_secs(3) {
                return Ok(last.1 - started);
            }
            if started.elapsed() > within {
                return Err(format!("provider calls went on for {within:?} after a restart").into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// CPU seconds the process has used.
    fn cpu(&self) -> f64 {
        procfs::cpu_seconds(self.pid())
    }

    /// `VmRSS` and `VmHWM` in MiB.
    fn memory(&self) -> (f64, f64) {
        procfs::memory_mib(self.pid())
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Where the machine's CPU went: cumulative seconds, or the difference of
/// two readings. The rest (tinyproxy, whose workers are processes of
/// their own, an API server, anything else running) is what the machine
/// was busy with beyond the operator and this process.
struct Machine {
    busy: f64,
    bench: f64,
}

impl Machine {
    fn now() -> Self {
        Self {
            busy: procfs::machine_busy_seconds(),
            // The simulator runs in this process.
            bench: procfs::cpu_seconds(std::process::id()),
        }
    }

    fn since(&self, before: &Self) -> Self {
        Self { busy: self.busy - before.busy, bench: self.bench - before.bench }
    }
}

/// The sum of the samples of `name` in the metrics text, of those whose
/// labels hold `label` when one is given.
fn metric_sum(text: &str, name: &str, label: Option<&str>) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.strip_prefix(name))
        .filter(|rest| rest.starts_with(['{', ' ']))
        .filter(|rest| label.is_none_or(|label| rest.contains(label)))
        .filter_map(|rest| rest.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
        .sum()
}

/// Health probes made so far, passed or failed.
fn probes(text: &str) -> f64 {
    metric_sum(text, "proxyfleet_health_probes_total", None)
}

fn bench_calls(text: &str) -> f64 {
    metric_sum(text, "proxyfleet_provider_calls_total", Some("entry=\"bench\""))
}

/// Seconds spent in the calls that bring a Proxy up (create and get; the
/// idle entries make only checks).
fn bring_up_seconds(text: &str) -> f64 {
    ["create", "get"]
        .iter()
        .map(|op| {
            let label = format!("operation=\"{op}\"");
            metric_sum(text, "proxyfleet_provider_call_seconds_sum", Some(&label))
        })
        .sum()
}

/// Replaces the standalone operator's manifests with `text` in one rename,
/// so its next read sees all of them or none.
fn write_manifests(folder: &Path, text: &str) -> std::io::Result<()> {
    let next = folder.with_extension("next");
    std::fs::write(&next, text)?;
    std::fs::rename(next, folder.join("proxies.yaml"))
}

/// Creates the bench sends to the API server at once in Kubernetes mode.
const ADD_IN_FLIGHT: usize = 16;

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let options = Options::parse()?;
    let backends = Backends::start(&options).await?;
    let dir = tempfile::tempdir()?;
    let mut operator = Operator::prepare(&options, &backends, dir.path()).await?;
    let result = measure(&options, &backends, &mut operator).await;
    let cleaned = operator.clean_up().await;
    if let Some(keep) = &options.keep_logs {
        std::fs::create_dir_all(keep)?;
        std::fs::copy(&operator.log, keep.join("operator.log"))?;
    }
    result.and(cleaned)
}

async fn measure(
    options: &Options,
    backends: &Backends,
    operator: &mut Operator,
) -> Result<(), Box<dyn Error>> {
    // The first start compiles the plugins; what runs for months is a
    // process that found them compiled.
    let cold = operator.start().await?;
    let (cold_rss, cold_hwm) = operator.memory();
    let ready = operator.start().await?;
    let (empty_rss, _) = operator.memory();

    // One Proxy alone: what bringing one up costs with this entry and
    // backend, in the provider's calls and end to end.
    // Objects in a cluster are seen as soon as they are made.
    let since = || options.kube.then(Instant::now);
    let added = since();
    operator.add(backends, 0, 1).await?;
    let (single, _) = operator.time_to_running(0, 1, Duration::from_secs(120), added).await?;
    let per_proxy = operator.metrics_text().await.map_or(0.0, |text| bring_up_seconds(&text));

    let n = options.proxies;
    let rest = (n - 1) as f64;
    let before = operator.metrics_text().await.unwrap_or_default();
    let (mut calls_before, mut busy_before) = (bench_calls(&before), bring_up_seconds(&before));
    let mut cpu_before = operator.cpu();
    let mut machine_before = Machine::now();
    let mut added = since();
    let adding = Instant::now();
    if options.create_first {
        operator.stop();
    }
    operator.add(backends, 1, n).await?;
    // In a cluster the Proxies are made one request each while the
    // operator already works on the first ones: part of the time to
    // converge is the API server taking them.
    let created = adding.elapsed();
    if options.create_first {
        // A new process: its counters start at nothing, and its start is
        // part of the time.
        (calls_before, busy_before, cpu_before) = (0.0, 0.0, 0.0);
        machine_before = Machine::now();
        added = Some(Instant::now());
        operator.start().await?;
    }
    let (converged, first) =
        operator.time_to_running(1, n as u64, Duration::from_secs(3600), added).await?;
    let converge_cpu = operator.cpu() - cpu_before;
    let machine = Machine::now().since(&machine_before);
    let (rss, hwm) = operator.memory();
    let after = operator.metrics_text().await.unwrap_or_default();
    let calls = bench_calls(&after) - calls_before;
    // Of the call slots the entry's limits allow over that time, the share
    // its create and get calls filled: what the driver leaves unused.
    let busy = bring_up_seconds(&after) - busy_before;
    let filled = busy / (converged.as_secs_f64() * options.concurrency.min(n - 1) as f64);

    let probes_before = probes(&operator.metrics_text().await.unwrap_or_default());
    let idle_before = operator.cpu();
    tokio::time::sleep(options.idle).await;
    let idle_cpu = (operator.cpu() - idle_before) / options.idle.as_secs_f64();
    let (idle_rss, idle_hwm) = operator.memory();
    let text = operator.metrics_text().await.unwrap_or_default();
    let round = metric_sum(&text, "proxyfleet_health_round_seconds", None);
    let healthy = metric_sum(&text, "proxyfleet_proxies_health", Some("state=\"healthy\""));
    let probes_per_second = (probes(&text) - probes_before) / options.idle.as_secs_f64();
    let console = if options.consoles > 0 { Some(consoles(options, operator).await) } else { None };

    // The same settled fleet without probes, to tell what probing costs
    // from the rest: a restart with rounds an hour apart (the first one
    // runs at start), idle again once its start-up calls are over.
    operator.command.args(["--health-interval", "1h"]);
    let restart = operator.start().await?;
    let (restart_rss, _) = operator.memory();
    let settled = operator.settle(Duration::from_secs(600)).await?;
    let quiet_before = operator.cpu();
    tokio::time::sleep(options.idle).await;
    let quiet_cpu = (operator.cpu() - quiet_before) / options.idle.as_secs_f64();
    let per_probe = (idle_cpu - quiet_cpu) / probes_per_second.max(f64::MIN_POSITIVE);

    let waves = (n - 1).div_ceil(options.concurrency) as f64;
    let bound = per_proxy * waves;
    println!(
        "scale: {n} Proxies{} on the {} plugin, {} mode, concurrency {}{}",
        if options.pool { " in one ProxyPool" } else { "" },
        options.entry(),
        if options.kube { "kube" } else { "standalone" },
        options.concurrency,
        if options.gcp { format!(", API latency {:?}", options.latency) } else { String::new() },
    );
    println!(
        "  first start, compiling    {:>10.2} s, RSS {cold_rss:.1} MiB (high-water {cold_hwm:.1} MiB)",
        cold.as_secs_f64()
    );
    println!("  restart, plugins cached   {:>10.2} s, RSS {empty_rss:.1} MiB", ready.as_secs_f64());
    println!(
        "  one Proxy to Running      {:>10.3} s, of which its provider calls {per_proxy:.3} s (t1)",
        single.as_secs_f64()
    );
    println!(
        "  {} more to Running        {:>10.2} s (first {:.2} s); bound {waves} waves × t1 = {bound:.2} s: {:.2}×",
        n - 1,
        converged.as_secs_f64(),
        first.as_secs_f64(),
        converged.as_secs_f64() / bound,
    );
    if options.kube && options.pool {
        println!(
            "  {} scaling the pool {:>10.2} s (one request; the pool controller makes the Proxies)",
            if options.create_first { "before that," } else { "of which" },
            created.as_secs_f64(),
        );
    } else if options.kube {
        // Counted from the first create; the bench looks for Running ones
        // only once it has made them all, so `first` is no earlier.
        println!(
            "  {} creating them    {:>10.2} s ({} requests, {ADD_IN_FLIGHT} at a time)",
            if options.create_first { "before that," } else { "of which" },
            created.as_secs_f64(),
            n - 1
        );
    }
    println!(
        "  call slots filled         {:>10.0} % (a Proxy's calls took {:.3} s under this load)",
        filled * 100.0,
        busy / rest
    );
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let seconds = converged.as_secs_f64();
    println!(
        "  machine while converging  {:>10.2} of {cores} cores busy: operator {:.2}, simulator and bench {:.2}, the rest {:.2}",
        machine.busy / seconds,
        converge_cpu / seconds,
        machine.bench / seconds,
        (machine.busy - converge_cpu - machine.bench) / seconds,
    );
    println!("  provider calls per Proxy  {:>10.2}", calls / rest);
    println!("  operator CPU per Proxy    {:>10.2} ms", converge_cpu / rest * 1000.0);
    println!("  RSS after converging      {rss:>10.1} MiB (high-water {hwm:.1} MiB)");
    println!(
        "  idle CPU over {:>3} s       {:>10.2} % of a core (RSS {idle_rss:.1} MiB, high-water {idle_hwm:.1} MiB)",
        options.idle.as_secs(),
        idle_cpu * 100.0,
    );
    println!(
        "  of which probes           {probes_per_second:>10.0} /s at {:.0} µs of CPU each",
        per_probe * 1e6
    );
    println!("  last probe round          {round:>10.2} s ({healthy} healthy)");
    println!(
        "  restart with {n:<6}       {:>10.2} s to ready, RSS {restart_rss:.1} MiB; start-up calls over after {:.2} s",
        restart.as_secs_f64(),
        settled.as_secs_f64()
    );
    println!(
        "  idle CPU without probes   {:>10.2} % of a core (over {} s)",
        quiet_cpu * 100.0,
        options.idle.as_secs()
    );
    if let Some(console) = console {
        let mut paints = console.paints.clone();
        paints.sort_by(f64::total_cmp);
        println!(
            "  console, Proxies page     first contentful paint {:.0} ms median, {:.0} ms max over {} loads ({} rows a page of {n})",
            paints[paints.len() / 2],
            paints[paints.len() - 1],
            paints.len(),
            console.rows,
        );
        println!(
            "  idle CPU, {} consoles open {:>8.2} % of a core (over {} s): {:+.2} points on none",
            options.consoles,
            console.idle_cpu * 100.0,
            options.idle.as_secs(),
            (console.idle_cpu - idle_cpu) * 100.0,
        );
    }
    Ok(())
}

/// What the console cost over the settled fleet.
struct ConsoleFigures {
    /// First contentful paint of the Proxies page, in ms, per load.
    paints: Vec<f64>,
    /// Rows the page showed.
    rows: u64,
    /// The operator's idle CPU with the consoles open, in cores.
    idle_cpu: f64,
}

/// The pages the open consoles show, in turn.
const CONSOLE_PAGES: [&str; 4] = ["/ui/", "/ui/proxies", "/ui/providers", "/ui/gateway"];

/// Times the Proxies page and idles with `options.consoles` consoles open.
async fn consoles(options: &Options, operator: &Operator) -> ConsoleFigures {
    use proxyfleet_tests::browser::Browser;

    let proxies = format!("http://{}/ui/proxies", operator.api);
    let timing = Browser::start().await;
    let mut paints = Vec::new();
    let mut rows = 0;
    for _ in 0..5 {
        timing.goto(&proxies).await;
        // The paint entry is there once a frame was drawn after the load.
        let mut paint = None;
        for _ in 0..100 {
            paint = timing
                .execute(
                    "const paint = performance.getEntriesByName('first-contentful-paint')[0];
                     return paint ? paint.startTime : null;",
                )
                .await
                .as_f64();
            if paint.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        paints.push(paint.expect("Chromium reports a first contentful paint within 10 s"));
        rows = timing
            .execute("return document.querySelectorAll('#proxies tbody tr').length;")
            .await
            .as_u64()
            .unwrap_or(0);
    }
    timing.close().await;

    let mut open = Vec::new();
    for i in 0..options.consoles {
        let browser = Browser::start().await;
        let page = CONSOLE_PAGES[i % CONSOLE_PAGES.len()];
        browser.goto(&format!("http://{}{page}", operator.api)).await;
        browser.wait_for_text("#live-status", |text| text == "live", Duration::from_secs(30)).await;
        open.push(browser);
    }
    // Let the pages' first fetches pass before measuring.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before = operator.cpu();
    tokio::time::sleep(options.idle).await;
    let idle_cpu = (operator.cpu() - before) / options.idle.as_secs_f64();
    for browser in open {
        browser.close().await;
    }
    ConsoleFigures { paints, rows, idle_cpu }
}
