//! The discovery API over HTTP/1.1 and JSON; `docs/discovery-api.yaml`
//! is its OpenAPI description and a test keeps the two in step.
//!
//! Routes (see the OpenAPI file for bodies):
//! - `GET /v1/proxies`, `GET /v1/proxies/{id}`, `GET /v1/proxies/next`,
//!   `POST /v1/proxies/{id}/report`
//! - `GET|POST /v1/leases`, `POST /v1/leases/{id}/renew`,
//!   `DELETE /v1/leases/{id}`
//! - `GET /v1/providers` (the mode's provider checks and plugin revisions),
//!   `POST /v1/providers/{entry}/rollback`
//! - `GET /v1/echo`: the health check target; answers the caller's address
//! - `GET /healthz`, `GET /readyz`, `GET /metrics`
//! - `/ui/`: the web console ([`crate::console`]); `/` leads there
//!
//! Every error is JSON `{"error": "..."}`; request fields are checked
//! strictly and an unknown one is named in the error.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use serde::Deserialize;
use tokio::net::TcpListener;

use crate::action::Action;
use crate::auth::{Access, ApiAuth};
use crate::catalog::{CatalogError, Fleet, Picked, ReportKind, Selector, Strategy, site_of};
use crate::console::{self, Console};
use crate::leases::LeaseView;
pub use crate::server::{ConnectionLimits, DRAIN};

/// Request bodies are small JSON objects.
const MAX_BODY: usize = 64 * 1024;
const JSON: &str = "application/json";
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

pub use crate::mode::{EntryCheck, ModeStatus, Refusal};

/// The API's shared state.
pub struct Api {
    fleet: Arc<Fleet>,
    auth: Arc<ApiAuth>,
    mode: Option<Arc<dyn ModeStatus>>,
    console: Console,
}

impl fmt::Debug for Api {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Api")
            .field("fleet", &self.fleet)
            .field("auth", &self.auth)
            .finish_non_exhaustive()
    }
}

impl Api {
    /// An API over `fleet`.
    pub fn new(fleet: Arc<Fleet>, auth: Arc<ApiAuth>) -> Self {
        let console = Console::new(Arc::clone(&fleet), Arc::clone(&auth), None);
        Self { fleet, auth, mode: None, console }
    }

    /// Adds the mode's provider status.
    #[must_use]
    pub fn with_mode(mut self, mode: Arc<dyn ModeStatus>) -> Self {
        self.console =
            Console::new(Arc::clone(&self.fleet), Arc::clone(&self.auth), Some(Arc::clone(&mode)));
        self.mode = Some(mode);
        self
    }
}

/// Serves `api` on `listener` until `shutdown` resolves, then drains the
/// connections (at most [`DRAIN`]) and returns.
pub async fn serve(
    listener: TcpListener,
    api: Arc<Api>,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()>,
) {
    let sampler = api.console.spawn_sampler();
    let service = move |peer: SocketAddr, _slot| {
        let api = Arc::clone(&api);
        hyper::service::service_fn(move |request: Request<Incoming>| {
            let api = Arc::clone(&api);
            async move {
                let path = request.uri().path();
                let response = if Console::owns(path) {
                    api.console.handle(request).await
                } else if path == "/" {
                    let mut response = Response::new(console::full(""));
                    *response.status_mut() = StatusCode::SEE_OTHER;
                    response
                        .headers_mut()
                        .insert(header::LOCATION, HeaderValue::from_static("/ui/"));
                    response
                } else {
                    handle(&api, peer, request).await.map(BodyExt::boxed)
                };
                Ok::<_, Infallible>(response)
            }
        })
    };
    crate::server::serve(listener, "discovery API", limits, service, shutdown).await;
    sampler.abort();
}

/// A response, or an error response.
type Answer = Result<Response<Full<Bytes>>, ApiError>;

#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self { status, message: message.into() }
    }

    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }
}

impl From<CatalogError> for ApiError {
    fn from(err: CatalogError) -> Self {
        Self::new(err.status(), err.to_string())
    }
}

async fn handle(api: &Api, peer: SocketAddr, request: Request<Incoming>) -> Response<Full<Bytes>> {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let access = match (&method, segments.as_slice()) {
        (_, ["healthz" | "readyz" | "metrics"] | ["v1", "echo"]) => Access::Public,
        (&Method::POST, ["v1", "proxies", _, "report"] | ["v1", "leases"])
        | (&Method::POST, ["v1", "leases", _, "renew"] | ["v1", "providers", _, "rollback"])
        | (&Method::DELETE, ["v1", "leases", _]) => Access::Write,
        (&Method::GET, ["v1", "proxies"] | ["v1", "proxies", _] | ["v1", "providers"])
            if segments.get(2) != Some(&"next") =>
        {
            Access::ReadList
        }
        _ => Access::Token,
    };
    let authorization = request.headers().get(header::AUTHORIZATION).map(HeaderValue::as_bytes);
    if !api.auth.allows(access, authorization) {
        if !api.auth.has_tokens() {
            // No token could help: say how the operator is set up instead.
            return error_response(&ApiError::new(
                StatusCode::FORBIDDEN,
                "this request changes state, and this operator has no API tokens: start it \
                 with --api-token-file (then send `Authorization: Bearer <token>`), or with \
                 --api-open-writes to let anyone who reaches the API make such requests",
            ));
        }
        let mut response = error_response(&ApiError::new(
            StatusCode::UNAUTHORIZED,
            "this request needs `Authorization: Bearer <token>` with a token from the API token file",
        ));
        response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        return response;
    }
    let query = request.uri().query().unwrap_or("").to_owned();
    let answer = match (&method, segments.as_slice()) {
        (&Method::GET, ["healthz"]) => Ok(text(StatusCode::OK, "text/plain", "ok\n".into())),
        (&Method::GET, ["readyz"]) => Ok(if api.fleet.is_ready() {
            text(StatusCode::OK, "text/plain", "ready\n".into())
        } else {
            text(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                "not ready: the first round of health probes has not finished\n".into(),
            )
        }),
        (&Method::GET, ["metrics"]) => {
            Ok(text(StatusCode::OK, OPENMETRICS, api.fleet.metrics().encode()))
        }
        (&Method::GET, ["v1", "echo"]) => Ok(json(
            StatusCode::OK,
            &serde_json::json!({ "ip": peer.ip().to_string(), "port": peer.port() }),
        )),
        (&Method::GET, ["v1", "proxies"]) => list(api, &query),
        (&Method::GET, ["v1", "proxies", "next"]) => next(api, &query),
        (&Method::GET, ["v1", "proxies", id]) => {
            api.fleet.get(id).map(|view| json(StatusCode::OK, &view)).map_err(ApiError::from)
        }
        (&Method::POST, ["v1", "proxies", id, "report"]) => {
            let id = (*id).to_owned();
            report(api, &id, request).await
        }
        (&Method::GET, ["v1", "leases"]) => {
            let items: Vec<LeaseView> =
                api.fleet.leases().into_iter().map(|lease| with_credential(api, lease)).collect();
            Ok(json(StatusCode::OK, &serde_json::json!({ "items": items })))
        }
        (&Method::POST, ["v1", "leases"]) => lease(api, request).await,
        (&Method::POST, ["v1", "leases", id, "renew"]) => {
            let id = (*id).to_owned();
            renew(api, &id, request).await
        }
        (&Method::DELETE, ["v1", "leases", id]) => api
            .fleet
            .release(id)
            .await
            .map(|()| text(StatusCode::NO_CONTENT, JSON, String::new()))
            .map_err(ApiError::from),
        (&Method::GET, ["v1", "providers"]) => Ok(json(
            StatusCode::OK,
            &api.mode.as_ref().map_or(serde_json::json!({ "items": [] }), |m| m.providers()),
        )),
        (&Method::POST, ["v1", "providers", entry, "rollback"]) => match &api.mode {
            None => {
                Err(ApiError::new(StatusCode::NOT_FOUND, format!("no provider entry {entry:?}")))
            }
            Some(mode) => match mode.rollback(entry) {
                Ok(active) => {
                    let action = Action::Rollback { entry: (*entry).to_owned() };
                    tracing::info!(reason = action.reason(), "API action: {}", action.note());
                    mode.record(&action).await;
                    Ok(json(StatusCode::OK, &active))
                }
                Err(refusal) => {
                    let (status, message) = refusal.into_answer();
                    Err(ApiError::new(status, message))
                }
            },
        },
        _ => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no route {method} {path}; see docs/discovery-api.yaml"),
        )),
    };
    answer.unwrap_or_else(|err| error_response(&err))
}

/// Query parameters of the proxy routes, checked against the route's keys.
struct Query {
    selector: Selector,
    healthy: Option<bool>,
    strategy: Option<Strategy>,
    format_url: bool,
}

fn parse_query(query: &str, allowed: &[&str]) -> Result<Query, ApiError> {
    let mut parsed =
        Query { selector: Selector::default(), healthy: None, strategy: None, format_url: false };
    for (key, value) in form_urlencoded::parse(query.as_bytes()) {
        if !allowed.contains(&key.as_ref()) {
            return Err(ApiError::bad_request(format!(
                "unknown query parameter {key:?}; this route takes {}",
                allowed.join(", ")
            )));
        }
        match key.as_ref() {
            "pool" => parsed.selector.pool = Some(value.into_owned()),
            "host" => parsed.selector.site = Some(site_of("host", &value)?),
            "provider" => parsed.selector.provider = Some(value.into_owned()),
            "label" => {
                let Some((k, v)) = value.split_once('=') else {
                    return Err(ApiError::bad_request(format!(
                        "label: {value:?} is not key=value; repeat `label=key=value` per label"
                    )));
                };
                parsed.selector.labels.push((k.to_owned(), v.to_owned()));
            }
            "healthy" => {
                parsed.healthy = Some(match value.as_ref() {
                    "true" => true,
                    "false" => false,
                    other => {
                        return Err(ApiError::bad_request(format!(
                            "healthy: {other:?} is not a boolean; use true or false"
                        )));
                    }
                });
            }
            "strategy" => {
                parsed.strategy = Some(
                    Strategy::parse("strategy", &value)
                        .map_err(|err| ApiError::bad_request(err.to_string()))?,
                );
            }
            "format" => {
                parsed.format_url = match value.as_ref() {
                    "url" => true,
                    "json" => false,
                    other => {
                        return Err(ApiError::bad_request(format!(
                            "format: {other:?} is not a format; use json or url"
                        )));
                    }
                };
            }
            _ => {}
        }
    }
    Ok(parsed)
}

fn list(api: &Api, query: &str) -> Answer {
    let query = parse_query(query, &["pool", "provider", "label", "healthy"])?;
    let items = api.fleet.list(&query.selector, query.healthy);
    Ok(json(StatusCode::OK, &serde_json::json!({ "items": items })))
}

fn next(api: &Api, query: &str) -> Answer {
    let query = parse_query(query, &["pool", "provider", "label", "host", "strategy", "format"])?;
    let picked = api.fleet.next_picked(&query.selector, query.strategy)?;
    let url = handed_out_url(api, &picked);
    let id = picked.id;
    Ok(if query.format_url {
        text(StatusCode::OK, "text/plain", format!("{url}\n"))
    } else {
        json(StatusCode::OK, &serde_json::json!({ "id": id, "url": url }))
    })
}

async fn read_json<T: for<'de> Deserialize<'de> + Default>(
    request: Request<Incoming>,
) -> Result<T, ApiError> {
    let body = Limited::new(request.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|err| ApiError::bad_request(format!("cannot read the body: {err}")))?
        .to_bytes();
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(&body).map_err(|err| ApiError::bad_request(format!("body: {err}")))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct LeaseRequest {
    pool: Option<String>,
    provider: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    host: Option<String>,
    ttl_seconds: Option<u64>,
    /// Exclusive unless asked otherwise: a crawler leasing a proxy for a
    /// session rarely wants to share its exit address.
    exclusive: Option<bool>,
    strategy: Option<String>,
}

async fn lease(api: &Api, request: Request<Incoming>) -> Answer {
    let body: LeaseRequest = read_json(request).await?;
    let selector = Selector {
        pool: body.pool,
        provider: body.provider,
        labels: body.labels.into_iter().collect(),
        site: body.host.as_deref().map(|host| site_of("host", host)).transpose()?,
    };
    let strategy = body
        .strategy
        .map(|s| Strategy::parse("strategy", &s))
        .transpose()
        .map_err(|err| ApiError::bad_request(err.to_string()))?;
    let lease = api
        .fleet
        .lease(
            &selector,
            strategy,
            body.exclusive.unwrap_or(true),
            body.ttl_seconds.map(Duration::from_secs),
        )
        .await?;
    Ok(json(StatusCode::CREATED, &with_credential(api, lease)))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RenewRequest {
    ttl_seconds: Option<u64>,
}

async fn renew(api: &Api, id: &str, request: Request<Incoming>) -> Answer {
    let body: RenewRequest = read_json(request).await?;
    let lease = api.fleet.renew(id, body.ttl_seconds.map(Duration::from_secs)).await?;
    Ok(json(StatusCode::OK, &with_credential(api, lease)))
}

/// A proxy's credential goes only to callers that showed an API token: with
/// a token file, the routes that hand out proxies need one. Without, the
/// URL stays bare and the crawler cannot use a proxy that asks for one.
fn handed_out_url(api: &Api, picked: &Picked) -> String {
    if api.auth.has_tokens() { picked.endpoint.url_with_credential() } else { picked.url.clone() }
}

/// See [`handed_out_url`].
fn with_credential(api: &Api, mut lease: LeaseView) -> LeaseView {
    if api.auth.has_tokens()
        && let Some(url) = api.fleet.url_with_credential(&lease.proxy_id)
    {
        lease.url = url;
    }
    lease
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ReportRequest {
    kind: ReportKind,
    #[serde(default)]
    reason: String,
    /// The site that turned the proxy away: the ban holds for it only.
    host: Option<String>,
}

impl Default for ReportRequest {
    fn default() -> Self {
        Self { kind: ReportKind::Failure, reason: String::new(), host: None }
    }
}

async fn report(api: &Api, id: &str, request: Request<Incoming>) -> Answer {
    let body: ReportRequest = read_json(request).await?;
    // The reason is the crawler's free text: keep logs and metrics bounded.
    let reason: String = body.reason.chars().take(200).collect();
    let outcome = match &body.host {
        Some(host) => api.fleet.ban_site(id, host, body.kind, &reason)?,
        None => api.fleet.report(id, body.kind, &reason)?,
    };
    Ok(json(StatusCode::OK, &outcome))
}

fn json(status: StatusCode, value: &impl serde::Serialize) -> Response<Full<Bytes>> {
    let body = serde_json::to_vec(value).unwrap_or_else(|err| {
        format!("{{\"error\":\"cannot encode the answer: {err}\"}}").into_bytes()
    });
    respond(status, JSON, Bytes::from(body))
}

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    respond(status, content_type, Bytes::from(body))
}

fn respond(status: StatusCode, content_type: &'static str, body: Bytes) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

fn error_response(err: &ApiError) -> Response<Full<Bytes>> {
    json(err.status, &serde_json::json!({ "error": err.message }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_name_unknown_keys_and_bad_values() {
        let q = parse_query(
            "pool=default%2Fa&label=tier=gold&healthy=true",
            &["pool", "label", "healthy"],
        )
        .unwrap();
        assert_eq!(q.selector.pool.as_deref(), Some("default/a"));
        assert_eq!(q.selector.labels, [("tier".to_owned(), "gold".to_owned())]);
        assert_eq!(q.healthy, Some(true));
        let err = parse_query("pol=a", &["pool"]).err().unwrap();
        assert!(err.message.contains("\"pol\"") && err.message.contains("pool"), "{}", err.message);
        let err = parse_query("label=gold", &["label"]).err().unwrap();
        assert!(err.message.starts_with("label:"), "{}", err.message);
        let err = parse_query("healthy=yes", &["healthy"]).err().unwrap();
        assert!(err.message.starts_with("healthy:"), "{}", err.message);
    }

    #[test]
    fn lease_bodies_reject_unknown_fields_by_name() {
        let err = serde_json::from_str::<LeaseRequest>(r#"{"ttl": 5}"#).unwrap_err().to_string();
        assert!(err.contains("unknown field `ttl`") && err.contains("ttlSeconds"), "{err}");
    }
}
