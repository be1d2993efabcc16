//! The HTTPS front: TLS, the token endpoint, bearer-token authentication,
//! query and body parsing, routing, and rendering answers the way Google's
//! APIs do.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use proxyfleet_sim_support::https::DropConnection;
use serde_json::{Value, json};

use crate::oauth::TokenRefusal;
use crate::state::{ApiError, ApiResult, Shared, error_body};

const API_PREFIX: &str = "/compute/v1/projects/";
/// How long `operations.wait` waits at most, as Compute Engine does.
const WAIT_CAP: Duration = Duration::from_secs(120);

fn json_response(status: u16, body: &Value) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json; charset=UTF-8")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("a valid response")
}

fn render(result: ApiResult) -> Response<Full<Bytes>> {
    match result {
        Ok(value) => json_response(200, &value),
        Err(error) => json_response(error.code, &error_body(&error)),
    }
}

pub(crate) async fn handle(
    shared: &Shared,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, DropConnection> {
    let faults = shared.faults();
    if !faults.latency.is_zero() {
        tokio::time::sleep(faults.latency).await;
    }
    let method = request.method().as_str().to_owned();
    let path = request.uri().path().to_owned();
    let query = parse_form(request.uri().query().unwrap_or(""));
    let line = match request.uri().query() {
        Some(q) => format!("{method} {path}?{q}"),
        None => format!("{method} {path}"),
    };
    let is_api = path.starts_with(API_PREFIX);
    let fault = shared.record_request(line, is_api);
    let authorization = request
        .headers()
        .get("authorization")
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    let Ok(body) = request.into_body().collect().await else {
        return Err(DropConnection);
    };
    let body = body.to_bytes();

    if method == "POST" && path == "/token" {
        return Ok(token(shared, &faults, &body));
    }
    let Some(route) = path.strip_prefix(API_PREFIX) else {
        return Ok(render(Err(ApiError::new(404, "notFound", format!("Not Found: {path}")))));
    };
    let user = match authenticate(shared, authorization.as_deref()) {
        Ok(user) => user,
        Err(error) => return Ok(render(Err(error))),
    };
    if let Some(error) = fault {
        return Ok(render(Err(error)));
    }
    let body: Value = if body.is_empty() {
        Value::Null
    } else {
        match serde_json::from_slice(&body) {
            Ok(value) => value,
            Err(error) => {
                return Ok(render(Err(ApiError::new(
                    400,
                    "parseError",
                    format!("Invalid JSON payload received. {error}"),
                ))));
            }
        }
    };
    let segments: Vec<String> = route.trim_matches('/').split('/').map(percent_decode).collect();
    let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
    let param = |key: &str| query.get(key).map(String::as_str);
    let result = match (method.as_str(), segments.as_slice()) {
        ("GET", [project]) => shared.project(project),
        ("GET", [project, "zones", zone]) => shared.zone(project, zone),
        ("GET", [project, "global", "images", "family", family]) => {
            shared.image(project, family, true)
        }
        ("GET", [project, "global", "images", name]) => shared.image(project, name, false),
        ("GET", [project, "global", "instanceTemplates", name]) => {
            shared.instance_template(project, name)
        }
        ("GET", [project, "zones", zone, "instances"]) => shared.list_instances(
            project,
            zone,
            param("filter"),
            param("maxResults"),
            param("pageToken"),
        ),
        ("POST", [project, "zones", zone, "instances"]) => {
            let result = shared.insert_instance(
                project,
                zone,
                &body,
                param("requestId"),
                param("sourceInstanceTemplate"),
                &user,
            );
            if result.is_ok() && shared.take_lost_insert() {
                return Err(DropConnection);
            }
            result
        }
        ("GET", [project, "zones", zone, "instances", name]) => {
            shared.get_instance(project, zone, name)
        }
        ("DELETE", [project, "zones", zone, "instances", name]) => {
            let result = shared.delete_instance(project, zone, name, param("requestId"), &user);
            if result.is_ok() && shared.take_lost_delete() {
                return Err(DropConnection);
            }
            result
        }
        ("GET", [project, "zones", zone, "operations", name]) => {
            shared.get_operation(project, zone, name)
        }
        ("POST", [project, "zones", zone, "operations", name, "wait"]) => {
            wait(shared, project, zone, name).await
        }
        _ => Err(ApiError::new(
            404,
            "notFound",
            format!("The requested URL {path} was not found on this server."),
        )),
    };
    Ok(render(result))
}

/// `operations.wait`: answers once the operation is done, or after the cap
/// with its current state.
async fn wait(shared: &Shared, project: &str, zone: &str, name: &str) -> ApiResult {
    let started = Instant::now();
    loop {
        let operation = shared.get_operation(project, zone, name)?;
        if operation["status"] == "DONE" || started.elapsed() >= WAIT_CAP {
            return Ok(operation);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The token endpoint: form in, token JSON or an OAuth error out.
fn token(shared: &Shared, faults: &crate::Faults, body: &[u8]) -> Response<Full<Bytes>> {
    if faults.token_endpoint_down {
        return json_response(
            503,
            &json!({"error": "internal_failure", "error_description": "Backend Error"}),
        );
    }
    let form = parse_form(&String::from_utf8_lossy(body));
    match shared.oauth.exchange(&form) {
        Ok(answer) => json_response(200, &answer),
        Err((status, error, description)) => {
            json_response(status, &json!({"error": error, "error_description": description}))
        }
    }
}

/// The account behind a request's bearer token, or Google's refusal.
fn authenticate(shared: &Shared, authorization: Option<&str>) -> Result<String, ApiError> {
    let unauthenticated = |message: &str| ApiError::new(401, "authError", message.to_owned());
    let Some(token) = authorization.and_then(|value| value.strip_prefix("Bearer ")) else {
        return Err(unauthenticated(
            "Request is missing required authentication credential. Expected OAuth 2 access \
             token, login cookie or other valid authentication credential.",
        ));
    };
    match shared.oauth.authorize(token) {
        Ok(grant) => Ok(grant.client_email),
        Err(TokenRefusal::Invalid) => Err(unauthenticated(
            "Request had invalid authentication credentials. Expected OAuth 2 access token, \
             login cookie or other valid authentication credential.",
        )),
        Err(TokenRefusal::InsufficientScope) => Err(ApiError::new(
            403,
            "insufficientPermissions",
            "Request had insufficient authentication scopes.",
        )),
    }
}

fn parse_form(text: &str) -> HashMap<String, String> {
    text.split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(&key.replace('+', " ")), percent_decode(&value.replace('+', " ")))
        })
        .collect()
}

pub(crate) fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%'
            && index + 2 < bytes.len()
            && let Ok(hex) = std::str::from_utf8(&bytes[index + 1..index + 3])
            && let Ok(byte) = u8::from_str_radix(hex, 16)
        {
            out.push(byte);
            index += 3;
        } else {
            out.push(bytes[index]);
            index += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_decoded() {
        let form = parse_form("filter=labels.proxyfleet%3A*&requestId=a-b");
        assert_eq!(form.get("filter").map(String::as_str), Some("labels.proxyfleet:*"));
        assert_eq!(percent_decode("a%20b"), "a b");
    }
}
