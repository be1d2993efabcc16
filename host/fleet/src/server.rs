//! The HTTP/1.1 accept loop the discovery API and the gateway share:
//! connections are served until shutdown, then drained for at most
//! [`DRAIN`].
//!
//! Each listener holds at most [`ConnectionLimits::max_connections`]
//! connections: at the bound it stops accepting, so further clients wait
//! in the kernel's backlog and hold none of this process's descriptors,
//! which the other listener, the health probes and the plugins keep. A
//! connection whose next request head does not arrive within
//! [`ConnectionLimits::header_read_timeout`] (an idle keep-alive one too)
//! is closed.

use std::convert::Infallible;
use std::error::Error as StdError;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::{Body, Incoming};
use hyper::service::Service;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How long a shutdown waits for requests under way.
pub const DRAIN: Duration = Duration::from_secs(5);

/// How often at most a listener at its bound says so in the log.
const FULL_WARNING_EVERY: Duration = Duration::from_secs(60);

/// One connection's place among a listener's
/// [`ConnectionLimits::max_connections`], free again when the last clone
/// is dropped.
#[derive(Debug, Clone)]
pub(crate) struct Slot(#[allow(dead_code, reason = "held, never read")] Arc<OwnedSemaphorePermit>);

/// What one listener holds at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Client connections open at once.
    pub max_connections: usize,
    /// Budget for a request head, from the moment the connection waits
    /// for one (after accepting, and after each answer on a kept one).
    pub header_read_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self { max_connections: 1024, header_read_timeout: Duration::from_secs(10) }
    }
}

/// Serves the service `make(peer, slot)` builds for each connection on
/// `listener` until `shutdown` resolves, then drains the connections and
/// returns. Connections may be upgraded (the gateway's CONNECT tunnels):
/// hyper lets go of an upgraded connection, so whoever takes it over keeps
/// a clone of its [`Slot`] for as long as it lives.
pub(crate) async fn serve<S, B>(
    listener: TcpListener,
    what: &'static str,
    limits: ConnectionLimits,
    make: impl Fn(SocketAddr, Slot) -> S,
    shutdown: impl Future<Output = ()>,
) where
    S: Service<Request<Incoming>, Response = Response<B>, Error = Infallible> + Send + 'static,
    S::Future: Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn StdError + Send + Sync>>,
{
    tokio::pin!(shutdown);
    // hyper-util's GracefulShutdown does not take upgradeable connections,
    // so each connection task watches for the stop itself.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut warned: Option<Instant> = None;
    loop {
        let slot = match Arc::clone(&slots).try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                if warned.is_none_or(|at| at.elapsed() >= FULL_WARNING_EVERY) {
                    tracing::warn!(
                        max_connections = limits.max_connections,
                        "{what}: every connection slot is taken; new clients wait until one closes"
                    );
                    warned = Some(Instant::now());
                }
                tokio::select! {
                    () = &mut shutdown => break,
                    slot = Arc::clone(&slots).acquire_owned() => match slot {
                        Ok(slot) => slot,
                        Err(_) => break,
                    },
                }
            }
        };
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(err) => {
                // Out of file descriptors, typically: pause instead of spinning.
                tracing::warn!("{what}: accept failed: {err}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let slot = Slot(Arc::new(slot));
        let service = make(peer, slot.clone());
        let mut stopped = stopped.clone();
        tasks.spawn(async move {
            // Held until the connection (and a tunnel it became) ends.
            let _slot = slot;
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout)
                .serve_connection(TokioIo::new(stream), service)
                .with_upgrades();
            tokio::pin!(connection);
            let ended = tokio::select! {
                ended = connection.as_mut() => ended,
                () = async { let _ = stopped.wait_for(|stopped| *stopped).await; } => {
                    // Requests under way are answered; an idle keep-alive
                    // connection closes now.
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(err) = ended {
                tracing::debug!("{what}: connection ended: {err}");
            }
        });
        while tasks.try_join_next().is_some() {}
    }
    drop(listener);
    let _ = stop.send(true);
    let drained = tokio::time::timeout(DRAIN, async { while tasks.join_next().await.is_some() {} });
    if drained.await.is_err() {
        // Dropping the set aborts what is left.
        tracing::warn!("{what}: connections still open after {DRAIN:?}; closing them");
    }
}
