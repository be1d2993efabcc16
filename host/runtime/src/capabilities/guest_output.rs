//! A plugin's stdout and stderr. What a guest prints (a Rust panic's
//! message, a Python traceback) goes into the operator's log when the call
//! ends, under the plugin, entry, operation and proxy of the call, one
//! record a line: stderr at `warn`, stdout at `info`.
//!
//! Bounded per call and stream: the first [`MAX_CAPTURED`] bytes are kept
//! and the rest only counted, and a line is cut at [`MAX_LINE_BYTES`].
//! Redacted like the plugin's own log records, then control characters
//! escaped, so printing cannot leak a secret nor forge a host log line.
//! Writes always succeed at once: a chatty guest is neither stopped nor
//! slowed by its output.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

use super::CallScope;
use super::Redactor;
use super::log::{PLUGIN_LOG_TARGET, escaped_line};

/// Most bytes of one stream kept from one call.
pub(crate) const MAX_CAPTURED: usize = 16 * 1024;
/// Longest line logged, escaped.
pub(crate) const MAX_LINE_BYTES: usize = 1024;
/// How much a guest may write at once.
const WRITE_PERMIT: usize = 64 * 1024;

/// Which of the guest's outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    fn as_str(self) -> &'static str {
        match self {
            Self::Stdout => "stdout",
            Self::Stderr => "stderr",
        }
    }
}

/// One output of one call; clones share what was written.
#[derive(Clone, Default)]
pub(crate) struct GuestOutput {
    captured: Arc<Mutex<Captured>>,
}

#[derive(Default)]
struct Captured {
    bytes: Vec<u8>,
    dropped: usize,
}

impl GuestOutput {
    fn keep(&self, bytes: &[u8]) {
        let mut captured = self.captured.lock().unwrap_or_else(PoisonError::into_inner);
        let room = MAX_CAPTURED.saturating_sub(captured.bytes.len());
        let kept = bytes.len().min(room);
        captured.bytes.extend_from_slice(&bytes[..kept]);
        captured.dropped += bytes.len() - kept;
    }

    /// Logs what the guest wrote, under the call's scope, and forgets it.
    pub(crate) fn emit(&self, stream: Stream, scope: &CallScope) {
        let (bytes, dropped) = {
            let mut captured = self.captured.lock().unwrap_or_else(PoisonError::into_inner);
            (std::mem::take(&mut captured.bytes), std::mem::take(&mut captured.dropped))
        };
        let (plugin, entry, operation, proxy) =
            (&*scope.plugin, &*scope.entry, scope.operation, scope.proxy.as_deref().unwrap_or(""));
        let name = stream.as_str();
        for line in lines(&bytes, dropped, &scope.redactor) {
            match stream {
                Stream::Stderr => tracing::warn!(
                    target: PLUGIN_LOG_TARGET,
                    plugin, entry, operation, proxy, stream = name, "{line}"
                ),
                Stream::Stdout => tracing::info!(
                    target: PLUGIN_LOG_TARGET,
                    plugin, entry, operation, proxy, stream = name, "{line}"
                ),
            }
        }
    }
}

/// What `bytes` (of which `dropped` more were not kept) logs as: each
/// non-blank line redacted, escaped and cut, then the count of what was not
/// kept.
fn lines(bytes: &[u8], dropped: usize, redactor: &Redactor) -> Vec<String> {
    let text = String::from_utf8_lossy(bytes);
    // Redacted whole before anything is cut, so a cut never leaves part of
    // a secret the redactor would no longer recognise.
    let text = redactor.redact(&text);
    let mut lines: Vec<String> = text
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| escaped_line(line, MAX_LINE_BYTES))
        .collect();
    if dropped > 0 {
        lines.push(format!("… {dropped} more bytes not kept"));
    }
    lines
}

impl IsTerminal for GuestOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[async_trait::async_trait]
impl OutputStream for GuestOutput {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.keep(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(WRITE_PERMIT)
    }
}

#[async_trait::async_trait]
impl Pollable for GuestOutput {
    async fn ready(&mut self) {}
}

impl AsyncWrite for GuestOutput {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.keep(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_redacted_escaped_cut_and_what_was_not_kept_is_counted() {
        let redactor = Redactor::default();
        redactor.remember("s3cret-token");
        let output = GuestOutput::default();
        let first = b"Traceback (most recent call last):\n  token s3cret-token\n\n\x1b[31mred\n";
        output.keep(first);
        output.keep(&vec![b'x'; MAX_CAPTURED]);
        let captured = output.captured.lock().unwrap();
        let logged = lines(&captured.bytes, captured.dropped, &redactor);
        assert_eq!(logged[0], "Traceback (most recent call last):");
        assert_eq!(logged[1], "  token [redacted]");
        assert_eq!(logged[2], "\\u{1b}[31mred", "control characters escaped");
        assert!(logged[3].len() <= MAX_LINE_BYTES && logged[3].ends_with('…'), "{}", logged[3]);
        let kept = captured.bytes.len();
        assert_eq!(kept, MAX_CAPTURED);
        assert_eq!(logged[4], format!("… {} more bytes not kept", first.len()));
        assert_eq!(logged.len(), 5);
    }
}
