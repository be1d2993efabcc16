//! The host a plugin talks to when it runs natively, in its own unit tests.
//!
//! On `wasm32` the SDK's [`crate::kv`], [`crate::http`] and [`crate::log`]
//! calls go to the operator through the component's imports. Off wasm those
//! imports do not exist, so the same calls go to a [`Host`] installed for
//! the current thread instead: a plugin's logic can then be tested as it
//! is, through its [`crate::Provider`] functions, with `cargo test`.
//!
//! Plugin authors rarely implement [`Host`] themselves: the
//! `proxyfleet-sdk-testkit` crate provides one with an in-memory store,
//! declared HTTP exchanges and captured logs. This module is what such a
//! kit builds on; it exists only off wasm.
//!
//! ```
//! use proxyfleet_sdk::kv::{CasOutcome, KvEntry, KvError};
//! use proxyfleet_sdk::log::Level;
//! use proxyfleet_sdk::native::{self, ErrorCode, Host, HttpRequest, HttpResponse};
//!
//! /// A host with an empty store that refuses every request.
//! struct Empty;
//!
//! impl Host for Empty {
//!     fn kv_get(&self, _: &str) -> Result<Option<KvEntry>, KvError> {
//!         Ok(None)
//!     }
//!     fn kv_compare_and_swap(
//!         &self,
//!         key: &str,
//!         _: Option<u64>,
//!         _: Option<&[u8]>,
//!     ) -> Result<CasOutcome, KvError> {
//!         Err(KvError::Unavailable(format!("read-only: {key}")))
//!     }
//!     fn kv_list(&self, _: &str) -> Result<Vec<KvEntry>, KvError> {
//!         Ok(Vec::new())
//!     }
//!     fn http(&self, _: &HttpRequest) -> Result<HttpResponse, ErrorCode> {
//!         Err(ErrorCode::HttpRequestDenied)
//!     }
//!     fn log(&self, _: Level, _: &str, _: &[(String, String)]) {}
//! }
//!
//! let answer = native::with_host(std::rc::Rc::new(Empty), || proxyfleet_sdk::kv::get("proxy/a"));
//! assert_eq!(answer, Ok(None));
//! ```

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use crate::bindings::proxyfleet::provider::kv::{CasOutcome, KvEntry};
use crate::bindings::proxyfleet::provider::log::Level;
use crate::kv_error::KvError;
use crate::method::Method;

#[doc(hidden)]
pub mod doc_host;

/// How a transport failure is reported: the `wasi:http` error code the
/// operator would give (`ConnectionRefused`, `HttpRequestDenied` for a
/// destination the entry does not grant, ...).
pub use wasip2::http::types::ErrorCode;

/// What the plugin's imports do, off wasm.
///
/// ```
/// use std::rc::Rc;
/// use proxyfleet_sdk::http::Request;
/// use proxyfleet_sdk::native::{self, ErrorCode, Host, HttpRequest, HttpResponse};
/// # use proxyfleet_sdk::kv::{CasOutcome, KvEntry, KvError};
/// # use proxyfleet_sdk::log::Level;
///
/// /// Answers every request with `204 No Content`.
/// struct NoContent;
///
/// impl Host for NoContent {
///     fn http(&self, _: &HttpRequest) -> Result<HttpResponse, ErrorCode> {
///         Ok(HttpResponse { status: 204, headers: Vec::new(), body: Vec::new() })
///     }
///     // kv_get, kv_compare_and_swap, kv_list and log as in the module's example.
/// #     fn kv_get(&self, _: &str) -> Result<Option<KvEntry>, KvError> {
/// #         Ok(None)
/// #     }
/// #     fn kv_compare_and_swap(
/// #         &self,
/// #         _: &str,
/// #         _: Option<u64>,
/// #         _: Option<&[u8]>,
/// #     ) -> Result<CasOutcome, KvError> {
/// #         Err(KvError::Unavailable("no store".into()))
/// #     }
/// #     fn kv_list(&self, _: &str) -> Result<Vec<KvEntry>, KvError> {
/// #         Ok(Vec::new())
/// #     }
/// #     fn log(&self, _: Level, _: &str, _: &[(String, String)]) {}
/// }
///
/// let url = "https://api.example/v1/instances/pf-1";
/// let answer = native::with_host(Rc::new(NoContent), || Request::delete(url).send());
/// assert_eq!(answer.expect("an answer").status, 204);
/// ```
pub trait Host {
    /// `kv::get`.
    fn kv_get(&self, key: &str) -> Result<Option<KvEntry>, KvError>;

    /// `kv::compare_and_swap`: write (or delete, for `None`) only when the
    /// key's version is `expected` (`None`: absent).
    fn kv_compare_and_swap(
        &self,
        key: &str,
        expected: Option<u64>,
        value: Option<&[u8]>,
    ) -> Result<CasOutcome, KvError>;

    /// `kv::list`: the entries whose key starts with `prefix`.
    fn kv_list(&self, prefix: &str) -> Result<Vec<KvEntry>, KvError>;

    /// One HTTP exchange. The request is what the operator would send,
    /// `content-length` included; an `Err` is a transport failure.
    fn http(&self, request: &HttpRequest) -> Result<HttpResponse, ErrorCode>;

    /// One log record.
    fn log(&self, level: Level, message: &str, fields: &[(String, String)]);

    /// `config::json`: the entry's config. `{}` unless the host has one.
    fn config_json(&self) -> String {
        "{}".to_owned()
    }

    /// `config::lookup`: the value the provider's
    /// [`lookup_table`](crate::Provider::lookup_table) answered under `key`
    /// for the entry. None unless the host keeps a table.
    fn config_lookup(&self, key: &str) -> Option<String> {
        let _ = key;
        None
    }
}

/// A request as the plugin sent it.
///
/// ```
/// use std::rc::Rc;
/// use proxyfleet_sdk::http::{Method, Request};
/// use proxyfleet_sdk::native::{self, ErrorCode, Host, HttpRequest, HttpResponse};
/// # use proxyfleet_sdk::kv::{CasOutcome, KvEntry, KvError};
/// # use proxyfleet_sdk::log::Level;
///
/// /// Answers `201 Created` with the body it was sent.
/// struct Echo;
///
/// impl Host for Echo {
///     fn http(&self, request: &HttpRequest) -> Result<HttpResponse, ErrorCode> {
///         assert_eq!(request.method, Method::Post);
///         assert_eq!(request.url, "https://api.example/v1/instances");
///         Ok(HttpResponse { status: 201, headers: Vec::new(), body: request.body.clone() })
///     }
///     // kv_get, kv_compare_and_swap, kv_list and log as in the module's example.
/// #     fn kv_get(&self, _: &str) -> Result<Option<KvEntry>, KvError> {
/// #         Ok(None)
/// #     }
/// #     fn kv_compare_and_swap(
/// #         &self,
/// #         _: &str,
/// #         _: Option<u64>,
/// #         _: Option<&[u8]>,
/// #     ) -> Result<CasOutcome, KvError> {
/// #         Err(KvError::Unavailable("no store".into()))
/// #     }
/// #     fn kv_list(&self, _: &str) -> Result<Vec<KvEntry>, KvError> {
/// #         Ok(Vec::new())
/// #     }
/// #     fn log(&self, _: Level, _: &str, _: &[(String, String)]) {}
/// }
///
/// let sent = native::with_host(Rc::new(Echo), || {
///     Request::post("https://api.example/v1/instances").body("text/plain", "pf-1").send()
/// });
/// assert_eq!(sent.expect("an answer").text(), "pf-1");
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct HttpRequest {
    /// The method.
    pub method: Method,
    /// The whole URL, as the plugin wrote it.
    pub url: String,
    /// Header fields in the order the plugin added them.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The whole body.
    pub body: Vec<u8>,
    /// The connect timeout the plugin asked for.
    pub connect_timeout: Duration,
    /// The first-byte timeout the plugin asked for.
    pub first_byte_timeout: Duration,
    /// The between-bytes timeout the plugin asked for.
    pub between_bytes_timeout: Duration,
}

/// Lists header names only: values may be credentials.
impl std::fmt::Debug for HttpRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.headers.iter().map(|(name, _)| name.as_str()).collect();
        f.debug_struct("HttpRequest")
            .field("method", &self.method)
            .field("url", &self.url)
            .field("header_names", &names)
            .field("body_len", &self.body.len())
            .finish_non_exhaustive()
    }
}

impl HttpRequest {
    /// The first value of header `name`, compared case-insensitively.
    ///
    /// ```
    /// use std::rc::Rc;
    /// use proxyfleet_sdk::http::Request;
    /// use proxyfleet_sdk::native::{self, ErrorCode, Host, HttpRequest, HttpResponse};
    /// # use proxyfleet_sdk::kv::{CasOutcome, KvEntry, KvError};
    /// # use proxyfleet_sdk::log::Level;
    ///
    /// /// Refuses requests without a credential.
    /// struct NeedsToken;
    ///
    /// impl Host for NeedsToken {
    ///     fn http(&self, request: &HttpRequest) -> Result<HttpResponse, ErrorCode> {
    ///         let status = match request.header("Authorization") {
    ///             Some(b"Bearer t0ken") => 200,
    ///             _ => 401,
    ///         };
    ///         Ok(HttpResponse { status, headers: Vec::new(), body: Vec::new() })
    ///     }
    ///     // kv_get, kv_compare_and_swap, kv_list and log as in the module's example.
    /// #     fn kv_get(&self, _: &str) -> Result<Option<KvEntry>, KvError> {
    /// #         Ok(None)
    /// #     }
    /// #     fn kv_compare_and_swap(
    /// #         &self,
    /// #         _: &str,
    /// #         _: Option<u64>,
    /// #         _: Option<&[u8]>,
    /// #     ) -> Result<CasOutcome, KvError> {
    /// #         Err(KvError::Unavailable("no store".into()))
    /// #     }
    /// #     fn kv_list(&self, _: &str) -> Result<Vec<KvEntry>, KvError> {
    /// #         Ok(Vec::new())
    /// #     }
    /// #     fn log(&self, _: Level, _: &str, _: &[(String, String)]) {}
    /// }
    ///
    /// let status = |request: Request| request.send_any_status().map(|response| response.status);
    /// native::with_host(Rc::new(NeedsToken), || {
    ///     let url = "https://api.example/v1/instances";
    ///     assert_eq!(status(Request::get(url)), Ok(401));
    ///     assert_eq!(status(Request::get(url).bearer_auth("t0ken")), Ok(200));
    /// });
    /// ```
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_slice())
    }
}

/// An answer for the plugin.
///
/// ```
/// use std::rc::Rc;
/// use proxyfleet_sdk::http::Request;
/// use proxyfleet_sdk::native::{self, ErrorCode, Host, HttpRequest, HttpResponse};
/// # use proxyfleet_sdk::kv::{CasOutcome, KvEntry, KvError};
/// # use proxyfleet_sdk::log::Level;
///
/// /// A backend with no instances.
/// struct Empty;
///
/// impl Host for Empty {
///     fn http(&self, _: &HttpRequest) -> Result<HttpResponse, ErrorCode> {
///         Ok(HttpResponse {
///             status: 200,
///             headers: vec![("content-type".into(), "application/json".into())],
///             body: br#"{"items":[]}"#.to_vec(),
///         })
///     }
///     // kv_get, kv_compare_and_swap, kv_list and log as in the module's example.
/// #     fn kv_get(&self, _: &str) -> Result<Option<KvEntry>, KvError> {
/// #         Ok(None)
/// #     }
/// #     fn kv_compare_and_swap(
/// #         &self,
/// #         _: &str,
/// #         _: Option<u64>,
/// #         _: Option<&[u8]>,
/// #     ) -> Result<CasOutcome, KvError> {
/// #         Err(KvError::Unavailable("no store".into()))
/// #     }
/// #     fn kv_list(&self, _: &str) -> Result<Vec<KvEntry>, KvError> {
/// #         Ok(Vec::new())
/// #     }
/// #     fn log(&self, _: Level, _: &str, _: &[(String, String)]) {}
/// }
///
/// let listed = native::with_host(Rc::new(Empty), || -> proxyfleet_sdk::Result<serde_json::Value> {
///     Request::get("https://api.example/v1/instances").send()?.json()
/// });
/// assert_eq!(listed.expect("a list")["items"], serde_json::json!([]));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpResponse {
    /// The status code.
    pub status: u16,
    /// Header fields.
    pub headers: Vec<(String, String)>,
    /// The whole body; the plugin reads it in chunks as it would a stream.
    pub body: Vec<u8>,
}

thread_local! {
    /// The host of the calls running on this thread, set by [`with_host`].
    static CURRENT: RefCell<Option<Rc<dyn Host>>> = const { RefCell::new(None) };
}

/// Runs `call` with `host` answering this thread's kv, http and log calls,
/// and restores whatever host was installed before, also when `call`
/// panics.
///
/// ```
/// use std::rc::Rc;
/// use proxyfleet_sdk::http::Request;
/// use proxyfleet_sdk::native;
/// # use proxyfleet_sdk::native::doc_host::{DocHost, answer};
/// # let fixed = DocHost::new(|_| answer(200, &[], "8.2.4"));
///
/// // `fixed` answers every request with `8.2.4`.
/// let version = native::with_host(Rc::new(fixed), || -> proxyfleet_sdk::Result<String> {
///     Ok(Request::get("https://pve.example:8006/api2/json/version").send()?.text())
/// })?;
/// assert_eq!(version, "8.2.4");
/// # Ok::<(), proxyfleet_sdk::ProviderError>(())
/// ```
pub fn with_host<R>(host: Rc<dyn Host>, call: impl FnOnce() -> R) -> R {
    struct Restore(Option<Rc<dyn Host>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let previous = self.0.take();
            CURRENT.with(|current| *current.borrow_mut() = previous);
        }
    }
    let _restore = Restore(CURRENT.with(|current| current.borrow_mut().replace(host)));
    call()
}

/// Calls `f` with the installed host.
///
/// # Panics
///
/// When no host is installed: a plugin function was called natively
/// outside [`with_host`] (for instance directly, not through a test kit).
pub(crate) fn host<R>(f: impl FnOnce(&dyn Host) -> R) -> R {
    // A clone, so that the host may itself call into the SDK.
    let Some(host) = CURRENT.with(|current| current.borrow().clone()) else {
        panic!(
            "proxyfleet-sdk: no host for config, kv, http or log calls off wasm; run the plugin's \
             functions inside proxyfleet_sdk::native::with_host (proxyfleet-sdk-testkit does)"
        )
    };
    f(host.as_ref())
}
