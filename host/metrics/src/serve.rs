//! A small HTTP endpoint for scrapers and probes: `GET /metrics`,
//! `GET /healthz` (the process answers) and `GET /livez` (no part of the
//! operator has stalled: see [`proxyfleet_core::liveness`]).
//!
//! It is often bound to every interface, so it holds at most
//! [`MAX_CONNECTIONS`] at once (a slot is taken before accepting, so that
//! clients beyond it wait in the kernel's backlog and hold no descriptor
//! of ours) and closes a connection that sends no request head within
//! [`HEADER_READ_TIMEOUT`]: a flood of it cannot take the descriptors the
//! rest of the operator needs.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use proxyfleet_core::liveness::Watchdog;

use crate::Metrics;

/// The content type of the OpenMetrics text format the registry encodes.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Connections served at once: scrapers are a handful of Prometheus
/// replicas and the odd curl.
pub const MAX_CONNECTIONS: usize = 64;

/// How long a connection may take to send a request head, and how long an
/// idle keep-alive connection is kept.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `metrics` and the liveness `watchdog` on `listener` until
/// `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    watchdog: Watchdog,
    shutdown: impl Future<Output = ()>,
) {
    serve_bounded(listener, metrics, watchdog, MAX_CONNECTIONS, HEADER_READ_TIMEOUT, shutdown)
        .await;
}

async fn serve_bounded(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    watchdog: Watchdog,
    max_connections: usize,
    header_read_timeout: Duration,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let slots = Arc::new(Semaphore::new(max_connections));
    loop {
        let slot = tokio::select! {
            () = &mut shutdown => return,
            slot = Arc::clone(&slots).acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => return,
            },
        };
        let accepted = tokio::select! {
            () = &mut shutdown => return,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(err) => {
                tracing::warn!("metrics endpoint: accept failed: {err}");
                continue;
            }
        };
        let metrics = Arc::clone(&metrics);
        let watchdog = watchdog.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let metrics = Arc::clone(&metrics);
                let watchdog = watchdog.clone();
                async move { Ok::<_, Infallible>(answer(&request, &metrics, &watchdog)) }
            });
            if let Err(err) = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(header_read_timeout)
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!("metrics endpoint: connection ended: {err}");
            }
            drop(slot);
        });
    }
}

fn answer(
    request: &Request<Incoming>,
    metrics: &Metrics,
    watchdog: &Watchdog,
) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match (request.method(), request.uri().path()) {
        (&Method::GET, "/metrics") => (StatusCode::OK, CONTENT_TYPE, metrics.encode()),
        (&Method::GET, "/healthz") => (StatusCode::OK, "text/plain", "ok\n".to_owned()),
        (&Method::GET, "/livez") => livez(watchdog),
        _ => (StatusCode::NOT_FOUND, "text/plain", "not found: try /metrics\n".to_owned()),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(value) = content_type.parse() {
        response.headers_mut().insert(hyper::header::CONTENT_TYPE, value);
    }
    response
}

/// 200 naming the parts watched, or 503 naming each stalled part and why.
fn livez(watchdog: &Watchdog) -> (StatusCode, &'static str, String) {
    let stalls = watchdog.stalls();
    if stalls.is_empty() {
        let parts = watchdog.parts();
        let watched = if parts.is_empty() { "nothing yet".to_owned() } else { parts.join(", ") };
        return (StatusCode::OK, "text/plain", format!("ok: {watched}\n"));
    }
    let mut body = String::from("stalled:\n");
    for stall in stalls {
        body.push_str(&format!("- {stall}\n"));
    }
    (StatusCode::SERVICE_UNAVAILABLE, "text/plain", body)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    async fn get(addr: std::net::SocketAddr, path: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: metrics\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response
    }

    #[tokio::test]
    async fn scrapers_get_the_text_format() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let metrics = Arc::new(Metrics::new());
        metrics.record_check("pve", true);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let watchdog = Watchdog::new(Duration::from_secs(3600));
        let watcher = watchdog.expect_beats("plugin watcher");
        let server = tokio::spawn(serve(listener, metrics, watchdog, async {
            let _ = stopped.await;
        }));
        let response = get(addr, "/metrics").await;
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        assert!(response.contains("application/openmetrics-text"), "{response}");
        assert!(response.contains("proxyfleet_provider_healthy{entry=\"pve\"} 1"), "{response}");
        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
        let live = get(addr, "/livez").await;
        assert!(live.starts_with("HTTP/1.1 200") && live.contains("ok: plugin watcher"), "{live}");
        // A loop whose task ended without stopping fails the probe.
        drop(watcher);
        let dead = get(addr, "/livez").await;
        assert!(dead.starts_with("HTTP/1.1 503"), "{dead}");
        assert!(dead.contains("- plugin watcher: its task ended"), "{dead}");
        assert!(get(addr, "/nope").await.starts_with("HTTP/1.1 404"));
        let _ = stop.send(());
        tokio::time::timeout(Duration::from_secs(5), server).await.unwrap().unwrap();
    }

    async fn bounded(max: usize, timeout: Duration) -> std::net::SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let metrics = Arc::new(Metrics::new());
        tokio::spawn(serve_bounded(
            listener,
            metrics,
            Watchdog::default(),
            max,
            timeout,
            std::future::pending(),
        ));
        addr
    }

    /// A client beyond the bound waits in the backlog until a connection
    /// closes.
    #[tokio::test]
    async fn connections_beyond_the_bound_wait_for_a_slot() {
        let addr = bounded(4, Duration::from_secs(3600)).await;
        let mut flood = Vec::new();
        for _ in 0..4 {
            flood.push(tokio::net::TcpStream::connect(addr).await.unwrap());
        }
        let waiting = tokio::spawn(get(addr, "/healthz"));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiting.is_finished(), "served beyond the bound");
        drop(flood.pop());
        let answer = tokio::time::timeout(Duration::from_secs(30), waiting)
            .await
            .expect("served once a slot is free")
            .unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }

    /// Connections that send nothing are closed after the header-read
    /// timeout, and their slots serve others.
    #[tokio::test]
    async fn idle_connections_are_closed_after_the_header_read_timeout() {
        let addr = bounded(4, Duration::from_millis(500)).await;
        let mut flood = Vec::new();
        for _ in 0..4 {
            flood.push(tokio::net::TcpStream::connect(addr).await.unwrap());
        }
        let answer = tokio::time::timeout(Duration::from_secs(30), get(addr, "/healthz"))
            .await
            .expect("served once the idle connections are closed");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        for mut idle in flood {
            let mut rest = Vec::new();
            tokio::time::timeout(Duration::from_secs(30), idle.read_to_end(&mut rest))
                .await
                .expect("the idle connection is closed")
                .unwrap();
        }
    }
}
