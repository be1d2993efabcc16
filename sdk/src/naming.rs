//! Stable names and numbers derived from a Proxy's UID, so that a retried
//! `create` computes the same backend identifier and adopts what an earlier
//! attempt left instead of making a second instance.

use std::ops::RangeInclusive;
use std::time::{SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};

use crate::mark::hex;

/// Fewest hex digits of the hash a derived name keeps (48 bits), so that
/// names stay unique per UID even under a long prefix or a short limit.
const MIN_NAME_HASH_HEX: usize = 12;

/// Prefix used when the given one has nothing usable in it.
const FALLBACK_PREFIX: &str = "pf";

/// A deterministic DNS-1123 label for `uid`: `<prefix>-<hex of sha256(uid)>`,
/// the hash cut so that the name is at most `max_len` characters.
///
/// The result is lowercase `[a-z0-9-]`, starts with a letter and ends with
/// a letter or digit, so it also satisfies the stricter RFC 1035 rule (GCP
/// instance names, Kubernetes service names). The prefix is lowercased, other
/// characters become `-`, and leading non-letters are dropped (an empty
/// result becomes `pf`). The hash keeps at least 12 hex digits: a long
/// prefix is cut for it, and `max_len` below 14 is treated as 14.
///
/// ```
/// let name = proxyfleet_sdk::derive_name("pf", "0b5bd7c4-5a54-4b7e-9d0c-1f3b8f3e2a11", 63);
/// assert!(name.starts_with("pf-"));
/// assert_eq!(name.len(), 63);
/// ```
pub fn derive_name(prefix: &str, uid: &str, max_len: usize) -> String {
    let max_len = max_len.max(MIN_NAME_HASH_HEX + 2);
    let digest = hex(&Sha256::digest(uid.as_bytes()));

    let mut prefix: String = prefix
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' })
        .skip_while(|c| !c.is_ascii_lowercase())
        .collect();
    // The prefix may take what the hash's minimum leaves, less the dash.
    prefix.truncate(max_len - MIN_NAME_HASH_HEX - 1);
    let prefix = match prefix.trim_end_matches('-') {
        "" => FALLBACK_PREFIX,
        trimmed => trimmed,
    };

    let hash_len = (max_len - prefix.len() - 1).min(digest.len());
    format!("{prefix}-{}", &digest[..hash_len])
}

/// The `attempt`-th candidate number for `uid` inside `range`, e.g. a VMID.
///
/// Attempts `0..range.len()` visit every number of the range exactly once, in
/// an order fixed by the UID: a provider tries attempt 0, and on finding the
/// number taken by someone else tries 1, 2, … A retried create walks the same
/// sequence, so it finds its own earlier instance again. Different UIDs start
/// at different places and stride differently, so concurrent creates rarely
/// contend. `None` when the range is empty or `attempt` is past its end.
///
/// ```
/// let first = proxyfleet_sdk::derive_number("uid-1", 100..=999_999_999, 0);
/// assert_eq!(first, proxyfleet_sdk::derive_number("uid-1", 100..=999_999_999, 0));
/// assert_eq!(proxyfleet_sdk::derive_number("uid-1", 100..=109, 10), None);
/// ```
pub fn derive_number(uid: &str, range: RangeInclusive<u32>, attempt: u32) -> Option<u32> {
    let (low, high) = (u64::from(*range.start()), u64::from(*range.end()));
    if low > high {
        return None;
    }
    let len = high - low + 1;
    if u64::from(attempt) >= len {
        return None;
    }
    let digest = Sha256::digest(uid.as_bytes());
    let word = |index: usize| {
        let mut bytes = [0; 8];
        bytes.copy_from_slice(&digest[index * 8..index * 8 + 8]);
        u64::from_le_bytes(bytes)
    };
    let start = word(0) % len;
    // A stride coprime with the length makes `start + k * stride (mod len)`
    // a permutation of 0..len; 1 always is, so the search ends.
    let mut stride = if len > 1 { word(1) % (len - 1) + 1 } else { 1 };
    while gcd(stride, len) != 1 {
        stride = stride % (len - 1) + 1;
    }
    // len <= 2^32, so every product below fits in u128 with room to spare.
    let offset = (u128::from(start) + u128::from(attempt) * u128::from(stride)) % u128::from(len);
    let number = low + u64::try_from(offset).ok()?;
    u32::try_from(number).ok()
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Seconds since the Unix epoch, by the host's wall clock.
///
/// ```
/// let now = proxyfleet_sdk::now_unix();
/// assert!(now > 1_700_000_000, "after November 2023");
/// ```
pub fn now_unix() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn is_dns_label(name: &str) -> bool {
        !name.is_empty()
            && name.len() <= 63
            && name.starts_with(|c: char| c.is_ascii_lowercase())
            && name.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
            && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    }

    #[test]
    fn derive_name_is_deterministic_and_bounded() {
        let name = derive_name("pf", "uid-1", 63);
        assert_eq!(name, derive_name("pf", "uid-1", 63));
        assert_ne!(name, derive_name("pf", "uid-2", 63));
        assert_eq!(name.len(), 63);
        assert!(is_dns_label(&name), "{name}");
        // sha256("uid-1") starts with these digits.
        let digest = hex(&Sha256::digest(b"uid-1"));
        assert_eq!(derive_name("pf", "uid-1", 15), format!("pf-{}", &digest[..12]));
        assert_eq!(derive_name("pf", "uid-1", 200), format!("pf-{digest}"));
    }

    #[test]
    fn derive_name_sanitises_the_prefix() {
        let name = derive_name("9_Proxy Fleet_", "u", 40);
        assert!(name.starts_with("proxy-fleet-"), "{name}");
        assert!(is_dns_label(&name), "{name}");
        assert!(derive_name("", "u", 20).starts_with("pf-"));
        assert!(derive_name("123", "u", 20).starts_with("pf-"));
    }

    #[test]
    fn derive_name_keeps_enough_hash() {
        let name = derive_name(&"long".repeat(30), "u", 30);
        assert_eq!(name.len(), 30);
        assert!(name.rsplit('-').next().is_some_and(|hash| hash.len() >= 12));
        assert!(is_dns_label(&name), "{name}");
        let tiny = derive_name("pf", "u", 3);
        assert_eq!(tiny.len(), 14);
        assert!(is_dns_label(&tiny), "{tiny}");
    }

    #[test]
    fn derive_number_covers_the_range_once() {
        for (uid, range) in [
            ("a", 100..=199),
            ("b", 100..=1123),
            ("c", 0..=0),
            ("d", 7..=8),
            ("e", u32::MAX - 9..=u32::MAX),
            ("f", 1..=360),
        ] {
            let len = range.end() - range.start() + 1;
            let seen: HashSet<u32> = (0..len)
                .map(|attempt| {
                    let n = derive_number(uid, range.clone(), attempt).expect("inside");
                    assert!(range.contains(&n), "{n} outside {range:?}");
                    n
                })
                .collect();
            assert_eq!(seen.len() as u32, len, "{uid}: repeats in {range:?}");
            assert_eq!(derive_number(uid, range, len), None);
        }
    }

    #[test]
    fn derive_number_handles_the_full_range_and_empty_ones() {
        let full = 0..=u32::MAX;
        let first = derive_number("u", full.clone(), 0).expect("inside");
        assert_eq!(derive_number("u", full.clone(), 0), Some(first));
        assert_ne!(derive_number("u", full.clone(), 1), Some(first));
        assert!(derive_number("u", full, u32::MAX).is_some());
        #[allow(clippy::reversed_empty_ranges, reason = "testing an empty range")]
        let empty = 10..=9;
        assert_eq!(derive_number("u", empty, 0), None);
    }

    #[test]
    fn derive_number_spreads_uids() {
        let starts: HashSet<u32> = (0..50)
            .filter_map(|i| derive_number(&format!("uid-{i}"), 100..=999_999_999, 0))
            .collect();
        assert!(starts.len() >= 49, "{starts:?}");
    }

    #[test]
    fn now_is_after_2024() {
        assert!(now_unix() > 1_704_067_200);
    }
}
