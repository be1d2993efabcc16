//! A small blocking HTTP client over `wasi:http/outgoing-handler`.
//!
//! The host only lets a plugin reach the destinations its entry grants; a
//! request anywhere else fails with [`ProviderError::Unauthorized`]. Every
//! failure comes back as a [`ProviderError`] already classified for the
//! host: an HTTP status of 400 or more by [`classify_status`], a transport
//! failure by its `wasi:http` error code. [`Request::send_any_status`]
//! hands error answers back instead, for APIs whose bodies say more than
//! their status.
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
use wasip2::http::outgoing_handler;
use wasip2::http::types::{
    self as wasi, ErrorCode, Fields, IncomingBody, IncomingResponse, OutgoingBody, OutgoingRequest,
    RequestOptions,
};
use wasip2::io::streams::{InputStream, StreamError};

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
/// `blocking-write-and-flush` accepts at most 4096 bytes per call.
const WRITE_CHUNK: usize = 4096;
const READ_CHUNK: u64 = 64 * 1024;

/// An HTTP method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    fn expects_body(self) -> bool {
        matches!(self, Self::Post | Self::Put | Self::Patch)
    }

    fn as_wasi(self) -> wasi::Method {
        match self {
            Self::Get => wasi::Method::Get,
            Self::Head => wasi::Method::Head,
            Self::Post => wasi::Method::Post,
            Self::Put => wasi::Method::Put,
            Self::Patch => wasi::Method::Patch,
            Self::Delete => wasi::Method::Delete,
            Self::Options => wasi::Method::Options,
        }
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
    pub fn send(self) -> Result<Response> {
        let (method, url) = (self.method, self.url.clone());
        let response = self.send_any_status()?;
        match classify_answer(
            method,
            &url,
            response.status,
            response.reason_phrase(),
            &response.body,
        ) {
            Some(error) => Err(error),
            None => Ok(response),
        }
    }

    /// Performs the request and returns the response whatever its status;
    /// only failures to get one (transport, limits, the host's grants) are
    /// errors, classified as [`Request::send`] does.
    ///
    /// For APIs whose error answers say more than their status, such as
    /// Kubernetes `Status` objects or a `Retry-After` header: the plugin
    /// classifies them itself (falling back on [`classify_status`]).
    pub fn send_any_status(self) -> Result<Response> {
        let limit = self.max_response_bytes;
        let mut open = self.open()?;
        let body = open.read_all(limit)?;
        open.check_upload()?;
        Ok(Response {
            status: open.status,
            headers: std::mem::take(&mut open.headers),
            body,
            request: std::mem::take(&mut open.label),
        })
    }

    /// Performs the request and hands the body back chunk by chunk, for
    /// downloads too large to hold in memory (a disk image). A status of
    /// 400 or more is the error [`classify_status`] gives, as with
    /// [`Request::send`]; the response size limit does not apply.
    pub fn send_streaming(self) -> Result<BodyStream> {
        let mut open = self.open()?;
        if open.status >= 400 {
            // Enough of the body for the error message; the rest is dropped.
            let body = open.read_prefix(ERROR_BODY_BYTES);
            let status = open.status;
            let reason = open
                .headers
                .iter()
                .find(|(key, _)| key.eq_ignore_ascii_case(REASON_PHRASE_HEADER))
                .map(|(_, value)| value.as_str());
            return Err(classify_answer(open.method, &open.url, status, reason, &body)
                .unwrap_or_else(|| ProviderError::Permanent(format!("HTTP {status}"))));
        }
        open.check_upload()?;
        Ok(BodyStream { open })
    }

    /// Sends the request and waits for the response head.
    fn open(self) -> Result<OpenResponse> {
        if let Some(error) = self.deferred_error {
            return Err(error);
        }
        let target = Target::parse(&self.url).map_err(|reason| {
            ProviderError::Permanent(format!(
                "{} {}: invalid URL: {reason}",
                self.method,
                redact_userinfo(&self.url)
            ))
        })?;
        let label = format!("{} {}", self.method, self.url);
        let fail = |what: &str| ProviderError::Permanent(format!("{label}: {what}"));

        let headers = Fields::new();
        // The whole body is known, so say how long it is: without this the
        // host streams it chunked, which some API servers do not read.
        let has_content_length =
            self.headers.iter().any(|(name, _)| name.eq_ignore_ascii_case("content-length"));
        if !has_content_length && (!self.body.is_empty() || self.method.expects_body()) {
            let length = self.body.len().to_string();
            headers.append("content-length", length.as_bytes()).map_err(|error| {
                fail(&format!("header `content-length` refused by the host ({error:?})"))
            })?;
        }
        for (name, value) in &self.headers {
            headers.append(name, value).map_err(|error| {
                // The value is left out on purpose: it may be a credential.
                fail(&format!("header `{name}` refused by the host ({error:?})"))
            })?;
        }
        let request = OutgoingRequest::new(headers);
        request
            .set_method(&self.method.as_wasi())
            .map_err(|()| fail("method refused by the host"))?;
        request
            .set_scheme(Some(&target.scheme.as_wasi()))
            .map_err(|()| fail("scheme refused by the host"))?;
        request
            .set_authority(Some(&target.authority))
            .map_err(|()| fail("authority refused by the host"))?;
        request
            .set_path_with_query(Some(&target.path_with_query))
            .map_err(|()| fail("path refused by the host"))?;

        let options = RequestOptions::new();
        // An error only means the host does not support that timeout; its
        // own limits and the call deadline then apply.
        let nanos = |timeout: Duration| u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
        let _ = options.set_connect_timeout(Some(nanos(self.connect_timeout)));
        let _ = options.set_first_byte_timeout(Some(nanos(self.first_byte_timeout)));
        let _ = options.set_between_bytes_timeout(Some(nanos(self.between_bytes_timeout)));

        let outgoing_body = request.body().map_err(|()| fail("request body already taken"))?;
        let future_response = outgoing_handler::handle(request, Some(options))
            .map_err(|code| classify_transport(&code, self.method, &self.url, &target))?;

        // Written after `handle`, so that a body larger than the host's
        // buffer streams out instead of blocking before the request starts.
        let write_result = write_body(outgoing_body, &self.body);

        future_response.subscribe().block();
        let response = match future_response.get() {
            Some(Ok(Ok(response))) => response,
            // A broken upload usually shows here with the better code.
            Some(Ok(Err(code))) => {
                return Err(classify_transport(&code, self.method, &self.url, &target));
            }
            Some(Err(())) => return Err(fail("response already taken")),
            None => return Err(ProviderError::Transient(format!("{label}: no response"))),
        };
        // A server may answer before reading the whole body (401, 413): its
        // answer is what counts, so a failed upload is only reported when
        // the status does not say more.
        let upload_error = write_result.err();

        let status = response.status();
        let headers = response
            .headers()
            .entries()
            .into_iter()
            .map(|(name, value)| (name, String::from_utf8_lossy(&value).into_owned()))
            .collect();
        let incoming_body = response.consume().map_err(|()| fail("response body already taken"))?;
        let stream = incoming_body.stream().map_err(|()| fail("body stream already taken"))?;
        Ok(OpenResponse {
            stream: Some(stream),
            body: Some(incoming_body),
            _response: response,
            status,
            headers,
            method: self.method,
            url: self.url,
            target,
            label,
            upload_error,
            failed: None,
        })
    }
}

/// How much of an error answer's body [`Request::send_streaming`] reads
/// for the message.
const ERROR_BODY_BYTES: usize = 4096;

/// A response whose body has not been read yet. Field order is drop order:
/// the stream is a child of the body, the body of the response.
struct OpenResponse {
    stream: Option<InputStream>,
    body: Option<IncomingBody>,
    _response: IncomingResponse,
    status: u16,
    headers: Vec<(String, String)>,
    method: Method,
    url: String,
    target: Target,
    /// `METHOD URL`, for error messages.
    label: String,
    /// A failure sending the request body, reported once the status is known.
    upload_error: Option<ErrorCode>,
    /// How reading the body failed: every later read fails the same way,
    /// so a body cut off never reads as one that ended.
    failed: Option<ProviderError>,
}

impl OpenResponse {
    /// The next chunk of the body; `None` once it has all been read.
    fn next_chunk(&mut self) -> Result<Option<Vec<u8>>> {
        if let Some(error) = &self.failed {
            return Err(error.clone());
        }
        let Some(stream) = &self.stream else { return Ok(None) };
        match stream.blocking_read(READ_CHUNK) {
            Ok(chunk) => Ok(Some(chunk)),
            Err(StreamError::Closed) => {
                self.finish();
                Ok(None)
            }
            Err(StreamError::LastOperationFailed(io_error)) => {
                self.finish();
                let error = match wasi::http_error_code(&io_error) {
                    Some(code) => classify_transport(&code, self.method, &self.url, &self.target),
                    None => ProviderError::Transient(format!(
                        "{}: reading the response failed: {}",
                        self.label,
                        io_error.to_debug_string()
                    )),
                };
                self.failed = Some(error.clone());
                Err(error)
            }
        }
    }

    /// The first `limit` bytes of the body, or less when it ends or fails
    /// first: for the message of an error answer.
    fn read_prefix(&mut self, limit: usize) -> Vec<u8> {
        let mut bytes = Vec::new();
        while bytes.len() < limit {
            match self.next_chunk() {
                Ok(Some(chunk)) => bytes.extend_from_slice(&chunk),
                Ok(None) | Err(_) => break,
            }
        }
        bytes.truncate(limit);
        bytes
    }

    /// The whole body, at most `limit` bytes.
    fn read_all(&mut self, limit: usize) -> Result<Vec<u8>> {
        let mut bytes = Vec::new();
        while let Some(chunk) = self.next_chunk()? {
            if bytes.len() + chunk.len() > limit {
                self.finish();
                return Err(ProviderError::Permanent(format!(
                    "{}: response body too large (over {limit} bytes)",
                    self.label
                )));
            }
            bytes.extend_from_slice(&chunk);
        }
        Ok(bytes)
    }

    /// A failed request upload, unless the status says more.
    fn check_upload(&mut self) -> Result<()> {
        match self.upload_error.take().filter(|_| self.status < 400) {
            Some(code) => Err(classify_transport(&code, self.method, &self.url, &self.target)),
            None => Ok(()),
        }
    }

    /// Releases the body; trailers are not used.
    fn finish(&mut self) {
        drop(self.stream.take());
        if let Some(body) = self.body.take() {
            drop(IncomingBody::finish(body));
        }
    }
}

impl Drop for OpenResponse {
    fn drop(&mut self) {
        self.finish();
    }
}

/// A response body read chunk by chunk, from [`Request::send_streaming`].
pub struct BodyStream {
    open: OpenResponse,
}

impl fmt::Debug for BodyStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BodyStream")
            .field("request", &self.open.label)
            .field("status", &self.open.status)
            .finish_non_exhaustive()
    }
}

impl BodyStream {
    /// The status code (below 400).
    pub fn status(&self) -> u16 {
        self.open.status
    }

    /// The first value of header `name`, compared case-insensitively.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.open
            .headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }

    /// The announced body length (`Content-Length`), when there is one.
    pub fn content_length(&self) -> Option<u64> {
        self.header("content-length").and_then(|value| value.trim().parse().ok())
    }

    /// The next chunk of the body (at most 64 KiB); `None` at its end. A
    /// connection lost part way is [`ProviderError::Transient`], and so is
    /// every read after it.
    pub fn next_chunk(&mut self) -> Result<Option<Vec<u8>>> {
        self.open.next_chunk()
    }
}

/// Streams `body` out and finishes the outgoing body. A failure is returned
/// but only reported after the response future, which carries the better
/// error code when the connection broke.
fn write_body(outgoing_body: OutgoingBody, body: &[u8]) -> std::result::Result<(), ErrorCode> {
    let stream_result = match outgoing_body.write() {
        Ok(stream) => {
            let mut result = Ok(());
            for chunk in body.chunks(WRITE_CHUNK) {
                if let Err(error) = stream.blocking_write_and_flush(chunk) {
                    result = Err(stream_error_code(error));
                    break;
                }
            }
            // The stream is a child of the body and must go first.
            drop(stream);
            result
        }
        Err(()) => {
            Err(ErrorCode::InternalError(Some("request body stream already taken".to_owned())))
        }
    };
    let finish_result = OutgoingBody::finish(outgoing_body, None);
    stream_result.and(finish_result)
}

fn stream_error_code(error: StreamError) -> ErrorCode {
    match error {
        StreamError::LastOperationFailed(io_error) => wasi::http_error_code(&io_error)
            .unwrap_or_else(|| ErrorCode::InternalError(Some(io_error.to_debug_string()))),
        StreamError::Closed => ErrorCode::ConnectionTerminated,
    }
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

/// The response header in which the host hands over the status line's
/// reason phrase when it is not the standard one for the code: `wasi:http`
/// has no field for it, and some backends (Proxmox VE before 8.4) put their
/// error text only there. The host sets it and drops one the backend sent.
pub const REASON_PHRASE_HEADER: &str = "proxyfleet-reason-phrase";

/// The error for an HTTP `status`, or `None` below 400.
///
/// 401/403 → Unauthorized, 404 → NotFound, 409/423 → Conflict, 429 and 5xx →
/// Transient, other 4xx → Permanent. The message holds the method, URL,
/// status and a short excerpt of the body. [`classify_answer`] adds the
/// reason phrase.
pub fn classify_status(
    method: Method,
    url: &str,
    status: u16,
    body: &[u8],
) -> Option<ProviderError> {
    classify_answer(method, url, status, None, body)
}

/// [`classify_status`], with the status line's `reason` phrase (see
/// [`REASON_PHRASE_HEADER`]) after the status in the message.
///
/// ```
/// use proxyfleet_sdk::http::{Method, classify_answer};
/// let error = classify_answer(
///     Method::Put,
///     "https://pve:8006/api2/json/nodes/pve1/qemu/101/config",
///     500,
///     Some("VM 101 is locked (clone)"),
///     br#"{"data":null}"#,
/// )
/// .expect("an error");
/// assert!(error.message().contains("HTTP 500 VM 101 is locked (clone)"));
/// ```
pub fn classify_answer(
    method: Method,
    url: &str,
    status: u16,
    reason: Option<&str>,
    body: &[u8],
) -> Option<ProviderError> {
    if status < 400 {
        return None;
    }
    let excerpt = excerpt(body);
    let reason = reason.map(excerpt_text).filter(|reason| !reason.is_empty());
    let mut message = format!("{method} {}: HTTP {status}", redact_userinfo(url));
    if let Some(reason) = reason {
        message.push(' ');
        message.push_str(&reason);
    }
    if !excerpt.is_empty() {
        message.push_str(": ");
        message.push_str(&excerpt);
    }
    Some(match status {
        401 | 403 => ProviderError::Unauthorized(message),
        404 => ProviderError::NotFound(message),
        409 | 423 => ProviderError::Conflict(message),
        429 | 500.. => ProviderError::Transient(message),
        _ => ProviderError::Permanent(message),
    })
}

/// The start of `body` as one line of text.
fn excerpt(body: &[u8]) -> String {
    excerpt_text(&String::from_utf8_lossy(body))
}

/// The start of `text` as one line.
fn excerpt_text(text: &str) -> String {
    let mut words = text.split_whitespace();
    let mut out = String::new();
    let mut chars = 0;
    for word in words.by_ref() {
        let separator = usize::from(!out.is_empty());
        let word_chars = word.chars().count();
        if chars + separator + word_chars > BODY_EXCERPT_CHARS {
            let room = BODY_EXCERPT_CHARS.saturating_sub(chars + separator);
            if separator == 1 && room > 0 {
                out.push(' ');
            }
            out.extend(word.chars().take(room));
            out.push('…');
            return out;
        }
        if separator == 1 {
            out.push(' ');
        }
        out.push_str(word);
        chars += separator + word_chars;
    }
    out
}

/// The error for a transport failure reported by the host.
///
/// A denial by the host's grants is Unauthorized; DNS, connection and
/// timeout failures are Transient; size limits, malformed requests and TLS
/// failures are Permanent.
fn classify_transport(
    code: &ErrorCode,
    method: Method,
    url: &str,
    target: &Target,
) -> ProviderError {
    let request = format!("{method} {}", redact_userinfo(url));
    let transient = |what: &str| ProviderError::Transient(format!("{request}: {what}"));
    let permanent = |what: &str| ProviderError::Permanent(format!("{request}: {what}"));
    match code {
        ErrorCode::HttpRequestDenied => ProviderError::Unauthorized(format!(
            "denied by the host: the entry's grants do not allow {}",
            target.origin()
        )),
        ErrorCode::DestinationIpProhibited => ProviderError::Unauthorized(format!(
            "denied by the host: the entry's grants do not allow the address {} resolves to",
            target.origin()
        )),
        ErrorCode::DnsTimeout => transient("DNS lookup timed out"),
        ErrorCode::DnsError(payload) => transient(&format!(
            "DNS lookup failed{}",
            payload.rcode.as_deref().map(|rcode| format!(" ({rcode})")).unwrap_or_default()
        )),
        ErrorCode::DestinationNotFound => transient("destination not found"),
        ErrorCode::DestinationUnavailable => transient("destination unavailable"),
        ErrorCode::DestinationIpUnroutable => transient("destination address unroutable"),
        ErrorCode::ConnectionRefused => transient("connection refused"),
        ErrorCode::ConnectionTerminated => transient("connection closed early"),
        ErrorCode::ConnectionTimeout => transient("connect timed out"),
        ErrorCode::ConnectionReadTimeout => transient("timed out reading the response"),
        ErrorCode::ConnectionWriteTimeout => transient("timed out sending the request"),
        ErrorCode::ConnectionLimitReached => transient("connection limit reached"),
        ErrorCode::HttpResponseIncomplete => transient("response incomplete"),
        ErrorCode::HttpResponseTimeout => transient("timed out waiting for the response"),
        ErrorCode::HttpProtocolError => transient("HTTP protocol error"),
        ErrorCode::InternalError(detail) => transient(&format!(
            "host error{}",
            detail.as_deref().map(|detail| format!(": {detail}")).unwrap_or_default()
        )),
        ErrorCode::TlsProtocolError => permanent("TLS handshake failed"),
        ErrorCode::TlsCertificateError => permanent("TLS certificate rejected"),
        ErrorCode::TlsAlertReceived(payload) => permanent(&format!(
            "TLS alert from the server{}",
            payload
                .alert_message
                .as_deref()
                .map(|message| format!(": {message}"))
                .unwrap_or_default()
        )),
        // The host reports the size it saw; its cap is the entry's to set.
        ErrorCode::HttpResponseBodySize(size) => permanent(&format!(
            "response body too large{}: over the host's cap, the entry's \
             `limits.httpResponseMiB`",
            size.map(|size| format!(" ({size} bytes)")).unwrap_or_default()
        )),
        ErrorCode::HttpRequestBodySize(_) => permanent("request body too large"),
        ErrorCode::HttpResponseHeaderSectionSize(_) | ErrorCode::HttpResponseHeaderSize(_) => {
            permanent("response headers too large")
        }
        ErrorCode::HttpResponseTrailerSectionSize(_) | ErrorCode::HttpResponseTrailerSize(_) => {
            permanent("response trailers too large")
        }
        ErrorCode::HttpRequestHeaderSectionSize(_) | ErrorCode::HttpRequestHeaderSize(_) => {
            permanent("request headers too large")
        }
        ErrorCode::HttpRequestTrailerSectionSize(_) | ErrorCode::HttpRequestTrailerSize(_) => {
            permanent("request trailers too large")
        }
        ErrorCode::HttpRequestLengthRequired => permanent("server requires a content length"),
        ErrorCode::HttpRequestMethodInvalid => permanent("method refused"),
        ErrorCode::HttpRequestUriInvalid => permanent("URI refused"),
        ErrorCode::HttpRequestUriTooLong => permanent("URI too long"),
        ErrorCode::HttpResponseTransferCoding(_) => permanent("unsupported transfer coding"),
        ErrorCode::HttpResponseContentCoding(_) => permanent("unsupported content coding"),
        ErrorCode::HttpUpgradeFailed => permanent("protocol upgrade failed"),
        ErrorCode::LoopDetected => permanent("request loop detected"),
        ErrorCode::ConfigurationError => permanent("host HTTP configuration error"),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scheme {
    Http,
    Https,
}

impl Scheme {
    fn as_wasi(self) -> wasi::Scheme {
        match self {
            Self::Http => wasi::Scheme::Http,
            Self::Https => wasi::Scheme::Https,
        }
    }

    fn default_port(self) -> u16 {
        match self {
            Self::Http => 80,
            Self::Https => 443,
        }
    }
}

/// The parts of an absolute `http`/`https` URL that `wasi:http` takes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    scheme: Scheme,
    /// `host[:port]` as written in the URL.
    authority: String,
    /// The host, IPv6 literals in brackets.
    host: String,
    /// The explicit port, or the scheme's default.
    port: u16,
    /// Starts with `/`; the fragment is dropped.
    path_with_query: String,
}

impl Target {
    fn parse(url: &str) -> std::result::Result<Self, String> {
        let (scheme, rest) =
            url.split_once("://").ok_or_else(|| "expected scheme://host/path".to_owned())?;
        let scheme = match scheme.to_ascii_lowercase().as_str() {
            "http" => Scheme::Http,
            "https" => Scheme::Https,
            _ => return Err(format!("unsupported scheme `{scheme}` (use http or https)")),
        };
        let rest = rest.split_once('#').map_or(rest, |(before, _)| before);
        let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, path_with_query) = rest.split_at(authority_end);
        if authority.contains('@') {
            return Err(
                "credentials in the URL are not supported; send them in a header".to_owned()
            );
        }
        let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
            let (address, after) =
                bracketed.split_once(']').ok_or_else(|| "unclosed `[` in the host".to_owned())?;
            let port = match after {
                "" => None,
                _ => Some(
                    after
                        .strip_prefix(':')
                        .ok_or_else(|| "expected `:port` after `]`".to_owned())?,
                ),
            };
            (format!("[{address}]"), port)
        } else {
            match authority.rsplit_once(':') {
                Some((host, port)) => (host.to_owned(), Some(port)),
                None => (authority.to_owned(), None),
            }
        };
        if host.is_empty() || host == "[]" {
            return Err("missing host".to_owned());
        }
        let port = match port {
            None | Some("") => scheme.default_port(),
            Some(port) => port.parse().map_err(|_| format!("invalid port `{port}`"))?,
        };
        let path_with_query = if path_with_query.starts_with('/') {
            path_with_query.to_owned()
        } else {
            format!("/{path_with_query}")
        };
        Ok(Self {
            scheme,
            authority: authority.to_owned(),
            host: host.to_ascii_lowercase(),
            port,
            path_with_query,
        })
    }

    /// `scheme://host:port`, the unit the host grants.
    fn origin(&self) -> String {
        let scheme = match self.scheme {
            Scheme::Http => "http",
            Scheme::Https => "https",
        };
        format!("{scheme}://{}:{}", self.host, self.port)
    }
}

/// `url` with any `user:password@` removed, for messages.
fn redact_userinfo(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://{}", &rest[at + 1..]),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(url: &str) -> Target {
        Target::parse(url).unwrap_or_else(|error| panic!("{url}: {error}"))
    }

    #[test]
    fn parses_urls() {
        let plain = target("https://pve.example:8006/api2/json/nodes?type=vm#frag");
        assert_eq!(plain.scheme, Scheme::Https);
        assert_eq!(plain.authority, "pve.example:8006");
        assert_eq!(plain.origin(), "https://pve.example:8006");
        assert_eq!(plain.path_with_query, "/api2/json/nodes?type=vm");

        let bare = target("HTTP://Example.COM");
        assert_eq!(bare.origin(), "http://example.com:80");
        assert_eq!(bare.path_with_query, "/");

        let query_only = target("https://example.com?a=1");
        assert_eq!(query_only.authority, "example.com");
        assert_eq!(query_only.path_with_query, "/?a=1");

        let v6 = target("http://[2001:db8::1]:8080/x");
        assert_eq!(v6.origin(), "http://[2001:db8::1]:8080");
        assert_eq!(v6.authority, "[2001:db8::1]:8080");
        assert_eq!(target("https://[::1]/").port, 443);
    }

    #[test]
    fn rejects_bad_urls() {
        for url in [
            "example.com/x",
            "ftp://example.com/",
            "https:///path",
            "https://host:99999/",
            "https://host:port/",
            "http://[::1/",
            "http://[::1]x/",
            "https://user:secret@example.com/",
        ] {
            assert!(Target::parse(url).is_err(), "{url} parsed");
        }
        let error = Target::parse("https://user:secret@example.com/").expect_err("refused");
        assert!(!error.contains("secret"), "{error}");
    }

    #[test]
    fn redacts_userinfo() {
        assert_eq!(redact_userinfo("https://u:p@h/x@y"), "https://h/x@y");
        assert_eq!(redact_userinfo("https://h/x@y"), "https://h/x@y");
        assert_eq!(redact_userinfo("nonsense"), "nonsense");
    }

    #[test]
    fn classifies_statuses() {
        let url = "https://api.example/v1/vms/7";
        let class = |status| classify_status(Method::Get, url, status, b"");
        assert_eq!(class(200), None);
        assert_eq!(class(204), None);
        assert_eq!(class(302), None);
        assert!(matches!(class(401), Some(ProviderError::Unauthorized(_))));
        assert!(matches!(class(403), Some(ProviderError::Unauthorized(_))));
        assert!(matches!(class(404), Some(ProviderError::NotFound(_))));
        assert!(matches!(class(409), Some(ProviderError::Conflict(_))));
        assert!(matches!(class(423), Some(ProviderError::Conflict(_))));
        assert!(matches!(class(429), Some(ProviderError::Transient(_))));
        assert!(matches!(class(500), Some(ProviderError::Transient(_))));
        assert!(matches!(class(503), Some(ProviderError::Transient(_))));
        assert!(matches!(class(400), Some(ProviderError::Permanent(_))));
        assert!(matches!(class(422), Some(ProviderError::Permanent(_))));
        assert_eq!(
            class(404).map(|error| error.message().to_owned()),
            Some("GET https://api.example/v1/vms/7: HTTP 404".to_owned())
        );
    }

    #[test]
    fn status_messages_carry_a_short_excerpt() {
        let body = format!("{{\"errors\":\n  {{\"vmid\": \"{}\"}}}}", "x".repeat(500));
        let error =
            classify_status(Method::Post, "https://h/p", 400, body.as_bytes()).expect("an error");
        let message = error.message();
        assert!(
            message.starts_with("POST https://h/p: HTTP 400: {\"errors\": {\"vmid\": \"xxx"),
            "{message}"
        );
        assert!(message.ends_with('…'), "{message}");
        assert!(message.chars().count() < 260, "{message}");
    }

    #[test]
    fn excerpt_collapses_whitespace() {
        assert_eq!(excerpt(b"  a\n\tb  c "), "a b c");
        assert_eq!(excerpt(b""), "");
        assert_eq!(excerpt(&[0xff, b'a']), "\u{fffd}a");
    }

    #[test]
    fn classifies_transport_errors() {
        let url = "https://api.example:8443/v1";
        let target = target(url);
        let class = |code: ErrorCode| classify_transport(&code, Method::Get, url, &target);
        assert_eq!(
            class(ErrorCode::HttpRequestDenied),
            ProviderError::Unauthorized(
                "denied by the host: the entry's grants do not allow https://api.example:8443"
                    .to_owned()
            )
        );
        for code in [
            ErrorCode::DnsTimeout,
            ErrorCode::DnsError(wasi::DnsErrorPayload {
                rcode: Some("NXDOMAIN".into()),
                info_code: None,
            }),
            ErrorCode::ConnectionRefused,
            ErrorCode::ConnectionTerminated,
            ErrorCode::ConnectionTimeout,
            ErrorCode::ConnectionReadTimeout,
            ErrorCode::HttpResponseTimeout,
            ErrorCode::DestinationUnavailable,
        ] {
            assert!(matches!(class(code), ProviderError::Transient(_)));
        }
        for code in [
            ErrorCode::HttpResponseBodySize(Some(1024)),
            ErrorCode::HttpRequestBodySize(None),
            ErrorCode::TlsCertificateError,
            ErrorCode::HttpRequestUriInvalid,
        ] {
            assert!(matches!(class(code), ProviderError::Permanent(_)));
        }
        let message = class(ErrorCode::ConnectionRefused).message().to_owned();
        assert_eq!(message, "GET https://api.example:8443/v1: connection refused");
    }

    #[test]
    fn debug_leaves_header_values_out() {
        let request = Request::get("https://h/")
            .header("authorization", "Bearer s3cret")
            .json(&serde_json::json!({"a": 1}));
        let debug = format!("{request:?}");
        assert!(debug.contains("authorization"), "{debug}");
        assert!(debug.contains("content-type"), "{debug}");
        assert!(!debug.contains("s3cret"), "{debug}");
    }

    #[test]
    fn json_body_replaces_the_content_type() {
        let request =
            Request::post("https://h/").header("Content-Type", "text/plain").json(&[1, 2]);
        assert_eq!(request.body, b"[1,2]");
        let content_types: Vec<_> = request
            .headers
            .iter()
            .filter(|(name, _)| name.eq_ignore_ascii_case("content-type"))
            .collect();
        assert_eq!(content_types.len(), 1);
        assert_eq!(content_types[0].1, b"application/json");
    }

    #[test]
    fn response_helpers() {
        let response = Response {
            status: 200,
            headers: vec![("Content-Type".into(), "application/json".into())],
            body: br#"{"data": 5}"#.to_vec(),
            request: "GET https://h/".into(),
        };
        assert_eq!(response.header("content-type"), Some("application/json"));
        assert_eq!(response.header("etag"), None);
        let value: serde_json::Value = response.json().expect("JSON");
        assert_eq!(value["data"], 5);
        let error = response.json::<Vec<u8>>().expect_err("not a list");
        assert!(matches!(error, ProviderError::Permanent(_)));
        assert!(error.message().starts_with("GET https://h/: unexpected response body (HTTP 200)"));
    }
}
