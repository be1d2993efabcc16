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
//! Nor can such a file cost memory: its size is checked against what a
//! compilation of the component can take before anything is read (a
//! larger file, or one that is not a regular file, is a miss, replaced by
//! the next compilation), and its MAC is computed chunk by chunk as it is
//! read, so the code is held once.
//! The operator's own user is trusted: it could as well replace the binary.

use std::hash::{Hash as _, Hasher as _};
use std::io::{Read as _, Write as _};
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
/// Bytes of compiled code a cache file may hold per byte of the component
/// it was compiled from, and [`CODE_SLACK`] bytes besides: see
/// [`size_bound`]. Measured with this engine: 2.7 to 3.1 (the five plugins
/// and the fixtures, 63 to 453 KiB of WebAssembly, 0.19 to 1.3 MB
/// compiled), so a new wasmtime may well grow it before a file is ever
/// refused; one that is only costs a compilation at each start.
const CODE_PER_WASM_BYTE: u64 = 8;
/// What a cache file may hold beyond [`CODE_PER_WASM_BYTE`]: the ELF
/// headers, type information and tables even an empty component has.
const CODE_SLACK: u64 = 8 << 20;
/// How much of a cache file is read (and MACed) at a time.
const READ_CHUNK: usize = 64 << 10;

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

    /// A MAC over the name's parts, ready to take the code: the MAC covers
    /// the engine key, the digest, then the code.
    fn mac_context(&self, digest: &str) -> hmac::Context {
        let mut context = hmac::Context::with_key(&self.key);
        for part in [self.engine_key.as_bytes(), b"\0", digest.as_bytes(), b"\0"] {
            context.update(part);
        }
        context
    }

    /// The cached compilation of the component with this digest, if any;
    /// `wasm_bytes` is the component's size, which bounds what is read.
    #[expect(
        unsafe_code,
        reason = "deserializing trusts the bytes: they are the ones whose MAC was just \
                  verified under the host's key, so this host wrote them for this digest \
                  and this engine"
    )]
    pub(crate) fn load(
        &self,
        engine: &Engine,
        digest: &str,
        wasm_bytes: usize,
    ) -> Option<Component> {
        let path = self.path_for(digest);
        let code = match self.read_verified(&path, digest, size_bound(wasm_bytes)) {
            Ok(code) => code,
            Err(Miss::Absent) => return None,
            Err(miss) => {
                tracing::warn!(
                    "ignoring cache file {}: {miss}; the component is compiled again and its \
                     compilation written in its place",
                    path.display()
                );
                return None;
            }
        };
        // SAFETY: see the reason above; wasmtime still checks the engine
        // compatibility header and refuses a mismatched file.
        match unsafe { Component::deserialize(engine, &code) } {
            Ok(component) => Some(component),
            Err(err) => {
                tracing::warn!("ignoring unusable cache file {}: {err}", path.display());
                None
            }
        }
    }

    /// The code of the cache file at `path`, read once: its size checked
    /// against `bound` before anything is read, and its MAC computed over
    /// each chunk as it arrives, so the code is held once and a planted
    /// file costs a `stat`, not its size in memory.
    fn read_verified(&self, path: &Path, digest: &str, bound: u64) -> Result<Vec<u8>, Miss> {
        // Never a link, and never blocking on a FIFO someone left there.
        let flags = no_follow() | rustix::fs::OFlags::NONBLOCK.bits().cast_signed();
        let mut file =
            std::fs::OpenOptions::new().read(true).custom_flags(flags).open(path).map_err(
                |err| match err.kind() {
                    std::io::ErrorKind::NotFound => Miss::Absent,
                    _ if err.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) => {
                        Miss::NotAFile
                    }
                    _ => Miss::Unreadable(err),
                },
            )?;
        let meta = file.metadata().map_err(Miss::Unreadable)?;
        if !meta.file_type().is_file() {
            return Err(Miss::NotAFile);
        }
        if meta.len() > bound {
            return Err(Miss::TooLarge { size: meta.len(), bound });
        }
        let mut mac = [0_u8; KEY_BYTES];
        file.read_exact(&mut mac).map_err(|err| match err.kind() {
            std::io::ErrorKind::UnexpectedEof => Miss::TooShort,
            _ => Miss::Unreadable(err),
        })?;
        let mut context = self.mac_context(digest);
        let capacity = usize::try_from(meta.len()).unwrap_or(0).saturating_sub(KEY_BYTES);
        let mut code = Vec::with_capacity(capacity);
        let mut chunk = vec![0_u8; READ_CHUNK];
        loop {
            let read = match file.read(&mut chunk) {
                Ok(0) => break,
                Ok(read) => read,
                Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(err) => return Err(Miss::Unreadable(err)),
            };
            // A file that grows while it is read is held to the bound too.
            let size = (KEY_BYTES + code.len() + read) as u64;
            if size > bound {
                return Err(Miss::TooLarge { size, bound });
            }
            context.update(&chunk[..read]);
            code.extend_from_slice(&chunk[..read]);
        }
        if !same_mac(context.sign().as_ref(), &mac) {
            return Err(Miss::BadMac);
        }
        Ok(code)
    }

    /// Writes a compilation atomically (temp file, then rename) so a crash
    /// never leaves a truncated file under the final name.
    pub(crate) fn store(&self, digest: &str, component: &Component) {
        let path = self.path_for(digest);
        let result = component.serialize().map_err(|err| err.to_string()).and_then(|code| {
            let mut context = self.mac_context(digest);
            context.update(&code);
            let tag = context.sign();
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

/// Why a cache file was not used.
#[derive(Debug, thiserror::Error)]
enum Miss {
    /// There is none: the usual miss, not worth a word.
    #[error("there is none")]
    Absent,
    /// Not a regular file (a link, a directory, a FIFO).
    #[error("it is not a regular file")]
    NotAFile,
    /// It cannot be read.
    #[error("it cannot be read: {0}")]
    Unreadable(std::io::Error),
    /// Larger than any compilation of the component could be: not read.
    #[error(
        "it holds {size} bytes or more, more than a compilation of this component can \
         ({bound} bytes), so it was not read"
    )]
    TooLarge { size: u64, bound: u64 },
    /// Shorter than its MAC.
    #[error("it is too short to be one")]
    TooShort,
    /// Its MAC does not verify: not written by this host for this
    /// component (planted, copied under another digest, or corrupt).
    #[error("its MAC does not verify, so this host did not write it for this component")]
    BadMac,
}

/// The largest cache file read for a component of `wasm_bytes` bytes:
/// the MAC, [`CODE_PER_WASM_BYTE`] bytes of code per byte of WebAssembly,
/// and [`CODE_SLACK`] besides.
fn size_bound(wasm_bytes: usize) -> u64 {
    (KEY_BYTES as u64)
        .saturating_add((wasm_bytes as u64).saturating_mul(CODE_PER_WASM_BYTE))
        .saturating_add(CODE_SLACK)
}

/// Whether two MACs are equal, in time that does not depend on where
/// they differ.
fn same_mac(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0_u8, |differ, (x, y)| differ | (x ^ y)) == 0
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

    /// The smallest component there is: the preamble of an empty one.
    const EMPTY_COMPONENT: &[u8] = b"\0asm\x0d\0\x01\0";

    /// Bytes this thread has read through system calls so far (files and
    /// sockets alike; `cache.load` reads on the calling thread).
    fn thread_bytes_read() -> u64 {
        let io = std::fs::read_to_string("/proc/thread-self/io").expect("procfs");
        io.lines()
            .find_map(|line| line.strip_prefix("rchar: "))
            .and_then(|n| n.parse().ok())
            .expect("an rchar line")
    }

    /// Issue 43, item 9: a 1 GiB file planted in the cache was read whole
    /// (and copied once more for its MAC) before its MAC was checked,
    /// 2 GiB of memory per load. It is now refused on its size, unread,
    /// and the next compilation is written in its place.
    #[test]
    fn issue_43_item_9_a_planted_oversized_file_is_refused_unread_and_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::default();
        let cache = PrecompiledCache::open(dir.path().to_owned(), &engine).unwrap();
        let digest = "0".repeat(64);
        let component = Component::new(&engine, EMPTY_COMPONENT).unwrap();
        cache.store(&digest, &component);
        let path = cache.path_for(&digest);
        let stored = std::fs::metadata(&path).unwrap().len();
        let before = thread_bytes_read();
        assert!(cache.load(&engine, &digest, EMPTY_COMPONENT.len()).is_some());
        let read_legit = thread_bytes_read() - before;
        assert!(read_legit >= stored, "the measure sees a load read the file: {read_legit}");

        // Planted: 1 GiB (sparse, so it costs no disk), as large as the
        // bound is for a component of 127 MiB.
        std::fs::remove_file(&path).unwrap();
        std::fs::File::create(&path).unwrap().set_len(1 << 30).unwrap();
        let before = thread_bytes_read();
        assert!(cache.load(&engine, &digest, EMPTY_COMPONENT.len()).is_none(), "a miss");
        let read_planted = thread_bytes_read() - before;
        assert!(read_planted < 4096, "the planted file was read: {read_planted} bytes");

        // The miss compiles and stores again, which replaces the file.
        cache.store(&digest, &component);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), stored);
        assert!(cache.load(&engine, &digest, EMPTY_COMPONENT.len()).is_some());
    }

    #[test]
    fn a_fifo_or_a_directory_in_the_cache_is_a_miss_that_never_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::default();
        let cache = PrecompiledCache::open(dir.path().to_owned(), &engine).unwrap();
        let digest = "1".repeat(64);
        let path = cache.path_for(&digest);
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            &path,
            rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
        )
        .unwrap();
        assert!(cache.load(&engine, &digest, EMPTY_COMPONENT.len()).is_none());
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        assert!(cache.load(&engine, &digest, EMPTY_COMPONENT.len()).is_none());
    }

    #[test]
    fn a_file_within_the_bound_but_with_a_wrong_mac_is_a_miss() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::default();
        let cache = PrecompiledCache::open(dir.path().to_owned(), &engine).unwrap();
        let digest = "2".repeat(64);
        let component = Component::new(&engine, EMPTY_COMPONENT).unwrap();
        cache.store(&digest, &component);
        let path = cache.path_for(&digest);
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert!(matches!(
            cache.read_verified(&path, &digest, size_bound(EMPTY_COMPONENT.len())),
            Err(Miss::BadMac)
        ));
        std::fs::write(&path, &bytes[..KEY_BYTES - 1]).unwrap();
        assert!(matches!(
            cache.read_verified(&path, &digest, size_bound(EMPTY_COMPONENT.len())),
            Err(Miss::TooShort)
        ));
    }

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
