//! The plugin contract's MUST list (`docs/plugin-contract.md`) as a suite
//! any provider entry can be put through: `describe` is well formed,
//! `validate-config` refuses an unknown key naming it and a config without
//! a key its schema requires naming that, `create` is idempotent per UID
//! and writes the mark (with the spec's installation), creates for
//! different Proxies at once get instances of their own, `get` reads the
//! mark back and answers `not-found` for an unknown id, `list` returns
//! only instances this installation marked, `delete` is idempotent,
//! `check` answers within its deadline, a cancelled call ends at once and
//! its retry adopts, and nothing a call returns holds the Proxy's
//! credential.
//!
//! It drives the entry through core's [`Provider`], so it runs the same on
//! a WebAssembly component the runtime bound (`proxyfleet plugin test`) and
//! on fakes in its own tests. It creates instances in the entry's backend
//! (a simulator, or a backend set aside for tests) for Proxies of its own,
//! `conformance-<random>`, and deletes them again, also after a failure.
//!
//! ```no_run
//! # async fn example(
//! #     provider: std::sync::Arc<dyn proxyfleet_core::Provider>,
//! #     binder: &dyn proxyfleet_conformance::Binder,
//! #     spec: proxyfleet_core::ProxySpec,
//! # ) {
//! let options = proxyfleet_conformance::Options::new(serde_json::json!({}), spec);
//! let report = proxyfleet_conformance::run(provider, binder, &options).await;
//! print!("{}", report.text());
//! std::fs::write("conformance.xml", report.junit()).unwrap();
//! assert!(report.passed());
//! # }
//! ```

mod cases;
mod report;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use proxyfleet_core::{Provider, ProviderError, ProxySpec};
use serde_json::Value;

pub use report::{Case, Outcome, Report};

/// Binds the entry under test with another config, as the host does when
/// it loads an entry: the plugin's `validate-config` decides.
#[async_trait]
pub trait Binder: Send + Sync {
    /// The entry with `config` in place of its own config, or the error
    /// its `validate-config` answered.
    async fn bind(&self, config: &Value) -> Result<Arc<dyn Provider>, ProviderError>;

    /// The installation the host puts into every spec it hands the entry,
    /// which every mark must carry unchanged.
    fn installation(&self) -> String;

    /// The entry with `config`, bound under another installation that
    /// shares its backend (with a key-value store of its own): what a
    /// second operator would be. `None` skips the case that needs it.
    async fn bind_elsewhere(
        &self,
        config: &Value,
    ) -> Option<Result<Arc<dyn Provider>, ProviderError>> {
        let _ = config;
        None
    }
}

/// What the suite needs to know about the entry.
#[derive(Debug, Clone)]
pub struct Options {
    /// The entry's config, as `validate-config` receives it.
    pub config: Value,
    /// What each of the suite's Proxies asks for; the suite sets the name,
    /// namespace, UID and credential.
    pub spec: ProxySpec,
    /// The entry's call timeout: how long `check` may take, and how long a
    /// lock a stopped call left may hold (a plugin's lock lasts as long as
    /// the call that took it may run).
    pub call_timeout: Duration,
    /// How long a deleted instance may take to be gone.
    pub delete_wait: Duration,
    /// How often `get` is asked meanwhile.
    pub poll: Duration,
}

impl Options {
    /// Options with the host's default call timeout (30 s) and two minutes
    /// for a deleted instance to go.
    pub fn new(config: Value, spec: ProxySpec) -> Self {
        Self {
            config,
            spec,
            call_timeout: Duration::from_secs(30),
            delete_wait: Duration::from_secs(120),
            poll: Duration::from_millis(500),
        }
    }
}

/// Runs every case against `provider` (the entry as bound) and reports.
/// Instances it made are deleted before it returns, whatever failed.
pub async fn run(provider: Arc<dyn Provider>, binder: &dyn Binder, options: &Options) -> Report {
    cases::Run::new(provider, binder, options).all().await
}
