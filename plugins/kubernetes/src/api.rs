//! A small client for the Kubernetes REST API, and the classification of the
//! API server's error answers.
//!
//! The API server says what went wrong in a `Status` object (`reason`,
//! `message`, `details`), and a 403 covers both RBAC refusals and admission
//! refusals (quota, a missing service account, Pod Security), so errors are
//! classified from the `Status` here rather than by the status code alone.

use std::thread::sleep;
use std::time::{Duration, Instant};

use proxyfleet_sdk::http::{Failure, FailureKind, Method, Request, classify_status};
use proxyfleet_sdk::{HealthReason, ProviderError, Result};
use serde::Deserialize;
use serde_json::Value;

/// Longest `Retry-After` the client waits out itself before answering
/// `transient`; longer waits are the reconciler's backoff.
const MAX_RETRY_WAIT: Duration = Duration::from_secs(3);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(30);
/// How much of an answer that is not a `Status` goes into a message.
const EXCERPT_CHARS: usize = 200;

/// A failed API request: the contract's error, and what the caller may
/// branch on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status; 0 when no answer came (transport, the host's grants).
    pub status: u16,
    /// The `Status` reason, e.g. `AlreadyExists`, `NotFound`, `Forbidden`.
    pub reason: String,
    /// The kind of object the `Status` is about, e.g. `pods`, `namespaces`.
    pub kind: String,
    /// Seconds the server asks to wait before retrying.
    pub retry_after: Option<u64>,
    /// What failed: the transport's kind, the host's own answer, or the
    /// status.
    pub cause: FailureKind,
    pub error: ProviderError,
}

impl From<ApiError> for ProviderError {
    fn from(error: ApiError) -> Self {
        error.error
    }
}

impl ApiError {
    fn transport(failure: Failure) -> Self {
        Self {
            status: 0,
            reason: String::new(),
            kind: String::new(),
            retry_after: None,
            cause: failure.kind(),
            error: failure.into_error(),
        }
    }

    /// The health reason a check reports for this error, from its cause
    /// and class ([`FailureKind::health_reason`]).
    pub fn health_reason(&self) -> HealthReason {
        self.cause.health_reason(&self.error)
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Status {
    kind: String,
    message: String,
    reason: String,
    details: Details,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct Details {
    kind: String,
    causes: Vec<Cause>,
    retry_after_seconds: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Cause {
    field: String,
}

/// The start of `body` as one line.
fn excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.chars().count() <= EXCERPT_CHARS {
        return line;
    }
    let mut cut: String = line.chars().take(EXCERPT_CHARS).collect();
    cut.push('…');
    cut
}

/// Admission refusals the API server answers with 403, told apart from
/// RBAC's by their text (Kubernetes 1.20 to 1.33 word them alike).
fn classify_forbidden(message: String) -> ProviderError {
    if message.contains("exceeded quota") {
        ProviderError::QuotaExceeded(message)
    } else if message.contains("error looking up service account")
        || message.contains("no API token found for service account")
        || message.contains("because it is being terminated")
    {
        // The namespace's default service account is made moments after
        // the namespace; a terminating namespace is gone soon.
        ProviderError::Transient(message)
    } else if message.contains("violates PodSecurity") {
        ProviderError::InvalidConfig(format!(
            "{message} (the namespace's Pod Security level refuses the pod; check config keys `runAsUser`, `image`, `command`)"
        ))
    } else {
        ProviderError::Unauthorized(message)
    }
}

/// Whether an `Invalid` answer is about what the Proxy asked for (its
/// labels, cores, memory) rather than what the entry configures.
fn invalid_fields_are_the_specs(causes: &[Cause]) -> bool {
    !causes.is_empty()
        && causes.iter().all(|cause| {
            cause.field.starts_with("metadata.labels") || cause.field.contains(".resources")
        })
}

/// The error for an API answer of `status` (400 or more) to `method path`.
///
/// 401 → `unauthorized`; 403 → `unauthorized`, unless admission refused:
/// `quota-exceeded` for a ResourceQuota, `transient` for a service account
/// not made yet or a namespace being deleted, `invalid-config` for Pod
/// Security; 404 → `not-found`; 409 → `conflict` (the caller adopts on
/// `AlreadyExists`); 410 → `transient`; 422 → `invalid-spec` or
/// `invalid-config` by the fields named; 429 and 5xx → `transient`, with
/// the `Retry-After`; other 4xx → `permanent`. The message carries the
/// `Status` message.
pub fn classify(
    method: Method,
    path: &str,
    status: u16,
    retry_after_header: Option<&str>,
    body: &[u8],
) -> ApiError {
    let parsed =
        serde_json::from_slice::<Status>(body).ok().filter(|parsed| parsed.kind == "Status");
    let Some(parsed) = parsed else {
        // Not the API server's own answer (a proxy or load balancer in
        // front of it): the status decides.
        let fallback = classify_status(method, path, status, body).unwrap_or_else(|| {
            ProviderError::Permanent(format!("{method} {path}: HTTP {status}: {}", excerpt(body)))
        });
        let retry_after = retry_after_header.and_then(|value| value.trim().parse().ok());
        return ApiError {
            status,
            reason: String::new(),
            kind: String::new(),
            retry_after,
            cause: FailureKind::Status(status),
            error: fallback,
        };
    };
    let retry_after = retry_after_header
        .and_then(|value| value.trim().parse().ok())
        .or(parsed.details.retry_after_seconds);
    let mut message = format!("{method} {path}: HTTP {status}");
    if !parsed.reason.is_empty() {
        message.push(' ');
        message.push_str(&parsed.reason);
    }
    if !parsed.message.is_empty() {
        message.push_str(": ");
        message.push_str(&parsed.message);
    }
    if let Some(seconds) = retry_after {
        message.push_str(&format!(" (retry after {seconds}s)"));
    }
    let error = match status {
        401 => ProviderError::Unauthorized(format!(
            "{message} (the API server did not accept the bearer token from the grant's secretFile)"
        )),
        403 => classify_forbidden(message),
        404 => ProviderError::NotFound(message),
        409 => ProviderError::Conflict(message),
        410 => ProviderError::Transient(message),
        422 if invalid_fields_are_the_specs(&parsed.details.causes) => {
            ProviderError::InvalidSpec(message)
        }
        422 => ProviderError::InvalidConfig(format!(
            "{message} (a field the entry's config sets: check `image`, `command`, `args`, `nodeSelector`, `tolerations`)"
        )),
        429 | 500.. => ProviderError::Transient(message),
        _ => ProviderError::Permanent(message),
    };
    ApiError {
        status,
        reason: parsed.reason,
        kind: parsed.details.kind,
        retry_after,
        cause: FailureKind::Status(status),
        error,
    }
}

/// The API of one cluster, within one call's deadline.
#[derive(Debug)]
pub struct Client {
    base: String,
    deadline: Instant,
}

impl Client {
    /// `base` is the config's `apiServer`; requests end before `time_left`
    /// runs out, leaving a margin to answer.
    pub fn new(base: &str, time_left: Duration) -> Self {
        let margin = (time_left / 10).min(Duration::from_secs(3));
        Self { base: base.to_owned(), deadline: Instant::now() + time_left.saturating_sub(margin) }
    }

    pub fn get(&self, path: &str) -> Result<Value, ApiError> {
        self.call(Method::Get, path, None)
    }

    pub fn post(&self, path: &str, body: &Value) -> Result<Value, ApiError> {
        self.call(Method::Post, path, Some(body))
    }

    pub fn put(&self, path: &str, body: &Value) -> Result<Value, ApiError> {
        self.call(Method::Put, path, Some(body))
    }

    pub fn delete(&self, path: &str, body: &Value) -> Result<Value, ApiError> {
        self.call(Method::Delete, path, Some(body))
    }

    /// Performs `method path` and parses the answer as JSON. A 429 or 5xx
    /// asking for a short wait is retried once when the deadline allows;
    /// every request this plugin makes is safe to repeat (a repeated create
    /// meets `AlreadyExists` and adopts).
    fn call(&self, method: Method, path: &str, body: Option<&Value>) -> Result<Value, ApiError> {
        let url = format!("{}{path}", self.base);
        let mut retried = false;
        loop {
            let left = self.deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ApiError::transport(Failure::new(
                    FailureKind::Timeout,
                    ProviderError::Transient(format!("{method} {path}: no time left in the call")),
                )));
            }
            let mut request = Request::new(method, url.clone())
                .header("accept", "application/json")
                .connect_timeout(CONNECT_TIMEOUT.min(left))
                .first_byte_timeout(RESPONSE_TIMEOUT.min(left))
                .between_bytes_timeout(RESPONSE_TIMEOUT.min(left));
            if let Some(body) = body {
                request = request.json(body);
            }
            let response = request.send_any_status().map_err(ApiError::transport)?;
            if response.status < 400 {
                if response.body.is_empty() {
                    return Ok(Value::Null);
                }
                return response
                    .json()
                    .map_err(|error| ApiError::transport(Failure::new(FailureKind::Body, error)));
            }
            let error = ApiError {
                cause: FailureKind::of_answer(&response),
                ..classify(
                    method,
                    path,
                    response.status,
                    response.header("retry-after"),
                    &response.body,
                )
            };
            let retryable = error.status == 429 || error.status >= 500;
            if let Some(wait) = error.retry_after.map(Duration::from_secs)
                && retryable
                && !retried
                && wait <= MAX_RETRY_WAIT
                && Instant::now() + wait < self.deadline
            {
                retried = true;
                sleep(wait);
                continue;
            }
            return Err(error);
        }
    }
}

#[cfg(test)]
mod tests {
    use proxyfleet_sdk::http::encode_component;

    use super::*;

    fn status(code: u16, reason: &str, message: &str, details: &str) -> Vec<u8> {
        format!(
            r#"{{"kind":"Status","apiVersion":"v1","metadata":{{}},"status":"Failure","message":"{message}","reason":"{reason}","details":{details},"code":{code}}}"#
        )
        .into_bytes()
    }

    fn class(code: u16, reason: &str, message: &str) -> ProviderError {
        classify(
            Method::Post,
            "/api/v1/namespaces/p/pods",
            code,
            None,
            &status(code, reason, message, "{}"),
        )
        .error
    }

    #[test]
    fn statuses_map_to_classes_with_their_message() {
        let unauthorized = class(401, "Unauthorized", "Unauthorized");
        assert!(
            matches!(&unauthorized, ProviderError::Unauthorized(m) if m.contains("secretFile"))
        );
        assert_eq!(
            class(
                403,
                "Forbidden",
                r#"pods is forbidden: User \"u\" cannot create resource \"pods\" in API group \"\" in the namespace \"p\""#
            ),
            ProviderError::Unauthorized(
                r#"POST /api/v1/namespaces/p/pods: HTTP 403 Forbidden: pods is forbidden: User "u" cannot create resource "pods" in API group "" in the namespace "p""#
                    .to_owned()
            )
        );
        assert!(matches!(
            class(404, "NotFound", r#"pods \"x\" not found"#),
            ProviderError::NotFound(_)
        ));
        assert!(matches!(class(409, "AlreadyExists", "exists"), ProviderError::Conflict(_)));
        assert!(matches!(
            class(409, "Conflict", "Precondition failed"),
            ProviderError::Conflict(_)
        ));
        assert!(matches!(class(410, "Expired", "too old"), ProviderError::Transient(_)));
        assert!(matches!(class(400, "BadRequest", "bad"), ProviderError::Permanent(_)));
        assert!(matches!(class(500, "InternalError", "etcd"), ProviderError::Transient(_)));
    }

    #[test]
    fn admission_refusals_are_not_authorization_failures() {
        let quota = class(
            403,
            "Forbidden",
            r#"pods \"pf-1\" is forbidden: exceeded quota: compute, requested: cpu=1, used: cpu=4, limited: cpu=4"#,
        );
        assert!(matches!(quota, ProviderError::QuotaExceeded(_)), "{quota:?}");
        let account = class(
            403,
            "Forbidden",
            r#"pods \"pf-1\" is forbidden: error looking up service account p/default: serviceaccount \"default\" not found"#,
        );
        assert!(matches!(account, ProviderError::Transient(_)), "{account:?}");
        let terminating = class(
            403,
            "Forbidden",
            r#"pods \"pf-1\" is forbidden: unable to create new content in namespace p because it is being terminated"#,
        );
        assert!(matches!(terminating, ProviderError::Transient(_)), "{terminating:?}");
        let security = class(
            403,
            "Forbidden",
            r#"pods \"pf-1\" is forbidden: violates PodSecurity \"restricted:latest\": seccompProfile"#,
        );
        assert!(matches!(security, ProviderError::InvalidConfig(_)), "{security:?}");
    }

    #[test]
    fn invalid_answers_name_who_must_fix_them() {
        let invalid = |field: &str| {
            let details = format!(
                r#"{{"name":"pf-1","kind":"Pod","causes":[{{"reason":"FieldValueInvalid","message":"bad","field":"{field}"}}]}}"#
            );
            classify(
                Method::Post,
                "/p",
                422,
                None,
                &status(422, "Invalid", "Pod is invalid", &details),
            )
            .error
        };
        assert!(matches!(invalid("metadata.labels"), ProviderError::InvalidSpec(_)));
        assert!(matches!(
            invalid("spec.containers[0].resources.requests"),
            ProviderError::InvalidSpec(_)
        ));
        assert!(matches!(invalid("spec.containers[0].image"), ProviderError::InvalidConfig(_)));
        assert!(matches!(invalid("spec.tolerations[0].key"), ProviderError::InvalidConfig(_)));
    }

    #[test]
    fn retry_after_comes_from_the_header_or_the_details() {
        let body = status(429, "TooManyRequests", "slow down", r#"{"retryAfterSeconds":2}"#);
        let from_details = classify(Method::Get, "/p", 429, None, &body);
        assert_eq!(from_details.retry_after, Some(2));
        assert!(
            matches!(&from_details.error, ProviderError::Transient(m) if m.ends_with("(retry after 2s)"))
        );
        assert_eq!(classify(Method::Get, "/p", 429, Some("5"), &body).retry_after, Some(5));
        let unavailable = classify(Method::Get, "/p", 503, Some(" 1 "), b"<html>busy</html>");
        assert_eq!(unavailable.retry_after, Some(1));
        assert!(matches!(unavailable.error, ProviderError::Transient(_)));
    }

    #[test]
    fn branches_see_reason_and_kind() {
        let details = r#"{"name":"gone","kind":"namespaces"}"#;
        let error = classify(
            Method::Post,
            "/p",
            404,
            None,
            &status(404, "NotFound", r#"namespaces \"gone\" not found"#, details),
        );
        assert_eq!((error.reason.as_str(), error.kind.as_str()), ("NotFound", "namespaces"));
        let exists = classify(
            Method::Post,
            "/p",
            409,
            None,
            &status(409, "AlreadyExists", "x", r#"{"kind":"pods"}"#),
        );
        assert_eq!(exists.reason, "AlreadyExists");
    }

    #[test]
    fn answers_that_are_not_statuses_fall_back_on_the_code() {
        let html = format!("<html>{}</html>", "x".repeat(500));
        let error = classify(Method::Get, "/version", 403, None, html.as_bytes());
        assert!(matches!(error.error, ProviderError::Unauthorized(_)));
        assert_eq!(error.reason, "");
        assert!(error.error.message().chars().count() < 300);
        assert_eq!(excerpt(b" a\n b "), "a b");
    }

    #[test]
    fn encoding_keeps_only_unreserved_characters() {
        assert_eq!(
            encode_component("app.kubernetes.io/managed-by=proxyfleet,proxyfleet.io/uid"),
            "app.kubernetes.io%2Fmanaged-by%3Dproxyfleet%2Cproxyfleet.io%2Fuid"
        );
    }
}
