//! A small client for the Compute Engine v1 REST API: JSON requests within
//! one call's deadline, zone operations, and the classification of Google's
//! error answers and of failed operations.
//!
//! Google reports errors as `{"error": {"code", "message", "errors":
//! [{"domain", "reason", "message"}], "status"}}`; the reason refines what
//! the status says (a 403 is a missing permission, an exhausted quota or a
//! rate limit). A failed operation carries `error.errors[].code`
//! (`QUOTA_EXCEEDED`, `ZONE_RESOURCE_POOL_EXHAUSTED`, ...) instead.

use std::thread::sleep;
use std::time::{Duration, Instant};

use proxyfleet_sdk::http::{Failure, Method, Request, Response, encode_component};
use proxyfleet_sdk::{ProviderError, Result};
use serde_json::Value;

use crate::config::Config;

/// The domain of the answers the host makes up when it cannot get an
/// access token for the request.
pub const HOST_DOMAIN: &str = "proxyfleet.host";

/// A failed zone operation, by what the caller does about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OperationFailure {
    /// The zone has no capacity for the shape now: another zone, or the
    /// same later, may work.
    Capacity(String),
    /// Anything else, classified.
    Failed(ProviderError),
}

/// The API of one project, within one call's deadline.
#[derive(Debug)]
pub struct Client {
    root: String,
    project: String,
    poll: Duration,
    deadline: Instant,
}

/// `errors[0].reason`, `errors[0].domain` and `message` of a Google error
/// body (empty when absent).
fn error_parts(body: &Value) -> (&str, &str, &str) {
    let error = &body["error"];
    let detail = &error["errors"][0];
    (
        detail["reason"].as_str().unwrap_or_default(),
        detail["domain"].as_str().unwrap_or_default(),
        error["message"].as_str().or_else(|| detail["message"].as_str()).unwrap_or_default(),
    )
}

/// The error for an answer of status 400 or more to `method path`.
pub fn classify(method: Method, path: &str, status: u16, body: &Value) -> ProviderError {
    let (reason, domain, message) = error_parts(body);
    let text = match (reason.is_empty(), message.is_empty()) {
        (true, true) => format!("{method} {path}: HTTP {status}"),
        (true, false) => format!("{method} {path}: HTTP {status}: {message}"),
        (false, _) => format!("{method} {path}: HTTP {status} {reason}: {message}"),
    };
    if domain == HOST_DOMAIN {
        // The host's own answer: the reason is in the message.
        return if status == 401 {
            ProviderError::Unauthorized(text)
        } else {
            ProviderError::Transient(text)
        };
    }
    match (status, reason) {
        (401, _) => ProviderError::Unauthorized(text),
        (403, "quotaExceeded") => ProviderError::QuotaExceeded(text),
        (403 | 429, "rateLimitExceeded" | "userRateLimitExceeded") | (429, _) => {
            ProviderError::Transient(text)
        }
        (403, _) => ProviderError::Unauthorized(format!(
            "{text} (grant the service account the role in docs/providers/gcp.md)"
        )),
        (404, _) => ProviderError::NotFound(text),
        (409 | 412, _) => ProviderError::Conflict(text),
        (500.., _) => ProviderError::Transient(text),
        _ => ProviderError::Permanent(text),
    }
}

/// How a `DONE` operation failed, if it did.
pub fn operation_failure(operation: &Value) -> Option<OperationFailure> {
    let errors = operation["error"]["errors"].as_array().filter(|errors| !errors.is_empty())?;
    let codes: Vec<&str> = errors.iter().filter_map(|e| e["code"].as_str()).collect();
    let messages: Vec<&str> = errors.iter().filter_map(|e| e["message"].as_str()).collect();
    let name = operation["name"].as_str().unwrap_or_default();
    let kind = operation["operationType"].as_str().unwrap_or("operation");
    let text =
        format!("{kind} operation {name} failed: {}: {}", codes.join(", "), messages.join("; "));
    let has = |code: &str| codes.contains(&code);
    Some(
        if has("ZONE_RESOURCE_POOL_EXHAUSTED") || has("ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS") {
            OperationFailure::Capacity(text)
        } else if has("QUOTA_EXCEEDED") {
            OperationFailure::Failed(ProviderError::QuotaExceeded(text))
        } else if has("RESOURCE_NOT_FOUND") {
            OperationFailure::Failed(ProviderError::InvalidConfig(format!(
                "{text} (check config keys `images`, `instanceTemplates`, `network`, `subnetwork`, `diskType`)"
            )))
        } else if has("RESOURCE_ALREADY_EXISTS") {
            OperationFailure::Failed(ProviderError::Conflict(text))
        } else {
            let status = operation["httpErrorStatusCode"].as_u64().unwrap_or(0);
            OperationFailure::Failed(match status {
                401 | 403 => ProviderError::Unauthorized(text),
                429 | 500.. => ProviderError::Transient(text),
                _ => ProviderError::Permanent(text),
            })
        },
    )
}

impl Client {
    /// The API of the config's project; waits end before `time_left` runs
    /// out, leaving a margin to answer.
    pub fn new(config: &Config, time_left: Duration) -> Self {
        let margin = (time_left / 10).min(Duration::from_secs(3));
        Self {
            root: format!("{}/compute/v1", config.endpoint),
            project: config.project.clone(),
            poll: Duration::from_millis(config.operation_poll_ms),
            deadline: Instant::now() + time_left.saturating_sub(margin),
        }
    }

    /// Whether there is time left for another poll.
    pub fn has_time(&self) -> bool {
        Instant::now() + self.poll < self.deadline
    }

    /// `path` relative to the project, or absolute from `projects/`.
    fn url(&self, path: &str) -> String {
        if path.starts_with("projects/") {
            format!("{}/{path}", self.root)
        } else if path.is_empty() {
            format!("{}/projects/{}", self.root, self.project)
        } else {
            format!("{}/projects/{}/{path}", self.root, self.project)
        }
    }

    /// Performs `method path` and returns the status and the JSON body
    /// (null when empty or not JSON), whatever the status.
    pub fn request(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> Result<(u16, Value), Failure> {
        let response = self.send(method, path, query, body)?;
        let value = serde_json::from_slice(&response.body).unwrap_or(Value::Null);
        Ok((response.status, value))
    }

    fn send(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> Result<Response, Failure> {
        let mut url = self.url(path);
        if !query.is_empty() {
            let query: Vec<String> = query
                .iter()
                .map(|(key, value)| format!("{key}={}", encode_component(value)))
                .collect();
            url = format!("{url}?{}", query.join("&"));
        }
        let mut request = Request::new(method, url).header("accept", "application/json");
        if let Some(body) = body {
            request = request.json(body);
        }
        request.send_any_status()
    }

    /// Performs `method path`; an answer of 400 or more is a failure,
    /// classified by Google's error format (and told apart from an answer
    /// the host made itself by its header).
    pub fn call(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> Result<Value, Failure> {
        let response = self.send(method, path, query, body)?;
        let value = serde_json::from_slice(&response.body).unwrap_or(Value::Null);
        if response.status >= 400 {
            let error = classify(method, &self.label(path), response.status, &value);
            return Err(Failure::of_answer(&response, error));
        }
        Ok(value)
    }

    /// A GET of `path`.
    pub fn get(&self, path: &str) -> Result<Value, Failure> {
        self.call(Method::Get, path, &[], None)
    }

    /// How `path` appears in messages.
    pub fn label(&self, path: &str) -> String {
        if path.starts_with("projects/") {
            path.to_owned()
        } else if path.is_empty() {
            format!("projects/{}", self.project)
        } else {
            format!("projects/{}/{path}", self.project)
        }
    }

    /// Polls the zone operation `operation` (as an API answer returned it)
    /// until it is `DONE`; `None` when the call's time runs out first.
    pub fn wait(&self, zone: &str, operation: &Value) -> Result<Option<Value>> {
        let mut current = operation.clone();
        loop {
            if current["status"] == "DONE" {
                return Ok(Some(current));
            }
            if !self.has_time() {
                return Ok(None);
            }
            sleep(self.poll);
            let name = current["name"].as_str().unwrap_or_default().to_owned();
            if name.is_empty() {
                return Err(ProviderError::Permanent(
                    "the API answered an operation without a name".to_owned(),
                ));
            }
            current = self.get(&format!("zones/{zone}/operations/{}", encode_component(&name)))?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn google(code: u16, reason: &str, message: &str) -> Value {
        json!({"error": {"code": code, "message": message,
               "errors": [{"domain": "global", "reason": reason, "message": message}]}})
    }

    #[test]
    fn answers_are_classified_by_status_and_reason() {
        let class =
            |status, reason| classify(Method::Get, "p", status, &google(status, reason, "m"));
        assert!(matches!(class(401, "authError"), ProviderError::Unauthorized(_)));
        assert!(matches!(class(403, "quotaExceeded"), ProviderError::QuotaExceeded(_)));
        assert!(matches!(class(403, "rateLimitExceeded"), ProviderError::Transient(_)));
        assert!(
            matches!(class(403, "forbidden"), ProviderError::Unauthorized(m) if m.contains("role"))
        );
        assert!(matches!(class(404, "notFound"), ProviderError::NotFound(_)));
        assert!(matches!(class(409, "alreadyExists"), ProviderError::Conflict(_)));
        assert!(matches!(class(429, "rateLimitExceeded"), ProviderError::Transient(_)));
        assert!(matches!(class(503, "backendError"), ProviderError::Transient(_)));
        assert!(matches!(class(400, "invalid"), ProviderError::Permanent(_)));
        let text = class(404, "notFound").message().to_owned();
        assert_eq!(text, "GET p: HTTP 404 notFound: m");
    }

    #[test]
    fn the_hosts_credential_answers_keep_their_reason() {
        let body = json!({"error": {"code": 401, "message": "the host could not get an access token: x",
                          "errors": [{"domain": HOST_DOMAIN, "reason": "credentialUnavailable"}]}});
        assert!(matches!(classify(Method::Get, "p", 401, &body),
            ProviderError::Unauthorized(m) if m.contains("could not get an access token")));
        assert!(matches!(classify(Method::Get, "p", 503, &body), ProviderError::Transient(_)));
    }

    #[test]
    fn operation_errors_are_classified_by_code() {
        let failed = |code: &str, http: u16| {
            operation_failure(
                &json!({"name": "operation-1", "operationType": "insert", "status": "DONE",
                "httpErrorStatusCode": http, "error": {"errors": [{"code": code, "message": "why"}]}}),
            )
        };
        assert!(matches!(
            failed("ZONE_RESOURCE_POOL_EXHAUSTED", 503),
            Some(OperationFailure::Capacity(_))
        ));
        assert!(matches!(
            failed("ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", 503),
            Some(OperationFailure::Capacity(_))
        ));
        assert!(matches!(failed("QUOTA_EXCEEDED", 403),
            Some(OperationFailure::Failed(ProviderError::QuotaExceeded(m))) if m.contains("QUOTA_EXCEEDED")));
        assert!(matches!(
            failed("RESOURCE_NOT_FOUND", 404),
            Some(OperationFailure::Failed(ProviderError::InvalidConfig(_)))
        ));
        assert!(matches!(
            failed("INTERNAL_ERROR", 500),
            Some(OperationFailure::Failed(ProviderError::Transient(_)))
        ));
        assert_eq!(operation_failure(&json!({"status": "DONE"})), None);
    }

    #[test]
    fn query_values_are_encoded() {
        assert_eq!(encode_component("labels.proxyfleet:*"), "labels.proxyfleet%3A%2A");
    }
}
