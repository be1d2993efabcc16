//! The [`Provider`] trait and the glue that exports an implementation as the
//! component's `provider` interface.

use std::fmt;
use std::marker::PhantomData;

use crate::bindings::exports::proxyfleet::provider::provider::Guest;
use crate::bindings::proxyfleet::provider::types as wit;
use crate::{CallContext, Health, Instance, PluginInfo, ProxySpec, Result};

/// A provider backend: what a plugin implements.
///
/// The host may call any function concurrently from separate instances of
/// the component and retries after errors and timeouts, so every operation
/// must be safe to repeat: keep state in the backend (or the [`crate::kv`]
/// store), never in memory between calls. Errors are classified by their
/// [`crate::ProviderError`] variant, which decides what the host does next.
///
/// ```
/// use proxyfleet_sdk::{
///     CallContext, Capabilities, Health, Instance, PluginInfo, Provider, ProviderError, ProxySpec,
///     Result,
/// };
///
/// /// A backend with no room: it never has an instance.
/// struct Full;
///
/// impl Provider for Full {
///     fn describe() -> PluginInfo {
///         PluginInfo::new("full", "0.1.0", r#"{"type":"object"}"#, Capabilities::default())
///     }
///     fn validate_config(config: &str) -> Result<()> {
///         proxyfleet_sdk::parse_config::<serde_json::Map<String, serde_json::Value>>(config).map(drop)
///     }
///     fn create(_: &CallContext, spec: &ProxySpec) -> Result<Instance> {
///         Err(ProviderError::QuotaExceeded(format!("no room for {}", spec.name)))
///     }
///     fn get(_: &CallContext, provider_id: &str) -> Result<Instance> {
///         Err(ProviderError::NotFound(format!("no instance {provider_id}")))
///     }
///     fn delete(_: &CallContext, _: &str) -> Result<()> {
///         Ok(()) // Already gone counts as deleted.
///     }
///     fn list(_: &CallContext) -> Result<Vec<Instance>> {
///         Ok(Vec::new())
///     }
///     fn check(_: &CallContext) -> Health {
///         Health::healthy()
///     }
/// }
///
/// assert_eq!(Full::validate_config("{}"), Ok(()));
/// assert!(matches!(Full::validate_config("[]"), Err(ProviderError::InvalidConfig(_))));
/// ```
pub trait Provider {
    /// Name, version, contract version, config schema and the HTTP
    /// destinations the plugin needs. Called once when the plugin loads.
    fn describe() -> PluginInfo;

    /// Checks an entry's config (JSON) when the entry is loaded, before any
    /// other call for it. Return [`crate::ProviderError::InvalidConfig`]
    /// naming the key; [`crate::parse_config`] does that for serde types.
    fn validate_config(config: &str) -> Result<()>;

    /// The entry's lookup table, made once when the entry is loaded, after
    /// [`Provider::validate_config`] accepted `config`: pairs of key and
    /// value that calls read one at a time with [`CallContext::lookup`]
    /// instead of parsing the whole config. Worth it for a long list (the
    /// `static` plugin answers one key per endpoint, so a `get` among
    /// 10,000 endpoints reads one); the default answers none. Keys must be
    /// unique, and the host keeps at most four times the config's size plus
    /// 64 KiB.
    ///
    /// ```
    /// use proxyfleet_sdk::{Provider, Result};
    /// # use proxyfleet_sdk::{CallContext, Capabilities, Health, Instance, PluginInfo, ProxySpec};
    ///
    /// #[derive(serde::Deserialize)]
    /// struct Config {
    ///     nodes: Vec<String>,
    /// }
    ///
    /// struct Nodes;
    ///
    /// impl Provider for Nodes {
    ///     fn validate_config(config: &str) -> Result<()> {
    ///         proxyfleet_sdk::parse_config::<Config>(config).map(drop)
    ///     }
    ///     /// `node/<name>` for every node, so a call checks one by name.
    ///     fn lookup_table(config: &str) -> Result<Vec<(String, String)>> {
    ///         let config: Config = proxyfleet_sdk::parse_config(config)?;
    ///         Ok(config.nodes.into_iter().map(|node| (format!("node/{node}"), String::new())).collect())
    ///     }
    /// #   fn describe() -> PluginInfo { PluginInfo::new("nodes", "0.1.0", "{}", Capabilities::default()) }
    /// #   fn create(_: &CallContext, _: &ProxySpec) -> Result<Instance> { unimplemented!() }
    /// #   fn get(_: &CallContext, _: &str) -> Result<Instance> { unimplemented!() }
    /// #   fn delete(_: &CallContext, _: &str) -> Result<()> { Ok(()) }
    /// #   fn list(_: &CallContext) -> Result<Vec<Instance>> { Ok(Vec::new()) }
    /// #   fn check(_: &CallContext) -> Health { Health::healthy() }
    /// }
    ///
    /// let table = Nodes::lookup_table(r#"{"nodes":["pve1","pve2"]}"#)?;
    /// assert_eq!(table[1], ("node/pve2".to_owned(), String::new()));
    /// # Ok::<(), proxyfleet_sdk::ProviderError>(())
    /// ```
    fn lookup_table(config: &str) -> Result<Vec<(String, String)>> {
        let _ = config;
        Ok(Vec::new())
    }

    /// Brings an instance for `spec` into existence.
    ///
    /// Idempotent: a retry for the same `spec.uid` must adopt what an
    /// earlier attempt left (derive the backend name or ID from the UID with
    /// [`crate::derive_name`] or [`crate::derive_number`], and find it again)
    /// instead of making a second instance. Mark what it creates with
    /// [`crate::OwnershipMark`].
    fn create(ctx: &CallContext, spec: &ProxySpec) -> Result<Instance>;

    /// The instance `provider_id` as the backend sees it now;
    /// [`crate::ProviderError::NotFound`] when it is gone.
    fn get(ctx: &CallContext, provider_id: &str) -> Result<Instance>;

    /// Deletes the instance. Idempotent: one that is already gone counts as
    /// deleted, so return `Ok(())` for it.
    fn delete(ctx: &CallContext, provider_id: &str) -> Result<()>;

    /// Every instance this entry owns (carrying our ownership mark), for
    /// orphan collection.
    fn list(ctx: &CallContext) -> Result<Vec<Instance>>;

    /// Whether the backend is usable with this entry's config and
    /// credentials. Issues on a healthy result are warnings.
    fn check(ctx: &CallContext) -> Health;
}

/// Exports a [`Provider`] implementation as the plugin's `provider`
/// interface. Use it once, at the top level of the plugin crate (a `cdylib`):
///
/// ```ignore
/// struct MyProvider;
/// impl proxyfleet_sdk::Provider for MyProvider { /* ... */ }
/// proxyfleet_sdk::export_provider!(MyProvider);
/// ```
///
/// The exports are only emitted for wasm targets: on the host target (unit
/// tests) they would be shared-library symbols named like
/// `proxyfleet:provider/provider@0.5.0#create`, which native linkers reject.
/// There the macro only checks that the type implements [`Provider`].
#[macro_export]
macro_rules! export_provider {
    ($provider:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            // The generated export macro takes an identifier, not a path or
            // a generic type, hence the alias.
            type ProxyfleetExportedProvider = $crate::__private::Export<$provider>;
    $crate::bindings::export!(ProxyfleetExportedProvider with_types_in $crate::bindings);
        };
        #[cfg(not(target_arch = "wasm32"))]
        const _: () = $crate::__private::assert_provider::<$provider>();
    };
}

/// Compile-time check behind `export_provider!` off wasm.
#[doc(hidden)]
pub const fn assert_provider<P: Provider>() {}

/// Adapts a [`Provider`] to the generated `Guest` trait: converts errors to
/// the contract's variant and passes borrowed arguments.
#[doc(hidden)]
pub struct Export<P>(PhantomData<fn() -> P>);

impl<P> fmt::Debug for Export<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Export")
    }
}

impl<P: Provider> Guest for Export<P> {
    fn describe() -> PluginInfo {
        P::describe()
    }

    fn validate_config(config: String) -> Result<Vec<(String, String)>, wit::ProviderError> {
        P::validate_config(&config).and_then(|()| P::lookup_table(&config)).map_err(Into::into)
    }

    fn create(ctx: CallContext, spec: ProxySpec) -> Result<Instance, wit::ProviderError> {
        P::create(&ctx, &spec).map_err(Into::into)
    }

    fn get(ctx: CallContext, provider_id: String) -> Result<Instance, wit::ProviderError> {
        P::get(&ctx, &provider_id).map_err(Into::into)
    }

    fn delete(ctx: CallContext, provider_id: String) -> Result<(), wit::ProviderError> {
        P::delete(&ctx, &provider_id).map_err(Into::into)
    }

    fn list(ctx: CallContext) -> Result<Vec<Instance>, wit::ProviderError> {
        P::list(&ctx).map_err(Into::into)
    }

    fn check(ctx: CallContext) -> Health {
        P::check(&ctx)
    }
}
