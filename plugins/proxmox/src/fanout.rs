//! Several API `GET`s in flight at once, for `check`, which asks every node
//! the same questions: the SDK's client waits for each response before the
//! next request, so this sends all requests through `wasi:http` first and
//! then collects the answers. The host still applies the entry's grants,
//! address policy, credential and limits to each request.

use proxyfleet_sdk::http::{Method, REASON_PHRASE_HEADER, classify_answer};
use proxyfleet_sdk::{ProviderError, Result};
use serde_json::Value;
use wasip2::http::outgoing_handler;
use wasip2::http::types::{
    ErrorCode, Fields, FutureIncomingResponse, IncomingBody, OutgoingBody, OutgoingRequest,
    RequestOptions, Scheme,
};
use wasip2::io::streams::StreamError;

use crate::pve;

/// Largest answer read; `check`'s answers are a few KiB.
const MAX_BODY: usize = 4 * 1024 * 1024;
const READ_CHUNK: u64 = 64 * 1024;
const CONNECT_TIMEOUT_NS: u64 = 10_000_000_000;
const FIRST_BYTE_TIMEOUT_NS: u64 = 30_000_000_000;

/// `GET`s every path under `base` (`https://host:port/api2/json`) at once
/// and returns each answer's `data`, in the order of `paths`. Errors are
/// classified as the SDK's client classifies them.
pub fn get_all(base: &str, paths: &[String]) -> Vec<Result<Value>> {
    let authority = base.strip_prefix("https://").and_then(|rest| rest.split('/').next());
    let prefix =
        base.strip_prefix("https://").and_then(|rest| rest.find('/').map(|slash| &rest[slash..]));
    let (Some(authority), Some(prefix)) = (authority, prefix) else {
        let error =
            ProviderError::InvalidConfig(format!("config key `url`: `{base}` is not an https URL"));
        return paths.iter().map(|_| Err(error.clone())).collect();
    };
    let pending: Vec<Result<FutureIncomingResponse>> =
        paths.iter().map(|path| send(authority, &format!("{prefix}{path}"))).collect();
    pending
        .into_iter()
        .zip(paths)
        .map(|(future, path)| {
            let url = format!("{base}{path}");
            future.and_then(|future| receive(&future, &url)).map_err(pve::classify)
        })
        .collect()
}

fn send(authority: &str, path: &str) -> Result<FutureIncomingResponse> {
    let refused = |what: &str| {
        ProviderError::Permanent(format!(
            "GET https://{authority}{path}: {what} refused by the host"
        ))
    };
    let request = OutgoingRequest::new(Fields::new());
    request.set_scheme(Some(&Scheme::Https)).map_err(|()| refused("scheme"))?;
    request.set_authority(Some(authority)).map_err(|()| refused("authority"))?;
    request.set_path_with_query(Some(path)).map_err(|()| refused("path"))?;
    let options = RequestOptions::new();
    // An error only means the host does not support that timeout; its own
    // limits and the call deadline then apply.
    let _ = options.set_connect_timeout(Some(CONNECT_TIMEOUT_NS));
    let _ = options.set_first_byte_timeout(Some(FIRST_BYTE_TIMEOUT_NS));
    let body = request.body().map_err(|()| refused("body"))?;
    let future = outgoing_handler::handle(request, Some(options))
        .map_err(|code| transport(&code, &format!("https://{authority}{path}")))?;
    // A GET has no body; finishing it lets the request go out.
    OutgoingBody::finish(body, None)
        .map_err(|code| transport(&code, &format!("https://{authority}{path}")))?;
    Ok(future)
}

fn receive(future: &FutureIncomingResponse, url: &str) -> Result<Value> {
    future.subscribe().block();
    let response = match future.get() {
        Some(Ok(Ok(response))) => response,
        Some(Ok(Err(code))) => return Err(transport(&code, url)),
        _ => return Err(ProviderError::Transient(format!("GET {url}: no response"))),
    };
    let status = response.status();
    let reason = response
        .headers()
        .get(REASON_PHRASE_HEADER)
        .first()
        .map(|value| String::from_utf8_lossy(value).into_owned());
    let incoming = response.consume().map_err(|()| {
        ProviderError::Transient(format!("GET {url}: response body already taken"))
    })?;
    let body = read(&incoming, url)?;
    drop(IncomingBody::finish(incoming));
    if let Some(error) = classify_answer(Method::Get, url, status, reason.as_deref(), &body) {
        return Err(error);
    }
    let envelope: Value = serde_json::from_slice(&body).map_err(|error| {
        ProviderError::Permanent(format!(
            "GET {url}: unexpected response body (HTTP {status}): {error}"
        ))
    })?;
    Ok(envelope.get("data").cloned().unwrap_or(Value::Null))
}

fn read(body: &IncomingBody, url: &str) -> Result<Vec<u8>> {
    let stream = body
        .stream()
        .map_err(|()| ProviderError::Transient(format!("GET {url}: body stream already taken")))?;
    let mut bytes = Vec::new();
    let result = loop {
        match stream.blocking_read(READ_CHUNK) {
            Ok(chunk) if bytes.len() + chunk.len() > MAX_BODY => {
                break Err(ProviderError::Permanent(format!(
                    "GET {url}: response body over {MAX_BODY} bytes"
                )));
            }
            Ok(chunk) => bytes.extend_from_slice(&chunk),
            Err(StreamError::Closed) => break Ok(()),
            Err(StreamError::LastOperationFailed(error)) => {
                break Err(ProviderError::Transient(format!(
                    "GET {url}: reading the response failed: {}",
                    error.to_debug_string()
                )));
            }
        }
    };
    // The stream is a child of the body and must be dropped before it.
    drop(stream);
    result.map(|()| bytes)
}

/// Words the host's transport failures in the terms `check` sorts by
/// (`denied`, `certificate`, `timed out`, the host's own detail).
fn transport(code: &ErrorCode, url: &str) -> ProviderError {
    let request = format!("GET {url}");
    match code {
        ErrorCode::HttpRequestDenied | ErrorCode::DestinationIpProhibited => {
            ProviderError::Unauthorized(format!(
                "{request}: denied by the host: the entry's grants do not allow it"
            ))
        }
        ErrorCode::TlsCertificateError => {
            ProviderError::Permanent(format!("{request}: TLS certificate rejected"))
        }
        ErrorCode::TlsProtocolError => {
            ProviderError::Permanent(format!("{request}: TLS handshake failed"))
        }
        ErrorCode::ConnectionTimeout
        | ErrorCode::ConnectionReadTimeout
        | ErrorCode::ConnectionWriteTimeout
        | ErrorCode::HttpResponseTimeout
        | ErrorCode::DnsTimeout => ProviderError::Transient(format!("{request}: timed out")),
        ErrorCode::InternalError(detail) => ProviderError::Transient(format!(
            "{request}: host error{}",
            detail.as_deref().map(|detail| format!(": {detail}")).unwrap_or_default()
        )),
        other => ProviderError::Transient(format!("{request}: {other:?}")),
    }
}
