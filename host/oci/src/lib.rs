//! Provider plugins as OCI artifacts.
//!
//! A providers entry may name its plugin as `oci://REGISTRY/REPO:TAG` or
//! `oci://REGISTRY/REPO@sha256:DIGEST` ([`PluginReference`]). This crate
//! reaches registries as `registries[]` allows ([`Registries`]), pulls a
//! build in the Wasm OCI artifact layout ([`layout`]) with every digest
//! checked, every answer's size bounded and redirects held to the address
//! policy ([`pull()`]), checks its cosign signatures against the keys a
//! policy names ([`KeyPolicy`]), keeps it content-addressed on disk and
//! checked whenever it is read ([`Store`]), and publishes one ([`push()`])
//! and its signature ([`sign()`]). What a pulled build is allowed to do is
//! the runtime's admission, as for a file.

mod access;
mod answer;
mod base64_bytes;
mod cosign_key;
mod destination;
mod digest;
mod error;
pub mod layout;
mod pull;
mod push;
mod reference;
mod session;
mod sign;
mod signature;
mod store;
mod tls;
mod token;

pub use access::{InvalidRegistry, RawRegistry, Registries, RegistryAccess};
pub use answer::Overrun;
pub use cosign_key::{KeyError, PrivateKey, PublicKey};
pub use destination::{MAX_REDIRECTS, RefusedDestination};
pub use error::OciError;
pub use pull::{
    DEFAULT_MAX_BYTES, PullLimits, Pulled, policies, pull, resolve, signatures, verify,
};
pub use push::{Pushed, push};
pub use reference::{PluginReference, ReferenceError, SCHEME, is_loopback_host};
pub use sign::{Signed, sign};
pub use signature::{KeyPolicy, RawVerify, Signature, Verified, signature_tag, verify_kept};
pub use store::{Store, StoredRef};
