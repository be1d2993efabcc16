//! The domain of proxyfleet: what a proxy instance is, what a provider can
//! do with one, and how its failures are classified.
//!
//! This crate knows neither Kubernetes nor WebAssembly. The reconciler, the
//! plugin runtime and tests all meet here: the runtime implements
//! [`Provider`] for plugins, tests implement it with fakes, and the
//! reconciler acts on [`ErrorClass`] without caring which it talks to.

pub mod address;
pub mod clock;
pub mod credential;
pub mod entry_resources;
mod error;
pub mod fake;
pub mod gc;
pub mod installation;
pub mod kv;
pub mod liveness;
pub mod observe;
pub mod pool;
mod provider;
pub mod proxy;
pub mod reconcile;
pub mod revisions;
pub mod secret_store;
pub mod source;
pub mod spec_key;
mod types;

pub use error::{ErrorClass, ProviderError, Result};
pub use provider::Provider;
pub use types::{
    Capabilities, Health, HealthIssue, HealthReason, HttpDestination, Instance, InstanceState,
    OwnershipMark, PluginInfo, ProxySpec,
};
