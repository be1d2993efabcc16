//! proxyfleet in Kubernetes: the `Proxy` and `ProxyPool` resources and
//! their conversion to the core model.

pub mod actions;
pub mod client;
pub mod cluster_providers;
pub mod controller;
pub mod convert;
pub mod crd;
pub mod crd_check;
pub mod crd_reference;
pub mod credential_secrets;
pub mod credentials;
pub mod events;
pub mod file_providers;
pub mod fleet;
pub mod fleet_services;
pub mod kube_version;
pub mod kv;
pub mod lease;
pub mod namespace_gate;
pub mod operate;
mod own_writes;
pub mod pool;
pub mod pool_status;
mod resource_version;
pub mod secrets;
pub mod spec_key;
pub mod spec_secrets;
