//! Liveness: a watchdog of heartbeats, so that `/livez` fails when a loop
//! of the operator has stopped making progress and a restart would help.
//!
//! Each long-running part registers a [`Heartbeat`] of one of two kinds:
//! - a **loop** ([`Watchdog::expect_beats`]) beats at the end of every
//!   round and is stalled when no round ended within its bound (the health
//!   engine, the plugin watcher, housekeeping);
//! - **passes** ([`Watchdog::expect_passes`]) mark each unit of work with a
//!   [`Pass`] and are stalled when one of them has been running longer than
//!   the bound (the reconcilers: idle with no work is healthy, one pass stuck
//!   among hundreds that finish is not).
//!
//! A part that stops on purpose (the leader's loops when leadership is
//! lost) calls [`Heartbeat::retire`]; a heartbeat dropped without it (its
//! task panicked or returned early) leaves its part reported as ended, so
//! a dead loop fails the probe instead of vanishing from it.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long a part may go without progress by default: above the default
/// provider call timeout (60 s) several times over, since a pass makes
/// several calls, and above the compile of a large plugin on two cores.
pub const DEFAULT_BOUND: Duration = Duration::from_secs(300);

/// Where the operator's parts register their heartbeats; cheap to clone.
#[derive(Debug, Clone)]
pub struct Watchdog {
    parts: Arc<Mutex<Parts>>,
    bound: Duration,
}

impl Default for Watchdog {
    fn default() -> Self {
        Self::new(DEFAULT_BOUND)
    }
}

#[derive(Debug, Default)]
struct Parts {
    next_id: u64,
    parts: BTreeMap<u64, Part>,
}

#[derive(Debug)]
struct Part {
    name: &'static str,
    bound: Duration,
    kind: Kind,
    /// When the part ended without retiring.
    ended: Option<Instant>,
}

#[derive(Debug)]
enum Kind {
    Beats { last: Instant },
    Passes { next_pass: u64, running: BTreeMap<u64, Instant> },
}

/// A part that has stopped making progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stall {
    /// The part, as it registered.
    pub part: &'static str,
    /// What is wrong with it.
    pub what: StallKind,
    /// Its bound.
    pub bound: Duration,
}

/// How a part stalled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StallKind {
    /// A loop whose last round ended this long ago.
    NoRound(Duration),
    /// A pass running for this long.
    PassRunning(Duration),
    /// The part's task ended without retiring, this long ago.
    Ended(Duration),
}

impl fmt::Display for Stall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bound = self.bound.as_secs();
        match self.what {
            StallKind::NoRound(for_) => write!(
                f,
                "{}: no round ended for {} s (bound {bound} s)",
                self.part,
                for_.as_secs()
            ),
            StallKind::PassRunning(for_) => write!(
                f,
                "{}: a pass has been running for {} s (bound {bound} s)",
                self.part,
                for_.as_secs()
            ),
            StallKind::Ended(ago) => {
                write!(f, "{}: its task ended {} s ago without stopping", self.part, ago.as_secs())
            }
        }
    }
}

impl Watchdog {
    /// A watchdog with no parts (live), whose parts may go `bound` without
    /// progress.
    pub fn new(bound: Duration) -> Self {
        Self { parts: Arc::default(), bound }
    }

    /// How long a part may go without progress.
    pub fn bound(&self) -> Duration {
        self.bound
    }

    /// Registers a loop that must end a round (call [`Heartbeat::beat`])
    /// at least every bound, counting from now.
    pub fn expect_beats(&self, name: &'static str) -> Heartbeat {
        self.register(name, Kind::Beats { last: Instant::now() })
    }

    /// Registers work done in passes ([`Heartbeat::pass`]), none of which
    /// may run longer than the bound.
    pub fn expect_passes(&self, name: &'static str) -> Heartbeat {
        self.register(name, Kind::Passes { next_pass: 0, running: BTreeMap::new() })
    }

    fn register(&self, name: &'static str, kind: Kind) -> Heartbeat {
        let mut parts = self.lock();
        let id = parts.next_id;
        parts.next_id += 1;
        parts.parts.insert(id, Part { name, bound: self.bound, kind, ended: None });
        Heartbeat { watchdog: self.clone(), id, retired: AtomicBool::new(false) }
    }

    /// The parts stalled now.
    pub fn stalls(&self) -> Vec<Stall> {
        self.stalls_at(Instant::now())
    }

    /// The parts stalled at `now`.
    pub fn stalls_at(&self, now: Instant) -> Vec<Stall> {
        let parts = self.lock();
        let mut stalls = Vec::new();
        for part in parts.parts.values() {
            let what = if let Some(ended) = part.ended {
                Some(StallKind::Ended(now.saturating_duration_since(ended)))
            } else {
                match &part.kind {
                    Kind::Beats { last } => {
                        let silent = now.saturating_duration_since(*last);
                        (silent > part.bound).then_some(StallKind::NoRound(silent))
                    }
                    // Pass ids grow with time: the first running one is the
                    // oldest.
                    Kind::Passes { running, .. } => running.values().next().and_then(|started| {
                        let running = now.saturating_duration_since(*started);
                        (running > part.bound).then_some(StallKind::PassRunning(running))
                    }),
                }
            };
            if let Some(what) = what {
                stalls.push(Stall { part: part.name, what, bound: part.bound });
            }
        }
        stalls
    }

    /// The names of the parts registered now, in registration order.
    pub fn parts(&self) -> Vec<&'static str> {
        self.lock().parts.values().map(|part| part.name).collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Parts> {
        // The state stays consistent across a panic: every change is one
        // assignment.
        self.parts.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One part's registration; see the module docs.
#[derive(Debug)]
pub struct Heartbeat {
    watchdog: Watchdog,
    id: u64,
    retired: AtomicBool,
}

impl Heartbeat {
    /// Marks the end of a round of a loop.
    pub fn beat(&self) {
        if let Some(Part { kind: Kind::Beats { last }, .. }) =
            self.watchdog.lock().parts.get_mut(&self.id)
        {
            *last = Instant::now();
        }
    }

    /// Marks the start of a pass; it ends when the guard drops.
    pub fn pass(&self) -> Pass {
        let mut parts = self.watchdog.lock();
        let pass = match parts.parts.get_mut(&self.id) {
            Some(Part { kind: Kind::Passes { next_pass, running }, .. }) => {
                let pass = *next_pass;
                *next_pass += 1;
                running.insert(pass, Instant::now());
                Some(pass)
            }
            _ => None,
        };
        Pass { watchdog: self.watchdog.clone(), part: self.id, pass }
    }

    /// Stops watching this part: it ended on purpose. Shared heartbeats
    /// (one reconciler's, in the context of every pass) retire once.
    pub fn retire(&self) {
        self.retired.store(true, Ordering::Release);
        self.watchdog.lock().parts.remove(&self.id);
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        if !self.retired.load(Ordering::Acquire)
            && let Some(part) = self.watchdog.lock().parts.get_mut(&self.id)
        {
            part.ended = Some(Instant::now());
        }
    }
}

/// A pass in progress; see [`Heartbeat::pass`].
#[derive(Debug)]
pub struct Pass {
    watchdog: Watchdog,
    part: u64,
    pass: Option<u64>,
}

impl Drop for Pass {
    fn drop(&mut self) {
        if let Some(pass) = self.pass
            && let Some(Part { kind: Kind::Passes { running, .. }, .. }) =
                self.watchdog.lock().parts.get_mut(&self.part)
        {
            running.remove(&pass);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUND: Duration = Duration::from_secs(60);

    #[test]
    fn a_loop_stalls_when_no_round_ends_within_its_bound() {
        let watchdog = Watchdog::new(BOUND);
        let heartbeat = watchdog.expect_beats("health engine");
        let start = Instant::now();
        assert!(watchdog.stalls_at(start + BOUND / 2).is_empty());
        let stalls = watchdog.stalls_at(start + BOUND * 2);
        assert_eq!(stalls.len(), 1);
        assert_eq!(stalls[0].part, "health engine");
        assert!(
            matches!(stalls[0].what, StallKind::NoRound(d) if d >= BOUND * 2 - Duration::from_secs(1))
        );
        assert!(stalls[0].to_string().starts_with("health engine: no round ended for 1"));
        heartbeat.beat();
        assert!(watchdog.stalls_at(Instant::now() + BOUND / 2).is_empty());
        heartbeat.retire();
    }

    #[test]
    fn passes_stall_only_while_one_runs_past_the_bound() {
        let watchdog = Watchdog::new(BOUND);
        let reconciler = watchdog.expect_passes("proxy reconciler");
        // Idle for long: no work is no stall.
        assert!(watchdog.stalls_at(Instant::now() + BOUND * 10).is_empty());
        let stuck = reconciler.pass();
        for _ in 0..3 {
            drop(reconciler.pass());
        }
        let later = Instant::now() + BOUND * 2;
        let stalls = watchdog.stalls_at(later);
        assert_eq!(stalls.len(), 1, "{stalls:?}");
        assert!(matches!(stalls[0].what, StallKind::PassRunning(_)));
        drop(stuck);
        assert!(watchdog.stalls_at(later).is_empty());
        reconciler.retire();
    }

    #[test]
    fn a_part_retired_is_forgotten_and_one_dropped_is_reported_ended() {
        let watchdog = Watchdog::new(BOUND);
        let leader_loop = watchdog.expect_beats("housekeeping");
        let watcher = watchdog.expect_beats("plugin watcher");
        assert_eq!(watchdog.parts(), ["housekeeping", "plugin watcher"]);
        leader_loop.retire();
        drop(watcher);
        let stalls = watchdog.stalls();
        assert_eq!(stalls.len(), 1);
        assert_eq!(stalls[0].part, "plugin watcher");
        assert!(matches!(stalls[0].what, StallKind::Ended(_)));
        assert!(stalls[0].to_string().contains("ended"), "{}", stalls[0]);
    }

    #[test]
    fn a_pass_outliving_its_retired_part_changes_nothing() {
        let watchdog = Watchdog::new(BOUND);
        let reconciler = watchdog.expect_passes("proxy reconciler");
        let pass = reconciler.pass();
        reconciler.retire();
        drop(pass);
        assert!(watchdog.parts().is_empty());
    }
}
