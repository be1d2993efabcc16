//! The `process_*` metrics every Prometheus client exports (CPU time,
//! memory, descriptors, threads, start time), read from `/proc/self` at
//! each scrape, named and typed as the Go and Python clients name them so
//! that shared dashboards and alerts work unchanged.
//!
//! Outside Linux, or when `/proc` cannot be read, the metrics are left out
//! of the scrape rather than reported as zero.

use procfs::process::{LimitValue, Process};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

/// Adds the collector to `registry` (the one without the prefix).
pub fn register(registry: &mut Registry) {
    registry.register_collector(Box::new(ProcessCollector));
}

#[derive(Debug)]
struct ProcessCollector;

/// One reading of `/proc/self`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// User and system CPU time, in seconds.
    pub cpu_seconds: f64,
    /// Resident memory, in bytes.
    pub resident_bytes: u64,
    /// Virtual memory, in bytes.
    pub virtual_bytes: u64,
    /// Open file descriptors.
    pub open_fds: u64,
    /// The soft limit of open file descriptors; `None` when unlimited.
    pub max_fds: Option<u64>,
    /// Threads.
    pub threads: u64,
    /// When the process started, in seconds since the Unix epoch.
    pub start_time_seconds: f64,
}

impl Sample {
    /// Reads this process's figures; `None` when `/proc` cannot be read.
    pub fn read() -> Option<Self> {
        let process = Process::myself().ok()?;
        let stat = process.stat().ok()?;
        let ticks = procfs::ticks_per_second() as f64;
        let page_size = procfs::page_size();
        let boot_time = procfs::boot_time_secs().ok()? as f64;
        let max_fds = match process.limits().ok()?.max_open_files.soft_limit {
            LimitValue::Value(max) => Some(max),
            LimitValue::Unlimited => None,
        };
        Some(Self {
            cpu_seconds: (stat.utime + stat.stime) as f64 / ticks,
            resident_bytes: stat.rss * page_size,
            virtual_bytes: stat.vsize,
            open_fds: process.fd_count().ok()? as u64,
            max_fds,
            threads: u64::try_from(stat.num_threads).unwrap_or(0),
            start_time_seconds: boot_time + stat.starttime as f64 / ticks,
        })
    }
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let Some(sample) = Sample::read() else {
            return Ok(());
        };
        let cpu = ConstCounter::new(sample.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            None,
            cpu.metric_type(),
        )?)?;
        let gauges = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                Some(sample.resident_bytes as f64),
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                Some(sample.virtual_bytes as f64),
            ),
            ("process_open_fds", "Number of open file descriptors", Some(sample.open_fds as f64)),
            (
                "process_max_fds",
                "Maximum number of open file descriptors",
                sample.max_fds.map(|max| max as f64),
            ),
            ("process_threads", "Number of OS threads in the process", Some(sample.threads as f64)),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
                Some(sample.start_time_seconds),
            ),
        ];
        for (name, help, value) in gauges {
            let Some(value) = value else { continue };
            let gauge = ConstGauge::new(value);
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_reads_as_itself() {
        let before = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let sample = Sample::read().expect("/proc/self is readable on Linux");
        assert!(sample.resident_bytes > 0 && sample.virtual_bytes >= sample.resident_bytes);
        assert!(sample.open_fds >= 3, "stdin, stdout and stderr at least: {sample:?}");
        assert!(sample.threads >= 1);
        // Boot time is whole seconds and the start time ticks: allow both.
        assert!(sample.start_time_seconds <= before + 2.0, "{sample:?}");
        assert!(sample.start_time_seconds > before - 24.0 * 3600.0, "{sample:?}");
    }

    #[test]
    fn the_registry_exports_them_unprefixed() {
        let mut registry = Registry::default();
        register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            "# TYPE process_cpu_seconds counter",
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_open_fds ",
            "process_start_time_seconds ",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
    }
}
