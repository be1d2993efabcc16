//! `proxyfleet plugin test`: the conformance suite (`proxyfleet-conformance`)
//! against one component bound as one provider entry, the way the operator
//! binds it, on the backend the entry names (a simulator or a backend set
//! aside for tests) or on one declared in a file (`--backend`). The
//! entry's key-value store is in memory.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use proxyfleet_conformance::Options;
use proxyfleet_core::ProxySpec;
use proxyfleet_core::kv::MemoryKv;
use proxyfleet_core::proxy::ProxyMeta;
use proxyfleet_harness::{DeclaredBackend, EntryBinder};
use proxyfleet_runtime::config::{EntryConfig, ProvidersConfig};
use proxyfleet_runtime::{Runtime, RuntimeOptions};
use proxyfleet_standalone::desired;

/// What the suite's Proxies ask for: the spec of the one Proxy in the
/// manifest `file` (the standalone format, read and checked as standalone
/// mode reads it), or a Proxy's defaults. Name, namespace, UID and
/// credential are the suite's own.
fn suite_spec(file: Option<&Path>) -> anyhow::Result<ProxySpec> {
    let desired = match file {
        Some(file) => desired::load(file).with_context(|| format!("--spec {}", file.display()))?,
        None => desired::parse(
            Path::new("the default spec"),
            &format!(
                "apiVersion: {}\nkind: Proxy\nmetadata: {{ name: conformance }}\n\
                 spec: {{ provider: conformance }}\n",
                desired::API_VERSION
            ),
        )?,
    };
    let [proxy] = desired.proxies.as_slice() else {
        anyhow::bail!("--spec: the file must hold one Proxy manifest, and nothing else");
    };
    anyhow::ensure!(desired.pools.is_empty(), "--spec: the file must hold one Proxy, not a pool");
    let meta = ProxyMeta {
        uid: String::new(),
        namespace: String::new(),
        name: String::new(),
        generation: 1,
    };
    Ok(proxy.desired.to_spec(&meta))
}

/// One provider entry read from `file` (YAML: `name`, `plugin`, `config`,
/// `grants`, `limits`), checked exactly as a providers file holding only
/// it.
pub fn read_entry(file: &Path) -> anyhow::Result<EntryConfig> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let entry: yaml_serde::Value =
        yaml_serde::from_str(&text).with_context(|| format!("{}: not YAML", file.display()))?;
    let wrapped = yaml_serde::to_string(&serde_json::json!({ "providers": [entry] }))?;
    let config = ProvidersConfig::parse(&wrapped).with_context(|| file.display().to_string())?;
    config.entries.into_iter().next().context("the file holds no entry")
}

/// The files a run reads.
#[derive(Debug, Clone, Copy)]
pub struct Files<'a> {
    /// The `.wasm` component.
    pub component: &'a Path,
    /// The provider entry.
    pub entry: &'a Path,
    /// A Proxy manifest for the suite's specs.
    pub spec: Option<&'a Path>,
    /// A declared backend answering the plugin's HTTP requests.
    pub backend: Option<&'a Path>,
}

/// Runs the suite and prints its report; writes the JUnit XML to `junit`
/// when given. Fails when a case failed.
pub async fn run(
    files: Files<'_>,
    junit: Option<PathBuf>,
    delete_wait: std::time::Duration,
    mut runtime_options: RuntimeOptions,
) -> anyhow::Result<ExitCode> {
    let entry = read_entry(files.entry)?;
    let mut options = Options::new(entry.config.clone(), suite_spec(files.spec)?);
    options.call_timeout = entry.limits.call_timeout;
    options.delete_wait = delete_wait;
    if let Some(backend) = files.backend {
        let backend = DeclaredBackend::load(backend).context("--backend")?;
        runtime_options.http_transport = Some(Arc::new(backend));
    }
    let runtime = Runtime::new(runtime_options)?;
    let revision = runtime.load_plugin(files.component).await?;
    let binder = EntryBinder::new(runtime, entry.clone(), revision, Arc::new(MemoryKv::new()));
    let provider = binder
        .bind_own()
        .await
        .with_context(|| format!("entry {}: the plugin refused its config", entry.name))?;
    let report = proxyfleet_conformance::run(provider, &binder, &options).await;
    crate::print_text(&report.text());
    if let Some(path) = junit {
        std::fs::write(&path, report.junit())
            .with_context(|| format!("--junit {}: cannot write it", path.display()))?;
    }
    Ok(if report.passed() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
