//! The health engine: every interval, probes every member with an endpoint
//! and records the results in the catalog.
//!
//! Probes run with bounded concurrency, each under its own timeout, so one
//! stalled proxy costs one slot for at most the timeout and never delays
//! the verdicts of the others beyond the round.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use proxyfleet_core::liveness::Heartbeat;

use crate::catalog::Fleet;
use crate::error::{Error, Result};
use crate::probe::{CheckTarget, ProbeFailure, ProbeMode, probe};

/// Probes in flight at once, unless set. Every probe in flight holds the
/// buffers of up to three HTTP connections (to the proxy, through its
/// tunnel, and the check target's on the operator's own API): in the scale
/// bench, 1,000 Proxies probed 256 at once put the operator's high-water
/// mark 5 MiB above the same run at 64, with rounds as short (0.25 s,
/// bound by the machine's CPU). 64 keep up with 1,000 Proxies every 10 s
/// as long as a probe takes under 0.6 s; more Proxies or slower proxies
/// need more (the engine warns when a round outlasts the interval).
pub const DEFAULT_CONCURRENCY: usize = 64;

/// How the engine probes.
#[derive(Debug, Clone)]
pub struct HealthSettings {
    /// Time between the starts of two rounds.
    pub interval: Duration,
    /// Budget of one probe (both requests of `Both`).
    pub timeout: Duration,
    /// Probes in flight at once.
    pub concurrency: usize,
    /// Passes in a row before a proxy is healthy.
    pub healthy_after: u32,
    /// Failures in a row before it is unhealthy.
    pub unhealthy_after: u32,
    /// Where probes go through the proxy.
    pub target: CheckTarget,
    /// Which requests a probe sends.
    pub mode: ProbeMode,
}

impl HealthSettings {
    /// Defaults around `target`: every 10 s, 5 s per probe, 64 at once,
    /// healthy after 2 passes, unhealthy after 3 failures.
    pub fn new(target: CheckTarget) -> Self {
        Self {
            interval: Duration::from_secs(10),
            timeout: Duration::from_secs(5),
            concurrency: DEFAULT_CONCURRENCY,
            healthy_after: 2,
            unhealthy_after: 3,
            target,
            mode: ProbeMode::Both,
        }
    }

    /// Checks ranges; errors name the flag.
    pub fn validate(&self) -> Result<()> {
        if self.healthy_after == 0 {
            return Err(Error::setting("--health-healthy-after", "0 passes; use 1 or more"));
        }
        if self.unhealthy_after == 0 {
            return Err(Error::setting("--health-unhealthy-after", "0 failures; use 1 or more"));
        }
        if self.concurrency == 0 {
            return Err(Error::setting("--health-concurrency", "0 probes at once; use 1 or more"));
        }
        if self.timeout.is_zero() || self.timeout > self.interval {
            return Err(Error::setting(
                "--health-timeout",
                format!(
                    "{:?} must be above zero and at most the interval ({:?})",
                    self.timeout, self.interval
                ),
            ));
        }
        Ok(())
    }
}

/// What one round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RoundReport {
    /// Proxies probed.
    pub probed: usize,
    /// Of those, passed.
    pub passed: usize,
    /// Wall time of the round.
    pub elapsed: Duration,
}

/// The engine.
#[derive(Debug, Clone)]
pub struct HealthEngine {
    settings: HealthSettings,
    fleet: Arc<Fleet>,
    heartbeat: Option<Arc<Heartbeat>>,
}

impl HealthEngine {
    /// An engine recording into `fleet`.
    pub fn new(settings: HealthSettings, fleet: Arc<Fleet>) -> Self {
        Self { settings, fleet, heartbeat: None }
    }

    /// Beats `heartbeat` at the end of every round (and of every attempt
    /// to restore the leases), so `/livez` fails when rounds stop ending.
    /// Its owner retires it.
    pub fn with_heartbeat(mut self, heartbeat: Arc<Heartbeat>) -> Self {
        self.heartbeat = Some(heartbeat);
        self
    }

    fn beat(&self) {
        if let Some(heartbeat) = &self.heartbeat {
            heartbeat.beat();
        }
    }

    /// The settings.
    pub fn settings(&self) -> &HealthSettings {
        &self.settings
    }

    /// Probes every member with an endpoint once and records the results.
    pub async fn round(&self) -> RoundReport {
        let started = Instant::now();
        let targets = self.fleet.probe_targets();
        let probed = targets.len();
        let settings = &self.settings;
        let metrics = Arc::clone(self.fleet.metrics());
        let results: Vec<_> = futures::stream::iter(targets)
            .map(|(id, endpoint)| {
                let metrics = Arc::clone(&metrics);
                async move {
                    let begun = Instant::now();
                    let result = tokio::time::timeout(
                        settings.timeout,
                        probe(&endpoint, &settings.target, settings.mode),
                    )
                    .await
                    .unwrap_or_else(|_| {
                        Err(ProbeFailure(format!(
                            "no answer through the proxy within {:?}",
                            settings.timeout
                        )))
                    });
                    metrics.record_probe(begun.elapsed(), result.is_ok());
                    (id, endpoint, result)
                }
            })
            .buffer_unordered(settings.concurrency)
            .collect()
            .await;
        let passed = results.iter().filter(|(_, _, r)| r.is_ok()).count();
        self.fleet.record_probes(results, settings.healthy_after, settings.unhealthy_after);
        self.fleet.sweep();
        self.fleet.sync_leases().await;
        let report = RoundReport { probed, passed, elapsed: started.elapsed() };
        metrics.record_health_round(report.elapsed);
        tracing::debug!(
            probed,
            passed,
            elapsed_ms = report.elapsed.as_millis() as u64,
            "health round"
        );
        report
    }

    /// Runs rounds until `shutdown` resolves. The catalog turns ready after
    /// the leases an earlier process or leader granted are restored and the
    /// first round has ended, so `/readyz` never reports a fleet nobody
    /// probed nor one that forgot its leases.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        loop {
            match self.fleet.restore_leases().await {
                Ok(live) => {
                    tracing::info!(live, "discovery leases restored");
                    break;
                }
                Err(err) => tracing::warn!("cannot restore discovery leases yet: {err}"),
            }
            self.beat();
            tokio::select! {
                () = &mut shutdown => return,
                () = tokio::time::sleep(self.settings.interval) => {}
            }
        }
        loop {
            let report = self.round().await;
            self.fleet.set_ready(true);
            self.beat();
            if report.elapsed > self.settings.interval {
                tracing::warn!(
                    probed = report.probed,
                    elapsed_ms = report.elapsed.as_millis() as u64,
                    "a health round took longer than the interval; raise --health-concurrency or the interval"
                );
            }
            let pause = self.settings.interval.saturating_sub(report.elapsed);
            tokio::select! {
                () = &mut shutdown => return,
                () = tokio::time::sleep(pause) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> HealthSettings {
        HealthSettings::new(CheckTarget::parse("t", "http://127.0.0.1:1/").unwrap())
    }

    #[test]
    fn defaults_validate_and_bad_values_name_their_flag() {
        settings().validate().unwrap();
        let mut s = settings();
        s.healthy_after = 0;
        assert!(s.validate().unwrap_err().to_string().starts_with("--health-healthy-after:"));
        let mut s = settings();
        s.timeout = Duration::from_secs(20);
        assert!(s.validate().unwrap_err().to_string().starts_with("--health-timeout:"));
    }
}
