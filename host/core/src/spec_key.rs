//! The installation's secret key for spec hashes.
//!
//! A Proxy's credential is configured into the proxy its provider starts,
//! so a new credential needs a new instance: the spec hash must change with
//! it. The hash is published in the Proxy's status, and a plain hash of a
//! password would let anyone who reads the status test guesses offline; so
//! the hash covers an HMAC-SHA256 of the credential under this key, which
//! only the operator holds (standalone: the state database; Kubernetes: a
//! Secret in the operator's namespace). A new key changes the hash of every
//! Proxy that has a credential, and so replaces those instances.

use std::fmt;

use hmac::{Hmac, Mac as _};
use sha2::Sha256;

use crate::credential::ProxyCredential;
use crate::kv::{CasOutcome, KvError, KvStore};

/// Where [`settle`] keeps the key in a key-value store: a scope no
/// provider entry can have (entry names hold no dots).
pub const SCOPE: &str = "proxyfleet.spec-key";
const KEY: &str = "key";
/// Bytes in a key.
pub const LEN: usize = 32;

/// The key. `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct SpecKey([u8; LEN]);

/// Why a kept key cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SpecKeyError {
    /// The stored value is not a key.
    #[error(
        "{place}: the spec key is {found} bytes long, not {LEN}; delete it to have a new one made (every Proxy with a credential then gets a new instance)"
    )]
    Length {
        /// Where it was read.
        place: String,
        /// Its length.
        found: usize,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] KvError),
}

impl SpecKey {
    /// A new random key.
    pub fn generate() -> Self {
        Self(rand::random())
    }

    /// A key from its bytes; `place` names where they were read, for the
    /// error.
    pub fn from_bytes(place: &str, bytes: &[u8]) -> Result<Self, SpecKeyError> {
        let key = <[u8; LEN]>::try_from(bytes)
            .map_err(|_| SpecKeyError::Length { place: place.to_owned(), found: bytes.len() })?;
        Ok(Self(key))
    }

    /// The key's bytes, to keep it.
    pub fn as_bytes(&self) -> &[u8; LEN] {
        &self.0
    }

    /// HMAC-SHA256 of the credential under this key: what a spec hash
    /// covers instead of the credential.
    pub fn credential_digest(&self, credential: &ProxyCredential) -> [u8; 32] {
        // A key of any length is valid for HMAC.
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&self.0) else {
            unreachable!("HMAC takes keys of any length")
        };
        // Length-prefixed, so no two credentials give the same input.
        for part in [credential.username(), credential.password()] {
            mac.update(&(part.len() as u64).to_le_bytes());
            mac.update(part.as_bytes());
        }
        mac.finalize().into_bytes().into()
    }

    /// A key for another `purpose`, derived from this one (HMAC-SHA256 of
    /// the purpose): what every replica of the installation, and the next
    /// process after a restart, derives alike, while neither key tells
    /// anything about the other.
    pub fn derive(&self, purpose: &str) -> [u8; 32] {
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&self.0) else {
            unreachable!("HMAC takes keys of any length")
        };
        mac.update(b"derive\0");
        mac.update(purpose.as_bytes());
        mac.finalize().into_bytes().into()
    }
}

impl fmt::Debug for SpecKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SpecKey(<redacted>)")
    }
}

/// The key kept in `store`, or a new one kept now at the first start. Two
/// replicas starting at once agree: the store's compare-and-swap lets one
/// write, and the other reads what it wrote. Only for a store no one else
/// reads (the standalone state database); Kubernetes keeps it in a Secret.
pub async fn settle(store: &dyn KvStore) -> Result<SpecKey, SpecKeyError> {
    let candidate = SpecKey::generate();
    loop {
        if let Some(entry) = store.get(SCOPE, KEY).await? {
            return SpecKey::from_bytes(&format!("the stored {SCOPE}/{KEY}"), &entry.value);
        }
        match store.compare_and_swap(SCOPE, KEY, None, Some(candidate.0.to_vec())).await? {
            CasOutcome::Applied(_) => return Ok(candidate),
            CasOutcome::Conflict(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::MemoryKv;

    #[test]
    fn a_derived_key_is_the_same_for_the_same_key_and_purpose_only() {
        let key = SpecKey::generate();
        let again = SpecKey::from_bytes("test", key.as_bytes()).unwrap();
        assert_eq!(key.derive("sessions"), again.derive("sessions"));
        assert_ne!(key.derive("sessions"), key.derive("other"));
        assert_ne!(key.derive("sessions"), SpecKey::generate().derive("sessions"));
        assert_ne!(&key.derive("sessions"), key.as_bytes());
    }

    fn credential(text: &str) -> ProxyCredential {
        ProxyCredential::parse(text).unwrap()
    }

    #[test]
    fn digests_depend_on_key_and_credential_and_the_key_never_shows() {
        let key = SpecKey::generate();
        let same = SpecKey::from_bytes("test", key.as_bytes()).unwrap();
        let a = credential("crawler:one");
        assert_eq!(key.credential_digest(&a), same.credential_digest(&a));
        assert_ne!(key.credential_digest(&a), key.credential_digest(&credential("crawler:two")));
        assert_ne!(key.credential_digest(&a), key.credential_digest(&credential("crawl:erone")));
        assert_ne!(key.credential_digest(&a), SpecKey::generate().credential_digest(&a));
        assert_eq!(format!("{key:?}"), "SpecKey(<redacted>)");
        let err = SpecKey::from_bytes("the Secret", b"short").unwrap_err().to_string();
        assert!(err.starts_with("the Secret: the spec key is 5 bytes long"), "{err}");
    }

    #[tokio::test]
    async fn the_first_start_keeps_a_key_and_later_starts_read_it() {
        let store = MemoryKv::new();
        let first = settle(&store).await.unwrap();
        assert_eq!(settle(&store).await.unwrap(), first);
        store.compare_and_swap(SCOPE, KEY, Some(1), Some(b"bad".to_vec())).await.unwrap();
        assert!(matches!(settle(&store).await, Err(SpecKeyError::Length { found: 3, .. })));
    }
}
