//! Provider plugins as OCI artifacts.
//!
//! A providers entry may name its plugin as `oci://REGISTRY/REPO:TAG` or
//! `oci://REGISTRY/REPO@sha256:DIGEST` ([`PluginReference`]). This crate
//! reaches registries as `registries[]` allows ([`Registries`]), pulls a
//! build in the Wasm OCI artifact layout ([`layout`]) with every digest
//! checked, every answer's size bounded and redirects held to the address
//! policy ([`pull()`]), keeps it content-addressed on disk and checked
//! whenever it is read ([`Store`]), and publishes one ([`push()`]). What a
//! pulled build is allowed to do is the runtime's admission, as for a file.

mod access;
mod answer;
mod destination;
mod digest;
mod error;
pub mod layout;
mod pull;
mod push;
mod reference;
mod session;
mod store;
mod tls;
mod token;

pub use access::{InvalidRegistry, RawRegistry, Registries, RegistryAccess};
pub use answer::Overrun;
pub use destination::{MAX_REDIRECTS, RefusedDestination};
pub use error::OciError;
pub use pull::{DEFAULT_MAX_BYTES, PullLimits, Pulled, pull, resolve};
pub use push::{Pushed, push};
pub use reference::{PluginReference, ReferenceError, SCHEME, is_loopback_host};
pub use store::{Store, StoredRef};
