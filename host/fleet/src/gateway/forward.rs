//! Absolute-form requests (`GET http://example.com/ HTTP/1.1`): sent on to
//! the picked proxy as they came, less the hop's headers, and its answer
//! streamed back. The request line names the target's address as the
//! gateway resolved it (`GET http://93.184.215.14:80/`), so the proxy does
//! not resolve the name again; the `Host` header keeps the name. A proxy
//! that rebuilds `Host` from the request line (tinyproxy does) sends the
//! address as the host name.
//!
//! A request goes to another proxy when its proxy cannot be reached, or
//! when the connection fails before the request was written (hyper hands
//! the request back then), or, for a request without a body and with an
//! idempotent method, when the proxy fails before answering: sending such a
//! request twice does no harm, and it is what a crawler would do itself.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, Uri, Version, header};
use hyper::body::{Body as _, Incoming};
use hyper_util::rt::TokioIo;
use proxyfleet_metrics::gateway::{ByteCounter, Kind};

use super::counted::counted_body;
use super::{
    Body, Gateway, Held, Refusal, Route, Upstream, added, ban_on_status, full, name_proxy,
    site_of_authority, strip_hop_headers,
};
use crate::catalog::Picked;

/// The parts of a request kept to send it again; `headers` are the
/// crawler's, less the hop's.
struct Head {
    method: Method,
    uri: Uri,
    headers: HeaderMap,
}

impl Head {
    /// The request for one proxy, with that proxy's own credential when it
    /// asks for one (never the crawler's).
    fn request(&self, body: Body, authorization: Option<HeaderValue>) -> Request<Body> {
        let mut request = Request::new(body);
        *request.method_mut() = self.method.clone();
        *request.uri_mut() = self.uri.clone();
        *request.version_mut() = Version::HTTP_11;
        *request.headers_mut() = self.headers.clone();
        if let Some(authorization) = authorization {
            request.headers_mut().insert(header::PROXY_AUTHORIZATION, authorization);
        }
        request
    }
}

pub(super) async fn send(
    gateway: &Gateway,
    route: &Route,
    held: Held,
    request: Request<Incoming>,
    started: Instant,
) -> Result<Response<Body>, Refusal> {
    let (parts, body) = request.into_parts();
    match parts.uri.scheme_str() {
        Some("http") => {}
        Some(other) => {
            return Err(Refusal::bad_request(format!(
                "{other}:// requests go through a CONNECT tunnel; curl and HTTP libraries do \
                 that themselves for https:// URLs"
            )));
        }
        None => {
            return Err(Refusal::bad_request(
                "this is a proxy: send absolute-form requests (curl -x http://HOST:PORT \
                 http://example.com/), or CONNECT for https",
            ));
        }
    }
    let authority =
        parts.uri.authority().ok_or_else(|| Refusal::bad_request("the request URL has no host"))?;
    let site = site_of_authority(authority)?;
    let target = gateway.target(authority, 80).await?;
    let mut headers = parts.headers;
    if !headers.contains_key(header::HOST)
        && let Ok(host) = HeaderValue::from_str(authority.as_str())
    {
        headers.insert(header::HOST, host);
    }
    let uri = pinned(&parts.uri, target)?;
    let mut head = Head { method: parts.method, uri, headers };
    strip_hop_headers(&mut head.headers);
    let replayable = body.is_end_stream() && head.method.is_idempotent();
    // Sent bytes count against the proxy the body goes to, which is known
    // only once one is reached.
    let sent_to: Arc<Mutex<Option<ByteCounter>>> = Arc::default();
    let mut pending: Option<Body> = Some({
        let sent_to = Arc::clone(&sent_to);
        counted_body(body, move |bytes| {
            if let Some(counter) = &*sent_to.lock().unwrap_or_else(PoisonError::into_inner) {
                counter.inc_by(bytes);
            }
        })
    });
    let mut tried = Vec::new();
    loop {
        let Upstream { picked, stream, tried: before, connected_in } =
            gateway.connect(route, &site, tried).await?;
        tried = before;
        let sent_at = Instant::now();
        let (mut sender, connection) =
            match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await {
                Ok(handshake) => handshake,
                Err(err) => {
                    let failure = format!(
                        "gateway: no HTTP connection to the proxy at {}: {err}",
                        picked.endpoint.addr()
                    );
                    gateway.failed_attempt(&picked, failure, &mut tried, true)?;
                    continue;
                }
            };
        tokio::spawn(async move {
            if let Err(err) = connection.await {
                tracing::debug!("gateway: upstream connection ended: {err}");
            }
        });
        let counters = gateway.fleet.metrics().gateway().record_request(
            picked.pool.as_deref(),
            &picked.name,
            Kind::Http,
        );
        *sent_to.lock().unwrap_or_else(PoisonError::into_inner) = Some(counters.sent);
        let outgoing = pending.take().unwrap_or_else(|| full(Bytes::new()));
        let request = head.request(outgoing, picked.endpoint.proxy_authorization());
        let answer = tokio::time::timeout(
            gateway.settings.response_timeout,
            sender.try_send_request(request),
        )
        .await;
        let failure = match answer {
            Ok(Ok(response)) if response.status() == StatusCode::PROXY_AUTHENTICATION_REQUIRED => {
                return Err(Gateway::refused_credential(&picked));
            }
            Ok(Ok(response)) => {
                let upstream = connected_in + sent_at.elapsed();
                let answered = Answered { site: &site, received: counters.received, held };
                return Ok(answer_of(
                    gateway,
                    &picked,
                    answered,
                    response,
                    added(started, upstream),
                ));
            }
            Ok(Err(mut err)) => {
                // Not written at all: the body comes back, and the request
                // may go elsewhere whatever its method.
                pending = err.take_message().map(|unsent| unsent.into_body());
                let err = err.into_error();
                if err.is_user() {
                    // The crawler's side failed (its upload ended early):
                    // nothing to hold against the proxy, no one to answer.
                    return Err(Refusal::bad_request(format!("the request failed: {err}")));
                }
                format!(
                    "gateway: the proxy at {} failed the request: {err}",
                    picked.endpoint.addr()
                )
            }
            Err(_) => format!(
                "gateway: the proxy at {} did not answer within {:?}",
                picked.endpoint.addr(),
                gateway.settings.response_timeout
            ),
        };
        let retry = pending.is_some() || replayable;
        gateway.failed_attempt(&picked, failure, &mut tried, retry)?;
    }
}

/// What the answer of a request is counted and judged against.
struct Answered<'a> {
    site: &'a str,
    received: ByteCounter,
    /// Held until the answer's body is done with.
    held: Held,
}

/// `uri` with its authority replaced by the address the gateway resolved.
fn pinned(uri: &Uri, target: std::net::SocketAddr) -> Result<Uri, Refusal> {
    let mut parts = uri.clone().into_parts();
    parts.authority = Some(
        target
            .to_string()
            .parse()
            .map_err(|err| Refusal::bad_request(format!("the target {target}: {err}")))?,
    );
    Uri::from_parts(parts).map_err(|err| Refusal::bad_request(format!("the request URL: {err}")))
}

/// The upstream's answer, on its way back: the hop's headers go, the
/// proxy's ID is added, and a ban status bans the proxy for the site.
fn answer_of(
    gateway: &Gateway,
    picked: &Picked,
    answered: Answered<'_>,
    response: Response<Incoming>,
    added: Duration,
) -> Response<Body> {
    let (mut parts, body) = response.into_parts();
    strip_hop_headers(&mut parts.headers);
    name_proxy(&mut parts.headers, &picked.id);
    ban_on_status(gateway, picked, answered.site, parts.status, "the site");
    gateway.fleet.metrics().gateway().observe_added(added);
    let Answered { received, held, .. } = answered;
    Response::from_parts(
        parts,
        counted_body(body, move |bytes| {
            let _ = &held;
            received.inc_by(bytes);
        }),
    )
}
