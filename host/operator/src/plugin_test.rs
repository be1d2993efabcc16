//! `proxyfleet plugin test`: the conformance suite (`proxyfleet-conformance`)
//! against one component bound as one provider entry, the way the operator
//! binds it, on the backend the entry names (a simulator or a backend set
//! aside for tests). The entry's key-value store is in memory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use proxyfleet_conformance::Options;
use proxyfleet_core::ProxySpec;
use proxyfleet_core::kv::MemoryKv;
use proxyfleet_harness::EntryBinder;
use proxyfleet_runtime::config::{EntryConfig, ProvidersConfig};
use proxyfleet_runtime::{Runtime, RuntimeOptions};
use serde::Deserialize;

/// What the suite's Proxies ask for, from `--spec`; name, namespace, UID
/// and credential are the suite's own.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawSpec {
    image: Option<String>,
    cores: Option<u32>,
    #[serde(rename = "memoryMiB")]
    memory_mib: Option<u64>,
    #[serde(rename = "diskGiB")]
    disk_gib: Option<u64>,
    port: Option<u16>,
    #[serde(default)]
    placement: BTreeMap<String, String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

impl RawSpec {
    fn into_spec(self) -> ProxySpec {
        ProxySpec {
            name: String::new(),
            namespace: String::new(),
            uid: String::new(),
            cores: self.cores.unwrap_or(1),
            memory_mib: self.memory_mib.unwrap_or(512),
            disk_gib: self.disk_gib.unwrap_or(8),
            image: self.image.unwrap_or_default(),
            placement: self.placement.into_iter().collect(),
            vlan_tag: None,
            port: self.port.unwrap_or(proxyfleet_core::proxy::DEFAULT_PORT),
            user_data: Vec::new(),
            labels: self.labels.into_iter().collect(),
            proxy_auth: None,
        }
    }
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

/// Runs the suite and prints its report; writes the JUnit XML to `junit`
/// when given. Fails when a case failed.
pub async fn run(
    file: &Path,
    entry_file: &Path,
    spec_file: Option<&Path>,
    junit: Option<PathBuf>,
    delete_wait: std::time::Duration,
) -> anyhow::Result<ExitCode> {
    let entry = read_entry(entry_file)?;
    let raw = match spec_file {
        None => RawSpec::default(),
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("--spec {}: cannot read it", path.display()))?;
            yaml_serde::from_str(&text).with_context(|| format!("--spec {}", path.display()))?
        }
    };
    let mut options = Options::new(entry.config.clone(), raw.into_spec());
    options.call_timeout = entry.limits.call_timeout;
    options.delete_wait = delete_wait;
    let runtime = Runtime::new(RuntimeOptions::default())?;
    let revision = runtime.load_plugin(file).await?;
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
