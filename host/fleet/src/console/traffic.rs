//! The gateway's traffic over time: its counters, open sessions and
//! per-site bans sampled every [`EVERY`] for the last [`KEPT`], so the
//! console can show rates now and charts over the hour without a metrics
//! server.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use proxyfleet_metrics::{ADDED_BUCKETS, GatewayTotals};

use crate::catalog::Fleet;

/// How often the counters are read.
pub const EVERY: Duration = Duration::from_secs(5);

/// How far back samples are kept.
pub const KEPT: Duration = Duration::from_secs(3600);

/// The window the current rate is taken over.
const RATE_WINDOW: Duration = Duration::from_secs(30);

/// One reading.
#[derive(Debug, Clone)]
pub struct Sample {
    at: Instant,
    totals: GatewayTotals,
    /// Open gateway sessions.
    pub sessions: usize,
    /// Site → proxies banned for it.
    pub bans: BTreeMap<String, usize>,
}

/// Samples of the gateway.
#[derive(Debug)]
pub struct Traffic {
    fleet: Arc<Fleet>,
    samples: Mutex<VecDeque<Sample>>,
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

/// What happened between two samples.
#[derive(Debug, Clone, PartialEq)]
pub struct Interval {
    /// Seconds before now the interval ends.
    pub ago: u64,
    /// Requests per second.
    pub requests: f64,
    /// Upstream errors and refusals per second.
    pub errors: f64,
    /// Open sessions at its end.
    pub sessions: usize,
    /// The median and the 99th percentile of the time the gateway added,
    /// in milliseconds, when it served anything.
    pub added_ms: Option<(f64, f64)>,
}

impl Traffic {
    /// No samples yet.
    pub fn new(fleet: Arc<Fleet>) -> Self {
        Self { fleet, samples: Mutex::default() }
    }

    /// Reads every [`EVERY`] until aborted.
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

    fn read(&self, at: Instant) -> Sample {
        Sample {
            at,
            totals: self.fleet.metrics().gateway().totals(),
            sessions: self.fleet.session_count(),
            bans: self.fleet.ban_counts(),
        }
    }

    /// Takes one sample at `now`.
    pub fn sample(&self, now: Instant) {
        let sample = self.read(now);
        let mut samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        samples.push_back(sample);
        while samples.front().is_some_and(|s| now.duration_since(s.at) > KEPT) {
            samples.pop_front();
        }
    }

    /// The rates over the last [`RATE_WINDOW`] (or as much of it as was
    /// sampled), up to the counters now.
    pub fn rates(&self) -> Rates {
        let now = Instant::now();
        let latest = self.fleet.metrics().gateway().totals();
        let samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(earlier) = samples
            .iter()
            .find(|s| now.duration_since(s.at) <= RATE_WINDOW)
            .or_else(|| samples.back())
        else {
            return Rates::default();
        };
        let over = now.duration_since(earlier.at);
        if over.is_zero() {
            return Rates::default();
        }
        Rates {
            requests: per_second(latest.requests, earlier.totals.requests, over),
            errors: per_second(errors(&latest), errors(&earlier.totals), over),
            over,
        }
    }

    /// The counters now.
    pub fn totals(&self) -> GatewayTotals {
        self.fleet.metrics().gateway().totals()
    }

    /// The counts over the last `window` (as much of it as was sampled):
    /// the difference of the counters now and then.
    pub fn recent(&self, window: Duration) -> GatewayTotals {
        let now = Instant::now();
        let latest = self.totals();
        let samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(earlier) = samples.iter().find(|s| now.duration_since(s.at) <= window) else {
            return GatewayTotals::default();
        };
        difference(&latest, &earlier.totals)
    }

    /// Every interval between samples, oldest first.
    pub fn intervals(&self) -> Vec<Interval> {
        let now = Instant::now();
        let samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        samples
            .iter()
            .zip(samples.iter().skip(1))
            .map(|(before, after)| {
                let over = after.at.duration_since(before.at);
                let delta = difference(&after.totals, &before.totals);
                Interval {
                    ago: now.duration_since(after.at).as_secs(),
                    requests: per_second(after.totals.requests, before.totals.requests, over),
                    errors: per_second(errors(&after.totals), errors(&before.totals), over),
                    sessions: after.sessions,
                    added_ms: percentile(&delta.added, 0.5).zip(percentile(&delta.added, 0.99)),
                }
            })
            .collect()
    }

    /// The bans per site at each sample, oldest first, for the sites with
    /// the most bans at any time (at most `sites` of them).
    pub fn bans(&self, sites: usize) -> Vec<(String, Vec<usize>)> {
        let samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        let mut peak: BTreeMap<&str, usize> = BTreeMap::new();
        for sample in samples.iter() {
            for (site, count) in &sample.bans {
                let top = peak.entry(site).or_default();
                *top = (*top).max(*count);
            }
        }
        let mut top: Vec<(&str, usize)> = peak.into_iter().collect();
        top.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        top.into_iter()
            .take(sites)
            .map(|(site, _)| {
                let counts =
                    samples.iter().map(|s| s.bans.get(site).copied().unwrap_or(0)).collect();
                (site.to_owned(), counts)
            })
            .collect()
    }
}

fn errors(totals: &GatewayTotals) -> u64 {
    totals.upstream_errors + totals.refused
}

fn per_second(later: u64, earlier: u64, over: Duration) -> f64 {
    if over.is_zero() {
        return 0.0;
    }
    #[expect(clippy::cast_precision_loss, reason = "a rate for display")]
    let delta = later.saturating_sub(earlier) as f64;
    delta / over.as_secs_f64()
}

fn difference(later: &GatewayTotals, earlier: &GatewayTotals) -> GatewayTotals {
    GatewayTotals {
        requests: later.requests.saturating_sub(earlier.requests),
        upstream_errors: later.upstream_errors.saturating_sub(earlier.upstream_errors),
        refused: later.refused.saturating_sub(earlier.refused),
        refused_by: later
            .refused_by
            .iter()
            .map(|(reason, count)| {
                (
                    *reason,
                    count.saturating_sub(earlier.refused_by.get(reason).copied().unwrap_or(0)),
                )
            })
            .filter(|(_, count)| *count > 0)
            .collect(),
        added: std::array::from_fn(|i| later.added[i].saturating_sub(earlier.added[i])),
    }
}

/// The `q` quantile of the bucketed added times, in milliseconds: the
/// upper bound of the bucket it falls in (twice the last bound past it).
pub fn percentile(buckets: &[u64], q: f64) -> Option<f64> {
    let total: u64 = buckets.iter().sum();
    if total == 0 {
        return None;
    }
    #[expect(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "a rank among counts"
    )]
    let rank = ((total as f64) * q).ceil().max(1.0) as u64;
    let mut seen = 0;
    for (i, count) in buckets.iter().enumerate() {
        seen += count;
        if seen >= rank {
            let bound = ADDED_BUCKETS
                .get(i)
                .copied()
                .unwrap_or(ADDED_BUCKETS[ADDED_BUCKETS.len() - 1] * 2.0);
            return Some(bound * 1000.0);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_read_the_buckets_upper_bounds() {
        let mut buckets = [0; ADDED_BUCKETS.len() + 1];
        assert_eq!(percentile(&buckets, 0.5), None);
        buckets[0] = 98;
        buckets[5] = 2;
        assert_eq!(percentile(&buckets, 0.5), Some(0.05));
        let p99 = percentile(&buckets, 0.99).unwrap();
        assert!((p99 - 1.6).abs() < 1e-9, "{p99}");
        buckets[ADDED_BUCKETS.len()] = 1000;
        assert!(percentile(&buckets, 0.99).unwrap() > 3000.0);
    }
}
