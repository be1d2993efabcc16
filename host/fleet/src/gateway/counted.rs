//! Bytes counted as they pass: a body's frames ([`counted_body`]) and a
//! tunnel's stream ([`Counted`]), so the figures hold however a transfer
//! ends (a reset is a normal end for a tunnel, and `copy_bidirectional`
//! reports no counts on an error).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use proxyfleet_metrics::gateway::ByteCounter;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::Body;

/// `body`, handing the size of each data frame to `count` as it passes.
pub(super) fn counted_body(body: Incoming, count: impl Fn(u64) + Send + Sync + 'static) -> Body {
    body.map_frame(move |frame| {
        if let Some(data) = frame.data_ref() {
            count(data.len() as u64);
        }
        frame
    })
    .boxed()
}

/// When bytes last passed through a [`Counted`] stream, in milliseconds
/// since the clock was made: shared with whoever watches the stream for
/// idleness. On tokio's clock, which the watchdog's timer runs on too.
#[derive(Debug, Clone)]
pub(super) struct Activity {
    start: tokio::time::Instant,
    last_ms: Arc<AtomicU64>,
}

impl Activity {
    pub(super) fn new() -> Self {
        Self { start: tokio::time::Instant::now(), last_ms: Arc::new(AtomicU64::new(0)) }
    }

    fn touch(&self) {
        let now = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(now, Ordering::Relaxed);
    }

    /// When bytes last passed (the clock's start when none have).
    pub(super) fn last(&self) -> tokio::time::Instant {
        self.start + std::time::Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }
}

/// `inner`, with what is read from it added to `read` and what is written
/// to it added to `written`, and every transfer noted in `activity`.
#[derive(Debug)]
pub(super) struct Counted<S> {
    inner: S,
    read: ByteCounter,
    written: ByteCounter,
    activity: Activity,
}

impl<S> Counted<S> {
    pub(super) fn new(
        inner: S,
        read: ByteCounter,
        written: ByteCounter,
        activity: Activity,
    ) -> Self {
        Self { inner, read, written, activity }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            self.read.inc_by((buf.filled().len() - before) as u64);
            self.activity.touch();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, data);
        if let Poll::Ready(Ok(written)) = polled {
            self.written.inc_by(written as u64);
            self.activity.touch();
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
