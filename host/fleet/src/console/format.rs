//! How the console writes numbers and times.

use proxyfleet_core::clock::unix_now;

/// `seconds` ago or ahead of now, as a person says it: `12s`, `5m`, `3h`, `2d`.
pub(super) fn span(seconds: u64) -> String {
    match seconds {
        0..60 => format!("{seconds}s"),
        60..3600 => format!("{}m", seconds / 60),
        3600..86_400 => format!("{}h", seconds / 3600),
        _ => format!("{}d", seconds / 86_400),
    }
}

/// How long ago Unix second `at` was.
pub(super) fn ago(at: u64) -> String {
    format!("{} ago", span(unix_now().saturating_sub(at)))
}

/// How long until Unix second `at`.
pub(super) fn until(at: u64) -> String {
    format!("for {}", span(at.saturating_sub(unix_now())))
}

/// A byte count with a binary unit.
pub(super) fn bytes(count: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    #[expect(clippy::cast_precision_loss, reason = "a size for display")]
    let mut value = count as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{count} B") } else { format!("{value:.1} {}", UNITS[unit]) }
}

/// `text` as a query-string value.
pub(super) fn encoded(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// A rate per second.
pub(super) fn rate(per_second: f64) -> String {
    if per_second >= 10.0 { format!("{per_second:.0}/s") } else { format!("{per_second:.2}/s") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_and_sizes_read_as_people_write_them() {
        assert_eq!(span(5), "5s");
        assert_eq!(span(125), "2m");
        assert_eq!(span(7300), "2h");
        assert_eq!(span(200_000), "2d");
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(3 * 1024 * 1024), "3.0 MiB");
        assert_eq!(rate(0.5), "0.50/s");
        assert_eq!(rate(42.4), "42/s");
    }
}
