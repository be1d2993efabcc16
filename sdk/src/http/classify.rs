//! Failures classified for the host: an HTTP answer by its status, a
//! transport failure by its `wasi:http` error code.

use wasip2::http::types::ErrorCode;

use super::failure::{Failure, FailureKind};
use super::target::{Target, redact_userinfo};
use super::{BODY_EXCERPT_CHARS, Method};
use crate::ProviderError;

/// The response header in which the host hands over the status line's
/// reason phrase when it is not the standard one for the code: `wasi:http`
/// has no field for it, and some backends (Proxmox VE before 8.4) put their
/// error text only there. The host sets it and drops one the backend sent.
///
/// ```
/// use proxyfleet_sdk::http::{REASON_PHRASE_HEADER, Request};
///
/// # use proxyfleet_sdk::native::doc_host::{answer, serve};
/// # serve(|_| answer(500, &[(REASON_PHRASE_HEADER, "VM 101 is locked (clone)")], br#"{"data":null}"#), || -> proxyfleet_sdk::Result<()> {
/// let url = "https://pve.example:8006/api2/json/nodes/pve1/qemu/101/config";
/// let response = Request::put(url).send_any_status()?;
/// assert_eq!(response.header(REASON_PHRASE_HEADER), Some("VM 101 is locked (clone)"));
/// // `send` puts it in the error's message.
/// let failure = Request::put(url).send().expect_err("HTTP 500");
/// assert!(failure.error().message().contains("HTTP 500 VM 101 is locked (clone)"));
/// # Ok(())
/// # }).expect("the example runs");
/// ```
pub const REASON_PHRASE_HEADER: &str = "proxyfleet-reason-phrase";

/// The error for an HTTP `status`, or `None` below 400.
///
/// 401/403 → Unauthorized, 404 → NotFound, 409/423 → Conflict, 429 and 5xx →
/// Transient, other 4xx → Permanent. The message holds the method, URL,
/// status and a short excerpt of the body. [`classify_answer`] adds the
/// reason phrase.
///
/// ```
/// use proxyfleet_sdk::ProviderError;
/// use proxyfleet_sdk::http::{Method, classify_status};
///
/// let url = "https://compute.googleapis.com/compute/v1/projects/p/zones/z/instances";
/// let error = classify_status(Method::Post, url, 429, b"rate limited").expect("an error");
/// assert!(matches!(error, ProviderError::Transient(_)));
/// assert_eq!(error.message(), format!("POST {url}: HTTP 429: rate limited"));
/// assert_eq!(classify_status(Method::Get, url, 304, b""), None);
/// ```
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
pub(super) fn excerpt(body: &[u8]) -> String {
    excerpt_text(&String::from_utf8_lossy(body))
}

/// The start of `text` as one line.
pub(super) fn excerpt_text(text: &str) -> String {
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

/// The failure for a transport error reported by the host, by its code.
///
/// A denial by the host's grants is Unauthorized; DNS, connection and
/// timeout failures are Transient; size limits, malformed requests and TLS
/// failures are Permanent.
pub(super) fn classify_transport(
    code: &ErrorCode,
    method: Method,
    url: &str,
    target: &Target,
) -> Failure {
    let request = format!("{method} {}", redact_userinfo(url));
    let transient = |kind: FailureKind, what: &str| {
        Failure::new(kind, ProviderError::Transient(format!("{request}: {what}")))
    };
    let permanent = |kind: FailureKind, what: &str| {
        Failure::new(kind, ProviderError::Permanent(format!("{request}: {what}")))
    };
    use FailureKind::{Connection, Denied, Dns, Other, Request, Timeout, Tls, TooLarge};
    match code {
        ErrorCode::HttpRequestDenied => Failure::new(
            Denied,
            ProviderError::Unauthorized(format!(
                "denied by the host: the entry's grants do not allow {}",
                target.origin()
            )),
        ),
        ErrorCode::DestinationIpProhibited => Failure::new(
            Denied,
            ProviderError::Unauthorized(format!(
                "denied by the host: the entry's grants do not allow the address {} resolves to",
                target.origin()
            )),
        ),
        ErrorCode::DnsTimeout => transient(Timeout, "DNS lookup timed out"),
        ErrorCode::DnsError(payload) => transient(
            Dns,
            &format!(
                "DNS lookup failed{}",
                payload.rcode.as_deref().map(|rcode| format!(" ({rcode})")).unwrap_or_default()
            ),
        ),
        ErrorCode::DestinationNotFound => transient(Dns, "destination not found"),
        ErrorCode::DestinationUnavailable => transient(Connection, "destination unavailable"),
        ErrorCode::DestinationIpUnroutable => {
            transient(Connection, "destination address unroutable")
        }
        ErrorCode::ConnectionRefused => transient(Connection, "connection refused"),
        ErrorCode::ConnectionTerminated => transient(Connection, "connection closed early"),
        ErrorCode::ConnectionTimeout => transient(Timeout, "connect timed out"),
        ErrorCode::ConnectionReadTimeout => transient(Timeout, "timed out reading the response"),
        ErrorCode::ConnectionWriteTimeout => transient(Timeout, "timed out sending the request"),
        ErrorCode::ConnectionLimitReached => transient(Connection, "connection limit reached"),
        ErrorCode::HttpResponseIncomplete => transient(Connection, "response incomplete"),
        ErrorCode::HttpResponseTimeout => transient(Timeout, "timed out waiting for the response"),
        ErrorCode::HttpProtocolError => transient(Other, "HTTP protocol error"),
        ErrorCode::InternalError(detail) => transient(
            Other,
            &format!(
                "host error{}",
                detail.as_deref().map(|detail| format!(": {detail}")).unwrap_or_default()
            ),
        ),
        ErrorCode::TlsProtocolError => permanent(Tls, "TLS handshake failed"),
        ErrorCode::TlsCertificateError => permanent(Tls, "TLS certificate rejected"),
        ErrorCode::TlsAlertReceived(payload) => permanent(
            Tls,
            &format!(
                "TLS alert from the server{}",
                payload
                    .alert_message
                    .as_deref()
                    .map(|message| format!(": {message}"))
                    .unwrap_or_default()
            ),
        ),
        // The host reports the size it saw; its cap is the entry's to set.
        ErrorCode::HttpResponseBodySize(size) => permanent(
            TooLarge,
            &format!(
                "response body too large{}: over the host's cap, the entry's \
                 `limits.httpResponseMiB`",
                size.map(|size| format!(" ({size} bytes)")).unwrap_or_default()
            ),
        ),
        ErrorCode::HttpRequestBodySize(_) => permanent(TooLarge, "request body too large"),
        ErrorCode::HttpResponseHeaderSectionSize(_) | ErrorCode::HttpResponseHeaderSize(_) => {
            permanent(TooLarge, "response headers too large")
        }
        ErrorCode::HttpResponseTrailerSectionSize(_) | ErrorCode::HttpResponseTrailerSize(_) => {
            permanent(TooLarge, "response trailers too large")
        }
        ErrorCode::HttpRequestHeaderSectionSize(_) | ErrorCode::HttpRequestHeaderSize(_) => {
            permanent(TooLarge, "request headers too large")
        }
        ErrorCode::HttpRequestTrailerSectionSize(_) | ErrorCode::HttpRequestTrailerSize(_) => {
            permanent(TooLarge, "request trailers too large")
        }
        ErrorCode::HttpRequestLengthRequired => {
            permanent(Request, "server requires a content length")
        }
        ErrorCode::HttpRequestMethodInvalid => permanent(Request, "method refused"),
        ErrorCode::HttpRequestUriInvalid => permanent(Request, "URI refused"),
        ErrorCode::HttpRequestUriTooLong => permanent(TooLarge, "URI too long"),
        ErrorCode::HttpResponseTransferCoding(_) => permanent(Other, "unsupported transfer coding"),
        ErrorCode::HttpResponseContentCoding(_) => permanent(Other, "unsupported content coding"),
        ErrorCode::HttpUpgradeFailed => permanent(Other, "protocol upgrade failed"),
        ErrorCode::LoopDetected => permanent(Other, "request loop detected"),
        ErrorCode::ConfigurationError => permanent(Other, "host HTTP configuration error"),
    }
}
