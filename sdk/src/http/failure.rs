//! A failed request, typed: what went wrong (the transport's error kind,
//! an answer the host made itself, or the server's status) and the
//! `Retry-After` the server gave, beside the error classified for the host.
//!
//! A plugin acts on the [`FailureKind`] and takes its health reasons from
//! [`Failure::health_reason`], never from a message's text: the host and
//! the SDK may reword their messages at any time.

use std::fmt;
use std::time::Duration;

use super::Response;
use crate::{HealthReason, ProviderError};

/// The response header that marks an answer the host made itself instead
/// of forwarding the request; its value names why ([`HostRefusal`]). The
/// host drops a header of this name from a backend's answers, so only the
/// host can set it.
///
/// ```
/// use proxyfleet_sdk::http::{FailureKind, HOST_REFUSAL_HEADER, HostRefusal, Request};
///
/// # use proxyfleet_sdk::native::doc_host::{answer, serve};
/// # serve(|_| answer(502, &[(HOST_REFUSAL_HEADER, "credential-unavailable")], b"the token endpoint refused"), || -> proxyfleet_sdk::Result<()> {
/// let url = "https://compute.googleapis.com/compute/v1/projects/p/zones";
/// let response = Request::get(url).send_any_status()?;
/// assert_eq!(response.header(HOST_REFUSAL_HEADER), Some("credential-unavailable"));
/// // `send` reads it into the failure's kind.
/// let failure = Request::get(url).send().expect_err("HTTP 502");
/// assert_eq!(failure.kind(), FailureKind::Host(HostRefusal::CredentialUnavailable));
/// # Ok(())
/// # }).expect("the example runs");
/// ```
pub const HOST_REFUSAL_HEADER: &str = "proxyfleet-host-refusal";

/// Why the host answered a request itself.
///
/// ```
/// use proxyfleet_sdk::{HealthReason, ProviderError};
/// use proxyfleet_sdk::http::{FailureKind, HostRefusal};
///
/// let kind = FailureKind::Host(HostRefusal::CredentialUnavailable);
/// let error = ProviderError::Transient("HTTP 502".into());
/// assert_eq!(kind.health_reason(&error), HealthReason::CredentialsUnavailable);
/// ```
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostRefusal {
    /// The credential the host adds for this destination could not be read
    /// or obtained (an unreadable secret file, a token endpoint that
    /// refused): `credential-unavailable`.
    CredentialUnavailable,
}

impl HostRefusal {
    /// The refusal a [`HOST_REFUSAL_HEADER`] value names; `None` for a
    /// value this SDK does not know (a newer host's).
    ///
    /// ```
    /// use proxyfleet_sdk::http::HostRefusal;
    /// assert_eq!(
    ///     HostRefusal::parse("credential-unavailable"),
    ///     Some(HostRefusal::CredentialUnavailable)
    /// );
    /// assert_eq!(HostRefusal::parse("something-new"), None);
    /// ```
    pub fn parse(value: &str) -> Option<Self> {
        match value.trim() {
            "credential-unavailable" => Some(Self::CredentialUnavailable),
            _ => None,
        }
    }
}

/// What made a request fail.
///
/// ```
/// use proxyfleet_sdk::ProviderError;
/// use proxyfleet_sdk::http::{FailureKind, Request};
///
/// # use proxyfleet_sdk::native::{ErrorCode, doc_host::serve};
/// # serve(|_| Err(ErrorCode::ConnectionRefused), || -> proxyfleet_sdk::Result<()> {
/// let failure = Request::get("https://pve.example:8006/api2/json/version")
///     .send()
///     .expect_err("nothing listens");
/// assert_eq!(failure.kind(), FailureKind::Connection);
/// assert!(matches!(failure.error(), ProviderError::Transient(_)));
/// # Ok(())
/// # }).expect("the example runs");
/// ```
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// The entry's grants do not allow the destination, or the address it
    /// resolves to.
    Denied,
    /// The host answered itself instead of sending the request.
    Host(HostRefusal),
    /// The name did not resolve.
    Dns,
    /// No connection could be made or kept: refused, unroutable, closed
    /// early, or the call's connection limit reached.
    Connection,
    /// A DNS, connect, first-byte, read or write timeout.
    Timeout,
    /// The TLS handshake failed or the server's certificate was rejected.
    Tls,
    /// A size limit was exceeded: the host's caps (the entry's `limits`) or
    /// the server's.
    TooLarge,
    /// The request could not be made as written: an invalid URL, a header
    /// or method the host refused.
    Request,
    /// The server answered with this status (400 or more).
    Status(u16),
    /// The server answered in a shape the plugin could not read.
    Body,
    /// Anything else the transport reported (protocol errors, host errors).
    Other,
}

impl FailureKind {
    /// The kind of an error answer (400 or more): the host's reason when
    /// the host made it itself, otherwise [`FailureKind::Status`].
    ///
    /// ```
    /// use proxyfleet_sdk::http::{FailureKind, Request};
    ///
    /// # use proxyfleet_sdk::native::doc_host::{answer, serve};
    /// # serve(|_| answer(429, &[("retry-after", "30")], b"slow down"), || -> proxyfleet_sdk::Result<()> {
    /// let response = Request::get("https://api.example/v1/instances").send_any_status()?;
    /// assert_eq!(FailureKind::of_answer(&response), FailureKind::Status(429));
    /// # Ok(())
    /// # }).expect("the example runs");
    /// ```
    pub fn of_answer(response: &Response) -> Self {
        match response.header(HOST_REFUSAL_HEADER).and_then(HostRefusal::parse) {
            Some(refusal) => Self::Host(refusal),
            None => Self::Status(response.status),
        }
    }

    /// The health reason a provider check reports for a failure of this
    /// kind classified as `error`: the host's credential refusal, a TLS
    /// failure and a timeout by their kind; otherwise by the error's class
    /// (unauthorized, the entry's config, or the backend unreachable). For
    /// a plugin that keeps the kind beside its own error type.
    ///
    /// ```
    /// use proxyfleet_sdk::http::FailureKind;
    /// use proxyfleet_sdk::{HealthReason, ProviderError};
    ///
    /// let error = ProviderError::Transient("GET https://pve:8006/api2/json/version: HTTP 503".into());
    /// assert_eq!(FailureKind::Status(503).health_reason(&error), HealthReason::Unreachable);
    /// assert_eq!(FailureKind::Tls.health_reason(&error), HealthReason::CertificateInvalid);
    /// let refused = ProviderError::Unauthorized("HTTP 401".into());
    /// assert_eq!(FailureKind::Status(401).health_reason(&refused), HealthReason::Unauthorized);
    /// ```
    pub fn health_reason(self, error: &ProviderError) -> HealthReason {
        match self {
            Self::Host(HostRefusal::CredentialUnavailable) => HealthReason::CredentialsUnavailable,
            Self::Tls => HealthReason::CertificateInvalid,
            Self::Timeout => HealthReason::Timeout,
            Self::Denied => HealthReason::Unauthorized,
            _ => match error {
                ProviderError::Unauthorized(_) => HealthReason::Unauthorized,
                ProviderError::InvalidConfig(_) => HealthReason::Misconfigured,
                _ => HealthReason::Unreachable,
            },
        }
    }
}

/// A failed request: its kind, the server's `Retry-After`, and the error
/// classified for the host (what the plugin returns when it gives up).
///
/// ```
/// use proxyfleet_sdk::http::{Failure, FailureKind};
/// use proxyfleet_sdk::{HealthReason, ProviderError};
/// let failure = Failure::new(
///     FailureKind::Timeout,
///     ProviderError::Transient("GET https://pve:8006/api2/json/version: connect timed out".into()),
/// );
/// assert_eq!(failure.health_reason(), HealthReason::Timeout);
/// let error: ProviderError = failure.into();
/// assert!(matches!(error, ProviderError::Transient(_)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    kind: FailureKind,
    retry_after: Option<Duration>,
    error: ProviderError,
}

impl Failure {
    /// A failure of `kind`, classified as `error`.
    ///
    /// ```
    /// use proxyfleet_sdk::ProviderError;
    /// use proxyfleet_sdk::http::{Failure, FailureKind};
    ///
    /// let failure = Failure::new(FailureKind::Body, ProviderError::Permanent("no `data` field".into()));
    /// assert_eq!(failure.kind(), FailureKind::Body);
    /// assert_eq!(failure.retry_after(), None);
    /// ```
    pub fn new(kind: FailureKind, error: ProviderError) -> Self {
        Self { kind, retry_after: None, error }
    }

    /// The failure for an error answer (400 or more) that the plugin
    /// classified itself as `error` (a backend whose bodies say more than
    /// their status): an answer the host made itself keeps the host's
    /// reason, any other is [`FailureKind::Status`]; the answer's
    /// `Retry-After` (in seconds) is kept.
    ///
    /// ```
    /// use std::time::Duration;
    /// use proxyfleet_sdk::ProviderError;
    /// use proxyfleet_sdk::http::{Failure, FailureKind, Request};
    ///
    /// # use proxyfleet_sdk::native::doc_host::{answer, serve};
    /// # serve(|_| answer(403, &[("retry-after", "30")], br#"{"error":{"status":"RESOURCE_EXHAUSTED"}}"#), || -> proxyfleet_sdk::Result<()> {
    /// let response = Request::post("https://api.example/v1/instances").send_any_status()?;
    /// // This API answers 403 for a spent quota: the body says which.
    /// let failure = Failure::of_answer(&response, ProviderError::QuotaExceeded("CPUS".into()));
    /// assert_eq!(failure.kind(), FailureKind::Status(403));
    /// assert_eq!(failure.retry_after(), Some(Duration::from_secs(30)));
    /// # Ok(())
    /// # }).expect("the example runs");
    /// ```
    pub fn of_answer(response: &Response, error: ProviderError) -> Self {
        Self { kind: FailureKind::of_answer(response), retry_after: retry_after(response), error }
    }

    /// What made the request fail.
    ///
    /// ```
    /// use proxyfleet_sdk::http::{FailureKind, Request};
    ///
    /// # use proxyfleet_sdk::native::{ErrorCode, doc_host::serve};
    /// # serve(|_| Err(ErrorCode::DnsTimeout), || -> proxyfleet_sdk::Result<()> {
    /// let failure = Request::get("https://pve.example:8006/api2/json/version")
    ///     .send()
    ///     .expect_err("the lookup timed out");
    /// assert_eq!(failure.kind(), FailureKind::Timeout);
    /// # Ok(())
    /// # }).expect("the example runs");
    /// ```
    pub fn kind(&self) -> FailureKind {
        self.kind
    }

    /// How long the server asked to wait before trying again, when it
    /// said (`Retry-After` in seconds).
    ///
    /// ```
    /// use std::time::Duration;
    /// use proxyfleet_sdk::http::Request;
    ///
    /// # use proxyfleet_sdk::native::doc_host::{answer, serve};
    /// # serve(|_| answer(503, &[("Retry-After", "120")], b"maintenance"), || -> proxyfleet_sdk::Result<()> {
    /// let failure = Request::get("https://api.example/v1/instances").send().expect_err("HTTP 503");
    /// assert_eq!(failure.retry_after(), Some(Duration::from_secs(120)));
    /// # Ok(())
    /// # }).expect("the example runs");
    /// ```
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// The error classified for the host.
    ///
    /// ```
    /// use proxyfleet_sdk::ProviderError;
    /// use proxyfleet_sdk::http::{Failure, FailureKind};
    ///
    /// let failure = Failure::new(FailureKind::Status(404), ProviderError::NotFound("vm 101".into()));
    /// assert_eq!(failure.error(), &ProviderError::NotFound("vm 101".into()));
    /// ```
    pub fn error(&self) -> &ProviderError {
        &self.error
    }

    /// The error classified for the host, for a plugin that gives up.
    ///
    /// ```
    /// use proxyfleet_sdk::ProviderError;
    /// use proxyfleet_sdk::http::{Failure, FailureKind};
    ///
    /// let failure = Failure::new(FailureKind::Dns, ProviderError::Transient("DNS lookup failed".into()));
    /// let error: ProviderError = failure.into_error();
    /// assert_eq!(error.to_string(), "transient: DNS lookup failed");
    /// ```
    pub fn into_error(self) -> ProviderError {
        self.error
    }

    /// The same failure with its error reclassified or reworded by `change`
    /// (its kind and `Retry-After` stay).
    ///
    /// ```
    /// use proxyfleet_sdk::ProviderError;
    /// use proxyfleet_sdk::http::{Failure, FailureKind};
    ///
    /// let failure = Failure::new(FailureKind::Status(409), ProviderError::Conflict("HTTP 409".into()));
    /// // This backend answers 409 while a task holds the VM: worth retrying.
    /// let failure = failure.map_error(|error| ProviderError::Transient(error.message().to_owned()));
    /// assert_eq!(failure.kind(), FailureKind::Status(409));
    /// assert!(matches!(failure.error(), ProviderError::Transient(_)));
    /// ```
    #[must_use]
    pub fn map_error(self, change: impl FnOnce(ProviderError) -> ProviderError) -> Self {
        Self { error: change(self.error), ..self }
    }

    /// The health reason a provider check reports for this failure
    /// ([`FailureKind::health_reason`]).
    ///
    /// ```
    /// use proxyfleet_sdk::http::{Failure, FailureKind, HostRefusal};
    /// use proxyfleet_sdk::{HealthReason, ProviderError};
    /// let refused = Failure::new(
    ///     FailureKind::Host(HostRefusal::CredentialUnavailable),
    ///     ProviderError::Unauthorized("GET https://compute/v1/projects/p: HTTP 401".into()),
    /// );
    /// assert_eq!(refused.health_reason(), HealthReason::CredentialsUnavailable);
    /// ```
    pub fn health_reason(&self) -> HealthReason {
        self.kind.health_reason(&self.error)
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for Failure {}

impl From<Failure> for ProviderError {
    fn from(failure: Failure) -> Self {
        failure.error
    }
}

/// An answer's `Retry-After` in seconds; the HTTP-date form is not read.
fn retry_after(response: &Response) -> Option<Duration> {
    response.header("retry-after")?.trim().parse().ok().map(Duration::from_secs)
}
