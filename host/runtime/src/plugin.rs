//! A loaded plugin revision: one component file, compiled and linked once,
//! instantiated afresh for every call.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use proxyfleet_core::kv::MemoryKv;
use proxyfleet_core::{Capabilities, HttpDestination, PluginInfo};
use sha2::{Digest as _, Sha256};
use tracing::Instrument as _;
use wasmtime::Store;
use wasmtime::component::Component;

use crate::bindings::{CONTRACT_VERSION, PROVIDER_EXPORT, ProviderPluginPre, types as wit};
use crate::capabilities::http::{EntryHttp, HttpTransport};
use crate::capabilities::kv::{EntryKv, KvQuota};
use crate::capabilities::{CallScope, Redactor};
use crate::config::{EntryConfig, Limits};
use crate::engine::Runtime;
use crate::error::LoadError;
use crate::state::PluginState;

/// One version of one plugin, ready to instantiate.
pub struct PluginRevision {
    /// What the plugin said about itself at load.
    pub info: PluginInfo,
    /// sha256 of the component file, hex.
    pub digest: String,
    /// Where it was loaded from.
    pub source: PathBuf,
    /// When it was loaded.
    pub loaded_at: SystemTime,
    /// Whether the compiled code came from the precompiled cache.
    pub from_cache: bool,
    /// Names of the interfaces and functions the component imports.
    pub imports: Vec<String>,
    /// Names of what it exports.
    pub exports: Vec<String>,
    /// The oldest host it declares it runs on ([`crate::min_host`]).
    pub min_host_version: Option<String>,
    pub(crate) pre: ProviderPluginPre<PluginState>,
}

impl std::fmt::Debug for PluginRevision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginRevision")
            .field("info", &self.info)
            .field("digest", &self.digest)
            .field("source", &self.source)
            .field("from_cache", &self.from_cache)
            .finish_non_exhaustive()
    }
}

impl Runtime {
    /// Loads a component: reads it, compiles it (or takes the cached
    /// compilation), checks its contract version, links it and asks it to
    /// `describe` itself.
    pub async fn load_plugin(&self, path: &Path) -> Result<Arc<PluginRevision>, LoadError> {
        let bytes = tokio::fs::read(path)
            .await
            .map_err(|source| LoadError::Read { path: path.to_owned(), source })?;
        let digest = file_digest(&bytes);
        self.load_plugin_bytes(path, bytes, digest).await
    }

    /// [`Runtime::load_plugin`] for content already read from `path`, with
    /// its [`file_digest`]: whoever hashed the file to decide whether to load
    /// it compiles exactly what it hashed, even if the file changes meanwhile.
    pub(crate) async fn load_plugin_bytes(
        &self,
        path: &Path,
        bytes: Vec<u8>,
        digest: String,
    ) -> Result<Arc<PluginRevision>, LoadError> {
        let inner = &self.inner;
        // Before anything is compiled: a build for a newer host is refused
        // by what it declares, not by what fails to link.
        let min_host_version = crate::min_host::check(path, &bytes)?.map(|v| v.to_string());
        let cached =
            inner.cache.as_ref().and_then(|cache| cache.load(&inner.engine, &digest, bytes.len()));
        let from_cache = cached.is_some();
        let component = match cached {
            Some(component) => component,
            None => {
                // Never closed: the runtime owns it for its whole life.
                let _turn = inner.compiling.acquire().await;
                let engine = inner.engine.clone();
                let compiled = tokio::task::spawn_blocking(move || Component::new(&engine, &bytes))
                    .await
                    .map_err(|err| LoadError::Invalid {
                        path: path.to_owned(),
                        message: format!("compilation did not finish: {err}"),
                    })?
                    .map_err(|err| LoadError::Invalid {
                        path: path.to_owned(),
                        message: format!("{err:#}"),
                    })?;
                if let Some(cache) = &inner.cache {
                    cache.store(&digest, &compiled);
                }
                compiled
            }
        };
        check_contract(path, &component, &inner.engine)?;
        let component_type = component.component_type();
        let imports =
            component_type.imports(&inner.engine).map(|(name, _)| name.to_owned()).collect();
        let exports =
            component_type.exports(&inner.engine).map(|(name, _)| name.to_owned()).collect();
        let instance_pre = inner.linker.instantiate_pre(&component).map_err(|err| {
            LoadError::Link { path: path.to_owned(), message: format!("{err:#}") }
        })?;
        let pre = ProviderPluginPre::new(instance_pre).map_err(|err| LoadError::Link {
            path: path.to_owned(),
            message: format!("{err:#}"),
        })?;
        let info = describe(self, path, &pre).await?;
        tracing::info!(
            plugin = %info.name,
            version = %info.version,
            digest = %digest,
            from_cache,
            "loaded plugin {}",
            path.display()
        );
        Ok(Arc::new(PluginRevision {
            info,
            digest,
            source: path.to_owned(),
            loaded_at: SystemTime::now(),
            from_cache,
            imports,
            exports,
            min_host_version,
            pre,
        }))
    }
}

/// A plugin's bytes as read (from the plugin directory or the store of
/// pulled builds), with their [`file_digest`]; `path` names it in errors.
pub(crate) struct PluginFile {
    pub(crate) path: PathBuf,
    pub(crate) bytes: Vec<u8>,
    pub(crate) digest: String,
}

/// sha256 of a component file, lower-case hex: what identifies a revision
/// (and what a `pin.digest` names).
pub fn file_digest(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Refuses a component that does not export the provider interface in a
/// version compatible with [`CONTRACT_VERSION`], naming what it exports.
fn check_contract(
    path: &Path,
    component: &Component,
    engine: &wasmtime::Engine,
) -> Result<(), LoadError> {
    let exports: Vec<String> =
        component.component_type().exports(engine).map(|(name, _)| name.to_owned()).collect();
    let provider_exports: Vec<&String> =
        exports.iter().filter(|name| name.starts_with(PROVIDER_EXPORT)).collect();
    let Some(found) = provider_exports.first() else {
        return Err(LoadError::Invalid {
            path: path.to_owned(),
            message: format!(
                "it does not export {PROVIDER_EXPORT}; its exports are [{}]",
                exports.join(", ")
            ),
        });
    };
    let version = found.strip_prefix(PROVIDER_EXPORT).and_then(|v| v.strip_prefix('@'));
    match version {
        Some(version) if is_compatible(version) => Ok(()),
        _ => Err(LoadError::IncompatibleContract {
            path: path.to_owned(),
            found: (*found).clone(),
            host_version: CONTRACT_VERSION,
            compatible: COMPATIBLE_RANGE,
        }),
    }
}

/// What [`is_compatible`] accepts, for error messages.
const COMPATIBLE_RANGE: &str = env!("PROXYFLEET_CONTRACT_RANGE");

/// Semver compatibility as the component model's linker applies it: below
/// 1.0 the minor version is the breaking one, from 1.0 the major.
pub(crate) fn is_compatible(version: &str) -> bool {
    let parse = |v: &str| -> Option<(u64, u64)> {
        let mut parts = v.split(['.', '-', '+']);
        Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
    };
    let (Some((major, minor)), Some((host_major, host_minor))) =
        (parse(version), parse(CONTRACT_VERSION))
    else {
        return false;
    };
    if host_major == 0 {
        major == 0 && minor == host_minor
    } else {
        major == host_major && minor <= host_minor
    }
}

async fn describe(
    runtime: &Runtime,
    path: &Path,
    pre: &ProviderPluginPre<PluginState>,
) -> Result<PluginInfo, LoadError> {
    let fail = |message: String| LoadError::Describe { path: path.to_owned(), message };
    // `describe` runs before any entry is bound, on any file that lands:
    // no grants, a throwaway store, and limits tighter than any entry's
    // defaults, since it only has to answer a constant.
    let limits = Limits {
        call_timeout: std::time::Duration::from_secs(10),
        memory_bytes: 32 << 20,
        ..Limits::default()
    };
    let file_stem: Arc<str> =
        path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default().into();
    // The same span as an entry's calls, without an entry; the plugin's
    // name and version are known once it has answered.
    let span = tracing::info_span!(
        "provider.call",
        entry = "",
        plugin = tracing::field::Empty,
        plugin_version = tracing::field::Empty,
        operation = "describe",
        proxy = "",
        result = tracing::field::Empty,
        fault = tracing::field::Empty,
        elapsed_ms = tracing::field::Empty,
    );
    let started = std::time::Instant::now();
    let scope = CallScope {
        entry: "".into(),
        plugin: Arc::clone(&file_stem),
        operation: "describe",
        proxy: None,
        kv: Arc::new(EntryKv::new(Arc::new(MemoryKv::new()), KvQuota::from_limits(&limits))),
        redactor: Arc::new(Redactor::default()),
    };
    let http = Arc::new(EntryHttp::for_describe(deny_all_transport()));
    let mut store = new_store(runtime, PluginState::new(scope, http, limits.memory_bytes), &limits);
    let call = async {
        let plugin = pre.instantiate_async(&mut store).await?;
        plugin.proxyfleet_provider_provider().call_describe(&mut store).await
    };
    let outcome = tokio::time::timeout(limits.call_timeout, call).instrument(span.clone()).await;
    span.record("elapsed_ms", u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX));
    let (result, fault) = match &outcome {
        Ok(Ok(_)) => ("ok", None),
        Ok(Err(err))
            if matches!(err.downcast_ref::<wasmtime::Trap>(), Some(wasmtime::Trap::Interrupt)) =>
        {
            ("timeout", Some("timeout"))
        }
        Ok(Err(_)) if store.data().memory.hit => ("plugin-fault", Some("memory")),
        Ok(Err(_)) => ("plugin-fault", Some("trap")),
        Err(_) => ("timeout", Some("timeout")),
    };
    span.record("result", result);
    if let Some(fault) = fault {
        span.record("fault", fault);
    }
    // Checked before the span carries any of it.
    let oversize = match &outcome {
        Ok(Ok(info)) => crate::bounds::check_plugin_info(info).err(),
        _ => None,
    };
    match &outcome {
        Ok(Ok(info)) if oversize.is_none() => {
            span.record("plugin", info.name.as_str());
            span.record("plugin_version", info.version.as_str());
        }
        _ => {
            span.record("plugin", &*file_stem);
        }
    }
    tracing::debug!(parent: &span, "call ended");
    let info = outcome
        .map_err(|_| fail(format!("did not answer within {:?}", limits.call_timeout)))?
        .map_err(|err| fail(format!("{err:#}")))?;
    if let Some(oversize) = oversize {
        return Err(fail(oversize.to_string()));
    }
    if !is_compatible(&info.contract_version) {
        return Err(LoadError::IncompatibleContract {
            path: path.to_owned(),
            found: format!("a plugin that says it speaks contract {}", info.contract_version),
            host_version: CONTRACT_VERSION,
            compatible: COMPATIBLE_RANGE,
        });
    }
    if info.name.is_empty() {
        return Err(fail("the plugin's name is empty".into()));
    }
    Ok(PluginInfo {
        name: info.name,
        version: info.version,
        contract_version: info.contract_version,
        config_schema: info.config_schema,
        capabilities: Capabilities {
            http: info
                .capabilities
                .http
                .into_iter()
                .map(|d: wit::HttpDestination| HttpDestination {
                    scheme: d.scheme.to_ascii_lowercase(),
                    host: d.host.to_ascii_lowercase(),
                    port: d.port,
                })
                .collect(),
        },
    })
}

fn deny_all_transport() -> Arc<dyn HttpTransport> {
    Arc::new(crate::capabilities::http::DenyAll)
}

/// A store for one call: memory cap, and a deadline enforced by epoch
/// interruption that also yields to the executor on every tick.
pub(crate) fn new_store(
    runtime: &Runtime,
    state: PluginState,
    limits: &Limits,
) -> Store<PluginState> {
    let mut store = Store::new(&runtime.inner.engine, state);
    store.limiter(|state| &mut state.memory);
    store.data_mut().deadline = std::time::Instant::now() + limits.call_timeout;
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(|store| {
        if std::time::Instant::now() >= store.data().deadline {
            Err(wasmtime::Trap::Interrupt.into())
        } else {
            Ok(wasmtime::UpdateDeadline::Yield(1))
        }
    });
    store
}

/// Builds the HTTP capability of an entry: the runtime's shared transport
/// when one was given, otherwise a real client for the entry.
pub(crate) fn entry_http(
    runtime: &Runtime,
    entry: &EntryConfig,
    redactor: Arc<Redactor>,
) -> Result<Arc<EntryHttp>, String> {
    let transport: Arc<dyn HttpTransport> = match &runtime.inner.http_transport {
        Some(transport) => Arc::clone(transport),
        None => Arc::new(crate::capabilities::http::ReqwestTransport::for_entry(
            &entry.grants.http,
            entry.grants.ca_file.as_deref(),
            &entry.limits,
        )?),
    };
    Ok(Arc::new(EntryHttp::new(
        &entry.name,
        &entry.grants.http,
        &entry.limits,
        transport,
        redactor,
        runtime.inner.secrets.clone(),
        crate::capabilities::google::obtain,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compatibility_follows_semver_zero_rules() {
        assert!(is_compatible("0.5.0"));
        assert!(is_compatible("0.5.7"));
        assert!(!is_compatible("0.4.0"));
        assert!(!is_compatible("0.6.0"));
        assert!(!is_compatible("1.1.0"));
        assert!(!is_compatible("nonsense"));
    }
}
