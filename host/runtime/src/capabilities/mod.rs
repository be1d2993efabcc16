//! What the host offers plugins, one module per capability. Each is scoped
//! to the provider entry the call runs for: a plugin reaches only what its
//! entry's grants name.

pub mod address;
mod call;
pub(crate) mod config;
pub mod google;
pub(crate) mod guest_output;
pub mod http;
pub(crate) mod kv;
pub mod libvirt;
pub mod log;
pub mod loggable;
pub mod reason_phrase;
mod redact;

pub(crate) use call::CallScope;
pub use redact::Redactor;
