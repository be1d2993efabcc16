//! What a plugin revision must pass before it serves an entry, at load and
//! on a swap: it loaded (compiled, contract checked, described), it is the
//! build the entry pins if it pins one, it asks for nothing the entry does
//! not grant, and it accepts the entry's config. The last is a call into
//! the plugin, made by the registry; the rest are decided here.

use proxyfleet_core::{Capabilities, HttpDestination};

pub use proxyfleet_core::revisions::RejectionKind;

use crate::config::{EntryConfig, Grants, Pin};
use crate::plugin::PluginRevision;

/// A capability a plugin asks for (in `describe`) that its entry does not
/// grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MissingGrant {
    /// An HTTP destination no `grants.http` entry names.
    Http(HttpDestination),
    /// The libvirt interface, imported by a build whose entry has no
    /// `grants.libvirt`: what a build imports is what it may do, so one
    /// that gains libvirt is a widening the operator grants by name.
    Libvirt {
        /// The import, as the component names it.
        import: String,
    },
}

impl std::fmt::Display for MissingGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Http(destination) => write!(f, "grants.http {destination}"),
            Self::Libvirt { import } => write!(f, "grants.libvirt (the build imports {import})"),
        }
    }
}

/// Everything `requested` names that `grants` does not: a destination is
/// granted when a grant has the same scheme, host and port (default ports
/// filled in). Only the grants count, not what an earlier build asked for:
/// the operator decides what an entry reaches, not the plugin's history.
pub fn missing_grants(requested: &Capabilities, grants: &Grants) -> Vec<MissingGrant> {
    requested
        .http
        .iter()
        .filter(|wanted| {
            !grants.http.iter().any(|grant| same_destination(&grant.destination, wanted))
        })
        .map(|wanted| MissingGrant::Http(wanted.clone()))
        .collect()
}

fn same_destination(a: &HttpDestination, b: &HttpDestination) -> bool {
    let host = |d: &HttpDestination| d.host.trim_matches(['[', ']']).to_ascii_lowercase();
    a.scheme.eq_ignore_ascii_case(&b.scheme)
        && host(a) == host(b)
        && a.effective_port() == b.effective_port()
}

/// Why a revision may not serve an entry. Displayed after the plugin's
/// name ("plugin \"x\" refused the entry's config: ...").
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum Refusal {
    #[error("failed to load: {0}")]
    Load(String),
    #[error("is not the pinned build: the entry pins {pin}, the file is {}", described(version.as_deref(), digest))]
    Pin {
        pin: Pin,
        /// `None` when the file was refused by its digest alone, before
        /// it was compiled or described.
        version: Option<String>,
        digest: String,
    },
    #[error(
        "asks for what the entry does not grant: {}; grant it in the entry's `grants`, or \
         publish a build that does not ask for it",
        .0.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
    )]
    Widening(Vec<MissingGrant>),
    #[error("refused the entry's config: {0}")]
    Config(String),
    /// A credential the entry's grants name cannot be read (a missing
    /// Secret or key): the entry's fault, not the plugin's.
    #[error("cannot serve the entry: {0}")]
    Credential(String),
}

impl Refusal {
    pub(crate) fn kind(&self) -> RejectionKind {
        match self {
            Self::Load(_) => RejectionKind::Load,
            Self::Pin { .. } => RejectionKind::Pin,
            Self::Widening(_) => RejectionKind::Capabilities,
            Self::Config(_) | Self::Credential(_) => RejectionKind::Config,
        }
    }
}

fn described(version: Option<&str>, digest: &str) -> String {
    match version {
        Some(version) => format!("version {version} (sha256:{digest})"),
        None => format!("sha256:{digest} (not compiled)"),
    }
}

/// The refusal of a file by its digest alone, when every entry that uses
/// it pins another digest: such a file is neither compiled nor described,
/// so an untrusted file costs the host nothing. `None` when some entry may
/// take it (or none uses it), and it must be loaded to tell.
pub(crate) fn refused_by_digest_pins<'a>(
    using: impl IntoIterator<Item = &'a EntryConfig>,
    digest: &str,
) -> Option<Vec<(&'a EntryConfig, Refusal)>> {
    let mut refusals = Vec::new();
    for entry in using {
        match &entry.pin {
            Some(pin @ Pin::Digest(_)) if !pin.admits("", digest) => refusals.push((
                entry,
                Refusal::Pin { pin: pin.clone(), version: None, digest: digest.to_owned() },
            )),
            _ => return None,
        }
    }
    (!refusals.is_empty()).then_some(refusals)
}

/// The checks that need no call into the plugin: pin, then grants.
pub(crate) fn check_pin_and_grants(
    entry: &EntryConfig,
    revision: &PluginRevision,
) -> Result<(), Refusal> {
    if let Some(pin) = &entry.pin
        && !pin.admits(&revision.info.version, &revision.digest)
    {
        return Err(Refusal::Pin {
            pin: pin.clone(),
            version: Some(revision.info.version.clone()),
            digest: revision.digest.clone(),
        });
    }
    let mut missing = missing_grants(&revision.info.capabilities, &entry.grants);
    if entry.grants.libvirt.is_empty()
        && let Some(import) = revision.imports.iter().find(|name| is_libvirt_import(name))
    {
        missing.push(MissingGrant::Libvirt { import: import.clone() });
    }
    if missing.is_empty() { Ok(()) } else { Err(Refusal::Widening(missing)) }
}

/// True for the contract's libvirt interface, at any version.
fn is_libvirt_import(name: &str) -> bool {
    name.split('@').next() == Some(LIBVIRT_INTERFACE)
}

/// The contract's libvirt interface, without its version.
const LIBVIRT_INTERFACE: &str = "proxyfleet:provider/libvirt";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::HttpGrant;

    #[test]
    fn the_libvirt_interface_is_known_at_any_version_and_nothing_else() {
        assert!(is_libvirt_import("proxyfleet:provider/libvirt@0.5.0"));
        assert!(is_libvirt_import("proxyfleet:provider/libvirt"));
        assert!(!is_libvirt_import("proxyfleet:provider/libvirt-extra@0.5.0"));
        assert!(!is_libvirt_import("proxyfleet:provider/kv@0.5.0"));
        let missing = MissingGrant::Libvirt { import: "proxyfleet:provider/libvirt@0.5.0".into() };
        assert_eq!(
            missing.to_string(),
            "grants.libvirt (the build imports proxyfleet:provider/libvirt@0.5.0)"
        );
    }

    fn destination(scheme: &str, host: &str, port: Option<u16>) -> HttpDestination {
        HttpDestination { scheme: scheme.into(), host: host.into(), port }
    }

    fn grants(destinations: &[HttpDestination]) -> Grants {
        Grants {
            http: destinations
                .iter()
                .map(|d| HttpGrant {
                    destination: d.clone(),
                    allow_addresses: Vec::new(),
                    credential: None,
                })
                .collect(),
            ca_file: None,
            libvirt: Vec::new(),
        }
    }

    #[test]
    fn nothing_asked_nothing_missing() {
        assert!(missing_grants(&Capabilities::default(), &Grants::default()).is_empty());
    }

    #[test]
    fn a_destination_is_granted_by_scheme_host_and_effective_port() {
        let granted = grants(&[destination("https", "pve.lan", None)]);
        let asks = |d: HttpDestination| Capabilities { http: vec![d] };
        assert!(
            missing_grants(&asks(destination("https", "pve.lan", Some(443))), &granted).is_empty()
        );
        assert!(missing_grants(&asks(destination("HTTPS", "PVE.lan", None)), &granted).is_empty());
        for other in [
            destination("https", "pve.lan", Some(8006)),
            destination("http", "pve.lan", None),
            destination("https", "other.lan", None),
        ] {
            let missing = missing_grants(&asks(other.clone()), &granted);
            assert_eq!(missing, vec![MissingGrant::Http(other)]);
        }
    }

    #[test]
    fn only_the_ungranted_destinations_are_named() {
        let granted = grants(&[
            destination("https", "a.example", None),
            destination("http", "::1", Some(8080)),
        ]);
        let requested = Capabilities {
            http: vec![
                destination("https", "a.example", None),
                destination("http", "[::1]", Some(8080)),
                destination("https", "b.example", Some(8443)),
            ],
        };
        let missing = missing_grants(&requested, &granted);
        assert_eq!(missing.len(), 1);
        assert_eq!(missing[0].to_string(), "grants.http https://b.example:8443");
        let reason = Refusal::Widening(missing).to_string();
        assert!(reason.contains("grants.http https://b.example:8443"), "{reason}");
    }
}
