//! Which due Proxies are reconciled now.
//!
//! Each provider entry has its own bound: at most its `limits.concurrency`
//! reconciles in flight, which is as many provider calls as the runtime
//! lets it have open at once. So convergence runs at the speed each entry's
//! limits allow, and an entry whose backend is slow fills only its own
//! slots: the others' Proxies keep starting.
//!
//! Within an entry, passes that finish work already begun (an instance
//! starting or going away) go ahead of those that would begin new work,
//! taking every other slot while both wait: a fleet of thousands comes up
//! a slot's worth at a time, each Proxy Running soon after its create,
//! instead of every create first and then every poll, with nothing Running
//! until the last create is done. Every other slot, not every one: the
//! polls of many slow-booting instances would otherwise hold back new
//! creates for as long as the boots take.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::future::Future;

use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt as _, StreamExt as _};

/// The bound for a Proxy naming an entry the providers file does not have:
/// its reconcile only reports the entry missing.
pub const UNKNOWN_ENTRY_CONCURRENCY: usize = 4;

/// Whether a pass finishes begun work or begins new work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Turn {
    /// Finishes work begun: goes ahead of the [`Turn::Behind`] passes,
    /// taking every other slot while both wait.
    Ahead,
    /// Begins new work, or only looks again.
    Behind,
}

/// One entry's waiting passes, each line in the order they became due.
struct Line<T> {
    ahead: VecDeque<(String, T)>,
    behind: VecDeque<(String, T)>,
    /// Whether the last pass started came from `ahead`.
    last_ahead: bool,
}

impl<T> Default for Line<T> {
    fn default() -> Self {
        Self { ahead: VecDeque::new(), behind: VecDeque::new(), last_ahead: false }
    }
}

impl<T> Line<T> {
    /// The next pass: from `ahead` unless the last one was and `behind`
    /// has one waiting.
    fn pop(&mut self) -> Option<(String, T)> {
        let from_ahead = !self.ahead.is_empty() && (!self.last_ahead || self.behind.is_empty());
        self.last_ahead = from_ahead;
        if from_ahead { self.ahead.pop_front() } else { self.behind.pop_front() }
    }

    fn is_empty(&self) -> bool {
        self.ahead.is_empty() && self.behind.is_empty()
    }
}

/// Reconciles waiting for a slot of their entry and reconciles in flight.
/// A Proxy is in it at most once: waiting or running, it is busy.
pub(crate) struct Dispatch<'a, T> {
    /// By entry.
    waiting: BTreeMap<String, Line<T>>,
    running: FuturesUnordered<BoxFuture<'a, (String, String)>>,
    per_entry: HashMap<String, usize>,
    busy: HashSet<String>,
}

impl<'a, T> Dispatch<'a, T> {
    pub(crate) fn new() -> Self {
        Self {
            waiting: BTreeMap::new(),
            running: FuturesUnordered::new(),
            per_entry: HashMap::new(),
            busy: HashSet::new(),
        }
    }

    /// Whether `key` is waiting or running.
    pub(crate) fn is_busy(&self, key: &str) -> bool {
        self.busy.contains(key)
    }

    /// Puts the reconcile of `key` through `entry` in line, ahead or
    /// behind; it starts once the entry has room. A busy key is not queued
    /// twice.
    pub(crate) fn queue(&mut self, key: String, entry: String, item: T, turn: Turn) {
        if self.busy.insert(key.clone()) {
            let line = self.waiting.entry(entry).or_default();
            match turn {
                Turn::Ahead => line.ahead.push_back((key, item)),
                Turn::Behind => line.behind.push_back((key, item)),
            }
        }
    }

    /// Starts what waits, as far as each entry's bound (`limit` of the
    /// entry, at least 1) allows; `work` makes the reconcile of one key.
    pub(crate) fn start<F>(
        &mut self,
        limit: impl Fn(&str) -> usize,
        mut work: impl FnMut(String, T) -> F,
    ) where
        F: Future<Output = ()> + Send + 'a,
    {
        for (entry, queue) in &mut self.waiting {
            let bound = limit(entry).max(1);
            let count = self.per_entry.entry(entry.clone()).or_default();
            while *count < bound {
                let Some((key, item)) = queue.pop() else { break };
                *count += 1;
                let (done_key, done_entry) = (key.clone(), entry.clone());
                self.running.push(work(key, item).map(move |()| (done_key, done_entry)).boxed());
            }
        }
        self.waiting.retain(|_, queue| !queue.is_empty());
        self.per_entry.retain(|_, count| *count > 0);
    }

    /// Waits for the next reconcile to end and returns its key, no longer
    /// busy; `None` when none is running (some may still wait: call
    /// [`Dispatch::start`]).
    pub(crate) async fn next(&mut self) -> Option<String> {
        let (key, entry) = self.running.next().await?;
        if let Some(count) = self.per_entry.get_mut(&entry) {
            *count -= 1;
            if *count == 0 {
                self.per_entry.remove(&entry);
            }
        }
        self.busy.remove(&key);
        Some(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(entry: &str) -> usize {
        if entry == "slow" { 1 } else { 3 }
    }

    #[tokio::test]
    async fn each_entry_is_held_to_its_own_bound() {
        let (slow_tx, waiting) = tokio::sync::oneshot::channel::<()>();
        let mut waiting = Some(waiting);
        let mut dispatch: Dispatch<'_, ()> = Dispatch::new();
        for key in ["ns/slow-1", "ns/slow-2"] {
            dispatch.queue(key.into(), "slow".into(), (), Turn::Behind);
        }
        for i in 0..4 {
            dispatch.queue(format!("ns/fast-{i}"), "fast".into(), (), Turn::Behind);
        }
        dispatch.queue("ns/fast-0".into(), "fast".into(), (), Turn::Behind);
        // The slow entry's one slot is taken by a reconcile that waits; the
        // other entry still starts three of its own.
        let mut started = Vec::new();
        dispatch.start(limits, |key, ()| {
            started.push(key.clone());
            let wait = if key == "ns/slow-1" { waiting.take() } else { None };
            async move {
                if let Some(wait) = wait {
                    let _ = wait.await;
                }
            }
        });
        assert_eq!(started, ["ns/fast-0", "ns/fast-1", "ns/fast-2", "ns/slow-1"]);
        assert!(dispatch.is_busy("ns/fast-3") && dispatch.is_busy("ns/slow-2"));
        let mut ended = Vec::new();
        for _ in 0..3 {
            ended.push(dispatch.next().await.expect("a fast one ends"));
        }
        ended.sort();
        assert_eq!(ended, ["ns/fast-0", "ns/fast-1", "ns/fast-2"]);
        assert!(!dispatch.is_busy("ns/fast-0"), "an ended reconcile is no longer busy");

        let mut started = Vec::new();
        dispatch.start(limits, |key, ()| {
            started.push(key);
            async {}
        });
        assert_eq!(started, ["ns/fast-3"], "the slow entry is still full");
        assert_eq!(dispatch.next().await.as_deref(), Some("ns/fast-3"));
        slow_tx.send(()).expect("the slow reconcile waits");
        assert_eq!(dispatch.next().await.as_deref(), Some("ns/slow-1"));
        assert_eq!(dispatch.next().await, None, "slow-2 waits to be started");
        assert!(dispatch.is_busy("ns/slow-2"));
        dispatch.start(limits, |_, ()| async {});
        assert_eq!(dispatch.next().await.as_deref(), Some("ns/slow-2"));
        assert!(!dispatch.is_busy("ns/slow-2"));
    }

    #[tokio::test]
    async fn begun_work_goes_ahead_of_new_work_in_its_entry_taking_every_other_slot() {
        let mut dispatch: Dispatch<'_, ()> = Dispatch::new();
        for i in 0..3 {
            dispatch.queue(format!("ns/new-{i}"), "slow".into(), (), Turn::Behind);
        }
        for i in 0..3 {
            dispatch.queue(format!("ns/starting-{i}"), "slow".into(), (), Turn::Ahead);
        }
        dispatch.queue("ns/other".into(), "fast".into(), (), Turn::Behind);
        let mut order = Vec::new();
        loop {
            dispatch.start(limits, |key, ()| {
                order.push(key);
                async {}
            });
            if dispatch.next().await.is_none() {
                break;
            }
        }
        let slow: Vec<&str> =
            order.iter().map(String::as_str).filter(|key| !key.ends_with("other")).collect();
        assert_eq!(
            slow,
            ["ns/starting-0", "ns/new-0", "ns/starting-1", "ns/new-1", "ns/starting-2", "ns/new-2"]
        );
        assert!(order.contains(&"ns/other".to_owned()), "the other entry's pass runs too");
    }
}
