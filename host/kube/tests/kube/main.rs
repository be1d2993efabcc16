//! The fast tier of the Kubernetes mode: the exact requests of a reconcile
//! pass, Proxy or ProxyPool, against a mocked API server (tower-test) and
//! the generated CRDs.
//! Needs no service; plain `cargo test` runs it.

mod controller_requests;
mod crd;
mod mock;
mod pool_requests;
