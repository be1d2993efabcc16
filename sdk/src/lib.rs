//! Write proxyfleet provider plugins in Rust.
//!
//! A provider plugin is a WebAssembly component (`wasm32-wasip2`) that the
//! proxyfleet operator loads to create, inspect and delete proxy instances on
//! one kind of backend. This crate wraps the plugin contract
//! (`wit/provider.wit`, package `proxyfleet:provider@0.5.0`) in plain Rust:
//!
//! - implement [`Provider`] for a type and export it with [`export_provider!`];
//! - read the entry's JSON config with [`CallContext::config`];
//! - talk to the backend's API with the blocking [`http`] client;
//! - keep allocation bookkeeping in the entry's [`kv`] store;
//! - drive hypervisors the entry grants through [`libvirt`] (over SSH);
//! - log through the host with [`log`];
//! - mark instances as ours with [`OwnershipMark`] and derive stable names and
//!   numbers from the Proxy UID with [`derive_name`] and [`derive_number`], so
//!   that a retried `create` adopts what an earlier attempt left.
//!
//! # Example
//!
//! A provider that hands out one fixed address per Proxy, remembering the
//! assignment in the key-value store:
//!
//! ```
//! use proxyfleet_sdk::{
//!     export_provider, kv, log, CallContext, Capabilities, Health, Instance, InstanceState,
//!     OwnershipMark, PluginInfo, Provider, ProviderError, ProxySpec, Result,
//! };
//!
//! #[derive(serde::Deserialize)]
//! #[serde(deny_unknown_fields)]
//! struct Config {
//!     address: String,
//! }
//!
//! struct Fixed;
//!
//! impl Provider for Fixed {
//!     fn describe() -> PluginInfo {
//!         PluginInfo::new(
//!             "fixed",
//!             env!("CARGO_PKG_VERSION"),
//!             r#"{"type":"object","required":["address"],"properties":{"address":{"type":"string"}}}"#,
//!             Capabilities::default(),
//!         )
//!     }
//!
//!     fn validate_config(config: &str) -> Result<()> {
//!         proxyfleet_sdk::parse_config::<Config>(config).map(drop)
//!     }
//!
//!     fn create(ctx: &CallContext, spec: &ProxySpec) -> Result<Instance> {
//!         let config: Config = ctx.config()?;
//!         let key = format!("proxy/{}", spec.uid);
//!         // Expected version `None`: only the first attempt writes; a retry
//!         // finds the key taken and adopts it.
//!         let _ = kv::compare_and_swap(&key, None, Some(spec.name.as_bytes()))?;
//!         log::info!("assigned", uid = spec.uid, address = config.address);
//!         let mark = OwnershipMark::for_spec(spec, proxyfleet_sdk::now_unix());
//!         Ok(Instance {
//!             provider_id: spec.uid.clone(),
//!             name: spec.name.clone(),
//!             state: InstanceState::Running,
//!             addresses: vec![config.address],
//!             port: None,
//!             created_at: Some(mark.created_at),
//!             mark: Some(mark),
//!         })
//!     }
//!
//!     fn get(ctx: &CallContext, provider_id: &str) -> Result<Instance> {
//!         match kv::get(&format!("proxy/{provider_id}"))? {
//!             Some(_) => Ok(Instance {
//!                 provider_id: provider_id.to_owned(),
//!                 name: provider_id.to_owned(),
//!                 state: InstanceState::Running,
//!                 addresses: vec![ctx.config::<Config>()?.address],
//!                 port: None,
//!                 created_at: None,
//!                 mark: None,
//!             }),
//!             None => Err(ProviderError::NotFound(format!("no proxy {provider_id}"))),
//!         }
//!     }
//!
//!     fn delete(_ctx: &CallContext, provider_id: &str) -> Result<()> {
//!         if let Some(entry) = kv::get(&format!("proxy/{provider_id}"))? {
//!             let _ = kv::compare_and_swap(&entry.key, Some(entry.version), None)?;
//!         }
//!         Ok(())
//!     }
//!
//!     fn list(_ctx: &CallContext) -> Result<Vec<Instance>> {
//!         Ok(Vec::new())
//!     }
//!
//!     fn check(_ctx: &CallContext) -> Health {
//!         Health::healthy()
//!     }
//! }
//!
//! export_provider!(Fixed);
//! # fn main() {}
//! ```
//!
//! Build it with `cargo build --release --target wasm32-wasip2` and a crate
//! type of `cdylib`. Off wasm (in `cargo test` on the host target) the calls
//! into the host (`kv`, `log`, `http`) go to the [`native`] host installed
//! for the thread: `proxyfleet-sdk-testkit` runs a provider's functions with
//! an in-memory store and declared HTTP exchanges that way. The
//! [`libvirt`] interface has no native host and panics off wasm.

#![deny(missing_docs)]

// The generated export glue in `bindings` names the runtime as
// `::proxyfleet_sdk::...` so that it resolves from the plugin crate that
// expands `export_provider!`; this makes the same path resolve in here.
extern crate self as proxyfleet_sdk;

pub mod cloud_init;
mod config;
mod error;
pub mod http;
pub mod iso;
pub mod kv;
mod kv_error;
pub mod libvirt;
pub mod log;
mod mark;
mod method;
mod naming;
#[cfg(not(target_arch = "wasm32"))]
pub mod native;
mod provider;
mod types;
pub mod xml;

pub use config::parse_config;
pub use error::{ProviderError, Result};
pub use mark::{LabelError, MARK_LABEL_KEYS};
pub use naming::{derive_name, derive_number, now_unix};
pub use provider::Provider;
pub use types::{
    CONTRACT_VERSION, CallContext, Capabilities, Health, HealthIssue, HealthReason,
    HttpDestination, Instance, InstanceState, Network, OwnershipMark, PluginInfo, ProxyAuth,
    ProxySpec,
};

/// Bindings generated from `wit/` by wit-bindgen. Not part of the API: use
/// the re-exports and wrappers at the crate root.
#[doc(hidden)]
#[allow(
    missing_docs,
    unsafe_code,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic,
    reason = "generated by wit-bindgen"
)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "wit",
        world: "provider-plugin",
        // `export_provider!` expands the export macro inside plugin crates.
        pub_export_macro: true,
        runtime_path: "::proxyfleet_sdk::__private::wit_bindgen_rt",
        additional_derives: [PartialEq, Eq],
    });
}

/// Declares the oldest proxyfleet release a plugin runs on, for a plugin
/// that relies on host behaviour newer than its contract version says:
/// a host older than `$version` refuses the build at load, naming both
/// versions, instead of loading it and failing later. Hosts that predate
/// the declaration ignore it. Written once, at the crate root:
///
/// ```ignore
/// proxyfleet_sdk::min_host_version!("0.2.0");
/// ```
///
/// It is the custom section `proxyfleet-min-host-version` of the built
/// component; `proxyfleet plugin inspect` shows it as `minHostVersion`.
#[macro_export]
macro_rules! min_host_version {
    ($version:literal) => {
        const _: () = {
            const VERSION: &str = $version;
            #[allow(unsafe_code, reason = "a custom section holding a version, never executed")]
            #[used]
            #[unsafe(link_section = "proxyfleet-min-host-version")]
            static MIN_HOST_VERSION: [u8; VERSION.len()] = {
                let bytes = VERSION.as_bytes();
                let mut out = [0u8; VERSION.len()];
                let mut i = 0;
                while i < bytes.len() {
                    out[i] = bytes[i];
                    i += 1;
                }
                out
            };
        };
    };
}

/// Items the exported macros expand to. Not part of the API.
#[doc(hidden)]
pub mod __private {
    pub use crate::provider::{Export, assert_provider};
    pub use wit_bindgen::rt as wit_bindgen_rt;
}
