//! Which installation of proxyfleet this is: the ID every ownership mark
//! carries, so two installations sharing a backend never collect each
//! other's instances.
//!
//! An installation gets its ID once: from `--installation-id` when the
//! first start names one, otherwise generated at that start. Either way it
//! is kept in the installation's store (the state database standalone, the
//! ConfigMap `proxyfleet-kv-proxyfleet.installation` in a cluster), where
//! every later start and every replica reads it. A later start that names
//! another ID is refused: the instances marked with the kept one would no
//! longer be collected.

use std::fmt;

use crate::kv::{CasOutcome, KvError, KvStore};

/// The store scope the ID is kept under; entry names are DNS labels, so no
/// entry's scope can be this one.
pub const SCOPE: &str = "proxyfleet.installation";
const KEY: &str = "id";
/// Longest ID, so it fits a label value beside a prefix on every backend.
const MAX_LEN: usize = 32;

/// An installation's ID: 1-32 characters of `[a-z0-9-]`, starting and
/// ending with a letter or digit (a valid label value on GCE, Kubernetes
/// and Proxmox tags alike).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct InstallationId(String);

/// Why an installation ID was refused or could not be settled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InstallationError {
    /// The text is not a valid ID.
    #[error(
        "{field}: {value:?} is not an installation ID; use 1-{MAX_LEN} characters of [a-z0-9-], starting and ending with a letter or digit"
    )]
    Invalid {
        /// Where the text came from (a flag, a stored key).
        field: String,
        /// The text.
        value: String,
    },
    /// The flag names another ID than the installation already has.
    #[error(
        "--installation-id {wanted} differs from this installation's ID {kept} (kept in its store): instances marked {kept} would no longer be collected; set --installation-id {kept} or leave the flag out"
    )]
    Changed {
        /// The ID the flag names.
        wanted: String,
        /// The ID in the store.
        kept: String,
    },
    /// The store could not be read or written.
    #[error("the installation ID cannot be read or kept: {0}")]
    Store(#[from] KvError),
}

impl InstallationId {
    /// Checks `value`; `field` names where it came from in the error.
    pub fn parse(field: &str, value: &str) -> Result<Self, InstallationError> {
        let edge =
            |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
        let valid = !value.is_empty()
            && value.len() <= MAX_LEN
            && value.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && edge(value.chars().next())
            && edge(value.chars().last());
        if valid {
            Ok(Self(value.to_owned()))
        } else {
            Err(InstallationError::Invalid { field: field.to_owned(), value: value.to_owned() })
        }
    }

    /// A new random ID: 12 hex digits (48 random bits).
    pub fn generate() -> Self {
        let random = uuid::Uuid::new_v4().simple().to_string();
        Self(random[..12].to_owned())
    }

    /// The ID as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// `unnamed`: the ID of a runtime that was given none (tests, the plugin
/// CLI). Both modes always [`settle`] a real one before anything is
/// created.
impl Default for InstallationId {
    fn default() -> Self {
        Self("unnamed".to_owned())
    }
}

impl fmt::Display for InstallationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How [`settle`] arrived at the ID (logged at start as `Kept` or `New`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// Read from the store.
    Kept,
    /// Written now: the first start of this installation.
    New,
}

/// The installation's ID: the one kept in `store`, or `wanted` (or a
/// generated one) kept now at the first start. Two replicas starting at
/// once agree: the store's compare-and-swap lets one write, and the other
/// reads what it wrote.
pub async fn settle(
    store: &dyn KvStore,
    wanted: Option<&InstallationId>,
) -> Result<(InstallationId, Settled), InstallationError> {
    let candidate = wanted.cloned().unwrap_or_else(InstallationId::generate);
    loop {
        if let Some(entry) = store.get(SCOPE, KEY).await? {
            let kept = String::from_utf8_lossy(&entry.value).into_owned();
            let kept = InstallationId::parse(&format!("the stored {SCOPE}/{KEY}"), &kept)?;
            return match wanted {
                Some(wanted) if *wanted != kept => {
                    Err(InstallationError::Changed { wanted: wanted.0.clone(), kept: kept.0 })
                }
                _ => Ok((kept, Settled::Kept)),
            };
        }
        let value = Some(candidate.0.clone().into_bytes());
        match store.compare_and_swap(SCOPE, KEY, None, value).await? {
            CasOutcome::Applied(_) => return Ok((candidate, Settled::New)),
            // Another replica kept its ID first: the next read finds it.
            CasOutcome::Conflict(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::MemoryKv;

    #[test]
    fn ids_are_label_values_and_errors_name_the_field() {
        for good in ["a", "prod-eu", "0a1b2c3d4e5f", &"x".repeat(32)] {
            InstallationId::parse("--installation-id", good).unwrap();
        }
        for bad in ["", "-a", "a-", "Prod", "a_b", "a.b", &"x".repeat(33)] {
            let err = InstallationId::parse("--installation-id", bad).unwrap_err().to_string();
            assert!(err.starts_with("--installation-id: "), "{err}");
        }
        let generated = InstallationId::generate();
        assert_eq!(InstallationId::parse("g", generated.as_str()).unwrap(), generated);
        assert_ne!(generated, InstallationId::generate());
    }

    #[tokio::test]
    async fn the_first_start_keeps_its_id_and_later_starts_read_it() {
        let store = MemoryKv::new();
        let (first, how) = settle(&store, None).await.unwrap();
        assert_eq!(how, Settled::New);
        let (again, how) = settle(&store, None).await.unwrap();
        assert_eq!((again, how), (first.clone(), Settled::Kept));
        let (named, how) = settle(&store, Some(&first)).await.unwrap();
        assert_eq!((named, how), (first, Settled::Kept));
    }

    #[tokio::test]
    async fn a_named_id_is_kept_and_another_name_later_is_refused() {
        let store = MemoryKv::new();
        let prod = InstallationId::parse("f", "prod").unwrap();
        assert_eq!(settle(&store, Some(&prod)).await.unwrap(), (prod.clone(), Settled::New));
        let other = InstallationId::parse("f", "staging").unwrap();
        let err = settle(&store, Some(&other)).await.unwrap_err();
        assert_eq!(
            err,
            InstallationError::Changed { wanted: "staging".into(), kept: "prod".into() }
        );
        assert!(err.to_string().contains("set --installation-id prod"), "{err}");
    }
}
