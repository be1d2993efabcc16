//! The `Provider` trait: what the reconciler can ask of a provider entry.

use async_trait::async_trait;

use crate::{Health, Instance, PluginInfo, ProxySpec, Result};

/// One provider entry, bound to its config: the reconciler's only view of a
/// backend. Implemented by the plugin runtime for WebAssembly plugins and by
/// fakes in tests.
///
/// Contract, whoever implements it:
/// - `create` is idempotent per `spec.uid`: a retry adopts what an earlier
///   attempt left and never makes a second instance.
/// - `get` answers [`crate::ErrorClass::NotFound`] when the instance is gone.
/// - `delete` of an instance that is already gone succeeds.
/// - `list` returns only instances that carry our ownership mark.
#[async_trait]
pub trait Provider: Send + Sync {
    /// Name of the provider entry.
    fn entry(&self) -> &str;

    /// What the plugin serving this entry says about itself.
    fn info(&self) -> PluginInfo;

    /// Creates (or adopts) the instance for `spec.uid`.
    async fn create(&self, spec: &ProxySpec) -> Result<Instance>;

    /// Reads an instance by its provider-id.
    async fn get(&self, provider_id: &str) -> Result<Instance>;

    /// Deletes an instance by its provider-id.
    async fn delete(&self, provider_id: &str) -> Result<()>;

    /// Every instance this entry owns.
    async fn list(&self) -> Result<Vec<Instance>>;

    /// Checks that the backend can serve calls.
    async fn check(&self) -> Health;
}
