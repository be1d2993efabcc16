//! Hot swap of provider plugins: watches the plugin directory and runs
//! [`Registry::rescan`] whenever something in it changes, and periodically
//! in case a change went unnoticed.
//!
//! Changes are recognised by content (the sha256 of each file, links
//! followed), never by the kind of event: a mounted ConfigMap changes by
//! swapping its `..data` link to a new timestamped directory, which shows
//! in the watched directory only as links created and renamed, and an
//! overlay or network volume may deliver no events at all.

use std::sync::Arc;
use std::time::Duration;

use notify::{EventKind, RecursiveMode, Watcher as _};
use proxyfleet_core::liveness::{Heartbeat, Watchdog};
use tokio::sync::Notify;

use crate::registry::Registry;

/// How a [`WatchHandle`] watches.
#[derive(Debug, Clone)]
pub struct WatchOptions {
    /// Rescans this often even without events.
    pub rescan_interval: Duration,
    /// After an event, waits until none came for this long (at most ten
    /// times as long) before rescanning, so a file still being written is
    /// read once it is complete rather than refused half-written.
    pub settle: Duration,
    /// Where each rescan beats (as `plugin watcher`), so `/livez` fails
    /// when rescans stop ending.
    pub watchdog: Option<Watchdog>,
}

impl Default for WatchOptions {
    fn default() -> Self {
        Self {
            rescan_interval: Duration::from_secs(5),
            settle: Duration::from_millis(100),
            watchdog: None,
        }
    }
}

/// The running watcher; dropping it (or [`WatchHandle::stop`]) stops it.
#[derive(Debug)]
pub struct WatchHandle {
    task: tokio::task::JoinHandle<()>,
    heartbeat: Option<Arc<Heartbeat>>,
}

impl WatchHandle {
    /// Stops watching and waits until a rescan under way has ended.
    pub async fn stop(mut self) {
        self.task.abort();
        // Its only outcome is having been cancelled.
        let _ = (&mut self.task).await;
    }
}

impl Drop for WatchHandle {
    fn drop(&mut self) {
        // Stopped on purpose: not a stall.
        if let Some(heartbeat) = &self.heartbeat {
            heartbeat.retire();
        }
        self.task.abort();
    }
}

/// Watches `registry`'s plugin directory until the handle is dropped. It
/// rescans once at the start, catching what changed since the registry was
/// loaded. When the directory cannot be watched (no inotify instances
/// left, an unsupported filesystem), it only rescans periodically.
///
/// Must be called within a Tokio runtime.
pub fn spawn_watcher(registry: Arc<Registry>, options: WatchOptions) -> WatchHandle {
    let wake = Arc::new(Notify::new());
    let watcher = watch_dir(&registry, Arc::clone(&wake));
    let heartbeat = options.watchdog.as_ref().map(|w| Arc::new(w.expect_beats("plugin watcher")));
    let beats = heartbeat.clone();
    let task = tokio::spawn(async move {
        // Owned by the task: events stop when it ends.
        let _watcher = watcher;
        let mut ticker = tokio::time::interval(options.rescan_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        loop {
            registry.rescan().await;
            if let Some(beats) = &beats {
                beats.beat();
            }
            tokio::select! {
                () = wake.notified() => settle(&wake, options.settle).await,
                _ = ticker.tick() => {}
            }
        }
    });
    WatchHandle { task, heartbeat }
}

impl Registry {
    /// [`spawn_watcher`] for this registry.
    pub fn watch(self: &Arc<Self>, options: WatchOptions) -> WatchHandle {
        spawn_watcher(Arc::clone(self), options)
    }
}

fn watch_dir(registry: &Registry, wake: Arc<Notify>) -> Option<notify::RecommendedWatcher> {
    let dir = registry.plugin_dir();
    let handler = move |event: notify::Result<notify::Event>| match event {
        // The rescan's own reads show up as accesses.
        Ok(event) if matches!(event.kind, EventKind::Access(_)) => {}
        Ok(_) => wake.notify_one(),
        Err(err) => {
            tracing::warn!("plugin directory watch: {err}; rescanning");
            wake.notify_one();
        }
    };
    let watched = notify::recommended_watcher(handler)
        .and_then(|mut watcher| watcher.watch(dir, RecursiveMode::NonRecursive).map(|()| watcher));
    match watched {
        Ok(watcher) => Some(watcher),
        Err(err) => {
            tracing::warn!(
                "cannot watch plugin directory {}: {err}; relying on periodic rescans",
                dir.display()
            );
            None
        }
    }
}

/// Returns once `quiet` passed without another wake-up, or after ten times
/// `quiet` in any case.
async fn settle(wake: &Notify, quiet: Duration) {
    let give_up = tokio::time::Instant::now() + quiet * 10;
    loop {
        tokio::select! {
            () = wake.notified() => {
                if tokio::time::Instant::now() >= give_up {
                    return;
                }
            }
            () = tokio::time::sleep(quiet) => return,
        }
    }
}
