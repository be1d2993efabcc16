//! The HTTP method of a [`crate::http::Request`], in a module of its own
//! because the native host, which `http` calls off wasm, names it too.

use std::fmt;

/// An HTTP method.
///
/// ```
/// use proxyfleet_sdk::http::{Method, Request};
///
/// let request = Request::new(Method::Options, "https://api.example/v1/instances");
/// assert!(format!("{request:?}").contains("method: Options"));
/// assert_eq!(Method::Patch.to_string(), "PATCH");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Method {
    /// `GET`
    Get,
    /// `HEAD`
    Head,
    /// `POST`
    Post,
    /// `PUT`
    Put,
    /// `PATCH`
    Patch,
    /// `DELETE`
    Delete,
    /// `OPTIONS`
    Options,
}

impl Method {
    /// Whether servers expect a body (and so a length) even when empty.
    pub(crate) fn expects_body(self) -> bool {
        matches!(self, Self::Post | Self::Put | Self::Patch)
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Get => "GET",
            Self::Head => "HEAD",
            Self::Post => "POST",
            Self::Put => "PUT",
            Self::Patch => "PATCH",
            Self::Delete => "DELETE",
            Self::Options => "OPTIONS",
        })
    }
}
