//! The WebAssembly engine shared by every plugin: configuration, the epoch
//! ticker that enforces call deadlines, and the linker with the host's
//! capabilities.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use proxyfleet_core::installation::InstallationId;
use proxyfleet_core::observe::CallObserver;
use proxyfleet_core::secret_store::SecretStore;
use wasmtime::component::{HasSelf, Linker};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use crate::bindings::{config, kv, libvirt, log, types};
use crate::cache::PrecompiledCache;
use crate::capabilities::config::ConfigImport;
use crate::capabilities::http::HttpTransport;
use crate::capabilities::kv::KvImport;
use crate::capabilities::libvirt::{LibvirtHelper, LibvirtImport};
use crate::capabilities::log::LogImport;
use crate::error::RuntimeError;
use crate::limits::MAX_MEMORY_MIB;
use crate::state::PluginState;

/// How often the engine's epoch advances. A plugin stuck in a loop is
/// stopped at most one tick after its deadline.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Instances the pooling allocator keeps slots for; calls beyond this fail
/// to instantiate (and are retried), so it bounds memory use as well.
const POOL_INSTANCES: u32 = 1000;

/// Bytes of each pooled table kept mapped between instances.
const KEEP_RESIDENT_TABLE_BYTES: usize = 64 << 10;
/// Bytes at the top of each pooled fiber stack kept mapped between calls.
const KEEP_RESIDENT_STACK_BYTES: usize = 256 << 10;

/// How the runtime is set up.
#[derive(Debug, Clone, Default)]
pub struct RuntimeOptions {
    /// Directory for precompiled components and pulled `oci://` builds
    /// (in its `oci` folder); `None` compiles on every load and keeps
    /// pulled builds only while the process runs.
    pub cache_dir: Option<PathBuf>,
    /// What a pull of an `oci://` plugin accepts.
    pub pull_limits: proxyfleet_oci::PullLimits,
    /// A transport for every entry's HTTP requests instead of a real
    /// client per entry (the test harness scripts answers this way).
    pub http_transport: Option<Arc<dyn HttpTransport>>,
    /// Use on-demand allocation even where pooling would work.
    pub disable_pooling: bool,
    /// Told about every call of every entry this runtime serves (a mode
    /// passes its metrics here); `None` reports nowhere.
    pub observer: Option<Arc<dyn CallObserver>>,
    /// The installation every create names, so plugins put it in their
    /// ownership marks; both modes settle it at start
    /// ([`proxyfleet_core::installation::settle`]).
    pub installation: InstallationId,
    /// The libvirt helper program (`proxyfleet-libvirt`); `None`: the one
    /// next to the running executable. Started only when an entry with a
    /// libvirt grant first connects.
    pub libvirt_helper: Option<PathBuf>,
    /// Reads the Kubernetes Secrets credentials name by `secretRef`;
    /// `None` (standalone): an entry naming one is refused, saying so.
    pub secrets: Option<Arc<dyn SecretStore>>,
}

/// The shared engine and linker. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Runtime {
    pub(crate) inner: Arc<RuntimeInner>,
    /// The installation every create names, and the only one whose
    /// instances a delete touches.
    pub(crate) installation: InstallationId,
}

pub(crate) struct RuntimeInner {
    pub(crate) engine: Engine,
    pub(crate) linker: Linker<PluginState>,
    pub(crate) cache: Option<PrecompiledCache>,
    /// Where pulled builds are kept; `None`: a directory of the registry's own.
    pub(crate) oci_store_dir: Option<PathBuf>,
    pub(crate) pull_limits: proxyfleet_oci::PullLimits,
    pub(crate) http_transport: Option<Arc<dyn HttpTransport>>,
    pub(crate) observer: Option<Arc<dyn CallObserver>>,
    pub(crate) pooling: bool,
    pub(crate) libvirt: Arc<LibvirtHelper>,
    pub(crate) secrets: Option<Arc<dyn SecretStore>>,
    /// One compilation at a time. Each one already spreads its functions
    /// over every core (`parallel_compilation`), so a second alongside it
    /// would gain little time and hold a second set of compiled functions in
    /// memory: compiling the four first-party plugins two at a time peaked
    /// 3–8 MiB higher and was no faster (docs/sizing.md).
    pub(crate) compiling: tokio::sync::Semaphore,
}

impl std::fmt::Debug for RuntimeInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeInner")
            .field("cache", &self.cache)
            .field("pooling", &self.pooling)
            .field("observer", &self.observer)
            .finish_non_exhaustive()
    }
}

impl Runtime {
    /// Creates the engine (pooling allocator where the address space
    /// allows, on-demand otherwise), the epoch ticker and the linker.
    pub fn new(options: RuntimeOptions) -> Result<Self, RuntimeError> {
        let (engine, pooling) = if options.disable_pooling {
            (build_engine(false)?, false)
        } else {
            match build_engine(true) {
                Ok(engine) => (engine, true),
                Err(err) => {
                    tracing::warn!("pooling allocator unavailable ({err}); allocating on demand");
                    (build_engine(false)?, false)
                }
            }
        };
        spawn_epoch_ticker(&engine);
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)
            .and_then(|()| wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker))
            // Each import gets only its capability's view of the call.
            .and_then(|()| {
                types::add_to_linker::<_, HasSelf<PluginState>>(&mut linker, |state| state)
            })
            .and_then(|()| {
                config::add_to_linker::<_, ConfigImport>(&mut linker, PluginState::config_view)
            })
            .and_then(|()| log::add_to_linker::<_, LogImport>(&mut linker, PluginState::log_view))
            .and_then(|()| kv::add_to_linker::<_, KvImport>(&mut linker, PluginState::kv_view))
            .and_then(|()| {
                libvirt::add_to_linker::<_, LibvirtImport>(&mut linker, PluginState::libvirt_view)
            })
            .map_err(|err| RuntimeError::Engine(format!("{err:#}")))?;
        let oci_store_dir = options.cache_dir.as_ref().map(|dir| dir.join("oci"));
        let cache =
            options.cache_dir.map(|dir| PrecompiledCache::open(dir, &engine)).transpose()?;
        Ok(Self {
            inner: Arc::new(RuntimeInner {
                engine,
                linker,
                cache,
                oci_store_dir,
                pull_limits: options.pull_limits,
                http_transport: options.http_transport,
                observer: options.observer,
                pooling,
                compiling: tokio::sync::Semaphore::new(1),
                libvirt: Arc::new(
                    options
                        .libvirt_helper
                        .map_or_else(LibvirtHelper::beside_current_exe, LibvirtHelper::new),
                ),
                secrets: options.secrets,
            }),
            installation: options.installation,
        })
    }

    /// The installation every create names (see [`RuntimeOptions`]).
    pub fn installation(&self) -> &InstallationId {
        &self.installation
    }

    /// This runtime (its engine, compiled plugins and cache) serving
    /// another installation: what a second operator sharing the backends
    /// would be, for the conformance suite.
    pub fn for_installation(&self, installation: InstallationId) -> Self {
        Self { inner: Arc::clone(&self.inner), installation }
    }

    /// Whether instances come from the pooling allocator.
    pub fn uses_pooling(&self) -> bool {
        self.inner.pooling
    }
}

fn build_engine(pooling: bool) -> Result<Engine, RuntimeError> {
    let mut config = Config::new();
    config.epoch_interruption(true);
    config.parallel_compilation(true);
    // Copy-on-write images make instantiation map memory instead of copying
    // data segments: most of what a fresh instance per call costs.
    config.memory_init_cow(true);
    if pooling {
        let mut pool = PoolingAllocationConfig::default();
        pool.total_component_instances(POOL_INSTANCES)
            .total_core_instances(POOL_INSTANCES * 8)
            .total_memories(POOL_INSTANCES * 2)
            .total_tables(POOL_INSTANCES * 4)
            .total_stacks(POOL_INSTANCES)
            .max_memories_per_component(4)
            .max_core_instances_per_component(32)
            .max_memory_size(usize::try_from(MAX_MEMORY_MIB << 20).unwrap_or(usize::MAX))
            // Resetting the used end of a fiber stack and of a table with
            // memset instead of madvise saves a page fault per page on the
            // next call and the TLB shootdowns of unmapping (about 5 µs of a
            // fresh-instance call, measured by the plugin_call bench).
            // Linear memory is left to madvise: a Rust plugin's stack sits
            // at the top of its first MiB, so keeping memory resident would
            // mean a 1 MiB memset per call, which costs more than it saves.
            .table_keep_resident(KEEP_RESIDENT_TABLE_BYTES)
            .async_stack_keep_resident(KEEP_RESIDENT_STACK_BYTES);
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    }
    Engine::new(&config).map_err(|err| RuntimeError::Engine(format!("{err:#}")))
}

/// Advances the epoch every [`EPOCH_TICK`] until the engine is dropped.
fn spawn_epoch_ticker(engine: &Engine) {
    let weak = engine.weak();
    let spawned = std::thread::Builder::new().name("proxyfleet-epoch".into()).spawn(move || {
        while let Some(engine) = weak.upgrade() {
            engine.increment_epoch();
            drop(engine);
            std::thread::sleep(EPOCH_TICK);
        }
    });
    if let Err(err) = spawned {
        // Without the ticker deadlines still hold through the async timeout
        // around every call; only pure loops could overrun.
        tracing::error!("cannot start the epoch ticker: {err}");
    }
}
