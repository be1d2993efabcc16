//! Faults at scale: the operator keeps N Proxies (some in ProxyPools) on
//! the gcp and proxmox simulators while the simulators answer with random
//! faults, the operator is killed with SIGKILL at random moments and
//! started again, and Proxies are deleted, created and pools scaled. A
//! second installation with entries of the same names shares both
//! simulators, beside instances no proxyfleet made.
//!
//! `--mode standalone` (the default) runs `proxyfleet standalone` on
//! manifest files; `--mode kube` runs two replicas of `proxyfleet run`
//! against the test API server (`deploy/dev/kube-apiserver/start.sh`) with
//! the Proxies as objects there, and kills whichever holds the leader
//! Lease.
//!
//! ```text
//! cargo xtask plugins
//! cargo bench [--profile dev] -p proxyfleet-operator --bench chaos -- \
//!     [--mode standalone|kube] [--proxies N] [--chaos-secs S] [--settle-secs S] [--seed N] \
//!     [--keep-logs DIR]
//! ```
//!
//! Once the chaos ends and the faults stop, it waits for the fleet to
//! converge and checks, and prints: exactly one instance per Proxy; no
//! instance of the installation that no Proxy owns (orphan collection has
//! run); no deletion of an instance of the other installation or without
//! our mark; no secret in any log line of either operator. It prints the
//! time to converge and the provider API requests per Proxy (from the
//! operator's debug line per request), and exits 1 when an invariant is
//! broken. A figure and a check, not a timed test: the machines that run
//! it are shared.

#![allow(clippy::print_stdout, reason = "a bench binary prints its figures")]

use std::collections::{BTreeMap, BTreeSet};
use std::error::Error;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use http::Method;
use k8s_openapi::api::coordination::v1::Lease;
use proxyfleet_fleet::client;
use proxyfleet_gce_sim as gce;
use proxyfleet_kube::crd::{Proxy, ProxyPool};
use proxyfleet_pve_sim as pve;
use proxyfleet_tests::ports::free_port;
use proxyfleet_tests::{localhost_tls, plugin};
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};

const PROJECT: &str = "chaos";
const EMAIL: &str = "chaos@chaos.iam.gserviceaccount.com";
const PVE_TOKEN: &str = "root@pam!proxyfleet=6f0e4c1a-93b2-4d87-a5e1-2c9d7b3f8a40";
const TEMPLATE: u32 = 100;
/// The installation under chaos, and the bystander.
const OURS: &str = "chaos-a";
const THEIRS: &str = "chaos-b";
const ENTRIES: [&str; 2] = ["gcp", "pve"];

/// What to run, from the command line.
#[derive(Debug)]
struct Options {
    kube: bool,
    proxies: usize,
    chaos: Duration,
    settle: Duration,
    seed: u64,
    /// Where to copy the operators' logs at the end.
    keep_logs: Option<PathBuf>,
}

impl Options {
    fn parse() -> Result<Self, Box<dyn Error>> {
        let mut options = Self {
            kube: false,
            proxies: 1000,
            chaos: Duration::from_secs(60),
            settle: Duration::from_secs(900),
            seed: 1,
            keep_logs: None,
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
                "--proxies" => options.proxies = value()?.parse()?,
                "--chaos-secs" => options.chaos = Duration::from_secs(value()?.parse()?),
                "--settle-secs" => options.settle = Duration::from_secs(value()?.parse()?),
                "--seed" => options.seed = value()?.parse()?,
                "--keep-logs" => options.keep_logs = Some(value()?.into()),
                other => return Err(format!("unknown flag {other}").into()),
            }
        }
        if options.proxies < 10 {
            return Err("--proxies: use 10 or more".into());
        }
        Ok(options)
    }
}

/// Both simulators and the files every installation's entries read.
struct Backends {
    gce: gce::Simulator,
    pve: pve::Simulator,
    dir: tempfile::TempDir,
    /// Secrets that must never reach a log line.
    secrets: Vec<String>,
}

impl Backends {
    async fn start() -> Result<Self, Box<dyn Error>> {
        let (ca, cert, key) = localhost_tls();
        let gce = gce::Simulator::start(
            gce::SimOptions {
                projects: vec![PROJECT.to_owned()],
                zones: vec!["europe-west1-b".to_owned()],
                token_lifetime: Duration::from_secs(3600),
                operation_duration: Duration::from_millis(200),
                boot_duration: Duration::from_millis(100),
                ..gce::SimOptions::default()
            },
            &cert,
            &key,
        )
        .await?;
        let pve = pve::Simulator::start(
            pve::SimOptions {
                token: PVE_TOKEN.to_owned(),
                clone_duration: Duration::from_millis(300),
                task_duration: Duration::from_millis(50),
                agent_delay: Duration::from_millis(100),
                ..pve::SimOptions::default()
            },
            &cert,
            &key,
        )
        .await?;
        pve.add_template("pve1", TEMPLATE, "debian-12", 8);
        let sa_key = gce.create_key(EMAIL)?;
        let dir = tempfile::tempdir()?;
        std::fs::create_dir(dir.path().join("plugins"))?;
        std::fs::copy(plugin("gcp"), dir.path().join("plugins/gcp.wasm"))?;
        std::fs::copy(plugin("proxmox"), dir.path().join("plugins/proxmox.wasm"))?;
        std::fs::write(dir.path().join("ca.pem"), ca)?;
        std::fs::write(dir.path().join("gcp-key.json"), &sa_key.json)?;
        std::fs::write(dir.path().join("pve-token"), format!("{PVE_TOKEN}\n"))?;
        let key: serde_json::Value = serde_json::from_str(&sa_key.json)?;
        let pem = key["private_key"].as_str().unwrap_or_default();
        let mut secrets = vec![PVE_TOKEN.split('=').nth(1).unwrap_or(PVE_TOKEN).to_owned()];
        // Any line of the key's body is a leak.
        secrets.extend(
            pem.lines()
                .filter(|line| !line.starts_with("-----") && line.len() > 20)
                .map(str::to_owned),
        );
        Ok(Self { gce, pve, dir, secrets })
    }

    /// The providers file both installations use: entries of the same
    /// names on the same backends.
    fn providers(&self) -> String {
        let dir = self.dir.path();
        let gcp = proxyfleet_tests::gcp::sim_entry(
            "gcp",
            &self.gce.endpoint(),
            PROJECT,
            &dir.join("ca.pem"),
            &dir.join("gcp-key.json"),
        );
        format!(
            "providers:
{gcp}    limits: {{ concurrency: 32, timeout: 30s }}
  - name: pve
    plugin: proxmox
    proxyAddresses: ['127.0.0.0/8']
    config:
      url: https://localhost:{port}
      nodes: [pve1]
      templates: {{ debian-12: {TEMPLATE} }}
      isoStorage: local
      vmidRange: {{ first: 1000, last: 99999 }}
      taskPollMs: 50
    limits: {{ concurrency: 32, timeout: 30s }}
    grants:
      caFile: {ca}
      http:
        - url: https://localhost:{port}
          allowAddresses: [127.0.0.1, '::1']
          credential: {{ header: Authorization, valueTemplate: 'PVEAPIToken={{secret}}', secretFile: {token} }}
",
            port = self.pve.addr().port(),
            ca = dir.join("ca.pem").display(),
            token = dir.join("pve-token").display(),
        )
    }

    /// Faults during the chaos: latency and a share of 5xx and 429 on
    /// both, and now and then a burst of lost insert and delete responses
    /// (dropped connections), quota refusals, lock timeouts and uploads cut
    /// off mid-body.
    fn set_faults(&self, burst: bool) {
        self.gce.set_faults(gce::Faults {
            latency: Duration::from_millis(5),
            server_error_every: 37,
            rate_limit_every: 41,
            lose_insert_responses: if burst { 3 } else { 0 },
            lose_delete_responses: if burst { 3 } else { 0 },
            quota_exceeded: burst,
            ..gce::Faults::default()
        });
        self.pve.set_faults(pve::Faults {
            latency: Duration::from_millis(5),
            server_error_every: 29,
            lock_timeout: burst,
            drop_upload: burst,
            ..pve::Faults::default()
        });
    }

    fn clear_faults(&self) {
        self.gce.set_faults(gce::Faults::default());
        self.pve.set_faults(pve::Faults::default());
    }

    /// UIDs in the marks of the live instances of `installation`, each as
    /// often as an instance carries it.
    fn marked(&self, installation: &str) -> BTreeMap<String, usize> {
        let mut uids = BTreeMap::new();
        for instance in self.gce.instances() {
            let stopping = matches!(instance.status.as_str(), "STOPPING" | "TERMINATED");
            if !stopping
                && instance.labels.get("proxyfleet-installation").map(String::as_str)
                    == Some(installation)
                && let Some(uid) = instance.labels.get("proxyfleet-uid")
            {
                *uids.entry(uid.clone()).or_default() += 1;
            }
        }
        for vm in self.pve.vms() {
            let description = vm.config.get("description").map(String::as_str).unwrap_or("");
            if text_value(description, "proxyfleet.io/installation:") == Some(installation)
                && let Some(uid) = text_value(description, "proxyfleet.io/uid:")
            {
                *uids.entry(uid.to_owned()).or_default() += 1;
            }
        }
        uids
    }

    /// Names of the instances no installation marked but named like ours:
    /// a clone interrupted before its mark, never finished nor removed.
    fn unmarked_ours(&self) -> Vec<String> {
        self.pve
            .vms()
            .into_iter()
            .filter(|vm| vm.vmid != TEMPLATE && vm.vmid >= 1000)
            .filter(|vm| {
                !vm.config.get("description").is_some_and(|d| d.contains("proxyfleet.io/uid:"))
            })
            .filter(|vm| vm.lock.is_none())
            .map(|vm| format!("pve/{}", vm.vmid))
            .collect()
    }

    /// Deletions of instances that are not `ours`: another installation's,
    /// or no installation's.
    fn foreign_deletions(&self, ours: &str) -> Vec<String> {
        let mut found: Vec<String> = self
            .gce
            .deletions()
            .into_iter()
            .filter(|d| d.labels.get("proxyfleet-installation").map(String::as_str) != Some(ours))
            .filter(|d| d.labels.get("proxyfleet-installation").map(String::as_str) != Some(THEIRS))
            .map(|d| format!("gce {} (labels {:?})", d.name, d.labels))
            .collect();
        found.extend(
            self.pve
                .destroyed()
                .into_iter()
                .filter(|vm| {
                    let description = vm.config.get("description").map(String::as_str);
                    let installation =
                        description.and_then(|d| text_value(d, "proxyfleet.io/installation:"));
                    // A half-made clone (no mark yet) of ours may be removed.
                    installation.is_some_and(|i| i != ours && i != THEIRS)
                        || description.is_some_and(|d| d.contains("not proxyfleet"))
                })
                .map(|vm| format!("pve {}", vm.vmid)),
        );
        found
    }

    /// Deletions of `theirs`' instances.
    fn deletions_of(&self, theirs: &str) -> usize {
        let gce = self
            .gce
            .deletions()
            .iter()
            .filter(|d| d.labels.get("proxyfleet-installation").map(String::as_str) == Some(theirs))
            .count();
        let pve = self
            .pve
            .destroyed()
            .iter()
            .filter(|vm| {
                vm.config
                    .get("description")
                    .and_then(|d| text_value(d, "proxyfleet.io/installation:"))
                    == Some(theirs)
            })
            .count();
        gce + pve
    }
}

/// The trimmed rest of the first line of `text` that starts with `key`.
fn text_value<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines().find_map(|line| line.trim().strip_prefix(key)).map(str::trim)
}

/// The Proxies an installation wants: plain ones and pools, by name.
#[derive(Debug, Clone, Default)]
struct Desired {
    plain: BTreeMap<String, &'static str>,
    pools: BTreeMap<String, (&'static str, usize)>,
    next: usize,
}

impl Desired {
    fn new(proxies: usize, with_pools: bool) -> Self {
        let mut desired = Self::default();
        let pooled = if with_pools { proxies / 5 } else { 0 };
        if with_pools {
            for (i, entry) in ["gcp", "pve", "gcp", "pve"].into_iter().enumerate() {
                desired.pools.insert(format!("pool-{i}"), (entry, pooled / 4));
            }
        }
        for _ in 0..proxies - pooled / 4 * 4 {
            desired.add();
        }
        desired
    }

    fn add(&mut self) {
        let entry = ENTRIES[self.next % 2];
        self.plain.insert(format!("p-{}", self.next), entry);
        self.next += 1;
    }

    fn count(&self) -> usize {
        self.plain.len() + self.pools.values().map(|(_, n)| n).sum::<usize>()
    }

    fn yaml(&self) -> String {
        let mut out = String::new();
        for (name, entry) in &self.plain {
            out.push_str(&format!(
                "apiVersion: proxyfleet.io/v1alpha1\nkind: Proxy\nmetadata: {{ name: {name} }}\nspec: {{ provider: {entry}, image: debian-12 }}\n---\n"
            ));
        }
        for (name, (entry, replicas)) in &self.pools {
            out.push_str(&format!(
                "apiVersion: proxyfleet.io/v1alpha1\nkind: ProxyPool\nmetadata: {{ name: {name} }}\nspec: {{ replicas: {replicas}, template: {{ spec: {{ provider: {entry}, image: debian-12 }} }} }}\n---\n"
            ));
        }
        out
    }
}

/// An installation the chaos acts on, in either mode.
trait Installation {
    /// Its installation ID.
    fn id(&self) -> &'static str;
    /// Makes the Proxies and pools `desired` says exist.
    async fn apply(&mut self, desired: &Desired) -> Result<(), Box<dyn Error>>;
    /// `(uid, phase)` of every Proxy; `None` while that cannot be read.
    async fn proxies(&self) -> Option<Vec<(String, String)>>;
    /// Kills an operator process with SIGKILL (the leader, when there are
    /// several) and starts it again.
    async fn kill_one(&mut self) -> Result<(), Box<dyn Error>>;
    /// Every log file its processes wrote.
    fn logs(&self) -> Vec<PathBuf>;
}

/// Provider API requests in `logs` (one debug line each).
fn requests_logged(logs: &[PathBuf]) -> std::io::Result<usize> {
    let mut requests = 0;
    for log in logs {
        let text = std::fs::read_to_string(log)?;
        requests += text.lines().filter(|line| line.contains("proxyfleet::request")).count();
    }
    Ok(requests)
}

/// One standalone installation as a process that can be killed.
struct Operator {
    id: &'static str,
    dir: tempfile::TempDir,
    providers: PathBuf,
    plugins: PathBuf,
    api: String,
    child: Option<Child>,
    starts: u32,
}

impl Operator {
    fn new(id: &'static str, backends: &Backends) -> Result<Self, Box<dyn Error>> {
        let dir = tempfile::tempdir()?;
        std::fs::create_dir(dir.path().join("proxies"))?;
        let providers = dir.path().join("providers.yaml");
        std::fs::write(&providers, backends.providers())?;
        Ok(Self {
            id,
            providers,
            plugins: backends.dir.path().join("plugins"),
            api: format!("127.0.0.1:{}", free_port()),
            dir,
            child: None,
            starts: 0,
        })
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("operator.log")
    }

    fn start(&mut self) -> Result<(), Box<dyn Error>> {
        let log = OpenOptions::new().create(true).append(true).open(self.log())?;
        let child = Command::new(env!("CARGO_BIN_EXE_proxyfleet"))
            .args(["-v", "--log-format", "text", "standalone", "--providers"])
            .arg(&self.providers)
            .arg("--plugin-dir")
            .arg(&self.plugins)
            .arg("--cache-dir")
            .arg(self.plugins.join("../cache"))
            .arg("--proxies")
            .arg(self.dir.path().join("proxies"))
            .arg("--state")
            .arg(self.dir.path().join("state.redb"))
            .args(["--installation-id", self.id, "--api-addr", &self.api])
            .args(["--metrics-addr", "127.0.0.1:0", "--gc-interval", "3s", "--gc-min-age", "5s"])
            .args(["--health-interval", "30s"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?;
        self.child = Some(child);
        self.starts += 1;
        Ok(())
    }

    /// SIGKILL: nothing is written on the way out.
    fn kill(&mut self) {
        kill(&mut self.child);
    }

    /// `(uid, phase)` of every Proxy the API lists; `None` while it does
    /// not answer.
    async fn listed(&self) -> Option<Vec<(String, String)>> {
        let base = format!("http://{}", self.api);
        let (status, body) =
            client::call(&base, Method::GET, "/v1/proxies", None, None).await.ok()?;
        let list: serde_json::Value = serde_json::from_str(&body).ok().filter(|_| status == 200)?;
        Some(
            list["items"]
                .as_array()?
                .iter()
                .map(|item| {
                    (
                        item["id"].as_str().unwrap_or_default().to_owned(),
                        item["phase"].as_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect(),
        )
    }
}

impl Installation for Operator {
    fn id(&self) -> &'static str {
        self.id
    }

    /// Writes the manifests whole, so the operator never reads half a file.
    async fn apply(&mut self, desired: &Desired) -> Result<(), Box<dyn Error>> {
        let next = self.dir.path().join("proxies.next");
        std::fs::write(&next, desired.yaml())?;
        std::fs::rename(next, self.dir.path().join("proxies/proxies.yaml"))?;
        Ok(())
    }

    async fn proxies(&self) -> Option<Vec<(String, String)>> {
        self.listed().await
    }

    async fn kill_one(&mut self) -> Result<(), Box<dyn Error>> {
        self.kill();
        self.start()
    }

    fn logs(&self) -> Vec<PathBuf> {
        vec![self.log()]
    }
}

/// SIGKILLs `child`, if it runs, and reaps it.
fn kill(child: &mut Option<Child>) {
    if let Some(mut child) = child.take() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One installation in the test cluster: two replicas of `proxyfleet run`
/// electing a leader, the Proxies and pools as objects.
struct Cluster {
    client: kube::Client,
    /// The replicas' namespace: the leader Lease and the store ConfigMaps.
    namespace: String,
    /// The Proxies' namespace.
    watch: String,
    dir: tempfile::TempDir,
    providers: PathBuf,
    plugins: PathBuf,
    replicas: Vec<(String, Option<Child>)>,
    /// What the API server holds now.
    applied: Desired,
    /// Replicas started in place of killed ones.
    generation: usize,
}

const LEASE: &str = "chaos-leader";

impl Cluster {
    async fn new(backends: &Backends) -> Result<Self, Box<dyn Error>> {
        let client = proxyfleet_tests::kube_admin_client().await;
        proxyfleet_tests::kube_install_crds(&client).await;
        let namespace = proxyfleet_tests::kube_test_namespace(&client, "chaos-operator").await;
        let watch = proxyfleet_tests::kube_test_namespace(&client, "chaos-proxies").await;
        let dir = tempfile::tempdir()?;
        let providers = dir.path().join("providers.yaml");
        std::fs::write(&providers, backends.providers())?;
        let mut cluster = Self {
            client,
            namespace,
            watch,
            dir,
            providers,
            plugins: backends.dir.path().join("plugins"),
            replicas: vec![("replica-0".to_owned(), None), ("replica-1".to_owned(), None)],
            applied: Desired::default(),
            generation: 0,
        };
        for index in 0..cluster.replicas.len() {
            cluster.start(index)?;
        }
        Ok(cluster)
    }

    fn log(&self, index: usize) -> PathBuf {
        self.dir.path().join(format!("replica-{index}.log"))
    }

    fn start(&mut self, index: usize) -> Result<(), Box<dyn Error>> {
        let log = OpenOptions::new().create(true).append(true).open(self.log(index))?;
        let api = format!("127.0.0.1:{}", free_port());
        let child = Command::new(env!("CARGO_BIN_EXE_proxyfleet"))
            .env("KUBECONFIG", proxyfleet_tests::kube_state_dir().join("kubeconfig"))
            .env_remove("POD_NAME")
            .env_remove("POD_NAMESPACE")
            .args(["-v", "--log-format", "text", "run", "--providers"])
            .arg(&self.providers)
            .arg("--plugin-dir")
            .arg(&self.plugins)
            .arg("--cache-dir")
            .arg(self.plugins.join("../cache"))
            .args(["--namespace", &self.namespace, "--watch-namespace", &self.watch])
            .args(["--identity", &self.replicas[index].0, "--lease-name", LEASE])
            .args(["--lease-duration", "6s", "--installation-id", OURS, "--api-addr", &api])
            .args(["--metrics-addr", "127.0.0.1:0", "--gc-interval", "3s", "--gc-min-age", "5s"])
            .args(["--health-interval", "30s"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?;
        self.replicas[index].1 = Some(child);
        Ok(())
    }

    fn proxies_api(&self) -> kube::Api<Proxy> {
        kube::Api::namespaced(self.client.clone(), &self.watch)
    }

    fn pools_api(&self) -> kube::Api<ProxyPool> {
        kube::Api::namespaced(self.client.clone(), &self.watch)
    }
}

impl Installation for Cluster {
    fn id(&self) -> &'static str {
        OURS
    }

    async fn apply(&mut self, desired: &Desired) -> Result<(), Box<dyn Error>> {
        let (proxies, pools) = (self.proxies_api(), self.pools_api());
        let post = kube::api::PostParams::default();
        for name in self.applied.plain.keys().filter(|name| !desired.plain.contains_key(*name)) {
            proxies.delete(name, &kube::api::DeleteParams::default()).await?;
        }
        for (name, entry) in
            desired.plain.iter().filter(|(n, _)| !self.applied.plain.contains_key(*n))
        {
            let proxy: Proxy = serde_json::from_value(serde_json::json!({
                "apiVersion": "proxyfleet.io/v1alpha1",
                "kind": "Proxy",
                "metadata": { "name": name },
                "spec": { "provider": entry, "image": "debian-12" },
            }))?;
            proxies.create(&post, &proxy).await?;
        }
        for (name, (entry, replicas)) in &desired.pools {
            match self.applied.pools.get(name) {
                None => {
                    let pool: ProxyPool = serde_json::from_value(serde_json::json!({
                        "apiVersion": "proxyfleet.io/v1alpha1",
                        "kind": "ProxyPool",
                        "metadata": { "name": name },
                        "spec": {
                            "replicas": replicas,
                            "template": { "spec": { "provider": entry, "image": "debian-12" } },
                        },
                    }))?;
                    pools.create(&post, &pool).await?;
                }
                Some((_, applied)) if applied != replicas => {
                    let patch = serde_json::json!({ "spec": { "replicas": replicas } });
                    let params = kube::api::PatchParams::default();
                    pools.patch(name, &params, &kube::api::Patch::Merge(&patch)).await?;
                }
                Some(_) => {}
            }
        }
        self.applied = desired.clone();
        Ok(())
    }

    async fn proxies(&self) -> Option<Vec<(String, String)>> {
        let list = self.proxies_api().list(&kube::api::ListParams::default()).await.ok()?;
        Some(
            list.items
                .into_iter()
                .map(|proxy| {
                    let phase = proxy.status.as_ref().map_or("Pending".to_owned(), |status| {
                        serde_json::to_value(status.phase)
                            .ok()
                            .and_then(|v| v.as_str().map(str::to_owned))
                            .unwrap_or_default()
                    });
                    let phase = if proxy.metadata.deletion_timestamp.is_some() {
                        "Deleting".to_owned()
                    } else {
                        phase
                    };
                    (proxy.metadata.uid.unwrap_or_default(), phase)
                })
                .collect(),
        )
    }

    /// Kills the replica holding the leader Lease (either, when none does)
    /// and starts a new one in its place under a new identity, as a
    /// replaced pod would be: the survivor takes over once the Lease
    /// lapses.
    async fn kill_one(&mut self) -> Result<(), Box<dyn Error>> {
        let leases: kube::Api<Lease> = kube::Api::namespaced(self.client.clone(), &self.namespace);
        let holder = leases
            .get_opt(LEASE)
            .await?
            .and_then(|lease| lease.spec)
            .and_then(|spec| spec.holder_identity);
        let index = self
            .replicas
            .iter()
            .position(|(identity, _)| Some(identity) == holder.as_ref())
            .unwrap_or(0);
        kill(&mut self.replicas[index].1);
        self.generation += 1;
        self.replicas[index].0 = format!("replica-{index}-{}", self.generation);
        self.start(index)
    }

    fn logs(&self) -> Vec<PathBuf> {
        (0..self.replicas.len()).map(|index| self.log(index)).collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for (_, child) in &mut self.replicas {
            kill(child);
        }
    }
}

/// What the fleet looks like against what it should: each a broken
/// invariant when not empty.
#[derive(Debug, Default)]
struct Check {
    not_running: usize,
    missing: Vec<String>,
    duplicated: Vec<String>,
    orphans: Vec<String>,
    unmarked: Vec<String>,
}

impl Check {
    async fn of(
        installation: &impl Installation,
        backends: &Backends,
        desired: &Desired,
    ) -> Option<Self> {
        let proxies = installation.proxies().await?;
        let marked = backends.marked(installation.id());
        let live: BTreeSet<&String> = proxies.iter().map(|(uid, _)| uid).collect();
        let mut check = Self {
            not_running: proxies.iter().filter(|(_, phase)| phase != "Running").count()
                + desired.count().saturating_sub(proxies.len()),
            unmarked: backends.unmarked_ours(),
            ..Self::default()
        };
        for uid in &live {
            match marked.get(*uid) {
                None => check.missing.push((*uid).clone()),
                Some(1) => {}
                Some(_) => check.duplicated.push((*uid).clone()),
            }
        }
        check.orphans = marked.keys().filter(|uid| !live.contains(uid)).cloned().collect();
        Some(check)
    }

    fn converged(&self) -> bool {
        self.not_running == 0
            && self.missing.is_empty()
            && self.duplicated.is_empty()
            && self.orphans.is_empty()
            && self.unmarked.is_empty()
    }
}

async fn wait_converged(
    installation: &impl Installation,
    backends: &Backends,
    desired: &Desired,
    within: Duration,
) -> (Duration, Option<Check>) {
    let started = Instant::now();
    let mut last = None;
    let mut said = Instant::now();
    while started.elapsed() < within {
        if let Some(check) = Check::of(installation, backends, desired).await {
            if check.converged() {
                return (started.elapsed(), Some(check));
            }
            if said.elapsed() > Duration::from_secs(15) {
                // Where a slow convergence stands, on stderr beside the figures.
                eprintln!(
                    "chaos: {:.0} s: {} not Running, {} without an instance, {} with more than one, {} orphans, {} unmarked",
                    started.elapsed().as_secs_f64(),
                    check.not_running,
                    check.missing.len(),
                    check.duplicated.len(),
                    check.orphans.len(),
                    check.unmarked.len(),
                );
                said = Instant::now();
            }
            last = Some(check);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    (started.elapsed(), last)
}

/// Lines of `log` holding any of `secrets`.
fn leaks(log: &Path, secrets: &[String]) -> std::io::Result<usize> {
    let log = std::fs::read_to_string(log)?;
    Ok(log
        .lines()
        .filter(|line| secrets.iter().any(|secret| line.contains(secret.as_str())))
        .count())
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(err) => {
            eprintln!("chaos: {err}");
            ExitCode::FAILURE
        }
    }
}

/// What one chaos run did and found.
#[derive(Debug, Default)]
struct Outcome {
    kills: usize,
    deleted: usize,
    added: usize,
    scaled: usize,
    bursts: usize,
    took: Duration,
    check: Option<Check>,
    logs: Vec<PathBuf>,
}

/// Runs the chaos on `installation`, then stops the faults and waits for
/// the fleet to converge.
async fn chaos(
    installation: &mut impl Installation,
    backends: &Backends,
    desired: &mut Desired,
    options: &Options,
    rng: &mut StdRng,
) -> Result<Outcome, Box<dyn Error>> {
    let mut outcome = Outcome::default();
    let initial_pool = options.proxies / 20;
    let churn = options.proxies / 50 + 1;
    installation.apply(desired).await?;
    let started = Instant::now();
    while started.elapsed() < options.chaos {
        tokio::time::sleep(Duration::from_millis(rng.random_range(500..3000))).await;
        match rng.random_range(0..100) {
            0..30 => {
                installation.kill_one().await?;
                outcome.kills += 1;
            }
            30..50 => {
                for _ in 0..rng.random_range(1..=churn) {
                    let names: Vec<String> = desired.plain.keys().cloned().collect();
                    if let Some(name) = names.get(rng.random_range(0..names.len().max(1))) {
                        desired.plain.remove(name);
                        outcome.deleted += 1;
                    }
                }
                installation.apply(desired).await?;
            }
            50..70 => {
                for _ in 0..rng.random_range(1..=churn) {
                    desired.add();
                    outcome.added += 1;
                }
                installation.apply(desired).await?;
            }
            70..85 => {
                let pool = format!("pool-{}", rng.random_range(0..4));
                if let Some((_, replicas)) = desired.pools.get_mut(&pool) {
                    *replicas = rng.random_range(0..=initial_pool * 2);
                    outcome.scaled += 1;
                }
                installation.apply(desired).await?;
            }
            _ => {
                backends.set_faults(true);
                tokio::time::sleep(Duration::from_secs(1)).await;
                backends.set_faults(false);
                outcome.bursts += 1;
            }
        }
    }
    backends.clear_faults();
    let (took, check) = wait_converged(installation, backends, desired, options.settle).await;
    outcome.took = took;
    outcome.check = check;
    outcome.logs = installation.logs();
    Ok(outcome)
}

async fn run() -> Result<bool, Box<dyn Error>> {
    let options = Options::parse()?;
    let mut rng = StdRng::seed_from_u64(options.seed);
    let backends = Backends::start().await?;
    // Someone else's instances on both backends.
    backends.gce.add_foreign_instance(PROJECT, "europe-west1-b", "db-1", &[("team", "data")]);
    backends.pve.add_foreign_vm("pve1", 500, "db", "not proxyfleet", "");

    // The bystander: its own few Proxies, settled before the chaos starts.
    let mut theirs = Operator::new(THEIRS, &backends)?;
    let their_fleet = Desired::new(10, false);
    theirs.apply(&their_fleet).await?;
    theirs.start()?;
    let (_, settled) = wait_converged(&theirs, &backends, &their_fleet, options.settle).await;
    if !settled.as_ref().is_some_and(Check::converged) {
        return Err(format!("the second installation never settled: {settled:?}").into());
    }
    let their_instances = backends.marked(THEIRS);

    let mut desired = Desired::new(options.proxies, true);
    backends.set_faults(false);
    // The installation lives (its processes and their logs) until the
    // checks below have read the logs.
    let (outcome, _ours): (Outcome, Box<dyn std::any::Any>) = if options.kube {
        let mut ours = Cluster::new(&backends).await?;
        (chaos(&mut ours, &backends, &mut desired, &options, &mut rng).await?, Box::new(ours))
    } else {
        let mut ours = Operator::new(OURS, &backends)?;
        ours.start()?;
        (chaos(&mut ours, &backends, &mut desired, &options, &mut rng).await?, Box::new(ours))
    };
    let converged = outcome.check.as_ref().is_some_and(Check::converged);

    let mut secrets = backends.secrets.clone();
    secrets.extend(backends.gce.tokens_issued().into_iter().map(|grant| grant.access_token));
    let mut leaked = 0;
    for log in outcome.logs.iter().chain(theirs.logs().iter()) {
        leaked += leaks(log, &secrets)?;
    }
    let theirs_deleted = backends.deletions_of(THEIRS);
    let their_now = backends.marked(THEIRS);
    let foreign = backends.foreign_deletions(OURS);
    let requests = requests_logged(&outcome.logs)?;
    if let Some(keep) = &options.keep_logs {
        std::fs::create_dir_all(keep)?;
        let theirs_logs = theirs.logs();
        for (index, log) in outcome.logs.iter().chain(theirs_logs.iter()).enumerate() {
            std::fs::copy(
                log,
                keep.join(format!(
                    "{index}-{}",
                    log.file_name().unwrap_or_default().to_string_lossy()
                )),
            )?;
        }
    }

    let mode = if options.kube { "kube (2 replicas)" } else { "standalone" };
    println!("chaos: {mode}, {} Proxies at the start, seed {}", options.proxies, options.seed);
    println!(
        "  {:.0} s of chaos: {} kills (SIGKILL), {} Proxies deleted, {} created, {} pool scalings, {} fault bursts",
        options.chaos.as_secs_f64(),
        outcome.kills,
        outcome.deleted,
        outcome.added,
        outcome.scaled,
        outcome.bursts,
    );
    println!("  {} Proxies at the end", desired.count());
    println!(
        "  converged {} {:.1} s after the chaos ended",
        if converged { "in" } else { "NOT within" },
        outcome.took.as_secs_f64()
    );
    println!(
        "  provider API requests: {requests} ({:.2} per Proxy ever wanted)",
        requests as f64 / (options.proxies + outcome.added) as f64
    );
    let mut broken = Vec::new();
    match &outcome.check {
        Some(check) => {
            let rows = [
                ("Proxies not Running", check.not_running),
                ("Proxies without an instance", check.missing.len()),
                ("Proxies with more than one instance", check.duplicated.len()),
                ("orphans (our instances no Proxy owns)", check.orphans.len()),
                ("unmarked instances left by interrupted creates", check.unmarked.len()),
            ];
            for (what, count) in rows {
                println!("  {what}: {count}");
                if count > 0 {
                    broken.push(what);
                }
            }
            if !converged {
                println!("  last check: {check:?}");
            }
        }
        None => broken.push("the Proxies could never be read"),
    }
    println!("  deletions of the other installation's instances: {theirs_deleted}");
    println!("  deletions of instances without a proxyfleet mark: {}", foreign.len());
    println!("  log lines holding a secret: {leaked}");
    if theirs_deleted > 0 || their_now != their_instances {
        broken.push("the other installation's instances were touched");
    }
    if !foreign.is_empty() {
        println!("    {foreign:?}");
        broken.push("instances without our mark were deleted");
    }
    if leaked > 0 {
        broken.push("secrets in the logs");
    }
    if requests == 0 || secrets.len() < 2 {
        // The log checks would have passed on nothing.
        broken.push("the logs hold no provider request, or no secret was known to look for");
    }
    if broken.is_empty() {
        println!("chaos: every invariant holds");
        Ok(true)
    } else {
        println!("chaos: BROKEN: {}", broken.join("; "));
        Ok(false)
    }
}
