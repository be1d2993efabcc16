//! Follows the providers file: when its content changes, it is read and
//! validated again and the registry made to serve it
//! ([`Registry::reconfigure`]), so entries are added, edited and removed
//! without a restart.
//!
//! A file that does not read, parse or validate changes nothing: the error
//! (naming the entry and key) is logged and every entry keeps serving what
//! it had, until the file changes again.
//!
//! The file is polled by content rather than watched for events: a mounted
//! ConfigMap changes by swapping a link in its directory, and a network
//! volume may deliver no events at all. Reading a file of a few KiB every
//! few seconds costs nothing.
//!
//! Every [`ProvidersWatchOptions::retry_failed`] the entries that serve
//! nothing and name Secrets are bound again once those read
//! ([`Registry::retry_failed`]): a Secret may have been created since,
//! with no change of the file.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use proxyfleet_core::liveness::{Heartbeat, Watchdog};

use crate::config::ProvidersConfig;
use crate::plugin::file_digest;
use crate::registry::Registry;

/// How [`follow_providers_file`] follows.
#[derive(Debug, Clone)]
pub struct ProvidersWatchOptions {
    /// How often the file is read.
    pub interval: Duration,
    /// How often entries that serve nothing for want of a Secret are
    /// bound again.
    pub retry_failed: Duration,
    /// Where each look beats (as `providers file`), so `/livez` fails when
    /// looks stop ending.
    pub watchdog: Option<Watchdog>,
}

impl Default for ProvidersWatchOptions {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(5),
            retry_failed: Duration::from_secs(30),
            watchdog: None,
        }
    }
}

/// The running follower; dropping it stops it.
#[derive(Debug)]
pub struct ProvidersWatchHandle {
    task: tokio::task::JoinHandle<()>,
    heartbeat: Option<Arc<Heartbeat>>,
}

impl Drop for ProvidersWatchHandle {
    fn drop(&mut self) {
        // Stopped on purpose: not a stall.
        if let Some(heartbeat) = &self.heartbeat {
            heartbeat.retire();
        }
        self.task.abort();
    }
}

/// Follows `path`, the providers file `registry` was loaded from with
/// `loaded` as its content, until the handle is dropped.
///
/// Must be called within a Tokio runtime.
pub fn follow_providers_file(
    registry: Arc<Registry>,
    path: PathBuf,
    loaded: &ProvidersConfig,
    options: ProvidersWatchOptions,
) -> ProvidersWatchHandle {
    let heartbeat = options.watchdog.as_ref().map(|w| Arc::new(w.expect_beats("providers file")));
    let beats = heartbeat.clone();
    let registries = loaded.registries.clone();
    let task = tokio::spawn(async move {
        // The first look applies the file as it is then: it may have
        // changed since the registry was loaded from it (an unchanged file
        // changes no entry).
        let mut last = None;
        let mut ticker = tokio::time::interval(options.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut retried = tokio::time::Instant::now();
        loop {
            ticker.tick().await;
            let now = read_digest(&path).await;
            if now.is_some() && now != last {
                let first = last.is_none();
                last = now;
                reload(&registry, &path, &registries, first).await;
            }
            if retried.elapsed() >= options.retry_failed {
                retried = tokio::time::Instant::now();
                for entry in registry.retry_failed().await {
                    tracing::info!(entry = %entry, "provider entry serves now, bound again");
                }
            }
            if let Some(beats) = &beats {
                beats.beat();
            }
        }
    });
    ProvidersWatchHandle { task, heartbeat }
}

/// The file's sha256, or `None` when it cannot be read now (a ConfigMap
/// between two links): a file that is briefly missing is not a change.
async fn read_digest(path: &std::path::Path) -> Option<String> {
    tokio::fs::read(path).await.ok().map(|bytes| file_digest(&bytes))
}

async fn reload(
    registry: &Registry,
    path: &std::path::Path,
    registries: &proxyfleet_oci::Registries,
    first: bool,
) {
    let config = match ProvidersConfig::load(path) {
        Ok(config) => config,
        Err(err) => {
            tracing::error!(
                "the providers file changed and is refused; every entry keeps serving what it \
                 had: {err}"
            );
            return;
        }
    };
    if &config.registries != registries {
        tracing::warn!(
            file = %path.display(),
            "the providers file's `registries` changed: registries are read at start, so this \
             takes effect when the operator restarts"
        );
    }
    for entry in &config.entries {
        for warning in entry.warnings() {
            tracing::warn!(entry = %entry.name, "{warning}");
        }
    }
    // Each entry's change is logged where it is made.
    let changes = registry.reconfigure(&config).await;
    if first && changes.is_empty() {
        return;
    }
    tracing::info!(
        file = %path.display(),
        entries_changed = changes.len(),
        "the providers file changed and was applied"
    );
}
