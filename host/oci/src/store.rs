//! Pulled builds on disk, content-addressed, so that a restart with the
//! registry down starts from what was last pulled.
//!
//! ```text
//! DIR/blobs/sha256/HEX     a component or a manifest, named by its sha256
//! DIR/refs/HEX.json        what a reference last resolved to (HEX: sha256 of the reference)
//! DIR/kept/HEX/L.json      a build of that reference an entry serves (L: its component's hex)
//! DIR/tmp/                 files being written
//! ```
//!
//! Nothing is trusted for its path. A blob is checked against its name
//! whenever it is read, and a record counts only when the manifest it
//! names is held, hashes to that name (the reference's own digest, for a
//! digest reference) and declares the record's component. A file that
//! fails is a missing one: it is removed, with a warning naming it and
//! both digests, and the reference counts as not held, so the next poll
//! (or the load, when the registry answers) pulls it again. What remains is
//! a tag's build as good as the directory: a manifest planted under its own
//! digest, with a record naming it, is a build like any other to the store,
//! which is why only the operator's user may write it.
//!
//! A reference keeps its current build and the builds its entries serve
//! ([`Store::keep`]): a newer build that admission refuses must not take
//! the one serving with it, or the next start would find nothing to serve.
//! Other blobs are removed whenever a reference moves. Files are written whole in `tmp/` and
//! renamed into place, so a crash leaves the old record or the new one,
//! never half of one. One process writes at a time through a [`Store`] and
//! its clones: writes, removals and the clean-up after them hold one lock,
//! so a clean-up never sees a blob whose record is still being written.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use serde::{Deserialize, Serialize};

use crate::digest::{is_sha256, sha256};
use crate::error::OciError;
use crate::layout::check_manifest;
use crate::pull::Pulled;
use crate::reference::PluginReference;
use crate::signature::Signature;

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
    /// The signatures that verified it at its pull, when a policy applied:
    /// checked again before the build serves after a restart.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub signatures: Vec<Signature>,
}

impl Store {
    /// Opens (creating) a store in `dir`.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, OciError> {
        let dir = dir.into();
        for sub in [dir.join("blobs/sha256"), dir.join("refs"), dir.join("kept"), dir.join("tmp")] {
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

    /// What `reference` last resolved to, if it was pulled here and its
    /// record holds: the record readable and naming this reference, its
    /// manifest held and checked against its digest (which is the
    /// reference's own, for a digest reference), and declaring the record's
    /// component. A record that does not hold is removed, and the
    /// reference is not held.
    pub fn current(&self, reference: &PluginReference) -> Result<Option<StoredRef>, OciError> {
        self.checked(&self.ref_path(reference), reference)
    }

    /// The builds of `reference` kept because entries serve them (see
    /// [`Store::keep`]), each checked like [`Store::current`]'s and with
    /// its component held; in no particular order.
    pub fn kept(&self, reference: &PluginReference) -> Result<Vec<StoredRef>, OciError> {
        let dir = self.kept_dir(reference);
        let files = match std::fs::read_dir(&dir) {
            Ok(files) => files,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => return Err(OciError::Store { path: dir, source }),
        };
        let mut kept = Vec::new();
        for file in files.flatten() {
            if let Some(stored) = self.checked(&file.path(), reference)?
                && self.holds(&stored.layer_digest)
            {
                kept.push(stored);
            }
        }
        kept.sort_by(|a, b| a.layer_digest.cmp(&b.layer_digest));
        Ok(kept)
    }

    /// Keeps the builds of `reference` whose components `serving` names
    /// (the ones its entries serve now) through later pulls, and lets go
    /// of every other kept build of it. A build is kept only if the store
    /// holds it, as the current build or as one kept before; others are
    /// skipped (a revision compiled before its blob was removed lives on
    /// in memory only). Answers what is kept now.
    pub fn keep(
        &self,
        reference: &PluginReference,
        serving: &[String],
    ) -> Result<Vec<StoredRef>, OciError> {
        let current = self.current(reference)?;
        let before = self.kept(reference)?;
        let _one_writer = self.writing.lock().unwrap_or_else(PoisonError::into_inner);
        let dir = self.kept_dir(reference);
        let mut kept = Vec::new();
        for layer in serving {
            let known = current
                .iter()
                .chain(&before)
                .find(|stored| stored.layer_digest == *layer && self.holds(layer));
            if let Some(stored) = known
                && !kept.contains(stored)
            {
                kept.push(stored.clone());
            }
        }
        for stored in &kept {
            let path = self.kept_path(reference, &stored.layer_digest)?;
            if before.contains(stored) && path.is_file() {
                continue;
            }
            std::fs::create_dir_all(&dir)
                .map_err(|source| OciError::Store { path: dir.clone(), source })?;
            self.write_atomic(&path, &self.record_bytes(&path, stored)?)?;
        }
        for stored in before.iter().filter(|stored| !kept.contains(stored)) {
            let path = self.kept_path(reference, &stored.layer_digest)?;
            let _ = std::fs::remove_file(path);
        }
        if kept.is_empty() {
            let _ = std::fs::remove_dir(&dir);
        }
        self.collect_garbage();
        Ok(kept)
    }

    /// The record at `path` for `reference`, checked: see [`Store::current`].
    fn checked(
        &self,
        path: &Path,
        reference: &PluginReference,
    ) -> Result<Option<StoredRef>, OciError> {
        let path = path.to_owned();
        let text = match std::fs::read(&path) {
            Ok(text) => text,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(OciError::Store { path, source }),
        };
        let missing =
            |why: &str, expected: &str, actual: &str| -> Result<Option<StoredRef>, OciError> {
                tracing::warn!(
                    path = %path.display(),
                    expected,
                    actual,
                    "a stored record {why}: removed, the build counts as not held"
                );
                self.remove_if_unchanged(&path, &text);
                Ok(None)
            };
        let stored = match serde_json::from_slice::<StoredRef>(&text) {
            Ok(stored) => stored,
            Err(err) => return missing("cannot be read", "a record", &err.to_string()),
        };
        if stored.reference != reference.as_str() {
            return missing("names another reference", reference.as_str(), &stored.reference);
        }
        if !is_sha256(&stored.manifest_digest) || !is_sha256(&stored.layer_digest) {
            return missing("names no sha256 digest", "sha256:…", &stored.manifest_digest);
        }
        if let Some(pinned) = reference.digest()
            && stored.manifest_digest != pinned
        {
            return missing(
                "names another manifest than its reference",
                pinned,
                &stored.manifest_digest,
            );
        }
        let declared = self
            .read(&stored.manifest_digest)?
            .map(|manifest| check_manifest(&manifest).map(|checked| checked.layer.digest));
        match declared {
            Some(Ok(layer)) if layer == stored.layer_digest => Ok(Some(stored)),
            Some(Ok(layer)) => missing(
                "names a component its manifest does not declare",
                &stored.layer_digest,
                &layer,
            ),
            Some(Err(err)) => missing(
                "names a manifest of another layout",
                &stored.manifest_digest,
                &err.to_string(),
            ),
            // Not held, or held with other content (which `read` removed).
            None => missing("names a manifest not held", &stored.manifest_digest, "none"),
        }
    }

    /// The blob (a component or a manifest) `digest` names, checked against
    /// it; `None` when it is not held, or held with other content, which is
    /// removed so that the next pull writes it again.
    pub fn read(&self, digest: &str) -> Result<Option<Vec<u8>>, OciError> {
        let path = self.blob_path(digest)?;
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(OciError::Store { path, source }),
        };
        let actual = sha256(&bytes);
        if actual == digest {
            return Ok(Some(bytes));
        }
        tracing::warn!(
            path = %path.display(),
            expected = digest,
            actual = %actual,
            "a stored blob does not match its name: removed, the build counts as not held"
        );
        // Under the write lock, and only if it is still the bad copy: a
        // put may have renamed a good one in meanwhile.
        let _one_writer = self.writing.lock().unwrap_or_else(PoisonError::into_inner);
        if std::fs::read(&path).is_ok_and(|now| sha256(&now) != digest) {
            let _ = std::fs::remove_file(&path);
        }
        Ok(None)
    }

    /// True when the build `layer_digest` names is on disk (unchecked:
    /// [`Store::read`] checks it).
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
        for (digest, bytes) in
            [(&pulled.manifest_digest, &pulled.manifest), (&pulled.layer_digest, &pulled.bytes)]
        {
            let blob = self.blob_path(digest)?;
            // A file already there is kept only if it is this very blob: a
            // damaged or planted one is replaced.
            if !std::fs::read(&blob).is_ok_and(|held| held == *bytes) {
                self.write_atomic(&blob, bytes)?;
            }
        }
        let stored = StoredRef {
            reference: reference.as_str().to_owned(),
            manifest_digest: pulled.manifest_digest.clone(),
            layer_digest: pulled.layer_digest.clone(),
            pulled_at: now_unix,
            signatures: pulled
                .verified
                .as_ref()
                .map(|verified| verified.signatures.clone())
                .unwrap_or_default(),
        };
        let path = self.ref_path(reference);
        self.write_atomic(&path, &self.record_bytes(&path, &stored)?)?;
        self.collect_garbage();
        Ok(stored)
    }

    fn record_bytes(&self, path: &Path, stored: &StoredRef) -> Result<Vec<u8>, OciError> {
        serde_json::to_vec_pretty(stored).map_err(|err| OciError::Store {
            path: path.to_owned(),
            source: std::io::Error::other(err),
        })
    }

    /// Removes the record at `path` if it still reads `text`: a put may
    /// have written a good one in meanwhile.
    fn remove_if_unchanged(&self, path: &Path, text: &[u8]) {
        let _one_writer = self.writing.lock().unwrap_or_else(PoisonError::into_inner);
        if std::fs::read(path).is_ok_and(|now| now == text) {
            let _ = std::fs::remove_file(path);
        }
    }

    /// Removes blobs that no record names; a failure leaves files behind,
    /// which costs disk, not correctness. Callers hold the write lock.
    fn collect_garbage(&self) {
        let Ok(mut records) = std::fs::read_dir(self.dir.join("refs"))
            .map(|files| files.flatten().map(|file| file.path()).collect::<Vec<_>>())
        else {
            return;
        };
        let Ok(kept_dirs) = std::fs::read_dir(self.dir.join("kept")) else { return };
        for dir in kept_dirs.flatten() {
            let Ok(files) = std::fs::read_dir(dir.path()) else { return };
            records.extend(files.flatten().map(|file| file.path()));
        }
        let mut kept = std::collections::BTreeSet::new();
        for record in records {
            let Ok(text) = std::fs::read(&record) else { return };
            // An unreadable record may still name blobs: keep everything.
            let Ok(stored) = serde_json::from_slice::<StoredRef>(&text) else { return };
            kept.insert(stored.manifest_digest);
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

    fn kept_dir(&self, reference: &PluginReference) -> PathBuf {
        let key = sha256(reference.as_str().as_bytes());
        self.dir.join("kept").join(&key["sha256:".len()..])
    }

    fn kept_path(&self, reference: &PluginReference, layer: &str) -> Result<PathBuf, OciError> {
        // Checked as a digest, so the name never leaves the directory.
        self.blob_path(layer)?;
        Ok(self.kept_dir(reference).join(format!("{}.json", &layer["sha256:".len()..])))
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
    use crate::layout::{CONFIG_MEDIA_TYPE, LAYER_MEDIA_TYPE, MANIFEST_MEDIA_TYPE};

    /// A build of `bytes` with a manifest in the layout that declares it.
    fn pulled(bytes: &[u8]) -> Pulled {
        let manifest = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": MANIFEST_MEDIA_TYPE,
            "config": { "mediaType": CONFIG_MEDIA_TYPE, "digest": sha256(b"{}"), "size": 2 },
            "layers": [{ "mediaType": LAYER_MEDIA_TYPE, "digest": sha256(bytes), "size": bytes.len() }],
        }))
        .unwrap();
        Pulled {
            manifest_digest: sha256(&manifest),
            manifest,
            layer_digest: sha256(bytes),
            bytes: bytes.to_vec(),
            verified: None,
        }
    }

    /// What the runtime serves for `reference`: its record, then its
    /// component, each checked.
    fn served(store: &Store, reference: &PluginReference) -> Option<Vec<u8>> {
        let stored = store.current(reference).unwrap()?;
        store.read(&stored.layer_digest).unwrap()
    }

    fn blob_file(dir: &Path, digest: &str) -> PathBuf {
        dir.join("blobs/sha256").join(&digest["sha256:".len()..])
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
        assert_eq!(current.manifest_digest, pulled(b"three").manifest_digest);
        assert_eq!(store.read(&sha256(b"three")).unwrap().unwrap(), b"three");
        assert!(store.holds(&sha256(b"three")));
        assert!(!store.holds(&sha256(b"two")), "a replaced build is removed");
        assert!(!store.holds(&pulled(b"two").manifest_digest), "and its manifest");
        // Another reference's build stays.
        let other = PluginReference::parse("oci://r.io/q:1").unwrap();
        store.put(&other, &pulled(b"other"), 3).unwrap();
        store.put(&reference, &pulled(b"four"), 4).unwrap();
        assert!(store.holds(&sha256(b"other")) && store.holds(&sha256(b"four")));
        assert!(store.holds(&pulled(b"other").manifest_digest));
        assert!(!store.holds(&sha256(b"three")));
        assert!(store.read("../../etc/passwd").is_err());
    }

    /// Issue 47, item 1: a newer build pulled while an entry serves the
    /// older one (and refused by admission) leaves the older one held,
    /// through any number of later pulls, until the entries let go of it.
    #[test]
    fn issue_47_item_1_a_kept_build_outlives_newer_pulls_until_let_go() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let reference = PluginReference::parse("oci://r.io/p:1").unwrap();
        let good = pulled(b"good");
        store.put(&reference, &good, 1).unwrap();
        assert_eq!(
            store.keep(&reference, std::slice::from_ref(&good.layer_digest)).unwrap().len(),
            1
        );
        for newer in [&b"refused"[..], b"refused too"] {
            store.put(&reference, &pulled(newer), 2).unwrap();
        }
        assert!(!store.holds(&sha256(b"refused")), "a build no one serves is not kept");
        let kept = store.kept(&reference).unwrap();
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].layer_digest, good.layer_digest);
        assert_eq!(kept[0].manifest_digest, good.manifest_digest);
        assert_eq!(store.read(&good.layer_digest).unwrap().unwrap(), b"good");
        // A store opened again (the next start) still has it.
        let again = Store::open(dir.path()).unwrap();
        assert_eq!(again.kept(&reference).unwrap(), kept);
        assert_eq!(
            again.current(&reference).unwrap().unwrap().layer_digest,
            sha256(b"refused too")
        );
        // Entries that move to the current build let go of the old one.
        let kept = again.keep(&reference, &[sha256(b"refused too")]).unwrap();
        assert_eq!(kept.len(), 1);
        assert!(!again.holds(&good.layer_digest) && !again.holds(&good.manifest_digest));
        // A build the store does not hold cannot be kept; nothing kept
        // leaves no directory behind.
        assert!(again.keep(&reference, &[sha256(b"never pulled")]).unwrap().is_empty());
        assert!(!again.kept_dir(&reference).exists());
        assert!(again.holds(&sha256(b"refused too")), "the current build stays");
        // Another reference's kept file does not count for this one.
        let other = PluginReference::parse("oci://r.io/q:1").unwrap();
        store.put(&other, &pulled(b"q"), 3).unwrap();
        store.keep(&other, &[sha256(b"q")]).unwrap();
        std::fs::create_dir_all(again.kept_dir(&reference)).unwrap();
        std::fs::copy(
            again.kept_path(&other, &sha256(b"q")).unwrap(),
            again.kept_path(&reference, &sha256(b"q")).unwrap(),
        )
        .unwrap();
        assert!(again.kept(&reference).unwrap().is_empty());
    }

    /// Issue 43, item 8: a blob planted under a digest its bytes do not hash
    /// to (the component or the manifest) is not served for a tag reference
    /// nor for a digest reference: it counts as missing and is removed, and
    /// the next put writes the real one again.
    #[test]
    fn issue_43_item_8_a_planted_blob_is_missing_for_a_tag_and_a_digest_reference() {
        let build = pulled(b"the real component");
        let tag = PluginReference::parse("oci://r.io/p:1").unwrap();
        let pinned =
            PluginReference::parse(&format!("oci://r.io/p@{}", build.manifest_digest)).unwrap();
        for reference in [&tag, &pinned] {
            for planted_over in [&build.layer_digest, &build.manifest_digest] {
                let dir = tempfile::tempdir().unwrap();
                let store = Store::open(dir.path()).unwrap();
                store.put(reference, &build, 1).unwrap();
                assert_eq!(served(&store, reference).as_deref(), Some(&b"the real component"[..]));
                let file = blob_file(dir.path(), planted_over);
                std::fs::write(&file, b"a planted build").unwrap();
                assert_eq!(served(&store, reference), None, "{reference}, {planted_over}");
                assert!(!file.exists(), "the planted file is removed");
                store.put(reference, &build, 2).unwrap();
                assert_eq!(served(&store, reference).as_deref(), Some(&b"the real component"[..]));
            }
        }
    }

    /// Issue 43, item 8: a record pointing at a planted build that hashes to
    /// its own name is not served unless the manifest it names, checked
    /// against its digest, declares that build; and for a digest reference
    /// only the manifest the reference names counts.
    #[test]
    fn issue_43_item_8_a_record_pointing_at_a_planted_build_is_missing() {
        let real = pulled(b"the real component");
        let planted = pulled(b"a planted component");
        let tag = PluginReference::parse("oci://r.io/p:1").unwrap();
        let pinned =
            PluginReference::parse(&format!("oci://r.io/p@{}", real.manifest_digest)).unwrap();
        for reference in [&tag, &pinned] {
            let dir = tempfile::tempdir().unwrap();
            let store = Store::open(dir.path()).unwrap();
            store.put(reference, &real, 1).unwrap();
            let record = store.ref_path(reference);
            // The planted component under its own digest, and the record
            // moved to it with the real manifest's digest kept.
            std::fs::write(blob_file(dir.path(), &planted.layer_digest), &planted.bytes).unwrap();
            let forged = StoredRef {
                reference: reference.as_str().to_owned(),
                manifest_digest: real.manifest_digest.clone(),
                layer_digest: planted.layer_digest.clone(),
                pulled_at: 1,
                signatures: Vec::new(),
            };
            std::fs::write(&record, serde_json::to_vec(&forged).unwrap()).unwrap();
            assert_eq!(served(&store, reference), None, "{reference}");
            assert!(!record.exists(), "the forged record is removed");
        }
        // A whole planted build (manifest and component, each under its own
        // digest) is not the build a digest reference names.
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let other = PluginReference::parse("oci://r.io/other:1").unwrap();
        store.put(&other, &planted, 1).unwrap();
        let forged = StoredRef {
            reference: pinned.as_str().to_owned(),
            manifest_digest: planted.manifest_digest.clone(),
            layer_digest: planted.layer_digest.clone(),
            pulled_at: 1,
            signatures: Vec::new(),
        };
        std::fs::write(store.ref_path(&pinned), serde_json::to_vec(&forged).unwrap()).unwrap();
        assert_eq!(served(&store, &pinned), None);
        // A record of the earlier layout, without its manifest, is missing
        // too: nothing ties its component to the manifest digest.
        std::fs::remove_file(blob_file(dir.path(), &planted.manifest_digest)).unwrap();
        assert_eq!(served(&store, &other), None);
    }

    #[test]
    fn an_unreadable_record_is_missing_not_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let reference = PluginReference::parse("oci://r.io/p:1").unwrap();
        std::fs::write(store.ref_path(&reference), b"not json").unwrap();
        assert_eq!(store.current(&reference).unwrap(), None);
        assert!(!store.ref_path(&reference).exists());
    }
}
