//! Fleet services: what runs beside the reconciler once proxies exist.
//!
//! - [`health`] probes every proxy that has an address through its proxy
//!   port (an absolute-form GET and a CONNECT tunnel to a check target) and
//!   keeps per-proxy counters and a verdict.
//! - [`catalog`] is the fleet as crawlers see it: members published by the
//!   mode (standalone or Kubernetes), their verdicts, quarantines after
//!   crawler reports, and leases.
//! - [`leases`] keeps the leases in a durable store, so a restart or a new
//!   leader keeps them.
//! - [`api`] serves the catalog over HTTP (the discovery API), the check
//!   target (`/v1/echo`) and `/healthz`, `/readyz`, `/metrics`.
//! - [`console`] is the web console on the API's listener, under `/ui/`.
//! - [`gateway`] is one proxy endpoint for crawlers: each request goes
//!   through a proxy the catalog picks.
//!
//! The crate knows nothing of where Proxies come from: a mode publishes
//! [`catalog::Member`]s and reads verdicts and replacement requests back.

pub mod action;
pub mod api;
pub mod auth;
pub mod catalog;
pub mod client;
pub mod console;
pub mod endpoint;
mod error;
pub mod gateway;
pub mod health;
pub mod leases;
pub mod mode;
pub mod probe;
mod server;

pub use catalog::{Endpoint, Fleet, FleetSettings, Member, Selector, Strategy, Verdict};
pub use error::{Error, Result};
pub use health::{HealthEngine, HealthSettings};
pub use probe::{CheckTarget, ProbeMode};
