//! Standalone mode: the reconciler on one machine, without Kubernetes.
//!
//! Desired Proxies come from manifest files ([`desired`]); records, status
//! and the plugins' key-value stores live in one embedded database
//! ([`store`], opened with its installation as a [`StateDb`]);
//! [`Standalone`] runs the same core reconciler, orphan collection and
//! provider checks the Kubernetes mode runs, on the entries of any
//! `ProviderSource` from core.

pub mod desired;
mod dispatch;
mod driver;
mod error;
mod state;
pub mod store;

pub use driver::{ProviderCheck, Settings, Standalone, UNKNOWN_ENTRY_CONCURRENCY};
pub use error::{Error, Result};
pub use state::StateDb;
