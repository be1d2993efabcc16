//! Pulled builds on disk, content-addressed, so that a restart with the
//! registry down starts from what was last pulled.
//!
//! ```text
//! DIR/blobs/sha256/HEX     a component, named by its sha256
//! DIR/refs/HEX.json        what a reference last resolved to (HEX: sha256 of the reference)
//! DIR/tmp/                 files being written
//! ```
//!
//! A blob is checked against its name on every read: a damaged or planted
//! file is refused (and removed) rather than compiled, and the reference
//! counts as not held, so the next poll pulls it again. A reference keeps
//! only its current build; other blobs are removed whenever a reference
//! moves. Files are written whole in `tmp/` and renamed into place, so a
//! crash leaves the old record or the new one, never half of one. One
//! process writes at a time through a [`Store`] and its clones: writes and
//! the clean-up after them hold one lock, so a clean-up never sees a blob
//! whose record is still being written.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use serde::{Deserialize, Serialize};

use crate::error::OciError;
use crate::pull::{Pulled, sha256};
use crate::reference::{PluginReference, is_sha256};

/// A store directory; clones share its write lock.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
    writing: Arc<Mutex<()>>,
}

/// What a reference last resolved to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct StoredRef {
    /// The reference, as written.
    pub reference: String,
    /// Its manifest's digest.
    pub manifest_digest: String,
    /// Its component's digest.
    pub layer_digest: String,
    /// When it was pulled, in Unix seconds.
    pub pulled_at: u64,
}

impl Store {
    /// Opens (creating) a store in `dir`.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, OciError> {
        let dir = dir.into();
        for sub in [dir.join("blobs/sha256"), dir.join("refs"), dir.join("tmp")] {
            std::fs::create_dir_all(&sub)
                .map_err(|source| OciError::Store { path: sub, source })?;
        }
        // What a crash left half-written is of no use to anyone.
        if let Ok(leftovers) = std::fs::read_dir(dir.join("tmp")) {
            for leftover in leftovers.flatten() {
                let _ = std::fs::remove_file(leftover.path());
            }
        }
        Ok(Self { dir, writing: Arc::default() })
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// What `reference` last resolved to, if it was ever pulled here.
    pub fn current(&self, reference: &PluginReference) -> Result<Option<StoredRef>, OciError> {
        let path = self.ref_path(reference);
        let text = match std::fs::read(&path) {
            Ok(text) => text,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(OciError::Store { path, source }),
        };
        let stored: StoredRef = serde_json::from_slice(&text).map_err(|err| OciError::Store {
            path: path.clone(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, err),
        })?;
        if stored.reference != reference.as_str() || !is_sha256(&stored.layer_digest) {
            return Err(OciError::Store {
                path,
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "the record names another reference or no sha256 digest",
                ),
            });
        }
        Ok(Some(stored))
    }

    /// The component `layer_digest` names, checked against it. A file that
    /// does not match is removed, so the next pull writes it again.
    pub fn read(&self, layer_digest: &str) -> Result<Vec<u8>, OciError> {
        let path = self.blob_path(layer_digest)?;
        let bytes = std::fs::read(&path)
            .map_err(|source| OciError::Store { path: path.clone(), source })?;
        let actual = sha256(&bytes);
        if actual != layer_digest {
            // Under the write lock, and only if it is still the bad copy: a
            // put may have renamed a good one in meanwhile.
            let _one_writer = self.writing.lock().unwrap_or_else(PoisonError::into_inner);
            if std::fs::read(&path).is_ok_and(|now| sha256(&now) != layer_digest) {
                let _ = std::fs::remove_file(&path);
            }
            return Err(OciError::Digest {
                reference: path.display().to_string(),
                what: "stored component",
                expected: layer_digest.to_owned(),
                actual,
            });
        }
        Ok(bytes)
    }

    /// True when the build `layer_digest` names is on disk (unchecked).
    pub fn holds(&self, layer_digest: &str) -> bool {
        self.blob_path(layer_digest).is_ok_and(|path| path.is_file())
    }

    /// Records `pulled` as what `reference` resolves to now and removes
    /// blobs no reference names any more.
    pub fn put(
        &self,
        reference: &PluginReference,
        pulled: &Pulled,
        now_unix: u64,
    ) -> Result<StoredRef, OciError> {
        let _one_writer = self.writing.lock().unwrap_or_else(PoisonError::into_inner);
        let blob = self.blob_path(&pulled.layer_digest)?;
        if !blob.is_file() {
            self.write_atomic(&blob, &pulled.bytes)?;
        }
        let stored = StoredRef {
            reference: reference.as_str().to_owned(),
            manifest_digest: pulled.manifest_digest.clone(),
            layer_digest: pulled.layer_digest.clone(),
            pulled_at: now_unix,
        };
        let record = serde_json::to_vec_pretty(&stored).map_err(|err| OciError::Store {
            path: self.ref_path(reference),
            source: std::io::Error::other(err),
        })?;
        self.write_atomic(&self.ref_path(reference), &record)?;
        self.collect_garbage();
        Ok(stored)
    }

    /// Removes blobs that no record names; a failure leaves files behind,
    /// which costs disk, not correctness. Callers hold the write lock.
    fn collect_garbage(&self) {
        let Ok(records) = std::fs::read_dir(self.dir.join("refs")) else { return };
        let mut kept = std::collections::BTreeSet::new();
        for record in records.flatten() {
            let Ok(text) = std::fs::read(record.path()) else { return };
            // An unreadable record may still name blobs: keep everything.
            let Ok(stored) = serde_json::from_slice::<StoredRef>(&text) else { return };
            kept.insert(stored.layer_digest);
        }
        let Ok(blobs) = std::fs::read_dir(self.dir.join("blobs/sha256")) else { return };
        for blob in blobs.flatten() {
            let name = blob.file_name();
            let Some(hex) = name.to_str() else { continue };
            let digest = format!("sha256:{hex}");
            // Only what this store names by digest is its to remove.
            if is_sha256(&digest)
                && !kept.contains(&digest)
                && let Err(err) = std::fs::remove_file(blob.path())
            {
                tracing::debug!(path = %blob.path().display(), "cannot remove an unused plugin blob: {err}");
            }
        }
    }

    fn blob_path(&self, digest: &str) -> Result<PathBuf, OciError> {
        if !is_sha256(digest) {
            return Err(OciError::Store {
                path: self.dir.clone(),
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("{digest:?} is not a sha256 digest"),
                ),
            });
        }
        Ok(self.dir.join("blobs/sha256").join(&digest["sha256:".len()..]))
    }

    fn ref_path(&self, reference: &PluginReference) -> PathBuf {
        let key = sha256(reference.as_str().as_bytes());
        self.dir.join("refs").join(format!("{}.json", &key["sha256:".len()..]))
    }

    fn write_atomic(&self, path: &Path, bytes: &[u8]) -> Result<(), OciError> {
        let error = |source| OciError::Store { path: path.to_owned(), source };
        let mut file = tempfile::NamedTempFile::new_in(self.dir.join("tmp")).map_err(error)?;
        file.write_all(bytes).map_err(error)?;
        file.as_file().sync_all().map_err(error)?;
        file.persist(path).map_err(|err| error(err.error))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pulled(bytes: &[u8]) -> Pulled {
        Pulled {
            manifest_digest: sha256(b"manifest"),
            layer_digest: sha256(bytes),
            bytes: bytes.to_vec(),
        }
    }

    #[test]
    fn a_reference_keeps_its_current_build_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let reference = PluginReference::parse("oci://r.io/p:1").unwrap();
        assert_eq!(store.current(&reference).unwrap(), None);
        for build in [&b"one"[..], b"two", b"three"] {
            store.put(&reference, &pulled(build), 1).unwrap();
        }
        let current = store.current(&reference).unwrap().unwrap();
        assert_eq!(current.layer_digest, sha256(b"three"));
        assert_eq!(store.read(&sha256(b"three")).unwrap(), b"three");
        assert!(store.holds(&sha256(b"three")));
        assert!(!store.holds(&sha256(b"two")), "a replaced build is removed");
        // Another reference's build stays.
        let other = PluginReference::parse("oci://r.io/q:1").unwrap();
        store.put(&other, &pulled(b"other"), 3).unwrap();
        store.put(&reference, &pulled(b"four"), 4).unwrap();
        assert!(store.holds(&sha256(b"other")) && store.holds(&sha256(b"four")));
        assert!(!store.holds(&sha256(b"three")));
    }

    #[test]
    fn a_damaged_blob_is_refused_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let reference = PluginReference::parse("oci://r.io/p:1").unwrap();
        store.put(&reference, &pulled(b"component"), 1).unwrap();
        let digest = sha256(b"component");
        let path = dir.path().join("blobs/sha256").join(&digest["sha256:".len()..]);
        std::fs::write(&path, b"planted").unwrap();
        let err = store.read(&digest).unwrap_err();
        assert!(matches!(err, OciError::Digest { what: "stored component", .. }), "{err}");
        assert!(!path.exists());
        assert!(store.read("../../etc/passwd").is_err());
    }
}
