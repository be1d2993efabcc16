//! CONNECT tunnels: the picked proxy is asked for a tunnel to the target's
//! address as the gateway resolved it (never the name, which the proxy
//! would resolve again), and once it agrees the crawler's connection is
//! joined to it.
//!
//! A proxy that cannot be reached, or that closes or fails before
//! answering the CONNECT, is reported and another one asked. A proxy that
//! answers with a refusal (the target is unreachable from it, say) is not:
//! the crawler gets that status, with the proxy's ID. A tunnel that carries
//! nothing either way for the gateway's tunnel idle timeout is closed.

use std::time::Instant;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use proxyfleet_metrics::gateway::Kind;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use super::counted::{Activity, Counted};
use super::{
    Body, Gateway, Held, Refusal, Route, Upstream, added, ban_on_status, full, name_proxy,
    site_of_authority,
};

/// The longest answer head taken from a proxy.
const MAX_HEAD: usize = 16 * 1024;

/// What the proxy answered to CONNECT.
enum Answer {
    /// The tunnel is open; bytes the proxy sent after its head.
    Open(Vec<u8>),
    /// The proxy refused.
    Refused(StatusCode),
}

pub(super) async fn open(
    gateway: &Gateway,
    route: &Route,
    held: Held,
    request: Request<Incoming>,
    started: Instant,
) -> Result<Response<Body>, Refusal> {
    let authority = request
        .uri()
        .authority()
        .filter(|authority| authority.port_u16().is_some())
        .cloned()
        .ok_or_else(|| Refusal::bad_request("CONNECT needs host:port as its target"))?;
    let site = site_of_authority(&authority)?;
    let target = gateway.target(&authority, 443).await?.to_string();
    let mut tried = Vec::new();
    let (upstream, leftover, upstream_took) = loop {
        let mut upstream = gateway.connect(route, &site, tried).await?;
        let asked = Instant::now();
        let answer = tokio::time::timeout(
            gateway.settings.connect_timeout,
            ask(&mut upstream.stream, &target, upstream.picked.endpoint.proxy_authorization()),
        )
        .await;
        let failure = match answer {
            Ok(Ok(Answer::Open(leftover))) => {
                let took = upstream.connected_in + asked.elapsed();
                break (upstream, leftover, took);
            }
            Ok(Ok(Answer::Refused(StatusCode::PROXY_AUTHENTICATION_REQUIRED))) => {
                return Err(Gateway::refused_credential(&upstream.picked));
            }
            Ok(Ok(Answer::Refused(status))) => {
                let picked = &upstream.picked;
                gateway.fleet.metrics().gateway().record_request(
                    picked.pool.as_deref(),
                    &picked.name,
                    Kind::Connect,
                );
                ban_on_status(gateway, picked, &site, status, &format!("CONNECT {authority}"));
                // A refusal is the proxy's to give; anything else that is
                // not a success (1xx, 3xx) makes no sense for CONNECT.
                let passed = if status.is_client_error() || status.is_server_error() {
                    status
                } else {
                    StatusCode::BAD_GATEWAY
                };
                let mut refusal = Refusal::new(
                    passed,
                    "upstream",
                    format!("the proxy answered {status} to CONNECT {authority}"),
                );
                refusal.proxy = Some(picked.id.clone());
                return Err(refusal);
            }
            Ok(Err(err)) => {
                format!(
                    "gateway: CONNECT through {} failed: {err}",
                    upstream.picked.endpoint.addr()
                )
            }
            Err(_) => format!(
                "gateway: the proxy at {} did not answer CONNECT within {:?}",
                upstream.picked.endpoint.addr(),
                gateway.settings.connect_timeout
            ),
        };
        tried = upstream.tried;
        gateway.failed_attempt(&upstream.picked, failure, &mut tried, true)?;
    };
    let Upstream { picked, stream, .. } = upstream;
    let counters = gateway.fleet.metrics().gateway().record_request(
        picked.pool.as_deref(),
        &picked.name,
        Kind::Connect,
    );
    let idle_timeout = gateway.settings.tunnel_idle_timeout;
    tokio::spawn(async move {
        // The tunnel holds its connection's and its client's slots.
        let _held = held;
        let upgraded = match hyper::upgrade::on(request).await {
            Ok(upgraded) => upgraded,
            Err(err) => {
                tracing::debug!("gateway: CONNECT not upgraded: {err}");
                return;
            }
        };
        let mut crawler = TokioIo::new(upgraded);
        if !leftover.is_empty() {
            if crawler.write_all(&leftover).await.is_err() {
                return;
            }
            counters.received.inc_by(leftover.len() as u64);
        }
        // What comes from the proxy goes to the crawler, and the other way:
        // every byte either way passes the upstream side, which notes it.
        let activity = Activity::new();
        let mut upstream = Counted::new(stream, counters.received, counters.sent, activity.clone());
        let copy = tokio::io::copy_bidirectional(&mut crawler, &mut upstream);
        tokio::pin!(copy);
        loop {
            let deadline = activity.last() + idle_timeout;
            tokio::select! {
                ended = &mut copy => {
                    if let Err(err) = ended {
                        tracing::debug!("gateway: tunnel ended: {err}");
                    }
                    break;
                }
                () = tokio::time::sleep_until(deadline) => {
                    // Bytes may have passed meanwhile: only a silence of the
                    // whole timeout closes the tunnel.
                    if activity.last() + idle_timeout <= tokio::time::Instant::now() {
                        tracing::debug!("gateway: tunnel idle for {idle_timeout:?}: closed");
                        break;
                    }
                }
            }
        }
    });
    gateway.fleet.metrics().gateway().observe_added(added(started, upstream_took));
    let mut response = Response::new(full(Bytes::new()));
    name_proxy(response.headers_mut(), &picked.id);
    Ok(response)
}

/// Asks the proxy on `stream` for a tunnel to `authority`, with the
/// proxy's own credential when it asks for one, and reads its answer head.
async fn ask(
    stream: &mut TcpStream,
    authority: &str,
    authorization: Option<HeaderValue>,
) -> std::io::Result<Answer> {
    let mut head = format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n").into_bytes();
    if let Some(authorization) = authorization {
        head.extend_from_slice(b"Proxy-Authorization: ");
        head.extend_from_slice(authorization.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"\r\n");
    stream.write_all(&head).await?;
    let mut buffer = Vec::with_capacity(1024);
    loop {
        let mut chunk = [0u8; 2048];
        let read = stream.read(&mut chunk).await?;
        if read == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the proxy closed the connection before answering",
            ));
        }
        buffer.extend_from_slice(&chunk[..read]);
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut answer = httparse::Response::new(&mut headers);
        match answer.parse(&buffer) {
            Ok(httparse::Status::Complete(length)) => {
                let status = answer
                    .code
                    .and_then(|code| StatusCode::from_u16(code).ok())
                    .unwrap_or(StatusCode::BAD_GATEWAY);
                return Ok(if status.is_success() {
                    Answer::Open(buffer.split_off(length))
                } else {
                    Answer::Refused(status)
                });
            }
            Ok(httparse::Status::Partial) if buffer.len() < MAX_HEAD => {}
            Ok(httparse::Status::Partial) => {
                return Err(std::io::Error::other(format!(
                    "the proxy's answer head is longer than {MAX_HEAD} bytes"
                )));
            }
            Err(err) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("the proxy's answer is not HTTP: {err}"),
                ));
            }
        }
    }
}
