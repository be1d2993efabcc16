//! `proxyfleet`: the operator binary.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};
use proxyfleet_core::kv::MemoryKv;
use proxyfleet_runtime::config::ProvidersConfig;
use proxyfleet_runtime::{EntryState, Registry, Runtime, RuntimeOptions};

#[derive(Debug, Parser)]
#[command(name = "proxyfleet", version, about = "Keeps fleets of egress proxies alive")]
struct Cli {
    /// Log format on stderr.
    #[arg(long, value_enum, default_value_t = LogFormat::Json, global = true)]
    log_format: LogFormat,
    /// More log output (-v debug, -vv trace); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
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
}

#[derive(Debug, Subcommand)]
enum ProvidersCommand {
    /// Loads every entry and prints each one's check as a JSON line; exits
    /// non-zero when an entry is unavailable or unhealthy.
    Check {
        #[command(flatten)]
        setup: Setup,
    },
}

#[derive(Debug, Subcommand)]
enum PluginCommand {
    /// Loads a component and prints what it says about itself, as JSON.
    Describe {
        /// The `.wasm` component.
        file: PathBuf,
    },
}

#[derive(Debug, clap::Args)]
struct Setup {
    /// The providers file.
    #[arg(long, default_value = "providers.yaml")]
    providers: PathBuf,
    /// Directory of plugin components.
    #[arg(long, default_value = "plugins")]
    plugin_dir: PathBuf,
    /// Directory for precompiled plugins.
    #[arg(long)]
    cache_dir: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format, cli.verbose);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("proxyfleet: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli.command)) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("proxyfleet: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(format: LogFormat, verbose: u8) {
    let default = match verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

async fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Providers { command: ProvidersCommand::Check { setup } } => check(setup).await,
        Command::Plugin { command: PluginCommand::Describe { file } } => {
            let runtime = Runtime::new(RuntimeOptions::default())?;
            let revision = runtime.load_plugin(&file).await?;
            let out = serde_json::json!({
                "file": file,
                "sha256": revision.digest,
                "info": revision.info,
            });
            println_json(&out);
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn check(setup: Setup) -> anyhow::Result<ExitCode> {
    let config = ProvidersConfig::load(&setup.providers)?;
    let runtime =
        Runtime::new(RuntimeOptions { cache_dir: setup.cache_dir, ..Default::default() })?;
    // Checks do not write bookkeeping; an in-memory store is enough here.
    let kv = Arc::new(MemoryKv::new());
    let registry = Registry::load(&runtime, &config, &setup.plugin_dir, kv)
        .await
        .with_context(|| format!("loading plugins from {}", setup.plugin_dir.display()))?;
    let mut all_ok = true;
    for (name, state) in registry.entries() {
        let line = match state {
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

#[expect(clippy::print_stdout, reason = "command output goes to stdout; logs go to stderr")]
fn println_json(value: &serde_json::Value) {
    println!("{value}");
}
