//! The fast tier of the Kubernetes mode: the exact requests of a reconcile
//! pass, Proxy or ProxyPool, of the Event recorder and of the plugins' store
//! with its watch, against a mocked
//! API server (tower-test); the generated CRDs; and the client's bound on requests in flight,
//! against an HTTP server on loopback.
//! Needs no service; plain `cargo test` runs it.

mod client;
mod controller_requests;
mod crd;
mod events;
mod kv;
mod mock;
mod pool_requests;
