//! The cluster tier: the Kubernetes mode against the real API server
//! (Kubernetes 1.20 built from Debian's source, started on loopback by
//! `deploy/dev/kube-apiserver/start.sh`), with the real plugins. Every
//! test works in a namespace of its own. One module per area;
//! `current_server` runs the CRD and controller checks against a current
//! API server as well (`deploy/dev/current-apiserver/start.sh`).
//!
//! Needs the `cluster` feature and the running server: `cargo test -p
//! proxyfleet-tests --features cluster --test cluster` (the README's test
//! command starts the server and runs every tier).

mod cluster_providers;
mod credential_secrets;
mod current_server;
mod kube_controller;
mod kube_crd;
mod kube_fleet;
mod kube_kv;
mod kube_lease;
mod kube_pool;
mod kube_revisions;
mod kubernetes_plugin;
mod provider_passes;
mod views;
