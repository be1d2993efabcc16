//! Which due Proxies are reconciled now.
//!
//! Each provider entry has its own bound: at most its `limits.concurrency`
//! reconciles in flight, which is as many provider calls as the runtime
//! lets it have open at once. So convergence runs at the speed each entry's
//! limits allow, and an entry whose backend is slow fills only its own
//! slots: the others' Proxies keep starting.

use std::collections::HashMap;
use std::future::Future;

use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt as _, StreamExt as _};

/// The bound for a Proxy naming an entry the providers file does not have:
/// its reconcile only reports the entry missing.
pub(crate) const UNKNOWN_ENTRY_CONCURRENCY: usize = 4;

/// Reconciles in flight, each yielding its Proxy's key and entry.
pub(crate) struct Dispatch<'a> {
    running: FuturesUnordered<BoxFuture<'a, (String, String)>>,
    per_entry: HashMap<String, usize>,
}

impl<'a> Dispatch<'a> {
    pub(crate) fn new() -> Self {
        Self { running: FuturesUnordered::new(), per_entry: HashMap::new() }
    }

    /// Whether `entry` has fewer than `limit` reconciles in flight.
    pub(crate) fn has_room(&self, entry: &str, limit: usize) -> bool {
        self.per_entry.get(entry).copied().unwrap_or(0) < limit.max(1)
    }

    /// Starts `work`, the reconcile of `key` through `entry`.
    pub(crate) fn start(
        &mut self,
        key: String,
        entry: String,
        work: impl Future<Output = ()> + Send + 'a,
    ) {
        *self.per_entry.entry(entry.clone()).or_default() += 1;
        self.running.push(work.map(move |()| (key, entry)).boxed());
    }

    /// Waits for the next reconcile to end and returns its key; `None` when
    /// none is in flight.
    pub(crate) async fn next(&mut self) -> Option<String> {
        let (key, entry) = self.running.next().await?;
        if let Some(count) = self.per_entry.get_mut(&entry) {
            *count -= 1;
            if *count == 0 {
                self.per_entry.remove(&entry);
            }
        }
        Some(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn each_entry_is_held_to_its_own_bound() {
        let (slow_tx, waiting) = tokio::sync::oneshot::channel::<()>();
        let mut dispatch = Dispatch::new();
        // The slow entry's one slot is taken by a reconcile that waits.
        assert!(dispatch.has_room("slow", 1));
        dispatch.start("ns/slow-1".into(), "slow".into(), async move {
            let _ = waiting.await;
        });
        assert!(!dispatch.has_room("slow", 1), "the slow entry is full");
        // The other entry still starts its own.
        for i in 0..3 {
            assert!(dispatch.has_room("fast", 3));
            dispatch.start(format!("ns/fast-{i}"), "fast".into(), async {});
        }
        assert!(!dispatch.has_room("fast", 3));
        let mut ended = Vec::new();
        for _ in 0..3 {
            ended.push(dispatch.next().await.expect("a fast one ends"));
        }
        ended.sort();
        assert_eq!(ended, ["ns/fast-0", "ns/fast-1", "ns/fast-2"]);
        assert!(dispatch.has_room("fast", 3) && !dispatch.has_room("slow", 1));
        slow_tx.send(()).expect("the slow reconcile waits");
        assert_eq!(dispatch.next().await.as_deref(), Some("ns/slow-1"));
        assert!(dispatch.has_room("slow", 1));
        assert_eq!(dispatch.next().await, None);
    }
}
