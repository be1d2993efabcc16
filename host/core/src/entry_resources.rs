//! Provider entries declared as resources (a Kubernetes
//! `ClusterProxyProvider`) rather than in the providers file: what a mode
//! hands the registry for each one, and what becomes of it.
//!
//! The plugin runtime implements [`ResourceEntries`] (it parses a spec as
//! it parses an entry of the providers file and binds it live); the
//! Kubernetes adapter drives it from its watch and reports the outcome in
//! the resource's conditions, knowing nothing of WebAssembly.

use async_trait::async_trait;

use crate::source::ProviderSource;

/// What became of a spec handed to [`ResourceEntries::apply`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// The entry serves this spec (it did already, or does now).
    Serving,
    /// The spec does not validate; nothing changed. The message names the
    /// key and the fix.
    Invalid {
        /// Why, naming the key.
        message: String,
    },
    /// The spec validates, but its plugin is unavailable or refused it.
    /// `kept_serving`: the entry still serves the spec it had before.
    Refused {
        /// Why, naming the plugin or the key at fault.
        reason: String,
        /// Whether the spec before still serves.
        kept_serving: bool,
    },
    /// The providers file has another entry of this name; the resource
    /// serves nothing until one of them is renamed. (A resource that
    /// states the file's entry as written shows that entry instead: it
    /// comes to what the entry comes to.)
    NameTaken,
}

/// Entries a mode declares one by one, beside those of the providers file.
#[async_trait]
pub trait ResourceEntries: ProviderSource {
    /// Serves `spec` (an entry as the providers file writes one, without
    /// its name, as JSON) as entry `name`; a spec equal to the one applied
    /// last changes nothing.
    async fn apply(&self, name: &str, spec: &serde_json::Value) -> Applied;

    /// Stops serving entry `name`, when a resource declared it.
    async fn remove(&self, name: &str);

    /// Every entry a resource declared, by name.
    fn resource_names(&self) -> Vec<String>;

    /// Every entry of the providers file as written (without its name),
    /// by name: what a cluster shows as resources. Entries whose name a
    /// resource took are left out.
    fn file_entries(&self) -> Vec<(String, serde_json::Value)>;
}
