//! Where requests go: the host's `wasi:http` on wasm, the thread's
//! [`crate::native`] host elsewhere. Both take the request as built and
//! hand back the answer's head and a body read in chunks; everything
//! around them (limits, classification, streaming) is shared.

use std::time::Duration;

use wasip2::http::types::ErrorCode;

use super::Method;
use super::target::Target;

#[cfg(not(target_arch = "wasm32"))]
mod native;
#[cfg(target_arch = "wasm32")]
mod wasi;

#[cfg(not(target_arch = "wasm32"))]
pub(super) use native::{Incoming, Pending, start};
#[cfg(target_arch = "wasm32")]
pub(super) use wasi::{Incoming, Pending, start};

/// A request ready to send: every header it carries (`content-length`
/// included), its body and its timeouts.
pub(super) struct Outgoing<'a> {
    pub(super) method: Method,
    pub(super) url: &'a str,
    #[cfg_attr(
        not(target_arch = "wasm32"),
        allow(dead_code, reason = "a native host takes the URL whole")
    )]
    pub(super) target: &'a Target,
    /// `METHOD URL`, for error messages.
    #[cfg_attr(
        not(target_arch = "wasm32"),
        allow(dead_code, reason = "a native host refuses nothing the SDK words itself")
    )]
    pub(super) label: &'a str,
    pub(super) headers: &'a [(String, Vec<u8>)],
    pub(super) body: &'a [u8],
    pub(super) connect_timeout: Duration,
    pub(super) first_byte_timeout: Duration,
    pub(super) between_bytes_timeout: Duration,
}

/// What a sent request's answer is reported against.
pub(super) struct Sent<'a> {
    pub(super) method: Method,
    pub(super) url: &'a str,
    pub(super) target: &'a Target,
    /// `METHOD URL`, for error messages.
    #[cfg_attr(
        not(target_arch = "wasm32"),
        allow(dead_code, reason = "a native host's failures carry no SDK wording")
    )]
    pub(super) label: &'a str,
}

/// An answer's head, its body not read yet.
pub(super) struct Head<B> {
    pub(super) status: u16,
    pub(super) headers: Vec<(String, String)>,
    pub(super) body: B,
    /// A failure sending the request body, reported once the status is known.
    pub(super) upload_error: Option<ErrorCode>,
}

/// Why reading a body failed.
#[cfg_attr(
    not(target_arch = "wasm32"),
    allow(dead_code, reason = "a native host answers whole, so its reads never fail")
)]
pub(super) enum ReadError {
    /// The transport's error code.
    Code(ErrorCode),
    /// A stream error with no code; its description.
    Io(String),
}
