//! Precompiled components on disk, keyed by the component's sha256 and the
//! engine's compatibility hash, so a restart skips compilation and an
//! upgraded host never loads code compiled for another engine.
//!
//! A cache file is native code the host maps and runs, so it is trusted
//! only as far as it is authenticated: each file starts with an
//! HMAC-SHA256 over the engine key, the component's digest and the code,
//! under a key in `cache.key` that only the operator's user can read
//! (a regular file, owned by its uid, mode 0600; created on first use).
//! A file planted by anyone else, or copied under another digest, fails
//! the MAC and is recompiled; so does a corrupt one. Whoever can write the
//! directory can still delete files, which costs a compile, not safety.
//! The operator's own user is trusted: it could as well replace the binary.

use std::hash::{Hash as _, Hasher as _};
use std::io::Write as _;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use ring::hmac;
use wasmtime::Engine;
use wasmtime::component::Component;

use crate::error::RuntimeError;

/// The file holding the MAC key, inside the cache directory.
const KEY_FILE: &str = "cache.key";
/// Bytes of key and of MAC.
const KEY_BYTES: usize = 32;

/// A directory of `<sha256>-<engine>.cwasm` files.
#[derive(Debug)]
pub(crate) struct PrecompiledCache {
    dir: PathBuf,
    engine_key: String,
    key: hmac::Key,
}

impl PrecompiledCache {
    pub(crate) fn open(dir: PathBuf, engine: &Engine) -> Result<Self, RuntimeError> {
        std::fs::create_dir_all(&dir)
            .map_err(|source| RuntimeError::Cache { path: dir.clone(), source })?;
        let key = load_or_create_key(&dir.join(KEY_FILE))?;
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        Ok(Self { dir, engine_key: format!("{:016x}", hasher.finish()), key })
    }

    fn path_for(&self, digest: &str) -> PathBuf {
        self.dir.join(format!("{digest}-{}.cwasm", self.engine_key))
    }

    /// What the MAC covers: the name's parts, then the code.
    fn signed_message(&self, digest: &str, code: &[u8]) -> Vec<u8> {
        let mut message = Vec::with_capacity(self.engine_key.len() + digest.len() + 2 + code.len());
        for part in [self.engine_key.as_bytes(), b"\0", digest.as_bytes(), b"\0", code] {
            message.extend_from_slice(part);
        }
        message
    }

    /// The cached compilation of the component with this digest, if any.
    #[expect(
        unsafe_code,
        reason = "deserializing trusts the bytes: they are the ones whose MAC was just \
                  verified under the host's key, so this host wrote them for this digest \
                  and this engine"
    )]
    pub(crate) fn load(&self, engine: &Engine, digest: &str) -> Option<Component> {
        let path = self.path_for(digest);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return None,
            Err(err) => {
                tracing::warn!("ignoring unreadable cache file {}: {err}", path.display());
                return None;
            }
        };
        let Some((mac, code)) = bytes.split_at_checked(KEY_BYTES) else {
            tracing::warn!("ignoring cache file {}: too short to be one", path.display());
            return None;
        };
        if hmac::verify(&self.key, &self.signed_message(digest, code), mac).is_err() {
            tracing::warn!(
                "ignoring cache file {}: its MAC does not verify, so this host did not write \
                 it for this component; it is compiled again",
                path.display()
            );
            return None;
        }
        // SAFETY: see the reason above; wasmtime still checks the engine
        // compatibility header and refuses a mismatched file.
        match unsafe { Component::deserialize(engine, code) } {
            Ok(component) => Some(component),
            Err(err) => {
                tracing::warn!("ignoring unusable cache file {}: {err}", path.display());
                None
            }
        }
    }

    /// Writes a compilation atomically (temp file, then rename) so a crash
    /// never leaves a truncated file under the final name.
    pub(crate) fn store(&self, digest: &str, component: &Component) {
        let path = self.path_for(digest);
        let result = component.serialize().map_err(|err| err.to_string()).and_then(|code| {
            let tag = hmac::sign(&self.key, &self.signed_message(digest, &code));
            // A new name that no one could have planted a link under.
            let nonce = random::<8>().ok_or("no random bytes for a temporary name")?;
            let tmp = path.with_extension(format!("tmp{}", u64::from_le_bytes(nonce)));
            let written = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(no_follow())
                .open(&tmp)
                .and_then(|mut file| {
                    file.write_all(tag.as_ref())?;
                    file.write_all(&code)
                });
            written.and_then(|()| std::fs::rename(&tmp, &path)).map_err(|err| err.to_string())
        });
        if let Err(err) = result {
            tracing::warn!("cannot write cache file {}: {err}", path.display());
        }
    }
}

/// `N` bytes from the system's secure random source.
fn random<const N: usize>() -> Option<[u8; N]> {
    let mut bytes = [0_u8; N];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes).ok()?;
    Some(bytes)
}

/// `O_NOFOLLOW`: opening a symbolic link fails instead of following it.
fn no_follow() -> i32 {
    rustix::fs::OFlags::NOFOLLOW.bits().cast_signed()
}

/// Reads the MAC key at `path`, which must be ours alone, or makes one.
/// The checks and the read use one open file, never following a link, so
/// the file cannot be swapped between them.
fn load_or_create_key(path: &Path) -> Result<hmac::Key, RuntimeError> {
    let refuse = |reason: String| RuntimeError::CacheKey { path: path.to_owned(), reason };
    let bytes =
        random::<KEY_BYTES>().ok_or_else(|| refuse("no random bytes for a new key".to_owned()))?;
    let created = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(no_follow())
        .open(path);
    match created {
        Ok(mut file) => {
            file.write_all(&bytes)
                .and_then(|()| file.sync_all())
                .map_err(|err| refuse(format!("cannot write it: {err}")))?;
            Ok(hmac::Key::new(hmac::HMAC_SHA256, &bytes))
        }
        // Made earlier, or by another process just now: read it.
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => read_key(path),
        Err(err) => Err(refuse(format!("cannot create it: {err}"))),
    }
}

fn read_key(path: &Path) -> Result<hmac::Key, RuntimeError> {
    let refuse = |reason: String| RuntimeError::CacheKey { path: path.to_owned(), reason };
    let mut file =
        std::fs::OpenOptions::new().read(true).custom_flags(no_follow()).open(path).map_err(
            |err| {
                if err.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) {
                    refuse("it is a symbolic link; remove it and a new key is made".to_owned())
                } else {
                    refuse(format!("cannot read it: {err}"))
                }
            },
        )?;
    let meta = file.metadata().map_err(|err| refuse(format!("cannot read it: {err}")))?;
    let euid = rustix::process::geteuid().as_raw();
    if !meta.file_type().is_file() {
        return Err(refuse("it is not a regular file; remove it and a new key is made".to_owned()));
    }
    if meta.uid() != euid || meta.mode() & 0o077 != 0 {
        return Err(refuse(format!(
            "it is owned by uid {} with mode {:04o}; it must be owned by uid {euid} \
             (the operator's) with mode 0600, or removed so that a new key is made",
            meta.uid(),
            meta.mode() & 0o7777
        )));
    }
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut file, &mut bytes)
        .map_err(|err| refuse(format!("cannot read it: {err}")))?;
    if bytes.len() != KEY_BYTES {
        return Err(refuse(format!(
            "it holds {} bytes, not {KEY_BYTES}; remove it and a new key is made",
            bytes.len()
        )));
    }
    Ok(hmac::Key::new(hmac::HMAC_SHA256, &bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_others_can_read_is_refused_naming_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(KEY_FILE);
        load_or_create_key(&path).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        load_or_create_key(&path).expect("the key it made is accepted");

        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .unwrap();
        let err = load_or_create_key(&path).unwrap_err().to_string();
        assert!(err.contains("mode 0644") && err.contains("mode 0600"), "{err}");

        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink("/dev/null", &path).unwrap();
        let err = load_or_create_key(&path).unwrap_err().to_string();
        assert!(err.contains("symbolic link"), "{err}");
    }
}
