//! The `proxyfleet` binary as real processes: standalone with the real
//! plugins, its metrics, OTLP export, the plugin subcommands, rollback, and
//! (with the `cluster` feature) replicas against the test API server. The
//! `on_node` module is ignored unless `cargo xtask e2e` runs it on a real
//! node. With the `browser` feature, the web console in headless Chromium.
//! One module per area.
//!
//! Needs the `plugins` feature: `cargo test -p proxyfleet-operator
//! --features plugins,cluster --test operator` (the README's test command
//! runs every tier).

mod binaries;
#[cfg(feature = "browser")]
mod console;
#[cfg(feature = "cluster")]
mod in_cluster;
mod monitoring;
mod on_node;
mod otlp;
mod plugin_cli;
mod plugin_rollback;
mod standalone_fleet;
mod standalone_gateway;
mod standalone_metrics;
