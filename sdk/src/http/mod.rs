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
///
/// ```
/// use proxyfleet_sdk::http::{DEFAULT_CONNECT_TIMEOUT, Request};
///
/// // A request that sets no timeout of its own has the default.
/// let shown = format!("{:?}", Request::get("https://api.example/v1/instances"));
/// assert!(shown.contains(&format!("connect_timeout: {DEFAULT_CONNECT_TIMEOUT:?}")));
/// ```
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Time allowed from sending the request to the first byte of the response,
/// unless the request sets its own. Backends that run a task before
/// answering (cloning a VM) need it generous.
///
/// ```
/// use proxyfleet_sdk::http::{DEFAULT_FIRST_BYTE_TIMEOUT, Request};
///
/// // A request that sets no timeout of its own has the default.
/// let shown = format!("{:?}", Request::get("https://api.example/v1/instances"));
/// assert!(shown.contains(&format!("first_byte_timeout: {DEFAULT_FIRST_BYTE_TIMEOUT:?}")));
/// ```
pub const DEFAULT_FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest pause between two chunks of the response body, unless the
/// request sets its own.
///
/// ```
/// use proxyfleet_sdk::http::{DEFAULT_BETWEEN_BYTES_TIMEOUT, Request};
///
/// // A request that sets no timeout of its own has the default.
/// let shown = format!("{:?}", Request::get("https://api.example/v1/instances"));
/// assert!(shown.contains(&format!("between_bytes_timeout: {DEFAULT_BETWEEN_BYTES_TIMEOUT:?}")));
/// ```
pub const DEFAULT_BETWEEN_BYTES_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest response body read unless the request sets its own limit; a
/// larger one fails with [`ProviderError::Permanent`].
///
/// ```
/// use proxyfleet_sdk::http::{DEFAULT_MAX_RESPONSE_BYTES, Request};
///
/// // A request that sets no limit of its own has the default.
/// let shown = format!("{:?}", Request::get("https://api.example/v1/instances"));
/// assert!(shown.contains(&format!("max_response_bytes: {DEFAULT_MAX_RESPONSE_BYTES}")));
/// ```
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// How many bytes of an error response's body go into the error message.
const BODY_EXCERPT_CHARS: usize = 200;
const READ_CHUNK: u64 = 64 * 1024;

pub use crate::method::Method;

/// An HTTP request being built; [`Request::send`] performs it.
///
/// ```
/// use proxyfleet_sdk::http::Request;
///
/// let request = Request::post("https://api.example/v1/instances")
///     .bearer_auth("s3cret-token")
///     .json(&serde_json::json!({ "name": "pf-6f1c2a9e0b7d", "size": "small" }));
/// // `Debug` names the headers but never shows their values.
/// let shown = format!("{request:?}");
/// assert!(shown.contains(r#"header_names: ["authorization", "content-type"]"#));
/// assert!(!shown.contains("s3cret-token"));
/// ```
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
    ///
    /// ```
    /// use proxyfleet_sdk::http::{Method, Request};
    ///
    /// let request = Request::new(Method::Options, "https://api.example/v1/instances");
    /// assert!(format!("{request:?}").contains("method: Options"));
    /// ```
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
    ///
    /// ```
    /// use proxyfleet_sdk::http::Request;
    ///
    /// let request = Request::get("https://api.example/v1/instances/pf-1");
    /// assert!(format!("{request:?}").contains("method: Get"));
    /// ```
    pub fn get(url: impl Into<String>) -> Self {
        Self::new(Method::Get, url)
    }

    /// A `POST` request.
    ///
    /// ```
    /// use proxyfleet_sdk::http::Request;
    ///
    /// let request = Request::post("https://api.example/v1/instances");
    /// assert!(format!("{request:?}").contains("method: Post"));
    /// ```
    pub fn post(url: impl Into<String>) -> Self {
        Self::new(Method::Post, url)
    }

    /// A `PUT` request.
    ///
    /// ```
    /// use proxyfleet_sdk::http::Request;
    ///
    /// let request = Request::put("https://api.example/v1/instances/pf-1/labels");
    /// assert!(format!("{request:?}").contains("method: Put"));
    /// ```
    pub fn put(url: impl Into<String>) -> Self {
        Self::new(Method::Put, url)
    }

    /// A `PATCH` request.
    ///
    /// ```
    /// use proxyfleet_sdk::http::Request;
    ///
    /// let request = Request::patch("https://api.example/v1/instances/pf-1");
    /// assert!(format!("{request:?}").contains("method: Patch"));
    /// ```
    pub fn patch(url: impl Into<String>) -> Self {
        Self::new(Method::Patch, url)
    }

    /// A `DELETE` request.
    ///
    /// ```
    /// use proxyfleet_sdk::http::Request;
    ///
    /// let request = Request::delete("https://api.example/v1/instances/pf-1");
    /// assert!(format!("{request:?}").contains("method: Delete"));
    /// ```
    pub fn delete(url: impl Into<String>) -> Self {
        Self::new(Method::Delete, url)
    }

    /// Adds a header; repeated names are sent as repeated fields.
    ///
    /// ```
    /// use proxyfleet_sdk::http::Request;
    ///
    /// let request = Request::get("https://pve.example:8006/api2/json/nodes")
    ///     .header("authorization", "PVEAPIToken=fleet@pve!plugin=0b5b")
    ///     .header("accept", "application/json");
    /// assert!(format!("{request:?}").contains(r#"header_names: ["authorization", "accept"]"#));
    /// ```
    #[must_use]
    pub fn header(mut self, name: impl Into<String>, value: impl AsRef<[u8]>) -> Self {
        self.headers.push((name.into(), value.as_ref().to_vec()));
        self
    }

    /// Adds `authorization: Bearer <token>`.
    ///
    /// ```
    /// use proxyfleet_sdk::http::Request;
    ///
    /// let request = Request::get("https://compute.googleapis.com/compute/v1/projects/p/zones")
    ///     .bearer_auth("ya29.token");
    /// assert!(format!("{request:?}").contains(r#"header_names: ["authorization"]"#));
    /// ```
    #[must_use]
    pub fn bearer_auth(self, token: &str) -> Self {
        self.header("authorization", format!("Bearer {token}"))
    }

    /// Sets a raw body and its content type.
    ///
    /// ```
    /// use proxyfleet_sdk::http::Request;
    ///
    /// let request = Request::post("https://pve.example:8006/api2/json/nodes/pve1/qemu/101/config")
    ///     .body("application/x-www-form-urlencoded", "cores=2&memory=2048");
    /// let shown = format!("{request:?}");
    /// assert!(shown.contains(r#"header_names: ["content-type"]"#) && shown.contains("body_len: 19"));
    /// ```
    #[must_use]
    pub fn body(mut self, content_type: &str, body: impl Into<Vec<u8>>) -> Self {
        self.body = body.into();
        self.set_content_type(content_type);
        self
    }

    /// Sets `value` serialised as JSON as the body, with
    /// `content-type: application/json`.
    ///
    /// ```
    /// use proxyfleet_sdk::http::Request;
    ///
    /// #[derive(serde::Serialize)]
    /// struct CloneVm {
    ///     newid: u32,
    ///     name: String,
    /// }
    ///
    /// let request = Request::post("https://pve.example:8006/api2/json/nodes/pve1/qemu/9000/clone")
    ///     .json(&CloneVm { newid: 4711, name: "pf-6f1c2a9e0b7d".into() });
    /// assert!(format!("{request:?}").contains(r#"header_names: ["content-type"]"#));
    /// ```
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
    ///
    /// ```
    /// use std::time::Duration;
    /// use proxyfleet_sdk::http::Request;
    ///
    /// let request = Request::get("https://pve.example:8006/api2/json/version")
    ///     .connect_timeout(Duration::from_secs(3));
    /// assert!(format!("{request:?}").contains("connect_timeout: 3s"));
    /// ```
    #[must_use]
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Time allowed from sending the request to the first response byte.
    ///
    /// ```
    /// use std::time::Duration;
    /// use proxyfleet_sdk::http::Request;
    ///
    /// // The clone answers only once it is done.
    /// let request = Request::post("https://pve.example:8006/api2/json/nodes/pve1/qemu/9000/clone")
    ///     .first_byte_timeout(Duration::from_secs(300));
    /// assert!(format!("{request:?}").contains("first_byte_timeout: 300s"));
    /// ```
    #[must_use]
    pub fn first_byte_timeout(mut self, timeout: Duration) -> Self {
        self.first_byte_timeout = timeout;
        self
    }

    /// Longest pause allowed between two chunks of the response body.
    ///
    /// ```
    /// use std::time::Duration;
    /// use proxyfleet_sdk::http::Request;
    ///
    /// let request = Request::get("https://images.example/debian-12.qcow2")
    ///     .between_bytes_timeout(Duration::from_secs(120));
    /// assert!(format!("{request:?}").contains("between_bytes_timeout: 120s"));
    /// ```
    #[must_use]
    pub fn between_bytes_timeout(mut self, timeout: Duration) -> Self {
        self.between_bytes_timeout = timeout;
        self
    }

    /// Sets all three timeouts to `timeout`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use proxyfleet_sdk::http::Request;
    ///
    /// let request = Request::get("https://api.example/healthz").timeout(Duration::from_secs(5));
    /// let shown = format!("{request:?}");
    /// assert!(shown.contains("connect_timeout: 5s") && shown.contains("first_byte_timeout: 5s"));
    /// assert!(shown.contains("between_bytes_timeout: 5s"));
    /// ```
    #[must_use]
    pub fn timeout(self, timeout: Duration) -> Self {
        self.connect_timeout(timeout).first_byte_timeout(timeout).between_bytes_timeout(timeout)
    }

    /// Largest response body to read; a larger one fails as permanent.
    ///
    /// ```
    /// use proxyfleet_sdk::ProviderError;
    /// use proxyfleet_sdk::http::{FailureKind, Request};
    ///
    /// # use proxyfleet_sdk::native::doc_host::{answer, serve};
    /// # serve(|_| answer(200, &[("content-type", "application/json")], vec![b' '; 4096]), || -> proxyfleet_sdk::Result<()> {
    /// let failure = Request::get("https://api.example/v1/instances")
    ///     .max_response_bytes(1024)
    ///     .send()
    ///     .expect_err("the body is over 1 KiB");
    /// assert_eq!(failure.kind(), FailureKind::TooLarge);
    /// assert!(matches!(failure.error(), ProviderError::Permanent(_)));
    /// # Ok(())
    /// # }).expect("the example runs");
    /// ```
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
    ///
    /// ```
    /// use proxyfleet_sdk::ProviderError;
    /// use proxyfleet_sdk::http::Request;
    ///
    /// # use proxyfleet_sdk::native::doc_host::{answer, serve};
    /// # serve(|request| if request.url.ends_with("/version") {
    /// #     answer(200, &[("content-type", "application/json")], br#"{"data":{"version":"8.2.4"}}"#)
    /// # } else {
    /// #     answer(404, &[], b"no such node")
    /// # }, || -> proxyfleet_sdk::Result<()> {
    /// let version = Request::get("https://pve.example:8006/api2/json/version").send()?;
    /// let body: serde_json::Value = version.json()?;
    /// assert_eq!(body["data"]["version"], "8.2.4");
    ///
    /// let failure = Request::get("https://pve.example:8006/api2/json/nodes/pve9/status")
    ///     .send()
    ///     .expect_err("HTTP 404");
    /// assert!(matches!(failure.error(), ProviderError::NotFound(_)));
    /// # Ok(())
    /// # }).expect("the example runs");
    /// ```
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
    ///
    /// ```
    /// use proxyfleet_sdk::http::{Failure, Method, Request, classify_status};
    ///
    /// # use proxyfleet_sdk::native::doc_host::{answer, serve};
    /// # serve(|_| answer(409, &[("content-type", "application/json")], br#"{"kind":"Status","reason":"AlreadyExists"}"#), || -> proxyfleet_sdk::Result<()> {
    /// let url = "https://k8s.example:6443/api/v1/namespaces/egress/pods";
    /// let response = Request::post(url).json(&serde_json::json!({"kind": "Pod"})).send_any_status()?;
    /// let status: serde_json::Value = response.json()?;
    /// let adopt = response.status == 409 && status["reason"] == "AlreadyExists";
    /// if !adopt {
    ///     if let Some(error) = classify_status(Method::Post, url, response.status, &response.body) {
    ///         return Err(Failure::of_answer(&response, error).into());
    ///     }
    /// }
    /// assert!(adopt, "an earlier attempt made the pod");
    /// # Ok(())
    /// # }).expect("the example runs");
    /// ```
    pub fn send_any_status(self) -> Result<Response, Failure> {
        let limit = self.max_response_bytes;
        read_response(self.open()?, limit)
    }

    /// Performs the request and hands the body back chunk by chunk, for
    /// downloads too large to hold in memory (a disk image). A status of
    /// 400 or more is the error [`classify_status`] gives, as with
    /// [`Request::send`]; the response size limit does not apply.
    ///
    /// ```
    /// use proxyfleet_sdk::http::Request;
    ///
    /// # use proxyfleet_sdk::native::doc_host::{answer, serve};
    /// # serve(|_| answer(200, &[("content-length", "200000")], vec![0u8; 200_000]), || -> proxyfleet_sdk::Result<()> {
    /// let mut image = Request::get("https://images.example/debian-12.qcow2").send_streaming()?;
    /// let mut copied = 0;
    /// while let Some(chunk) = image.next_chunk()? {
    ///     copied += chunk.len(); // hand the chunk on, e.g. to a libvirt upload
    /// }
    /// assert_eq!(image.content_length(), Some(200_000));
    /// assert_eq!(copied, 200_000);
    /// # Ok(())
    /// # }).expect("the example runs");
    /// ```
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
///
/// ```
/// use proxyfleet_sdk::http::Request;
///
/// # use proxyfleet_sdk::native::doc_host::{answer, serve};
/// # serve(|_| answer(201, &[("location", "/v1/instances/pf-1")], br#"{"id":"pf-1"}"#), || -> proxyfleet_sdk::Result<()> {
/// let response = Request::post("https://api.example/v1/instances").send()?;
/// assert_eq!(response.status, 201);
/// assert_eq!(response.headers, [("location".to_owned(), "/v1/instances/pf-1".to_owned())]);
/// assert_eq!(response.body, br#"{"id":"pf-1"}"#);
/// # Ok(())
/// # }).expect("the example runs");
/// ```
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
    ///
    /// ```
    /// use proxyfleet_sdk::http::Request;
    ///
    /// # use proxyfleet_sdk::native::doc_host::{answer, serve};
    /// # serve(|_| answer(200, &[("Content-Type", "application/json"), ("ETag", "\"7\"")], b"{}"), || -> proxyfleet_sdk::Result<()> {
    /// let response = Request::get("https://api.example/v1/instances/pf-1").send()?;
    /// assert_eq!(response.header("content-type"), Some("application/json"));
    /// assert_eq!(response.header("etag"), Some("\"7\""));
    /// assert_eq!(response.header("retry-after"), None);
    /// # Ok(())
    /// # }).expect("the example runs");
    /// ```
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }

    /// The status line's reason phrase, when it was not the standard one
    /// for the code ([`REASON_PHRASE_HEADER`]).
    ///
    /// ```
    /// use proxyfleet_sdk::http::Request;
    ///
    /// # use proxyfleet_sdk::native::doc_host::{answer, serve};
    /// # serve(|_| answer(500, &[(proxyfleet_sdk::http::REASON_PHRASE_HEADER, "VM 101 is locked (clone)")], br#"{"data":null}"#), || -> proxyfleet_sdk::Result<()> {
    /// let url = "https://pve.example:8006/api2/json/nodes/pve1/qemu/101/config";
    /// let response = Request::put(url).send_any_status()?;
    /// assert_eq!(response.status, 500);
    /// assert_eq!(response.reason_phrase(), Some("VM 101 is locked (clone)"));
    /// # Ok(())
    /// # }).expect("the example runs");
    /// ```
    pub fn reason_phrase(&self) -> Option<&str> {
        self.header(REASON_PHRASE_HEADER)
    }

    /// The body as text, with invalid UTF-8 replaced.
    ///
    /// ```
    /// use proxyfleet_sdk::http::Request;
    ///
    /// # use proxyfleet_sdk::native::doc_host::{answer, serve};
    /// # serve(|_| answer(200, &[("content-type", "text/plain")], b"ok\xff"), || -> proxyfleet_sdk::Result<()> {
    /// let response = Request::get("https://api.example/healthz").send()?;
    /// assert_eq!(response.text(), "ok\u{FFFD}");
    /// # Ok(())
    /// # }).expect("the example runs");
    /// ```
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// Parses the body as JSON. A body that does not parse is
    /// [`ProviderError::Permanent`]: the backend answered, but not in the
    /// shape this plugin understands.
    ///
    /// ```
    /// use proxyfleet_sdk::ProviderError;
    /// use proxyfleet_sdk::http::Request;
    ///
    /// #[derive(serde::Deserialize)]
    /// struct Instance {
    ///     id: String,
    ///     status: String,
    /// }
    ///
    /// # use proxyfleet_sdk::native::doc_host::{answer, serve};
    /// # serve(|_| answer(200, &[("content-type", "application/json")], br#"{"id":"pf-1","status":"RUNNING"}"#), || -> proxyfleet_sdk::Result<()> {
    /// let response = Request::get("https://api.example/v1/instances/pf-1").send()?;
    /// let instance: Instance = response.json()?;
    /// assert_eq!((instance.id.as_str(), instance.status.as_str()), ("pf-1", "RUNNING"));
    /// // Another shape than expected is permanent: retrying will not change it.
    /// let list = response.json::<Vec<Instance>>();
    /// assert!(matches!(list, Err(ProviderError::Permanent(_))));
    /// # Ok(())
    /// # }).expect("the example runs");
    /// ```
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
