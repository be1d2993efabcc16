//! What Linux's `/proc` says of a process: the figures the benches print
//! and the in-cluster test reports.

/// CPU seconds (user and system) in the text of a `/proc/<pid>/stat` or
/// `/proc/<pid>/task/<tid>/stat`; 0 when it cannot be read.
pub fn cpu_seconds_of(stat: &str) -> f64 {
    // Past the command name, which may hold spaces and parentheses; utime
    // and stime are fields 14 and 15, in USER_HZ (100 a second on every
    // architecture Linux supports).
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let field = |n: usize| fields.get(n).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (field(11) + field(12)) / 100.0
}

/// CPU seconds process `pid` has used, its threads included.
pub fn cpu_seconds(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(0.0, |stat| cpu_seconds_of(&stat))
}

/// CPU seconds the whole machine has been busy (every core, all but idle
/// and I/O wait) in the text of `/proc/stat`; 0 when it cannot be read.
pub fn busy_seconds_of(stat: &str) -> f64 {
    let Some(line) = stat.lines().find(|line| line.starts_with("cpu ")) else { return 0.0 };
    let ticks: Vec<f64> = line.split_whitespace().skip(1).filter_map(|v| v.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal (guest time is
    // counted in user already).
    let total: f64 = ticks.iter().take(8).sum();
    let idle = ticks.get(3).copied().unwrap_or(0.0) + ticks.get(4).copied().unwrap_or(0.0);
    (total - idle) / 100.0
}

/// CPU seconds the whole machine has been busy since it booted.
pub fn machine_busy_seconds() -> f64 {
    std::fs::read_to_string("/proc/stat").map_or(0.0, |stat| busy_seconds_of(&stat))
}

/// A memory line (`VmRSS:`, `VmHWM:`) of a `/proc/<pid>/status` text, in
/// MiB.
pub fn status_mib(status: &str, field: &str) -> Option<f64> {
    let value = status.lines().find_map(|line| line.strip_prefix(field))?;
    let kib: f64 = value.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib / 1024.0)
}

/// `VmRSS` and `VmHWM` of process `pid` in MiB; 0 for what cannot be read.
pub fn memory_mib(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name| status_mib(&status, name).unwrap_or(0.0);
    (field("VmRSS:"), field("VmHWM:"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_and_memory_are_read_past_an_odd_command_name() {
        let stat = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 250 150 0 0 20 0 8 0 1 0 0";
        assert!((cpu_seconds_of(stat) - 4.0).abs() < 1e-9, "{}", cpu_seconds_of(stat));
        let status = "Name:\tproxyfleet\nVmHWM:\t   69632 kB\nVmRSS:\t   65536 kB\n";
        assert_eq!(status_mib(status, "VmRSS:"), Some(64.0));
        assert_eq!(status_mib(status, "VmHWM:"), Some(68.0));
        assert_eq!(status_mib(status, "VmSwap:"), None);
        let machine = "cpu  300 10 90 1000 50 5 5 0 0 0\ncpu0 150 5 45 500 25 2 3 0 0 0\n";
        assert!((busy_seconds_of(machine) - 4.1).abs() < 1e-9, "{}", busy_seconds_of(machine));
        let own = std::process::id();
        assert!(memory_mib(own).0 > 0.0, "this process has resident memory");
    }
}
