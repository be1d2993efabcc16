//! The plugin runtime: loads provider plugins (WebAssembly components built
//! against `wit/provider.wit`) and runs each call in a fresh instance with
//! only the capabilities its provider entry grants.
//!
//! - [`Runtime`]: the engine, linker and precompiled cache, shared.
//! - [`Runtime::load_plugin`]: one component file → a [`PluginRevision`].
//! - [`PluginProvider`]: an entry bound to a revision; implements
//!   [`proxyfleet_core::Provider`].
//! - [`Registry`]: every entry of a providers file, loaded or failed; its
//!   entries take new plugin files that pass [`admission`] while running,
//!   keep the previous revision for [`Registry::rollback`], and report
//!   what they serve and refused in [`Registry::revisions`].
//! - [`watch`]: runs [`Registry::rescan`] when the plugin directory changes.
//! - [`providers_watch`]: runs [`Registry::reconfigure`] when the
//!   providers file changes, so entries change without a restart.
//! - [`follow`]: pulls new builds of the `oci://` plugins entries name, for
//!   the next rescan to offer.
//! - [`config`]: the providers file.
//! - [`capabilities`]: what plugins may use (HTTP, key-value store, logs).

pub mod admission;
mod bindings;
mod bounds;
mod cache;
pub mod capabilities;
pub mod config;
mod engine;
mod error;
pub mod follow;
mod grant_summary;
mod limits;
pub mod min_host;
mod oci;
mod plugin;
mod provider;
pub mod providers_watch;
mod registry;
mod revisions;
mod source;
mod state;
pub mod watch;

pub use bindings::CONTRACT_VERSION;
pub use engine::{EPOCH_TICK, Runtime, RuntimeOptions};
pub use error::{ConfigError, LoadError, RuntimeError};
pub use oci::{PollError, PullStatus};
pub use plugin::{PluginRevision, file_digest};
pub use provider::{Bound, PinnedInstance, PluginProvider};
pub use proxyfleet_core::source::RollbackError;
pub use registry::{EntryChange, EntryState, PendingLoad, PluginLoad, Registry};
pub use revisions::{EntryRevisions, RejectedCandidate, RevisionSummary};
