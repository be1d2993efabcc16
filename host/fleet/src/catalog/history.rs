//! A proxy's probe results over the last hour, by minute: what the
//! console's health history shows. Twelve bytes a minute, 60 minutes a
//! proxy (about 720 bytes; 7 MB for 10,000 proxies).

use std::collections::VecDeque;

use serde::Serialize;

/// Minutes kept.
pub const MINUTES: usize = 60;

#[derive(Debug, Clone, Copy)]
struct Minute {
    /// Unix minutes.
    minute: u32,
    passes: u16,
    failures: u16,
    /// Sum of the passing probes' latencies, in milliseconds.
    latency_ms: f32,
}

/// One minute of probes, as the console shows it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HistoryMinute {
    /// Unix seconds the minute starts.
    pub at: u64,
    /// Probes that passed.
    pub passes: u32,
    /// Probes that failed.
    pub failures: u32,
    /// Mean latency of the passing ones.
    pub latency_ms: Option<f64>,
}

/// One proxy's last hour.
#[derive(Debug, Clone, Default)]
pub(super) struct History(VecDeque<Minute>);

impl History {
    /// Counts a probe at Unix second `now`.
    pub(super) fn record(&mut self, now: u64, latency_ms: Option<f64>) {
        let minute = u32::try_from(now / 60).unwrap_or(u32::MAX);
        if self.0.back().is_none_or(|last| last.minute != minute) {
            if self.0.len() == MINUTES {
                self.0.pop_front();
            }
            self.0.push_back(Minute { minute, passes: 0, failures: 0, latency_ms: 0.0 });
        }
        let last = self.0.back_mut().expect("pushed above");
        match latency_ms {
            Some(ms) => {
                last.passes = last.passes.saturating_add(1);
                #[expect(clippy::cast_possible_truncation, reason = "milliseconds for a chart")]
                let ms = ms as f32;
                last.latency_ms += ms;
            }
            None => last.failures = last.failures.saturating_add(1),
        }
    }

    /// The minutes within the hour before Unix second `now`, oldest first.
    pub(super) fn minutes(&self, now: u64) -> Vec<HistoryMinute> {
        let first = (now / 60).saturating_sub(MINUTES as u64 - 1);
        self.0
            .iter()
            .filter(|m| u64::from(m.minute) >= first)
            .map(|m| HistoryMinute {
                at: u64::from(m.minute) * 60,
                passes: u32::from(m.passes),
                failures: u32::from(m.failures),
                latency_ms: (m.passes > 0).then(|| f64::from(m.latency_ms) / f64::from(m.passes)),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_fold_into_minutes_and_an_hour_is_kept() {
        let mut history = History::default();
        let start = 1_000_020 * 60;
        history.record(start, Some(10.0));
        history.record(start + 5, Some(30.0));
        history.record(start + 10, None);
        history.record(start + 60, None);
        let minutes = history.minutes(start + 60);
        assert_eq!(minutes.len(), 2);
        assert_eq!((minutes[0].passes, minutes[0].failures), (2, 1));
        assert_eq!(minutes[0].latency_ms, Some(20.0));
        assert_eq!(minutes[1].latency_ms, None);
        for minute in 0..200 {
            history.record(start + minute * 60, Some(1.0));
        }
        assert_eq!(history.0.len(), MINUTES);
        assert_eq!(history.minutes(start + 199 * 60).len(), MINUTES);
        assert!(history.minutes(start + 400 * 60).is_empty(), "nothing from over an hour ago");
    }
}
