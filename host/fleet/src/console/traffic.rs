//! The gateway's traffic over time: its counters sampled every
//! [`EVERY`] for the last [`KEPT`], so the console can show rates now and
//! over the hour without a metrics server.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use proxyfleet_metrics::{GatewayMetrics, GatewayTotals};

/// How often the counters are read.
pub const EVERY: Duration = Duration::from_secs(5);

/// How far back samples are kept.
pub const KEPT: Duration = Duration::from_secs(3600);

/// The window the current rate is taken over.
const RATE_WINDOW: Duration = Duration::from_secs(30);

/// Samples of the gateway's counters.
#[derive(Debug)]
pub struct Traffic {
    gateway: GatewayMetrics,
    samples: Mutex<VecDeque<(Instant, GatewayTotals)>>,
}

/// Rates over a window, per second.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Rates {
    /// Requests through an upstream.
    pub requests: f64,
    /// Upstream errors and requests the gateway refused.
    pub errors: f64,
    /// The window they were taken over; zero before two samples exist.
    pub over: Duration,
}

impl Traffic {
    /// No samples yet.
    pub fn new(gateway: GatewayMetrics) -> Self {
        Self { gateway, samples: Mutex::default() }
    }

    /// Reads the counters every [`EVERY`] until aborted.
    pub fn spawn(self: Arc<Self>) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(EVERY);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                self.sample(Instant::now());
            }
        })
    }

    /// Takes one sample at `now`.
    pub fn sample(&self, now: Instant) {
        let totals = self.gateway.totals();
        let mut samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        samples.push_back((now, totals));
        while samples.front().is_some_and(|(at, _)| now.duration_since(*at) > KEPT) {
            samples.pop_front();
        }
    }

    /// The rates over the last [`RATE_WINDOW`] (or as much of it as was
    /// sampled), up to the counters now.
    pub fn rates(&self) -> Rates {
        let now = Instant::now();
        let latest = self.gateway.totals();
        let samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        let Some((at, earlier)) = samples
            .iter()
            .find(|(at, _)| now.duration_since(*at) <= RATE_WINDOW)
            .or_else(|| samples.back())
        else {
            return Rates::default();
        };
        let over = now.duration_since(*at);
        if over.is_zero() {
            return Rates::default();
        }
        let per_second = |later: u64, earlier: u64| {
            #[expect(clippy::cast_precision_loss, reason = "a rate for display")]
            let delta = later.saturating_sub(earlier) as f64;
            delta / over.as_secs_f64()
        };
        Rates {
            requests: per_second(latest.requests, earlier.requests),
            errors: per_second(
                latest.upstream_errors + latest.refused,
                earlier.upstream_errors + earlier.refused,
            ),
            over,
        }
    }

    /// The counters now.
    pub fn totals(&self) -> GatewayTotals {
        self.gateway.totals()
    }
}
