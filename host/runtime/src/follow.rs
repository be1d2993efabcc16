//! Following `oci://` plugin references: each tag is resolved again every
//! poll interval, and a new build is pulled into the store and offered to
//! the entries by a [`Registry::rescan`], through the same admission as a
//! file. A digest reference is pulled once and never asked about again.
//!
//! A failed look is retried sooner, doubling from one second up to the poll
//! interval (at most five minutes), and changes nothing that serves: the
//! store keeps the last build, and an entry keeps its active revision. A
//! build refused before it is read (its layout, size or digests) is listed
//! among the entries' refused candidates and not pulled again until the
//! tag moves.

use std::sync::Arc;
use std::time::Duration;

use proxyfleet_oci::PluginReference;

use crate::oci::PollError;
use crate::registry::Registry;

/// The default time between two looks at a tag.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(60);
/// The first retry after a failed look.
const FIRST_RETRY: Duration = Duration::from_secs(1);
/// The longest wait after failed looks.
const MAX_RETRY: Duration = Duration::from_secs(300);

/// How references are followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FollowOptions {
    /// Time between two looks at a tag.
    pub poll_interval: Duration,
}

impl Default for FollowOptions {
    fn default() -> Self {
        Self { poll_interval: DEFAULT_POLL_INTERVAL }
    }
}

/// The running followers; dropping it (or [`FollowHandle::stop`]) stops them.
#[derive(Debug)]
pub struct FollowHandle {
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl FollowHandle {
    /// Stops following and waits until a look under way has ended.
    pub async fn stop(mut self) {
        for task in std::mem::take(&mut self.tasks) {
            task.abort();
            // Its only outcome is having been cancelled.
            let _ = task.await;
        }
    }
}

impl Drop for FollowHandle {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl Registry {
    /// Follows every `oci://` reference the entries name until the handle
    /// is dropped, starting once the first load has settled. Must be called
    /// within a Tokio runtime.
    pub fn follow(self: &Arc<Self>, options: FollowOptions) -> FollowHandle {
        let tasks = self
            .oci_references()
            .iter()
            .map(|reference| tokio::spawn(follow(Arc::clone(self), reference.clone(), options)))
            .collect();
        FollowHandle { tasks }
    }
}

async fn follow(registry: Arc<Registry>, reference: PluginReference, options: FollowOptions) {
    registry.wait_loaded().await;
    let mut failures: u32 = 0;
    loop {
        let wait = match registry.poll_reference(&reference).await {
            Ok(moved) => {
                failures = 0;
                if moved {
                    registry.rescan().await;
                }
                if !reference.follows_tag() {
                    return;
                }
                options.poll_interval
            }
            Err(PollError::Refused { manifest_digest, source }) => {
                tracing::warn!(
                    plugin = %reference,
                    manifest = %manifest_digest,
                    "refused the build the reference names; what serves keeps serving: {source}"
                );
                registry.reject_pulled(&reference, &manifest_digest, &source.to_string());
                failures = 0;
                if !reference.follows_tag() {
                    return;
                }
                options.poll_interval
            }
            Err(PollError::Registry(err)) => {
                failures = failures.saturating_add(1);
                let wait = retry_after(failures, options.poll_interval);
                tracing::warn!(
                    plugin = %reference,
                    failures,
                    retry_in = ?wait,
                    "cannot look at the plugin's registry; what serves keeps serving: {err}"
                );
                wait
            }
        };
        tokio::time::sleep(wait).await;
    }
}

/// The wait after `failures` failed looks in a row: one second, doubling,
/// up to the poll interval and never over five minutes.
fn retry_after(failures: u32, poll_interval: Duration) -> Duration {
    let doubled = FIRST_RETRY.saturating_mul(1 << failures.saturating_sub(1).min(16));
    doubled.min(poll_interval.min(MAX_RETRY)).max(FIRST_RETRY.min(poll_interval))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_double_from_a_second_up_to_the_poll_interval() {
        let minute = Duration::from_secs(60);
        let waits: Vec<u64> = (1..=8).map(|n| retry_after(n, minute).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(retry_after(40, Duration::from_secs(3600)), MAX_RETRY);
        assert_eq!(retry_after(3, Duration::from_millis(200)), Duration::from_millis(200));
    }
}
