//! The data of one plugin store: WASI context with nothing granted but
//! stdout and stderr (into the log), the HTTP hooks of the entry, limits,
//! and who the call is for.

use std::sync::Arc;

use wasmtime::ResourceLimiter;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use crate::capabilities::CallScope;
use crate::capabilities::config::{CallConfig, ConfigView};
use crate::capabilities::guest_output::{GuestOutput, Stream};
use crate::capabilities::http::{EntryHttp, HttpHooks};
use crate::capabilities::kv::KvView;
use crate::capabilities::libvirt::{EntryLibvirt, LibvirtView};
use crate::capabilities::log::LogView;

/// Caps linear memory growth and remembers that it did, so a trap caused by
/// the cap is reported as such rather than as a bare "out of bounds".
#[derive(Debug)]
pub(crate) struct MemoryCap {
    pub(crate) max_bytes: usize,
    pub(crate) hit: bool,
}

/// Most table elements a plugin may hold; Rust plugins need a few hundred.
const MAX_TABLE_ELEMENTS: usize = 100_000;

/// Largest header map a plugin may build (`wasi:http` fields): the host
/// holds it, outside the plugin's linear memory.
const FIELD_SIZE_LIMIT: usize = 32 << 10;

/// How many host resources (header maps, requests, bodies, streams,
/// uploads) a call may hold at once. They live in host memory, so their
/// number scales with the entry's `memoryMiB`: header maps at their limit
/// then take about as much host memory as the plugin may have of its own.
fn resource_cap(max_memory_bytes: usize) -> usize {
    (max_memory_bytes / FIELD_SIZE_LIMIT).clamp(256, 4096)
}

impl ResourceLimiter for MemoryCap {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.max_bytes {
            self.hit = true;
            return Err(wasmtime::format_err!(
                "memory cap of {} MiB reached (asked for {} MiB)",
                self.max_bytes >> 20,
                desired.div_ceil(1 << 20)
            ));
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }
}

/// The `T` of `Store<T>` for plugin calls.
pub(crate) struct PluginState {
    wasi: WasiCtx,
    http_ctx: WasiHttpCtx,
    table: ResourceTable,
    hooks: HttpHooks,
    pub(crate) memory: MemoryCap,
    pub(crate) scope: CallScope,
    /// When the running call must end; read by the epoch callback.
    pub(crate) deadline: std::time::Instant,
    /// The entry's libvirt hosts; none unless the caller sets them.
    pub(crate) libvirt: Arc<EntryLibvirt>,
    /// The entry's config and lookup table; none unless the caller sets them.
    pub(crate) config: CallConfig,
    /// Store writes this call made, against `limits.kvWritesPerCall`.
    pub(crate) kv_writes: u32,
    /// What the guest printed, logged when the store goes.
    stdout: GuestOutput,
    stderr: GuestOutput,
}

impl PluginState {
    pub(crate) fn new(scope: CallScope, http: Arc<EntryHttp>, max_memory_bytes: usize) -> Self {
        // No preopens, no environment, no arguments, no stdin, and sockets
        // off: a plugin's only way out is the HTTP capability. What it
        // prints goes into the log (a panic's message, a traceback).
        let (stdout, stderr) = (GuestOutput::default(), GuestOutput::default());
        let wasi = WasiCtx::builder()
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .allow_tcp(false)
            .allow_udp(false)
            .build();
        let mut http_ctx = WasiHttpCtx::new();
        http_ctx.set_field_size_limit(FIELD_SIZE_LIMIT);
        let mut table = ResourceTable::new();
        table.set_max_capacity(resource_cap(max_memory_bytes));
        Self {
            wasi,
            http_ctx,
            table,
            hooks: HttpHooks { in_flight: http.call_in_flight(), http },
            memory: MemoryCap { max_bytes: max_memory_bytes, hit: false },
            scope,
            deadline: std::time::Instant::now(),
            libvirt: Arc::default(),
            config: CallConfig::default(),
            kv_writes: 0,
            stdout,
            stderr,
        }
    }
}

impl Drop for PluginState {
    /// The call is over (answered, failed, trapped or timed out): what the
    /// guest printed goes into the log.
    fn drop(&mut self) {
        self.stderr.emit(Stream::Stderr, &self.scope);
        self.stdout.emit(Stream::Stdout, &self.scope);
    }
}

impl WasiView for PluginState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

impl WasiHttpView for PluginState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView { ctx: &mut self.http_ctx, table: &mut self.table, hooks: &mut self.hooks }
    }
}

impl crate::bindings::types::Host for PluginState {}

/// What each capability's imports see of a call: only their own part of
/// the store's data (as `wasmtime-wasi`'s `WasiCtxView`), handed to them
/// by the linker's getters in `engine`.
impl PluginState {
    pub(crate) fn config_view(&mut self) -> ConfigView<'_> {
        ConfigView { config: &self.config }
    }

    pub(crate) fn log_view(&mut self) -> LogView<'_> {
        LogView { scope: &self.scope }
    }

    pub(crate) fn kv_view(&mut self) -> KvView<'_> {
        KvView { scope: &self.scope, writes: &mut self.kv_writes }
    }

    pub(crate) fn libvirt_view(&mut self) -> LibvirtView<'_> {
        LibvirtView { hosts: &self.libvirt, table: &mut self.table }
    }
}
