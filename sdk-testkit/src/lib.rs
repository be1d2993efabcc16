//! Unit-test proxyfleet provider plugins natively, with `cargo test`.
//!
//! A plugin written with `proxyfleet-sdk` runs in the operator as a
//! WebAssembly component; its logic can also run natively, because off
//! wasm the SDK sends its key-value, HTTP and log calls to a host installed
//! for the thread ([`proxyfleet_sdk::native`]). [`TestKit`] is that host,
//! and calls the plugin's [`proxyfleet_sdk::Provider`] functions as the
//! operator would:
//!
//! - [`TestKit::new`] runs `validate_config` on the entry's config first;
//! - the key-value store ([`MemoryKv`]) is in memory, with the operator's
//!   versions, compare-and-swap and key and value size limits (not the
//!   entry's `limits` on key count, total size or writes per call);
//! - HTTP requests are answered by declared [`Exchange`]s or a route
//!   closure, and a request to a destination the plugin's `describe` does
//!   not name is refused as the operator refuses it;
//! - log records are kept ([`TestKit::logs`]);
//! - [`TestKit::verify`] fails the test on a request nothing answered, an
//!   exchange never used, or a Proxy credential where it must not be;
//! - [`assert_config_schema`] holds the config schema `describe` reports
//!   to what `validate_config` accepts.
//!
//! No WebAssembly runtime and no libvirt client are involved. The libvirt
//! interface has no in-memory stand-in: test a libvirt plugin's pure logic
//! (domain XML, address choice) directly, and the plugin itself with
//! `proxyfleet plugin test` against a libvirt daemon.
//!
//! The kit exists only off wasm: built for `wasm32` (as part of a plugin
//! workspace) the crate is empty.
//!
//! # Example
//!
//! A provider that finds its instance over HTTP and keeps the assignment in
//! the store, tested for a create that a retry adopts:
//!
//! ```
//! use proxyfleet_sdk::http::Request;
//! use proxyfleet_sdk::{
//!     CallContext, Capabilities, Health, HttpDestination, Instance, InstanceState, PluginInfo,
//!     Provider, ProviderError, ProxySpec, Result, kv,
//! };
//! use proxyfleet_sdk_testkit::{Exchange, Reply, TestKit, spec};
//!
//! struct Lookup;
//!
//! impl Provider for Lookup {
//!     fn describe() -> PluginInfo {
//!         let http = vec![HttpDestination::https("api.example", None)];
//!         PluginInfo::new("lookup", "0.1.0", "{}", Capabilities { http })
//!     }
//!     fn validate_config(config: &str) -> Result<()> {
//!         proxyfleet_sdk::parse_config::<serde_json::Map<String, serde_json::Value>>(config)
//!             .map(drop)
//!     }
//!     fn create(_: &CallContext, spec: &ProxySpec) -> Result<Instance> {
//!         #[derive(serde::Deserialize)]
//!         struct Found {
//!             address: String,
//!         }
//!         let key = format!("proxy/{}", spec.uid);
//!         let address = match kv::get(&key)? {
//!             Some(entry) => String::from_utf8_lossy(&entry.value).into_owned(),
//!             None => {
//!                 let url = format!("https://api.example/free/{}", spec.name);
//!                 let found: Found = Request::get(url).send()?.json()?;
//!                 kv::compare_and_swap(&key, None, Some(found.address.as_bytes()))?;
//!                 found.address
//!             }
//!         };
//!         Ok(Instance {
//!             provider_id: spec.uid.clone(),
//!             name: spec.name.clone(),
//!             state: InstanceState::Running,
//!             addresses: vec![address],
//!             port: Some(spec.port),
//!             created_at: None,
//!             mark: None,
//!         })
//!     }
//!     fn get(_: &CallContext, id: &str) -> Result<Instance> {
//!         Err(ProviderError::NotFound(id.to_owned()))
//!     }
//!     fn delete(_: &CallContext, _: &str) -> Result<()> {
//!         Ok(())
//!     }
//!     fn list(_: &CallContext) -> Result<Vec<Instance>> {
//!         Ok(Vec::new())
//!     }
//!     fn check(_: &CallContext) -> Health {
//!         Health::healthy()
//!     }
//! }
//!
//! let kit = TestKit::<Lookup>::new(&serde_json::json!({})).expect("the config is valid");
//! // Declared once: the retry must not ask again.
//! kit.expect(
//!     Exchange::get("https://api.example/free/web-1")
//!         .reply(Reply::json(200, &serde_json::json!({"address": "192.0.2.7"}))),
//! );
//! let spec = spec("web-1");
//! let first = kit.create(&spec).expect("created");
//! let retry = kit.create(&spec).expect("adopted");
//! assert_eq!(first, retry);
//! assert_eq!(kit.kv().entries().len(), 1);
//! kit.verify();
//! ```

#![cfg(not(target_arch = "wasm32"))]

mod exchanges;
mod kit;
mod schema;
mod spec;
mod store;

pub use exchanges::{Exchange, Reply};
pub use kit::{DEFAULT_DEADLINE, DEFAULT_ENTRY, LogRecord, TestKit};
pub use proxyfleet_sdk::native::{ErrorCode, HttpRequest, HttpResponse};
pub use schema::assert_config_schema;
pub use spec::{INSTALLATION, spec, spec_with_auth, uid};
pub use store::{MAX_KEY_BYTES, MAX_VALUE_BYTES, MemoryKv};
