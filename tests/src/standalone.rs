//! A standalone installation on the plugin runtime, put together as the
//! operator's `standalone` command does: the state database first, then the
//! registry built for its installation, then the driver.

use std::path::Path;
use std::sync::Arc;

use proxyfleet_metrics::Metrics;
use proxyfleet_runtime::config::ProvidersConfig;
use proxyfleet_runtime::{Registry, Runtime, RuntimeOptions};
use proxyfleet_standalone::{Settings, Standalone, StateDb};

/// Opens the state database at `state`, loads `providers` from
/// `plugin_dir`, and returns the driver on them with the registry it
/// serves (which a test may reconfigure).
///
/// # Panics
/// When the database, the runtime or the registry cannot be opened.
pub async fn open(
    settings: Settings,
    state: &Path,
    providers: &ProvidersConfig,
    plugin_dir: &Path,
) -> (Standalone, Arc<Registry>) {
    let state = StateDb::open(state, None).await.expect("the state database opens");
    let metrics = Arc::new(Metrics::new());
    let runtime = Runtime::new(RuntimeOptions {
        installation: state.installation().clone(),
        observer: Some(Arc::clone(&metrics) as _),
        ..RuntimeOptions::default()
    })
    .expect("the runtime starts");
    let registry = Registry::load(&runtime, providers, plugin_dir, state.kv())
        .await
        .expect("the providers load");
    let registry = Arc::new(registry);
    let standalone = Standalone::new(settings, state, Arc::clone(&registry) as _, metrics)
        .expect("the installation opens");
    (standalone, registry)
}
