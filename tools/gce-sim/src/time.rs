//! Wall-clock helpers: seconds since the epoch and the RFC 3339 timestamps
//! Compute Engine puts in `creationTimestamp` and operation times.

pub(crate) use proxyfleet_sim_support::now_unix;

/// `secs` since the epoch as Compute Engine writes it,
/// `2025-06-10T08:15:42.123-07:00` style, here always in UTC with
/// milliseconds: `2025-06-10T15:15:42.000+00:00`.
pub(crate) fn rfc3339(secs: u64) -> String {
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.000+00:00",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Howard Hinnant's `civil_from_days`, for days since 1970-01-01.
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000+00:00");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00.000+00:00");
        assert_eq!(rfc3339(1_767_225_599), "2025-12-31T23:59:59.000+00:00");
    }
}
