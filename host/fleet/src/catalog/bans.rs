//! Per-site bans: a proxy a site turned away is kept from requests for that
//! site only, and stays in service for every other.

use std::collections::HashMap;
use std::time::Instant;

use super::CatalogError;

/// The longest site name kept (a DNS name is at most 253 characters).
const MAX_SITE: usize = 253;

/// Proxy ID → site → when the ban ends (this process's clock, Unix seconds).
#[derive(Debug, Default)]
pub(super) struct SiteBans(HashMap<String, HashMap<String, (Instant, u64)>>);

impl SiteBans {
    pub(super) fn insert(&mut self, id: &str, site: String, until: Instant, until_unix: u64) {
        self.0.entry(id.to_owned()).or_default().insert(site, (until, until_unix));
    }

    /// Whether proxy `id` is banned for `site` now.
    pub(super) fn banned(&self, id: &str, site: &str, now: Instant) -> bool {
        self.0.get(id).and_then(|sites| sites.get(site)).is_some_and(|(until, _)| *until > now)
    }

    /// The live bans on proxy `id`: site → Unix seconds the ban ends.
    pub(super) fn of(&self, id: &str, now: Instant) -> Vec<(String, u64)> {
        let mut bans: Vec<(String, u64)> = self
            .0
            .get(id)
            .into_iter()
            .flatten()
            .filter(|(_, (until, _))| *until > now)
            .map(|(site, (_, at))| (site.clone(), *at))
            .collect();
        bans.sort();
        bans
    }

    /// Ends `id`'s ban for `site`; whether there was one.
    pub(super) fn remove(&mut self, id: &str, site: &str) -> bool {
        let Some(sites) = self.0.get_mut(id) else { return false };
        let removed = sites.remove(site).is_some();
        if sites.is_empty() {
            self.0.remove(id);
        }
        removed
    }

    /// Ends every ban of `id`; whether there was one.
    pub(super) fn remove_all(&mut self, id: &str) -> bool {
        self.0.remove(id).is_some_and(|sites| !sites.is_empty())
    }

    pub(super) fn sweep(&mut self, now: Instant) {
        self.0.retain(|_, sites| {
            sites.retain(|_, (until, _)| *until > now);
            !sites.is_empty()
        });
    }

    /// Forgets the bans of proxies `keep` says are gone.
    pub(super) fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.0.retain(|id, _| keep(id));
    }
}

/// A site as bans key it: the host name in lower case, without a port or a
/// trailing dot, so `Example.COM:443` and `example.com` are one site.
pub fn site_of(field: &str, text: &str) -> Result<String, CatalogError> {
    let invalid = |message: String| CatalogError::Invalid { field: field.to_owned(), message };
    let host = match text.strip_prefix('[') {
        // An IPv6 literal, with or without a port.
        Some(rest) => rest
            .split_once(']')
            .map(|(inside, _)| inside)
            .ok_or_else(|| invalid(format!("{text:?} opens an IPv6 literal it never closes")))?,
        None => match text.rsplit_once(':') {
            Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
            _ => text,
        },
    };
    let site = host.trim_end_matches('.').to_ascii_lowercase();
    let valid = !site.is_empty()
        && site.len() <= MAX_SITE
        && site.bytes().all(|b| b.is_ascii_alphanumeric() || b"-.:_".contains(&b));
    if !valid {
        return Err(invalid(format!(
            "{text:?} is not a host name; give the target's host, such as example.com"
        )));
    }
    Ok(site)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_site_is_its_host_in_lower_case_without_port_or_dot() {
        assert_eq!(site_of("site", "Example.COM:443").unwrap(), "example.com");
        assert_eq!(site_of("site", "example.com.").unwrap(), "example.com");
        assert_eq!(site_of("site", "[::1]:8080").unwrap(), "::1");
        assert_eq!(site_of("site", "10.0.0.1").unwrap(), "10.0.0.1");
        let err = site_of("host", "exa mple.com").unwrap_err().to_string();
        assert!(err.starts_with("host: "), "{err}");
        assert!(site_of("site", "").is_err());
        assert!(site_of("site", "[::1").is_err());
    }

    #[test]
    fn a_ban_holds_for_its_site_only_and_ends() {
        let now = Instant::now();
        let mut bans = SiteBans::default();
        bans.insert("p", "a.example".into(), now + Duration::from_secs(10), 1_010);
        assert!(bans.banned("p", "a.example", now));
        assert!(!bans.banned("p", "b.example", now));
        assert!(!bans.banned("q", "a.example", now));
        assert_eq!(bans.of("p", now), [("a.example".to_owned(), 1_010)]);
        bans.sweep(now + Duration::from_secs(11));
        assert!(!bans.banned("p", "a.example", now));
        assert!(bans.of("p", now).is_empty());
    }
}
