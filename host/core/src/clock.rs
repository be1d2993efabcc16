//! Wall-clock time as statuses, stores and ownership marks keep it: whole
//! seconds since the Unix epoch. A clock before the epoch reads as 0.

use std::time::{SystemTime, UNIX_EPOCH};

/// `time` in whole seconds since the Unix epoch.
pub fn unix_seconds(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Now, in whole seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    unix_seconds(SystemTime::now())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn seconds_are_whole_and_a_clock_before_the_epoch_reads_zero() {
        assert_eq!(unix_seconds(UNIX_EPOCH + Duration::from_millis(1_999)), 1);
        assert_eq!(unix_seconds(UNIX_EPOCH - Duration::from_secs(5)), 0);
    }
}
