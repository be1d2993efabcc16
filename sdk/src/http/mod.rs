//! A small blocking HTTP client over `wasi:http/outgoing-handler`.
//!
//! The host only lets a plugin reach the destinations its entry grants; a
//! request anywhere else fails with [`ProviderError::Unauthorized`]. Every
//! failure comes back as a [`Failure`]: its [`FailureKind`] (the
//! transport's error code, an answer the host made itself, or the status),
//! the server's `Retry-After`, and the error already classified for the
//! host (an HTTP status of 400 or more by [`classify_status`], a transport
//! failure by its `wasi:http` error code), which `?` turns it into.
//! [`Request::send_any_status`] hands error answers back instead, for APIs
//! whose bodies say more than their status; [`Failure::of_answer`] keeps
//! their kind.
//!
//! ```no_run
//! use proxyfleet_sdk::http::Request;
//! # fn example(token: &str) -> proxyfleet_sdk::Result<()> {
//! #[derive(serde::Deserialize)]
//! struct Version {
//!     version: String,
//! }
//! let version: Version = Request::get("https://pve.example:8006/api2/json/version")
//!     .header("authorization", format!("PVEAPIToken={token}"))
//!     .send()?
//!     .json()?;
//! # let _ = version.version;
//! # Ok(())
//! # }
//! ```
//!
//! Header values never appear in errors or in `Debug` output, since they
//! usually carry credentials; put credentials in headers, not in URLs.

use std::fmt;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::{ProviderError, Result};

/// Connect timeout unless the request sets its own.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Time allowed from sending the request to the first byte of the response,
/// unless the request sets its own. Backends that run a task before
/// answering (cloning a VM) need it generous.
pub const DEFAULT_FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest pause between two chunks of the response body, unless the
/// request sets its own.
pub const DEFAULT_BETWEEN_BYTES_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest response body read unless the request sets its own limit; a
/// larger one fails with [`ProviderError::Permanent`].
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// How many bytes of an error response's body go into the error message.
const BODY_EXCERPT_CHARS: usize = 200;
const READ_CHUNK: u64 = 64 * 1024;

pub use crate::method::Method;

/// An HTTP request being built; [`Request::send`] performs it.
#[derive(Clone)]
pub struct Request {
    method: Method,
    url: String,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
    connect_timeout: Duration,
    first_byte_timeout: Duration,
    between_bytes_timeout: Duration,
    max_response_bytes: usize,
    /// An error met while building (a body that failed to serialise),
    /// reported by `send` so that the builder methods stay chainable.
    deferred_error: Option<ProviderError>,
}

/// Lists header names only: values may be credentials.
impl fmt::Debug for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let header_names: Vec<&str> = self.headers.iter().map(|(name, _)| name.as_str()).collect();
        f.debug_struct("Request")
            .field("method", &self.method)
            .field("url", &self.url)
            .field("header_names", &header_names)
            .field("body_len", &self.body.len())
            .field("connect_timeout", &self.connect_timeout)
            .field("first_byte_timeout", &self.first_byte_timeout)
            .field("between_bytes_timeout", &self.between_bytes_timeout)
            .field("max_response_bytes", &self.max_response_bytes)
            .finish_non_exhaustive()
    }
}

impl Request {
    /// A request with no headers or body and the default timeouts.
    pub fn new(method: Method, url: impl Into<String>) -> Self {
        Self {
            method,
            url: url.into(),
            headers: Vec::new(),
            body: Vec::new(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            first_byte_timeout: DEFAULT_FIRST_BYTE_TIMEOUT,
            between_bytes_timeout: DEFAULT_BETWEEN_BYTES_TIMEOUT,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            deferred_error: None,
        }
    }

    /// A `GET` request.
    pub fn get(url: impl Into<String>) -> Self {
        Self::new(Method::Get, url)
    }

    /// A `POST` request.
    pub fn post(url: impl Into<String>) -> Self {
        Self::new(Method::Post, url)
    }

    /// A `PUT` request.
    pub fn put(url: impl Into<String>) -> Self {
        Self::new(Method::Put, url)
    }

    /// A `PATCH` request.
    pub fn patch(url: impl Into<String>) -> Self {
        Self::new(Method::Patch, url)
    }

    /// A `DELETE` request.
    pub fn delete(url: impl Into<String>) -> Self {
        Self::new(Method::Delete, url)
    }

    /// Adds a header; repeated names are sent as repeated fields.
    #[must_use]
    pub fn header(mut self, name: impl Into<String>, value: impl AsRef<[u8]>) -> Self {
        self.headers.push((name.into(), value.as_ref().to_vec()));
        self
    }

    /// Adds `authorization: Bearer <token>`.
    #[must_use]
    pub fn bearer_auth(self, token: &str) -> Self {
        self.header("authorization", format!("Bearer {token}"))
    }

    /// Sets a raw body and its content type.
    #[must_use]
    pub fn body(mut self, content_type: &str, body: impl Into<Vec<u8>>) -> Self {
        self.body = body.into();
        self.set_content_type(content_type);
        self
    }

    /// Sets `value` serialised as JSON as the body, with
    /// `content-type: application/json`.
    #[must_use]
    pub fn json<T: Serialize + ?Sized>(mut self, value: &T) -> Self {
        match serde_json::to_vec(value) {
            Ok(body) => {
                self.body = body;
                self.set_content_type("application/json");
            }
            Err(error) => {
                self.deferred_error = Some(ProviderError::Permanent(format!(
                    "{} {}: cannot serialise the JSON body: {error}",
                    self.method,
                    redact_userinfo(&self.url)
                )));
            }
        }
        self
    }

    fn set_content_type(&mut self, content_type: &str) {
        self.headers.retain(|(name, _)| !name.eq_ignore_ascii_case("content-type"));
        self.headers.push(("content-type".to_owned(), content_type.as_bytes().to_vec()));
    }

    /// Time allowed to establish the connection.
    #[must_use]
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Time allowed from sending the request to the first response byte.
    #[must_use]
    pub fn first_byte_timeout(mut self, timeout: Duration) -> Self {
        self.first_byte_timeout = timeout;
        self
    }

    /// Longest pause allowed between two chunks of the response body.
    #[must_use]
    pub fn between_bytes_timeout(mut self, timeout: Duration) -> Self {
        self.between_bytes_timeout = timeout;
        self
    }

    /// Sets all three timeouts to `timeout`.
    #[must_use]
    pub fn timeout(self, timeout: Duration) -> Self {
        self.connect_timeout(timeout).first_byte_timeout(timeout).between_bytes_timeout(timeout)
    }

    /// Largest response body to read; a larger one fails as permanent.
    #[must_use]
    pub fn max_response_bytes(mut self, limit: usize) -> Self {
        self.max_response_bytes = limit;
        self
    }

    /// Performs the request and reads the whole response.
    ///
    /// A status of 400 or more is returned as the error [`classify_status`]
    /// gives; any other status (including 3xx: redirects are not followed)
    /// as `Ok`.
    pub fn send(self) -> Result<Response, Failure> {
        self.start()?.answer()
    }

    /// Performs the request and returns the response whatever its status;
    /// only failures to get one (transport, limits, the host's grants) are
    /// errors, classified as [`Request::send`] does.
    ///
    /// For APIs whose error answers say more than their status, such as
    /// Kubernetes `Status` objects or a `Retry-After` header: the plugin
    /// classifies them itself (falling back on [`classify_status`]).
    pub fn send_any_status(self) -> Result<Response, Failure> {
        let limit = self.max_response_bytes;
        read_response(self.open()?, limit)
    }

    /// Performs the request and hands the body back chunk by chunk, for
    /// downloads too large to hold in memory (a disk image). A status of
    /// 400 or more is the error [`classify_status`] gives, as with
    /// [`Request::send`]; the response size limit does not apply.
    pub fn send_streaming(self) -> Result<BodyStream, Failure> {
        let mut open = self.open()?;
        if open.status >= 400 {
            // Enough of the body for the error message; the rest is dropped.
            let answer = Response {
                status: open.status,
                body: open.read_prefix(ERROR_BODY_BYTES),
                headers: std::mem::take(&mut open.headers),
                request: std::mem::take(&mut open.label),
            };
            return Err(error_answer(open.method, &open.url, &answer));
        }
        open.check_upload()?;
        Ok(BodyStream { open })
    }

    /// Sends the request and waits for the response head.
    fn open(self) -> Result<OpenResponse, Failure> {
        self.start()?.open()
    }

    /// Sends the request (and its body) without waiting for the answer.
    fn start(self) -> Result<Started, Failure> {
        if let Some(error) = self.deferred_error {
            return Err(Failure::new(FailureKind::Request, error));
        }
        let target = Target::parse(&self.url).map_err(|reason| {
            Failure::new(
                FailureKind::Request,
                ProviderError::Permanent(format!(
                    "{} {}: invalid URL: {reason}",
                    self.method,
                    redact_userinfo(&self.url)
                )),
            )
        })?;
        let label = format!("{} {}", self.method, self.url);

        let mut headers = Vec::with_capacity(self.headers.len() + 1);
        // The whole body is known, so say how long it is: without this the
        // host streams it chunked, which some API servers do not read.
        let has_content_length =
            self.headers.iter().any(|(name, _)| name.eq_ignore_ascii_case("content-length"));
        if !has_content_length && (!self.body.is_empty() || self.method.expects_body()) {
            headers.push(("content-length".to_owned(), self.body.len().to_string().into_bytes()));
        }
        headers.extend(self.headers);
        let pending = transport::start(&Outgoing {
            method: self.method,
            url: &self.url,
            target: &target,
            label: &label,
            headers: &headers,
            body: &self.body,
            connect_timeout: self.connect_timeout,
            first_byte_timeout: self.first_byte_timeout,
            between_bytes_timeout: self.between_bytes_timeout,
        })?;
        Ok(Started {
            pending,
            method: self.method,
            url: self.url,
            target,
            label,
            max_response_bytes: self.max_response_bytes,
        })
    }
}

/// A request on its way: sent, its answer not awaited yet.
struct Started {
    pending: transport::Pending,
    method: Method,
    url: String,
    target: Target,
    label: String,
    max_response_bytes: usize,
}

impl Started {
    /// Waits for the response head.
    fn open(self) -> Result<OpenResponse, Failure> {
        let head = self.pending.open(&Sent {
            method: self.method,
            url: &self.url,
            target: &self.target,
            label: &self.label,
        })?;
        Ok(OpenResponse {
            body: Some(head.body),
            status: head.status,
            headers: head.headers,
            method: self.method,
            url: self.url,
            target: self.target,
            label: self.label,
            // A server may answer before reading the whole body (401, 413):
            // its answer is what counts, so a failed upload is only reported
            // when the status does not say more.
            upload_error: head.upload_error,
            failed: None,
        })
    }

    /// Waits for the whole answer, as [`Request::send`] does.
    fn answer(self) -> Result<Response, Failure> {
        let (method, url, limit) = (self.method, self.url.clone(), self.max_response_bytes);
        let response = read_response(self.open()?, limit)?;
        if response.status >= 400 {
            return Err(error_answer(method, &url, &response));
        }
        Ok(response)
    }
}

/// The failure for an answer of 400 or more, classified by
/// [`classify_answer`] (reason phrase included) and kept with its kind.
fn error_answer(method: Method, url: &str, answer: &Response) -> Failure {
    let error = classify_answer(method, url, answer.status, answer.reason_phrase(), &answer.body)
        .unwrap_or_else(|| ProviderError::Permanent(format!("HTTP {}", answer.status)));
    Failure::of_answer(answer, error)
}

/// Reads an opened answer whole, at most `limit` bytes of body.
fn read_response(mut open: OpenResponse, limit: usize) -> Result<Response, Failure> {
    let body = open.read_all(limit)?;
    open.check_upload()?;
    Ok(Response {
        status: open.status,
        headers: std::mem::take(&mut open.headers),
        body,
        request: std::mem::take(&mut open.label),
    })
}

/// Sends every request before waiting for any answer, so that they are in
/// flight at once (a check asking every node the same question), and
/// returns each outcome in the order given, as [`Request::send`] would:
/// an answer of 400 or more is a [`Failure`].
///
/// The host holds each request to the entry's grants and limits as it
/// would one at a time; beyond the entry's `limits.httpInFlightPerCall`,
/// the surplus fails with a connection-limit failure.
///
/// ```no_run
/// use proxyfleet_sdk::http::{Request, send_all};
/// let answers = send_all(vec![
///     Request::get("https://pve.example:8006/api2/json/nodes/pve1/status"),
///     Request::get("https://pve.example:8006/api2/json/nodes/pve2/status"),
/// ]);
/// assert_eq!(answers.len(), 2);
/// ```
pub fn send_all(requests: Vec<Request>) -> Vec<Result<Response, Failure>> {
    let started: Vec<Result<Started, Failure>> = requests.into_iter().map(Request::start).collect();
    started.into_iter().map(|started| started.and_then(Started::answer)).collect()
}

/// A complete HTTP response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// Header fields in the order received; values decoded as UTF-8, lossily.
    pub headers: Vec<(String, String)>,
    /// The whole body.
    pub body: Vec<u8>,
    /// `METHOD URL`, for error messages.
    request: String,
}

impl Response {
    /// The first value of header `name`, compared case-insensitively.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }

    /// The status line's reason phrase, when it was not the standard one
    /// for the code ([`REASON_PHRASE_HEADER`]).
    pub fn reason_phrase(&self) -> Option<&str> {
        self.header(REASON_PHRASE_HEADER)
    }

    /// The body as text, with invalid UTF-8 replaced.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// Parses the body as JSON. A body that does not parse is
    /// [`ProviderError::Permanent`]: the backend answered, but not in the
    /// shape this plugin understands.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T> {
        serde_json::from_slice(&self.body).map_err(|error| {
            ProviderError::Permanent(format!(
                "{}: unexpected response body (HTTP {}): {error}: {}",
                self.request,
                self.status,
                excerpt(&self.body)
            ))
        })
    }
}

/// Percent-encodes everything but RFC 3986's unreserved characters, for a
/// path segment or a query value built into a URL.
///
/// ```
/// use proxyfleet_sdk::http::encode_component;
/// assert_eq!(encode_component("labels.proxyfleet:*"), "labels.proxyfleet%3A%2A");
/// assert_eq!(encode_component("a b/c~d"), "a%20b%2Fc~d");
/// ```
pub fn encode_component(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

mod body;
mod classify;
mod failure;
mod target;
#[cfg(test)]
mod tests;
mod transport;

pub use body::BodyStream;
use body::{ERROR_BODY_BYTES, OpenResponse};
use classify::excerpt;
pub use classify::{REASON_PHRASE_HEADER, classify_answer, classify_status};
pub use failure::{Failure, FailureKind, HOST_REFUSAL_HEADER, HostRefusal};
use target::{Target, redact_userinfo};
use transport::{Outgoing, Sent};
