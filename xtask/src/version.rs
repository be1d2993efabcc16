//! Tool versions as the toolchain step compares them: the dotted numbers at
//! the front of what a tool or a Debian package reports.
//!
//! Debian versions (`1:16.0.6-15~deb12u1`, `1.96.0+dfsg1-1~deb12u2`) are
//! not semver, and the step only ever asks "is the upstream version at
//! least N.M": so this reads the upstream part's leading numbers and
//! compares those, rather than implementing dpkg's full ordering.

use std::cmp::Ordering;
use std::fmt;

/// Leading dotted numbers of a version, e.g. `1.96.0` of `1.96.0+dfsg1-1`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version(Vec<u64>);

impl Version {
    /// `1.95`, `1.96.0`: dotted numbers and nothing else.
    pub fn parse(text: &str) -> Option<Self> {
        let parts: Option<Vec<u64>> =
            text.trim().split('.').map(|part| part.parse().ok()).collect();
        parts.filter(|parts| !parts.is_empty()).map(Self)
    }

    /// The upstream version at the front of a Debian package version:
    /// drops an epoch (`1:`), then reads the dotted numbers up to the first
    /// other character (`+dfsg`, `-1`, `~deb12u1`).
    pub fn of_debian(version: &str) -> Option<Self> {
        let upstream = match version.split_once(':') {
            Some((epoch, rest)) if epoch.chars().all(|c| c.is_ascii_digit()) => rest,
            _ => version,
        };
        Self::leading(upstream)
    }

    /// The first dotted number in a tool's `--version` line, e.g. `1.96.0`
    /// of `rustc 1.96.0 (abc 2026-05-01)` or `0.5.21` of
    /// `wasm-component-ld 0.5.21`.
    pub fn in_line(line: &str) -> Option<Self> {
        line.split_whitespace()
            .find(|word| word.starts_with(|c: char| c.is_ascii_digit()))
            .and_then(Self::leading)
    }

    fn leading(text: &str) -> Option<Self> {
        let end = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
        Self::parse(text[..end].trim_end_matches('.'))
    }

    /// At least `minimum`, comparing missing trailing parts as 0
    /// (`1.95` ≤ `1.95.0`).
    pub fn at_least(&self, minimum: &Version) -> bool {
        self.compare(minimum) != Ordering::Less
    }

    fn compare(&self, other: &Version) -> Ordering {
        let len = self.0.len().max(other.0.len());
        (0..len)
            .map(|index| {
                let a = self.0.get(index).copied().unwrap_or(0);
                let b = other.0.get(index).copied().unwrap_or(0);
                a.cmp(&b)
            })
            .find(|ordering| ordering.is_ne())
            .unwrap_or(Ordering::Equal)
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(u64::to_string).collect();
        f.write_str(&parts.join("."))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(text: &str) -> Version {
        Version::parse(text).expect("a version")
    }

    #[test]
    fn reads_debian_upstream_versions() {
        assert_eq!(Version::of_debian("1.96.0+dfsg1-1~deb12u2"), Some(v("1.96.0")));
        assert_eq!(Version::of_debian("1.85.0+dfsg3-1~deb12u3"), Some(v("1.85.0")));
        assert_eq!(Version::of_debian("1:16.0.6-15~deb12u1"), Some(v("16.0.6")));
        assert_eq!(Version::of_debian("0.0~git20220510.9886d3d-2"), Some(v("0.0")));
        assert_eq!(Version::of_debian("garbage"), None);
    }

    #[test]
    fn reads_tool_version_lines() {
        assert_eq!(
            Version::in_line("rustc 1.96.0 (aa 2026-05-01) (built from a source tarball)"),
            Some(v("1.96.0"))
        );
        assert_eq!(Version::in_line("wasm-component-ld 0.5.21"), Some(v("0.5.21")));
        assert_eq!(Version::in_line("LLD 16.0.6 (compatible with GNU linkers)"), Some(v("16.0.6")));
        assert_eq!(Version::in_line("no digits here"), None);
    }

    /// The fault a new machine hit: rustc-web 1.85 from stale lists was
    /// taken as good enough because its files were present.
    #[test]
    fn rustc_web_1_85_is_too_old_for_1_95() {
        let installed = Version::of_debian("1.85.0+dfsg3-1~deb12u3").expect("parsed");
        assert!(!installed.at_least(&v("1.95")));
        let upgraded = Version::of_debian("1.96.0+dfsg1-1~deb12u2").expect("parsed");
        assert!(upgraded.at_least(&v("1.95")));
        assert!(v("1.95.0").at_least(&v("1.95")));
        assert!(v("1.95").at_least(&v("1.95.0")));
        assert!(!v("0.5.9").at_least(&v("0.5.21")));
    }
}
