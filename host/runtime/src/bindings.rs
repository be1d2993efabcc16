//! Host bindings of the provider contract: the one `bindgen!` of the
//! project. Host implementations of the imports live in `capabilities`,
//! each on its capability's view of the call; these bindings name none of
//! them (the `libvirt.upload` resource stays bindgen's opaque handle).

wasmtime::component::bindgen!({
    path: "../../wit",
    world: "provider-plugin",
    imports: { default: async },
    exports: { default: async },
});

pub(crate) use exports::proxyfleet::provider::provider::Guest;
pub(crate) use proxyfleet::provider::{config, kv, libvirt, log, types};

/// The contract version this host speaks, read from `wit/provider.wit`'s
/// package line at build time.
pub const CONTRACT_VERSION: &str = env!("PROXYFLEET_CONTRACT_VERSION");

/// The name a compatible component exports the provider interface under,
/// without its version.
pub(crate) const PROVIDER_EXPORT: &str = "proxyfleet:provider/provider";
