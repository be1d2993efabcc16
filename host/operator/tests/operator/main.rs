//! The `proxyfleet` binary as real processes: standalone with the real
//! plugins, its metrics, OTLP export, the plugin subcommands, rollback, and
//! (with the `cluster` feature) replicas against the test API server. The
//! `on_node` module is ignored unless `cargo xtask e2e` runs it on a real
//! node. One module per area.
//!
//! Needs the `plugins` feature: `cargo test -p proxyfleet-operator
//! --features plugins,cluster --test operator` (the README's test command
//! runs every tier).

mod binaries;
#[cfg(feature = "cluster")]
mod in_cluster;
mod on_node;
mod otlp;
mod plugin_cli;
mod plugin_rollback;
mod standalone_fleet;
mod standalone_gateway;
mod standalone_metrics;
