//! `oci://REGISTRY/REPOSITORY:TAG` and `oci://REGISTRY/REPOSITORY@sha256:DIGEST`:
//! where a plugin build lives in a registry.
//!
//! The registry host is always spelled out: a bare `org/plugin` would mean
//! Docker Hub to the usual parsers, which is never what a providers file
//! means. A reference names a tag or a digest, never neither, so that what
//! an entry follows or pins is written down; with both, the digest decides
//! and the tag is only a label.

use std::fmt;
use std::net::IpAddr;

use thiserror::Error;

use crate::digest::is_sha256;

/// The scheme that marks a plugin source as an OCI reference.
pub const SCHEME: &str = "oci://";

/// A parsed plugin reference.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PluginReference {
    /// As written, `oci://` included.
    text: String,
    registry: String,
    repository: String,
    tag: Option<String>,
    digest: Option<String>,
}

/// Why a text is not a plugin reference.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{text:?} is not a plugin reference: {reason}")]
pub struct ReferenceError {
    text: String,
    reason: String,
}

impl ReferenceError {
    fn new(text: &str, reason: impl Into<String>) -> Self {
        Self { text: text.to_owned(), reason: reason.into() }
    }

    /// Why, without the text.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl PluginReference {
    /// Parses `oci://REGISTRY/REPOSITORY(:TAG|@sha256:DIGEST)`.
    pub fn parse(text: &str) -> Result<Self, ReferenceError> {
        let rest = text
            .strip_prefix(SCHEME)
            .ok_or_else(|| ReferenceError::new(text, format!("it must start with {SCHEME}")))?;
        let (host, _) = rest.split_once('/').ok_or_else(|| {
            ReferenceError::new(
                text,
                "name the registry and the repository, e.g. oci://ghcr.io/org/gcp:1.2.0",
            )
        })?;
        if !(host.contains('.') || host.contains(':') || host == "localhost") {
            return Err(ReferenceError::new(
                text,
                format!(
                    "{host:?} is not a registry host: spell the registry out, e.g. \
                     oci://ghcr.io/{rest}"
                ),
            ));
        }
        let parsed: oci_client::Reference = rest
            .parse()
            .map_err(|err: oci_client::ParseError| ReferenceError::new(text, err.to_string()))?;
        // The parser fills in `latest` for a reference with neither; whether
        // one was written is read from the text.
        let digest = parsed.digest().map(str::to_owned);
        let name_part = rest.split_once('@').map_or(rest, |(name, _)| name);
        let written_tag = name_part.rsplit_once('/').is_some_and(|(_, last)| last.contains(':'));
        let tag = written_tag.then(|| parsed.tag().map(str::to_owned)).flatten();
        if tag.is_none() && digest.is_none() {
            return Err(ReferenceError::new(
                text,
                "it names neither a tag nor a digest: add :TAG to follow a tag or \
                 @sha256:DIGEST to pin one build",
            ));
        }
        if let Some(digest) = &digest
            && !is_sha256(digest)
        {
            return Err(ReferenceError::new(
                text,
                "only sha256 digests are accepted: @sha256: and 64 lower-case hex digits",
            ));
        }
        Ok(Self {
            text: text.to_owned(),
            registry: parsed.registry().to_owned(),
            repository: parsed.repository().to_owned(),
            tag,
            digest,
        })
    }

    /// The registry host, with its port if one was written.
    pub fn registry(&self) -> &str {
        &self.registry
    }

    /// The repository path inside the registry.
    pub fn repository(&self) -> &str {
        &self.repository
    }

    /// The tag, if one was written.
    pub fn tag(&self) -> Option<&str> {
        self.tag.as_deref()
    }

    /// The manifest digest (`sha256:…`), if one was written.
    pub fn digest(&self) -> Option<&str> {
        self.digest.as_deref()
    }

    /// True when the build behind the reference may change: a tag without
    /// a digest.
    pub fn follows_tag(&self) -> bool {
        self.digest.is_none()
    }

    /// The reference as written, `oci://` included.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// True when the registry host is a loopback name or address.
    pub fn is_loopback(&self) -> bool {
        is_loopback_host(&self.registry)
    }

    /// The same reference pinned to `digest`, for fetching exactly the build
    /// a tag resolved to.
    pub(crate) fn at_digest(&self, digest: &str) -> oci_client::Reference {
        oci_client::Reference::with_digest(
            self.registry.clone(),
            self.repository.clone(),
            digest.to_owned(),
        )
    }

    /// The reference as the registry client takes it.
    pub(crate) fn to_client(&self) -> oci_client::Reference {
        match (&self.tag, &self.digest) {
            (Some(tag), Some(digest)) => oci_client::Reference::with_tag_and_digest(
                self.registry.clone(),
                self.repository.clone(),
                tag.clone(),
                digest.clone(),
            ),
            (None, Some(digest)) => self.at_digest(digest),
            (Some(tag), None) => oci_client::Reference::with_tag(
                self.registry.clone(),
                self.repository.clone(),
                tag.clone(),
            ),
            (None, None) => unreachable!("parse refuses a reference with neither"),
        }
    }
}

impl fmt::Display for PluginReference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::str::FromStr for PluginReference {
    type Err = ReferenceError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse(text)
    }
}

/// True for `localhost` and loopback addresses, with or without a port.
pub fn is_loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(bracketed) => bracketed.split_once(']').map_or(bracketed, |(addr, _)| addr),
        None => host.rsplit_once(':').map_or(host, |(name, port)| {
            if port.bytes().all(|b| b.is_ascii_digit()) { name } else { host }
        }),
    };
    name.eq_ignore_ascii_case("localhost")
        || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn a_tag_reference_follows_its_tag() {
        let reference = PluginReference::parse("oci://ghcr.io/org/plugins/gcp:1.2.0").unwrap();
        assert_eq!(reference.registry(), "ghcr.io");
        assert_eq!(reference.repository(), "org/plugins/gcp");
        assert_eq!(reference.tag(), Some("1.2.0"));
        assert_eq!(reference.digest(), None);
        assert!(reference.follows_tag());
        assert_eq!(reference.to_string(), "oci://ghcr.io/org/plugins/gcp:1.2.0");
    }

    #[test]
    fn a_digest_reference_pins_one_build_even_with_a_tag() {
        let pinned =
            PluginReference::parse(&format!("oci://127.0.0.1:15000/gcp@{DIGEST}")).unwrap();
        assert_eq!(pinned.registry(), "127.0.0.1:15000");
        assert_eq!((pinned.tag(), pinned.digest()), (None, Some(DIGEST)));
        assert!(!pinned.follows_tag());
        assert!(pinned.is_loopback());
        let both =
            PluginReference::parse(&format!("oci://localhost:5000/gcp:1.0@{DIGEST}")).unwrap();
        assert_eq!((both.tag(), both.digest()), (Some("1.0"), Some(DIGEST)));
        assert!(!both.follows_tag());
    }

    #[test]
    fn references_that_leave_something_implicit_are_refused_with_the_fix() {
        let cases = [
            ("ghcr.io/org/gcp:1", "must start with oci://"),
            ("oci://gcp:1", "name the registry and the repository"),
            ("oci://org/gcp:1", "spell the registry out, e.g. oci://ghcr.io/org/gcp:1"),
            ("oci://ghcr.io/org/gcp", "neither a tag nor a digest"),
            ("oci://ghcr.io:5000/org/gcp", "neither a tag nor a digest"),
            ("oci://ghcr.io/org/gcp@sha256:abc", "not a plugin reference"),
            ("oci://ghcr.io/Org/gcp:1", "not a plugin reference"),
        ];
        for (text, expected) in cases {
            let err = PluginReference::parse(text).unwrap_err();
            assert!(err.to_string().contains(expected), "{text}: {err}");
        }
    }

    #[test]
    fn loopback_hosts_are_recognised_with_and_without_ports() {
        for host in ["localhost", "LOCALHOST:5000", "127.0.0.1", "127.8.0.1:443", "[::1]:5000"] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in ["ghcr.io", "10.0.0.1:5000", "localhost.example:5000", "[fe80::1]:5000"] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }
}
