//! The plugins tier: the host runtime with the real first-party plugins
//! and fixtures (built by `cargo xtask plugins`) against real local
//! servers the tests start themselves on loopback: HTTPS test servers,
//! tinyproxy, the Proxmox and Compute Engine simulators and Debian's
//! `docker-registry`. One module per area.
//!
//! Needs the `plugins` feature: `cargo test -p proxyfleet-tests --features
//! plugins --test plugins` (the README's test command runs every tier).

mod credentials;
mod discovery;
mod fleet_health;
mod gcp;
mod gcp_logs;
mod harness;
mod hot_swap;
mod hot_swap_logs;
mod http_capability;
mod isolation;
mod live_entries;
mod loading;
mod oci;
mod oci_signatures;
mod plugin_logs;
mod provider_metrics;
mod provider_spans;
mod proxmox;
mod sandbox;
mod standalone;
mod standalone_health;
mod static_plugin;
