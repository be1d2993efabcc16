//! The HTTP/1.1 accept loop the discovery API and the gateway share:
//! connections are served until shutdown, then drained for at most
//! [`DRAIN`].

use std::convert::Infallible;
use std::error::Error as StdError;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::{Body, Incoming};
use hyper::service::Service;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

/// How long a shutdown waits for requests under way.
pub const DRAIN: Duration = Duration::from_secs(5);

/// Serves the service `make(peer)` builds for each connection on
/// `listener` until `shutdown` resolves, then drains the connections and
/// returns. Connections may be upgraded (the gateway's CONNECT tunnels).
pub(crate) async fn serve<S, B>(
    listener: TcpListener,
    what: &'static str,
    make: impl Fn(SocketAddr) -> S,
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
    loop {
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
        let service = make(peer);
        let mut stopped = stopped.clone();
        tasks.spawn(async move {
            // With a timer, hyper closes a connection whose request head
            // has not arrived within 30 s: an idle client holds nothing.
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
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
