//! Standalone mode: the reconciler on one machine, without Kubernetes.
//!
//! Desired Proxies come from manifest files ([`desired`]); records, status
//! and the plugins' key-value stores live in one embedded database
//! ([`store`]); [`Standalone`] runs the same core reconciler, orphan
//! collection and provider checks the Kubernetes mode runs.

pub mod desired;
mod dispatch;
mod driver;
mod error;
pub mod store;

pub use driver::{ProviderCheck, Settings, Standalone};
pub use error::{Error, Result};
