//! `proxyfleet`: the operator binary.

mod api_call;
mod descriptors;
mod fleet_args;
mod malloc;
mod plugin_fields;
mod plugin_new;
mod plugin_test;
mod plugin_watch;
mod registry_args;
mod shutdown;
mod signing_args;
mod telemetry;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};
use proxyfleet_core::installation::{self, InstallationId};
use proxyfleet_core::kv::MemoryKv;
use proxyfleet_core::liveness::Watchdog;
use proxyfleet_core::proxy::{ConditionType, Phase};
use proxyfleet_core::reconcile::Policy;
use proxyfleet_kube::credential_secrets::CredentialSecrets;
use proxyfleet_kube::kv::ConfigMapKv;
use proxyfleet_kube::lease::{ElectionConfig, LeaderElector};
use proxyfleet_kube::operate::{LeaderFleet, LeaderSettings, lead, mark_leader};
use proxyfleet_metrics::MetricsOptions;
use proxyfleet_oci::PullLimits;
use proxyfleet_runtime::config::ProvidersConfig;
use proxyfleet_runtime::follow::FollowOptions;
use proxyfleet_runtime::{EntryState, PluginProvider, Registry, Runtime, RuntimeOptions};
use proxyfleet_standalone::{Settings, Standalone, StateDb};

use crate::fleet_args::FleetArgs;

#[derive(Debug, Parser)]
#[command(name = "proxyfleet", version, about = "Keeps fleets of egress proxies alive")]
struct Cli {
    /// Log format on stderr: `auto` is JSON unless stderr is a terminal
    /// (JSON in a Pod, readable text when run by hand).
    #[arg(long, value_enum, default_value_t = LogFormat::Auto, global = true)]
    log_format: LogFormat,
    /// More log output (-v debug, -vv trace); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    /// Export spans over OTLP/HTTP (protobuf) to this collector, e.g.
    /// http://otel-collector:4318 (they go to its /v1/traces).
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT", global = true)]
    otlp_endpoint: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Auto,
    Json,
    Text,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Provider entries: load them and run their checks.
    Providers {
        #[command(subcommand)]
        command: ProvidersCommand,
    },
    /// Plugin files.
    Plugin {
        #[command(subcommand)]
        command: PluginCommand,
    },
    /// Runs in a Kubernetes cluster: reconciles Proxy objects while holding
    /// the leader Lease.
    Run(RunArgs),
    /// GETs paths from a running operator's API and fails naming each that
    /// does not answer 2xx (the chart's `helm test` hook runs it).
    Probe {
        /// The operator's API.
        #[arg(long, default_value = "http://127.0.0.1:8480")]
        api: String,
        /// A file whose first token line is sent as a bearer token.
        #[arg(long)]
        api_token_file: Option<PathBuf>,
        /// Paths to GET, in order, e.g. `/readyz /v1/proxies`.
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Prints the CustomResourceDefinitions as YAML, for `kubectl apply
    /// --server-side -f -`.
    Crd {
        /// Prints their reference page (Markdown) instead.
        #[arg(long)]
        reference: bool,
        /// The Kubernetes version they are for (`1.24`, `v1.30.2`); before
        /// 1.25 they leave out their CEL rules, which such servers refuse.
        /// Without it: for a current server.
        #[arg(long, value_name = "MAJOR.MINOR", value_parser = kube_version)]
        kube_version: Option<proxyfleet_kube::kube_version::KubeVersion>,
    },
    /// Runs on this machine without Kubernetes: Proxies from manifest
    /// files, state in an embedded database.
    Standalone(StandaloneArgs),
}

/// Orphan collection, provider checks and metrics, the same in both modes.
#[derive(Debug, clap::Args)]
struct Housekeeping {
    /// Where `/metrics` (Prometheus), `/healthz` and `/livez` are served;
    /// port 0 picks a free one.
    #[arg(long, default_value = "127.0.0.1:9464")]
    metrics_addr: std::net::SocketAddr,
    /// `/livez` fails when a reconcile pass has run this long, or a loop
    /// (health rounds, plugin rescans, housekeeping) has ended no round
    /// for this long. Keep it above the largest `limits.timeout` of the
    /// entries, times the calls of a pass.
    #[arg(long, default_value = "5m", value_parser = stall_after)]
    stall_after: Duration,
    /// Log the orphans that would be deleted instead of deleting them.
    #[arg(long)]
    gc_dry_run: bool,
    /// Orphans younger than this are left alone.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    gc_min_age: Duration,
    /// How often orphans are collected.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    gc_interval: Duration,
    /// How often every provider entry is checked.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    provider_check_interval: Duration,
    /// This installation's ID, written into every ownership mark; orphan
    /// collection takes only instances marked with it. Without the flag
    /// the first start generates one and keeps it in the store; a later
    /// start naming another ID is refused (1-32 characters of [a-z0-9-]).
    #[arg(long, env = "PROXYFLEET_INSTALLATION_ID", value_parser = installation_id)]
    installation_id: Option<InstallationId>,
}

/// `--stall-after`: a duration of at least 10 s (below, a busy but healthy
/// operator would be restarted).
fn stall_after(text: &str) -> Result<Duration, String> {
    let duration = humantime::parse_duration(text).map_err(|err| err.to_string())?;
    if duration < Duration::from_secs(10) {
        return Err(format!("{text} is too short; use 10s or more (the default is 5m)"));
    }
    Ok(duration)
}

/// `crd --kube-version`: `MAJOR.MINOR`.
fn kube_version(text: &str) -> Result<proxyfleet_kube::kube_version::KubeVersion, String> {
    proxyfleet_kube::kube_version::KubeVersion::parse(text).map_err(|err| err.to_string())
}

/// `--installation-id`: a valid installation ID.
fn installation_id(text: &str) -> Result<InstallationId, String> {
    InstallationId::parse("--installation-id", text).map_err(|err| err.to_string())
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    #[command(flatten)]
    setup: Setup,
    /// Namespace of the leader Lease and the plugins' key-value ConfigMaps.
    #[arg(long, env = "POD_NAMESPACE", default_value = "proxyfleet-system")]
    namespace: String,
    /// Reconcile Proxies of this namespace only (default: all namespaces).
    #[arg(long)]
    watch_namespace: Option<String>,
    /// This replica's identity in the leader election.
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Name of the leader Lease.
    #[arg(long, default_value = "proxyfleet-leader")]
    lease_name: String,
    /// How long the Lease holds without renewal.
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    lease_duration: Duration,
    /// Requests to the API server waiting for an answer at once, at most;
    /// more wait their turn. Each one in flight holds a connection.
    #[arg(long, value_name = "N", default_value_t = proxyfleet_kube::client::DEFAULT_IN_FLIGHT)]
    api_in_flight: std::num::NonZeroUsize,
    #[command(flatten)]
    housekeeping: Housekeeping,
    #[command(flatten)]
    fleet: FleetArgs,
}

#[derive(Debug, clap::Args)]
struct StandaloneArgs {
    #[command(flatten)]
    setup: Setup,
    /// A Proxy manifest file or a folder of them.
    #[arg(long, default_value = "proxies")]
    proxies: PathBuf,
    /// The state database file.
    #[arg(long, default_value = "proxyfleet-state.redb")]
    state: PathBuf,
    /// Reconcile until every Proxy is running or failed, print them as JSON
    /// lines, and exit (non-zero when one is not running).
    #[arg(long)]
    once: bool,
    /// With --once: how long to wait for the Proxies to settle.
    #[arg(long, default_value = "2m", value_parser = humantime::parse_duration)]
    settle_timeout: Duration,
    #[command(flatten)]
    housekeeping: Housekeeping,
    #[command(flatten)]
    fleet: FleetArgs,
}

#[derive(Debug, Subcommand)]
enum ProvidersCommand {
    /// Loads every entry and prints each one's check as a JSON line; exits
    /// non-zero when an entry is unavailable or unhealthy.
    Check {
        #[command(flatten)]
        setup: Setup,
    },
    /// Prints the JSON Schema of the providers file (the chart's
    /// values.schema.json holds it as `providers`).
    Schema,
}

#[derive(Debug, Subcommand)]
enum PluginCommand {
    /// Loads a component and prints, as JSON, what it says about itself
    /// (name, version, contract version, config schema, the capabilities it
    /// asks for), its digest, and what it imports and exports. An
    /// `oci://` reference is pulled (every digest and the layout checked)
    /// and looked at without being installed anywhere.
    #[command(alias = "describe")]
    Inspect {
        /// The `.wasm` component, or `oci://REGISTRY/REPOSITORY:TAG` (or
        /// `@sha256:DIGEST`).
        file: String,
        #[command(flatten)]
        cache: CompileCache,
        /// The largest build pulled, in bytes (an `oci://` reference).
        #[arg(long, default_value_t = proxyfleet_oci::DEFAULT_MAX_BYTES)]
        max_bytes: u64,
        /// A public key (cosign.pub) the build must be signed with; may be
        /// given more than once (any one verifies). Without it, the
        /// signatures the build has are counted, not checked.
        #[arg(long = "key")]
        keys: Vec<PathBuf>,
        #[command(flatten)]
        registry: registry_args::RegistryFlags,
    },
    /// Checks that a component accepts a provider entry's config: loads
    /// it, then binds the entry, which runs the plugin's validate-config.
    Validate {
        /// The `.wasm` component.
        file: PathBuf,
        /// One provider entry (`name`, `plugin`, `config`, `grants`,
        /// `limits`) as YAML.
        #[arg(long)]
        config: PathBuf,
        #[command(flatten)]
        cache: CompileCache,
    },
    /// Runs the plugin contract's conformance suite against a component
    /// bound as one provider entry, on the backend the entry names (a
    /// simulator, or one set aside for tests): instances are made for
    /// Proxies of the suite's own and deleted again. Prints a report and
    /// fails when a case failed (docs/plugin-contract.md).
    Test {
        /// The `.wasm` component.
        file: PathBuf,
        /// One provider entry (`name`, `plugin`, `config`, `grants`,
        /// `limits`) as YAML.
        #[arg(long)]
        config: PathBuf,
        /// A Proxy manifest (the standalone format) whose spec the suite's
        /// Proxies ask for; a Proxy's defaults without it.
        #[arg(long)]
        spec: Option<PathBuf>,
        /// Answer the plugin's HTTP requests from the backend declared in
        /// this YAML file (collections that keep what is created in them,
        /// fixed exchanges) instead of the network; the entry's grants
        /// still apply.
        #[arg(long)]
        backend: Option<PathBuf>,
        /// Also write the report as JUnit XML here.
        #[arg(long)]
        junit: Option<PathBuf>,
        /// How long a deleted instance may take to be gone.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "2m")]
        delete_wait: Duration,
        #[command(flatten)]
        cache: CompileCache,
    },
    /// Rebuilds a plugin project whenever one of its files changes, runs
    /// the conformance suite against each build (as `plugin test`), and
    /// copies a build that passes into --install-to, where an operator
    /// running on that plugin directory swaps it in without a restart.
    Watch {
        /// The project's directory.
        #[arg(default_value = ".")]
        project: PathBuf,
        /// The provider entry (YAML) the suite binds; its `plugin` names
        /// the file installed.
        #[arg(long)]
        config: PathBuf,
        /// The build, run with `sh -c` in the project.
        #[arg(long, default_value = plugin_watch::DEFAULT_BUILD)]
        build: String,
        /// The component the build writes, relative to the project
        /// (default: what cargo names the crate's wasm32-wasip2 release
        /// build).
        #[arg(long)]
        output: Option<PathBuf>,
        /// A Proxy manifest whose spec the suite's Proxies ask for.
        #[arg(long)]
        spec: Option<PathBuf>,
        /// Answer the plugin's HTTP requests from this declared backend.
        #[arg(long)]
        backend: Option<PathBuf>,
        /// The plugin directory of a running operator: a build that passes
        /// is copied there as `<plugin>.wasm`.
        #[arg(long)]
        install_to: Option<PathBuf>,
        /// How often the project is looked at.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "500ms")]
        interval: Duration,
        /// Build, test and install once, then exit with the suite's outcome.
        #[arg(long)]
        once: bool,
        /// How long a deleted instance may take to be gone.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "2m")]
        delete_wait: Duration,
        #[command(flatten)]
        cache: CompileCache,
    },
    /// Makes a provider plugin project NAME (a new directory): a Rust
    /// crate that builds as it is, its native unit tests and an entry; for
    /// an HTTP backend also a declared backend that `plugin test
    /// --backend` runs the conformance suite against
    /// (docs/writing-a-plugin.md).
    New {
        /// The plugin's name: lowercase letters, digits and `-`.
        name: String,
        /// What the provider speaks to.
        #[arg(long, value_enum, default_value_t = plugin_new::Backend::Http)]
        backend: plugin_new::Backend,
        /// Where the project's directory is made.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// Where the SDK and its test kit come from: the root of a
        /// proxyfleet checkout, or `crates.io` for their releases. Without
        /// it, the checkout this binary was built in.
        #[arg(long)]
        sdk: Option<String>,
    },
    /// Publishes a component to a registry in the Wasm OCI layout (as
    /// wasm-pkg-tools does) and prints its digests; an entry then names it
    /// as `oci://REGISTRY/REPOSITORY:TAG`, or pinned, `@sha256:DIGEST`.
    Push {
        /// The `.wasm` component.
        file: PathBuf,
        /// Where to: `[oci://]REGISTRY/REPOSITORY:TAG`.
        reference: String,
        #[command(flatten)]
        registry: registry_args::RegistryFlags,
    },
    /// Fetches a component from a registry, checks every digest and the
    /// layout, writes it, and prints its digests.
    Pull {
        /// `[oci://]REGISTRY/REPOSITORY:TAG` or `…@sha256:DIGEST`.
        reference: String,
        /// Where to write it (default: the repository's last segment, `.wasm`).
        #[arg(long, short)]
        output: Option<PathBuf>,
        /// The largest build accepted, in bytes.
        #[arg(long, default_value_t = proxyfleet_oci::DEFAULT_MAX_BYTES)]
        max_bytes: u64,
        /// A public key (cosign.pub) the build must be signed with; may be
        /// given more than once (any one verifies).
        #[arg(long = "key")]
        keys: Vec<PathBuf>,
        #[command(flatten)]
        registry: registry_args::RegistryFlags,
    },
    /// Writes a new signing key pair as cosign does: PREFIX.key (the
    /// private key, encrypted with the password) and PREFIX.pub (what a
    /// `verify: {keys: [...]}` names). Never replaces a file.
    Keygen {
        /// Path and name of the two files, without extension.
        #[arg(long, default_value = "cosign")]
        output_prefix: PathBuf,
        #[command(flatten)]
        password: signing_args::PasswordFlags,
    },
    /// Signs a published build (as `cosign sign --key` does): its manifest
    /// digest, signed with the private key, under the tag
    /// `sha256-<digest>.sig` beside it. Signatures already there are kept.
    Sign {
        /// `[oci://]REGISTRY/REPOSITORY:TAG` or `…@sha256:DIGEST`.
        reference: String,
        /// The private key (cosign.key).
        #[arg(long)]
        key: PathBuf,
        #[command(flatten)]
        password: signing_args::PasswordFlags,
        #[command(flatten)]
        registry: registry_args::RegistryFlags,
    },
    /// Checks that a published build is signed with one of the public
    /// keys (as an entry with `verify: {keys: [...]}` would check it);
    /// prints which key verified, or fails naming what was found.
    Verify {
        /// `[oci://]REGISTRY/REPOSITORY:TAG` or `…@sha256:DIGEST`.
        reference: String,
        /// A public key (cosign.pub); may be given more than once.
        #[arg(long = "key", required = true)]
        keys: Vec<PathBuf>,
        #[command(flatten)]
        registry: registry_args::RegistryFlags,
    },
    /// Brings back an entry's previous plugin revision in a running
    /// operator, at once, through its API; prints the revision now serving.
    Rollback {
        /// The provider entry.
        entry: String,
        /// The operator's API.
        #[arg(long, default_value = "http://127.0.0.1:8480")]
        api: String,
        /// A file holding an API token, when the API wants one.
        #[arg(long)]
        api_token_file: Option<PathBuf>,
    },
}

/// Where the plugin commands keep compiled plugins, so that looking at a
/// build again does not compile it again.
#[derive(Debug, clap::Args)]
struct CompileCache {
    /// Directory for compiled plugins (default: `$XDG_CACHE_HOME/proxyfleet`,
    /// else `~/.cache/proxyfleet`).
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// Compile without reading or writing any cache.
    #[arg(long, conflicts_with = "cache_dir")]
    no_cache: bool,
}

impl CompileCache {
    /// The directory to use, if any: the flag, else the user's cache
    /// directory (none without `XDG_CACHE_HOME` and `HOME`).
    fn dir(&self) -> Option<PathBuf> {
        if self.no_cache {
            return None;
        }
        if let Some(dir) = &self.cache_dir {
            return Some(dir.clone());
        }
        let set =
            |name| std::env::var_os(name).filter(|value| !value.is_empty()).map(PathBuf::from);
        set("XDG_CACHE_HOME")
            .or_else(|| set("HOME").map(|home| home.join(".cache")))
            .map(|cache| cache.join("proxyfleet"))
    }

    fn runtime_options(&self) -> RuntimeOptions {
        RuntimeOptions { cache_dir: self.dir(), ..RuntimeOptions::default() }
    }
}

#[derive(Debug, clap::Args)]
struct Setup {
    /// The providers file.
    #[arg(long, default_value = "providers.yaml")]
    providers: PathBuf,
    /// Directory of plugin components.
    #[arg(long, default_value = "plugins")]
    plugin_dir: PathBuf,
    /// Directory for precompiled plugins and for builds pulled from
    /// registries (in its `oci` folder); without it, a restart compiles
    /// every plugin again and needs the registries.
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// How often the tag of each `oci://` plugin is resolved again.
    #[arg(long, default_value = "60s", value_parser = poll_interval)]
    plugin_poll_interval: Duration,
    /// The largest plugin build accepted from a registry, in bytes; a
    /// larger one is refused before it is downloaded.
    #[arg(long, default_value_t = proxyfleet_oci::DEFAULT_MAX_BYTES)]
    plugin_max_bytes: u64,
}

/// `--plugin-poll-interval`: a duration of at least a second.
fn poll_interval(text: &str) -> Result<Duration, String> {
    let interval = humantime::parse_duration(text).map_err(|err| err.to_string())?;
    if interval < Duration::from_secs(1) {
        return Err(format!(
            "{text} is under a second, which would only load the registries: use 1s or more"
        ));
    }
    Ok(interval)
}

impl Setup {
    fn runtime_options(&self) -> RuntimeOptions {
        RuntimeOptions {
            cache_dir: self.cache_dir.clone(),
            pull_limits: PullLimits { max_bytes: self.plugin_max_bytes },
            ..RuntimeOptions::default()
        }
    }

    fn follow_options(&self) -> FollowOptions {
        FollowOptions { poll_interval: self.plugin_poll_interval }
    }
}

fn main() -> ExitCode {
    malloc::limit_arenas();
    let cli = Cli::parse();
    let json = match cli.log_format {
        LogFormat::Json => true,
        LogFormat::Text => false,
        LogFormat::Auto => !std::io::IsTerminal::is_terminal(&std::io::stderr()),
    };
    // Bound to a name: dropping the guard flushes and stops the exporter.
    let _telemetry = match telemetry::init(json, cli.verbose, cli.otlp_endpoint.as_deref()) {
        Ok(guard) => guard,
        Err(err) => {
            eprintln!("proxyfleet: {err:#}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("proxyfleet: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(async {
        malloc::spawn_trimmer();
        run(cli.command).await
    }) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("proxyfleet: {err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Providers { command: ProvidersCommand::Check { setup } } => check(setup).await,
        Command::Providers { command: ProvidersCommand::Schema } => {
            print_text(&format!("{:#}\n", ProvidersConfig::file_schema()));
            Ok(ExitCode::SUCCESS)
        }
        Command::Standalone(args) => standalone(args).await,
        Command::Run(args) => run_in_cluster(args).await,
        Command::Probe { api, api_token_file, paths } => {
            api_call::probe(&api, &paths, api_token_file.as_deref()).await
        }
        Command::Crd { reference: false, kube_version } => {
            print_text(&proxyfleet_kube::crd::crds_yaml(kube_version)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Crd { reference: true, .. } => {
            print_text(&proxyfleet_kube::crd_reference::markdown(&proxyfleet_kube::crd::crds()));
            Ok(ExitCode::SUCCESS)
        }
        Command::Plugin {
            command: PluginCommand::Inspect { file, cache, max_bytes, keys, registry },
        } => {
            let runtime = Runtime::new(cache.runtime_options())?;
            // A pulled build is looked at from a file of its own, removed
            // afterwards: nothing is installed.
            let scratch = tempfile::tempdir().context("cannot make a temporary directory")?;
            let (path, pulled) = if file.starts_with(proxyfleet_oci::SCHEME) {
                let (reference, pulled, signature) =
                    registry_args::fetch(&file, max_bytes, keys, registry).await?;
                let path = scratch.path().join("plugin.wasm");
                std::fs::write(&path, &pulled.bytes)
                    .with_context(|| format!("cannot write {}", path.display()))?;
                (path, Some((reference, pulled.manifest_digest, signature)))
            } else {
                anyhow::ensure!(
                    keys.is_empty(),
                    "--key: a file is not signed; signatures are checked for oci:// references"
                );
                (PathBuf::from(&file), None)
            };
            let revision = runtime.load_plugin(&path).await?;
            let out = serde_json::json!({
                "file": pulled.is_none().then_some(&file),
                "reference": pulled.as_ref().map(|(reference, _, _)| reference.to_string()),
                "manifestDigest": pulled.as_ref().map(|(_, digest, _)| digest),
                "signature": pulled.as_ref().map(|(_, _, signature)| signature),
                "sha256": revision.digest,
                "fromCache": revision.from_cache,
                "minHostVersion": revision.min_host_version,
                "info": revision.info,
                "imports": revision.imports,
                "exports": revision.exports,
            });
            println_json(&out);
            Ok(ExitCode::SUCCESS)
        }
        Command::Plugin { command: PluginCommand::Validate { file, config, cache } } => {
            validate(&file, &config, cache.runtime_options()).await
        }
        Command::Plugin {
            command: PluginCommand::Test { file, config, spec, backend, junit, delete_wait, cache },
        } => {
            let files = plugin_test::Files {
                component: &file,
                entry: &config,
                spec: spec.as_deref(),
                backend: backend.as_deref(),
            };
            plugin_test::run(files, junit, delete_wait, cache.runtime_options()).await
        }
        Command::Plugin {
            command:
                PluginCommand::Watch {
                    project,
                    config,
                    build,
                    output,
                    spec,
                    backend,
                    install_to,
                    interval,
                    once,
                    delete_wait,
                    cache,
                },
        } => {
            let watch = plugin_watch::Watch {
                project,
                build,
                output,
                entry: config,
                spec,
                backend,
                install_to,
                interval,
                once,
                delete_wait,
            };
            plugin_watch::run(watch, cache.runtime_options()).await
        }
        Command::Plugin { command: PluginCommand::New { name, backend, dir, sdk } } => {
            let sdk = match sdk.as_deref() {
                Some(value) => plugin_new::SdkSource::parse(value),
                None => plugin_new::SdkSource::beside(
                    &std::env::current_exe().context("cannot find this binary's path")?,
                )?,
            };
            let project = plugin_new::run(&name, backend, &dir, &sdk)?;
            print_text(&format!(
                "made {backend} provider plugin {name} in {}; next: its README.md\n",
                project.display()
            ));
            Ok(ExitCode::SUCCESS)
        }
        Command::Plugin { command: PluginCommand::Push { file, reference, registry } } => {
            println_json(&registry_args::push(&file, &reference, registry).await?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Plugin {
            command: PluginCommand::Pull { reference, output, max_bytes, keys, registry },
        } => {
            let pulled = registry_args::pull(&reference, output, max_bytes, keys, registry).await?;
            println_json(&pulled);
            Ok(ExitCode::SUCCESS)
        }
        Command::Plugin { command: PluginCommand::Keygen { output_prefix, password } } => {
            println_json(&signing_args::keygen(&output_prefix, &password)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Plugin { command: PluginCommand::Sign { reference, key, password, registry } } => {
            println_json(&signing_args::sign(&reference, &key, &password, registry).await?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Plugin { command: PluginCommand::Verify { reference, keys, registry } } => {
            println_json(&signing_args::verify(&reference, keys, registry).await?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Plugin { command: PluginCommand::Rollback { entry, api, api_token_file } } => {
            api_call::rollback(&entry, &api, api_token_file.as_deref()).await
        }
    }
}

async fn validate(
    file: &std::path::Path,
    entry_file: &std::path::Path,
    options: RuntimeOptions,
) -> anyhow::Result<ExitCode> {
    let entry = plugin_test::read_entry(entry_file)?;
    let runtime = Runtime::new(options)?;
    let revision = runtime.load_plugin(file).await?;
    let name = entry.name.clone();
    match PluginProvider::new(&runtime, entry, revision, Arc::new(MemoryKv::new())).await {
        Ok(_) => {
            println_json(&serde_json::json!({ "entry": name, "valid": true }));
            Ok(ExitCode::SUCCESS)
        }
        Err(err) => {
            println_json(
                &serde_json::json!({ "entry": name, "valid": false, "error": err.to_string() }),
            );
            Ok(ExitCode::FAILURE)
        }
    }
}

/// Follows the providers file the registry was loaded from
/// ([`proxyfleet_runtime::providers_watch`]).
fn follow_providers(
    registry: &Arc<Registry>,
    path: &std::path::Path,
    loaded: &ProvidersConfig,
    watchdog: Watchdog,
) -> proxyfleet_runtime::providers_watch::ProvidersWatchHandle {
    proxyfleet_runtime::providers_watch::follow_providers_file(
        Arc::clone(registry),
        path.to_owned(),
        loaded,
        proxyfleet_runtime::providers_watch::ProvidersWatchOptions {
            watchdog: Some(watchdog),
            ..Default::default()
        },
    )
}

/// Reads the providers file, and logs the settings in it that are valid
/// but work against each other.
fn load_providers(path: &std::path::Path) -> anyhow::Result<ProvidersConfig> {
    let providers = ProvidersConfig::load(path)?;
    for entry in &providers.entries {
        for warning in entry.warnings() {
            tracing::warn!(entry = %entry.name, "{warning}");
        }
    }
    Ok(providers)
}

async fn check(setup: Setup) -> anyhow::Result<ExitCode> {
    let config = load_providers(&setup.providers)?;
    let runtime = Runtime::new(setup.runtime_options())?;
    // Checks do not write bookkeeping; an in-memory store is enough here.
    let kv = Arc::new(MemoryKv::new());
    let registry = Registry::load(&runtime, &config, &setup.plugin_dir, kv)
        .await
        .with_context(|| format!("loading plugins from {}", setup.plugin_dir.display()))?;
    let mut all_ok = true;
    for (name, state) in registry.entries().iter() {
        let line = match state {
            // `load` settles every entry before it answers.
            EntryState::Loading => {
                all_ok = false;
                serde_json::json!({ "entry": name, "available": false, "reason": "loading" })
            }
            EntryState::Failed(reason) => {
                all_ok = false;
                serde_json::json!({ "entry": name, "available": false, "reason": reason })
            }
            EntryState::Ready(provider) => {
                let health = proxyfleet_core::Provider::check(provider.as_ref()).await;
                all_ok &= health.healthy;
                let revision = provider.revision();
                serde_json::json!({
                    "entry": name,
                    "available": true,
                    "plugin": revision.info.name,
                    "version": revision.info.version,
                    "healthy": health.healthy,
                    "issues": health.issues,
                })
            }
        };
        println_json(&line);
    }
    Ok(if all_ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

async fn run_in_cluster(args: RunArgs) -> anyhow::Result<ExitCode> {
    let stop = shutdown::on_signal()?;
    let providers = load_providers(&args.setup.providers)?;
    let config = kube::Config::infer().await.context("finding the Kubernetes API's address")?;
    let client = proxyfleet_kube::client::bounded(config, args.api_in_flight)
        .context("connecting to the Kubernetes API")?;
    let metrics = Arc::new(proxyfleet_metrics::Metrics::with_options(MetricsOptions {
        gateway_upstreams: args.fleet.gateway.gateway_upstream_metrics,
    }));
    let (kv, follow_kv) = ConfigMapKv::watched(client.clone(), &args.namespace);
    tokio::spawn(follow_kv);
    let kv = Arc::new(kv);
    let (installation, settled) =
        installation::settle(kv.as_ref(), args.housekeeping.installation_id.as_ref()).await?;
    tracing::info!(installation = %installation, ?settled, "installation");
    let runtime = Runtime::new(RuntimeOptions {
        observer: Some(Arc::clone(&metrics) as _),
        installation,
        secrets: Some(Arc::new(CredentialSecrets::new(client.clone(), &args.namespace))),
        ..args.setup.runtime_options()
    })?;
    // Plugins compile in the background (a cold cache takes seconds per
    // plugin): the API, metrics and probes come up first, and each entry
    // serves as soon as its plugin is ready.
    let (registry, pending) =
        Registry::open(&runtime, &providers, &args.setup.plugin_dir, Arc::clone(&kv) as _)
            .await
            .with_context(|| format!("loading plugins from {}", args.setup.plugin_dir.display()))?;
    let registry = Arc::new(registry);
    tokio::spawn({
        let registry = Arc::clone(&registry);
        async move {
            let started = std::time::Instant::now();
            registry.load_pending(pending).await;
            tracing::info!(elapsed = ?started.elapsed(), "plugins loaded");
        }
    });
    let identity = args.identity.unwrap_or_else(|| format!("proxyfleet-{}", std::process::id()));
    let elector = LeaderElector::new(
        client.clone(),
        &args.namespace,
        ElectionConfig {
            lease: args.lease_name,
            identity: identity.clone(),
            lease_duration: args.lease_duration,
            renew_every: args.lease_duration / 3,
        },
    );
    let fleet_setup = args.fleet.setup(args.housekeeping.metrics_addr).await?;
    // Discovery leases live in the API server beside the plugins' store,
    // so a new leader honours the leases the last one granted.
    let fleet = Arc::new(
        proxyfleet_fleet::Fleet::new(fleet_setup.fleet, Arc::clone(&metrics))
            .with_lease_store(Arc::clone(&kv) as _),
    );
    let watchdog = Watchdog::new(args.housekeeping.stall_after);
    let leader_fleet = LeaderFleet {
        fleet: Arc::clone(&fleet),
        wakes: Arc::default(),
        credentials: Arc::default(),
    };
    let settings = LeaderSettings {
        watch_namespace: args.watch_namespace.clone(),
        policy: Policy::default(),
        gc_interval: args.housekeeping.gc_interval,
        gc_min_age: args.housekeeping.gc_min_age,
        gc_dry_run: args.housekeeping.gc_dry_run,
        check_interval: args.housekeeping.provider_check_interval,
        metrics,
        fleet: Some(leader_fleet.clone()),
        spec_key: proxyfleet_kube::spec_key::settle(&client, &args.namespace).await?,
        watchdog: watchdog.clone(),
        resource_entries: Some(Arc::clone(&registry) as _),
    };
    serve_metrics(args.housekeeping.metrics_addr, Arc::clone(&settings.metrics), watchdog.clone())
        .await?;
    // Every replica serves the API, the gateway and the console from its
    // own catalog: it watches the Proxies, probes them, and shares the
    // discovery leases through the store. It is ready (`/readyz`) once it
    // restored the leases and probed the fleet once, leader or not.
    let engine = proxyfleet_fleet::HealthEngine::new(fleet_setup.health, Arc::clone(&fleet))
        .with_heartbeat(Arc::new(watchdog.expect_beats("health engine")));
    tokio::spawn(proxyfleet_kube::fleet_services::serve(
        client.clone(),
        args.watch_namespace.clone(),
        Arc::clone(&fleet),
        engine,
        Arc::clone(&leader_fleet.credentials),
        Arc::clone(&leader_fleet.wakes),
        stop.clone().cancelled_owned(),
    ));
    let gateway = fleet_args::serve_gateway(
        fleet_setup.gateway,
        Arc::clone(&fleet),
        Arc::clone(&fleet_setup.auth),
        stop.clone(),
    );
    // Whether this replica leads now, for the console.
    let leading = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let api = fleet_args::serve_api(
        fleet_setup.listener,
        fleet_setup.api_limits,
        fleet,
        fleet_setup.auth,
        Arc::new(fleet_args::SourceStatus {
            source: Arc::clone(&registry) as _,
            identity: identity.clone(),
            leading: Arc::clone(&leading),
            actions: proxyfleet_kube::actions::OperatorActions::new(
                client.clone(),
                identity.clone(),
            ),
            session_key: settings.spec_key.derive(proxyfleet_fleet::console::SESSION_KEY_PURPOSE),
        }),
        stop.clone(),
    );
    // Every replica swaps plugins and follows the providers file (a
    // mounted ConfigMap), so a new leader serves the same revisions and
    // entries.
    let _watcher = registry.watch(proxyfleet_runtime::watch::WatchOptions {
        watchdog: Some(watchdog.clone()),
        ..Default::default()
    });
    let _providers_watch = follow_providers(&registry, &args.setup.providers, &providers, watchdog);
    let _follower = registry.follow(args.setup.follow_options());
    // Every replica serves the ClusterProxyProviders as entries too; the
    // leader keeps their finalizers and status.
    let cluster_providers = tokio::spawn(proxyfleet_kube::cluster_providers::follow(
        client.clone(),
        Arc::clone(&registry) as _,
    ));
    // A process that died leading left the label on its pod; started again
    // in that pod it is a follower until it wins the Lease, and the label
    // must not name it the leader meanwhile.
    if let Ok(pod) = std::env::var("POD_NAME")
        && let Err(err) = mark_leader(&client, &args.namespace, &pod, false).await
    {
        tracing::warn!("cannot clear a leader label this pod kept from before: {err}");
    }
    // A replica campaigns only on CRDs that keep what it writes: until they
    // are applied it serves the API as a follower and says why in its log.
    let served = proxyfleet_kube::crd_check::wait_until_served(
        &client,
        Duration::from_secs(30),
        stop.cancelled(),
    )
    .await;
    // On a signal the elector stops leading and releases the Lease, so a
    // successor takes over at once instead of waiting the Lease out, while
    // the API drains beside it.
    if served {
        elector
            .run(
                |lost| {
                    let (client, registry, settings, identity, namespace, leading) = (
                        client.clone(),
                        Arc::clone(&registry),
                        settings.clone(),
                        identity.clone(),
                        args.namespace.clone(),
                        Arc::clone(&leading),
                    );
                    async move {
                        // A Proxy reconciled while its plugin compiles would
                        // turn unavailable for nothing; the leader starts once
                        // every entry is settled (or leadership is lost).
                        let mut lost_while_loading = lost.clone();
                        tokio::select! {
                            () = registry.wait_loaded() => {}
                            _ = lost_while_loading.wait_for(|lost| *lost) => return,
                        }
                        // Only when running as a pod: then its name is known.
                        let pod = std::env::var("POD_NAME").ok();
                        if let Some(pod) = &pod
                            && let Err(err) = mark_leader(&client, &namespace, pod, true).await
                        {
                            tracing::warn!("cannot label this pod as the leader: {err}");
                        }
                        leading.store(true, std::sync::atomic::Ordering::Release);
                        let metrics = Arc::clone(&settings.metrics);
                        metrics.set_leader(true);
                        // On the heap: leading runs every controller at once.
                        Box::pin(lead(client.clone(), registry as _, settings, identity, lost))
                            .await;
                        leading.store(false, std::sync::atomic::Ordering::Release);
                        metrics.set_leader(false);
                        metrics.forget_leader_state();
                        if let Some(pod) = &pod
                            && let Err(err) = mark_leader(&client, &namespace, pod, false).await
                        {
                            tracing::warn!("cannot remove the leader label from this pod: {err}");
                        }
                    }
                },
                stop.cancelled(),
            )
            .await;
    }
    cluster_providers.abort();
    let _ = api.await;
    if let Some(gateway) = gateway {
        let _ = gateway.await;
    }
    tracing::info!("stopped");
    Ok(ExitCode::SUCCESS)
}

/// Binds the metrics endpoint now, so a taken address fails the start with
/// a clear error, and serves it in the background.
async fn serve_metrics(
    addr: std::net::SocketAddr,
    metrics: Arc<proxyfleet_metrics::Metrics>,
    watchdog: Watchdog,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("--metrics-addr {addr}: cannot listen; pick a free address"))?;
    tracing::info!("metrics at http://{}/metrics", listener.local_addr()?);
    tokio::spawn(proxyfleet_metrics::serve(listener, metrics, watchdog, std::future::pending()));
    Ok(())
}

async fn standalone(args: StandaloneArgs) -> anyhow::Result<ExitCode> {
    let providers = load_providers(&args.setup.providers)?;
    let mut settings = Settings::new(args.proxies);
    settings.gc_dry_run = args.housekeeping.gc_dry_run;
    settings.gc_min_age = args.housekeeping.gc_min_age;
    settings.gc_interval = args.housekeeping.gc_interval;
    settings.check_interval = args.housekeeping.provider_check_interval;
    settings.watchdog = Watchdog::new(args.housekeeping.stall_after);
    let watchdog = settings.watchdog.clone();
    let state = StateDb::open(&args.state, args.housekeeping.installation_id.as_ref()).await?;
    let metrics = Arc::new(proxyfleet_metrics::Metrics::with_options(MetricsOptions {
        gateway_upstreams: args.fleet.gateway.gateway_upstream_metrics,
    }));
    let runtime = Runtime::new(RuntimeOptions {
        observer: Some(Arc::clone(&metrics) as _),
        installation: state.installation().clone(),
        ..args.setup.runtime_options()
    })?;
    let registry = Arc::new(
        Registry::load(&runtime, &providers, &args.setup.plugin_dir, state.kv())
            .await
            .with_context(|| format!("loading plugins from {}", args.setup.plugin_dir.display()))?,
    );
    if args.once {
        let standalone = Standalone::new(settings, state, registry, metrics)?;
        return settle_and_print(&standalone, args.settle_timeout).await;
    }
    let stop = shutdown::on_signal()?;
    let fleet = args.fleet.setup(args.housekeeping.metrics_addr).await?;
    settings.fleet = fleet.fleet;
    settings.health = Some(fleet.health);
    // Standalone, the one process leads.
    metrics.set_leader(true);
    let standalone =
        Arc::new(Standalone::new(settings, state, Arc::clone(&registry) as _, metrics)?);
    serve_metrics(
        args.housekeeping.metrics_addr,
        Arc::clone(standalone.metrics()),
        watchdog.clone(),
    )
    .await?;
    let gateway = fleet_args::serve_gateway(
        fleet.gateway,
        Arc::clone(standalone.fleet()),
        Arc::clone(&fleet.auth),
        stop.clone(),
    );
    let api = fleet_args::serve_api(
        fleet.listener,
        fleet.api_limits,
        Arc::clone(standalone.fleet()),
        fleet.auth,
        Arc::clone(&standalone) as _,
        stop.clone(),
    );
    // A new plugin file in the directory, or a new build behind an
    // `oci://` plugin's tag, is admitted and swapped in, and an entry
    // added to, edited in or removed from the providers file takes effect,
    // while everything keeps running.
    let _watcher = registry.watch(proxyfleet_runtime::watch::WatchOptions {
        watchdog: Some(watchdog.clone()),
        ..Default::default()
    });
    let _providers_watch = follow_providers(&registry, &args.setup.providers, &providers, watchdog);
    let _follower = registry.follow(args.setup.follow_options());
    standalone.run(stop.cancelled()).await?;
    let _ = api.await;
    if let Some(gateway) = gateway {
        let _ = gateway.await;
    }
    tracing::info!("stopped");
    Ok(ExitCode::SUCCESS)
}

/// `--once`: reconciles until settled and prints every Proxy.
async fn settle_and_print(standalone: &Standalone, timeout: Duration) -> anyhow::Result<ExitCode> {
    let records = standalone.run_until_settled(timeout).await?;
    let mut all_running = true;
    for record in records {
        all_running &= record.status.phase == Phase::Running;
        let reason = record
            .status
            .condition(ConditionType::Provisioned)
            .map(|c| format!("{}: {}", c.reason, c.message));
        println_json(&serde_json::json!({
            "proxy": record.key(),
            "uid": record.meta.uid,
            "provider": record.desired.provider,
            "pool": record.pool,
            "phase": record.status.phase,
            "providerID": record.status.provider_id,
            "ip": record.status.ip,
            "port": record.status.port.unwrap_or(record.desired.port),
            "provisioned": reason,
        }));
    }
    for check in standalone.check_providers().await {
        println_json(&serde_json::json!({ "providerCheck": check }));
    }
    Ok(if all_running { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

#[expect(clippy::print_stdout, reason = "command output goes to stdout; logs go to stderr")]
fn println_json(value: &serde_json::Value) {
    println!("{value}");
}

#[expect(clippy::print_stdout, reason = "command output goes to stdout; logs go to stderr")]
pub(crate) fn print_text(text: &str) {
    print!("{text}");
}
