//! Stopping on a signal: SIGTERM, which the kubelet sends a Pod's
//! containers before it kills them at the end of the grace period, and
//! SIGINT, a terminal's Ctrl-C. Either cancels one token that every part
//! of the process stops on.

use anyhow::Context as _;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

/// A token cancelled on the first SIGTERM or SIGINT. Installed before the
/// slow parts of start-up, so that a signal then is not fatal.
pub fn on_signal() -> anyhow::Result<CancellationToken> {
    let token = CancellationToken::new();
    let mut terminate = signal(SignalKind::terminate()).context("cannot watch for SIGTERM")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot watch for SIGINT")?;
    let cancel = token.clone();
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = terminate.recv() => "SIGTERM",
            _ = interrupt.recv() => "SIGINT",
        };
        tracing::info!(signal = name, "shutting down");
        cancel.cancel();
    });
    Ok(token)
}
