//! Precompiled components on disk, keyed by the component's sha256 and the
//! engine's compatibility hash, so a restart skips compilation and an
//! upgraded host never loads code compiled for another engine.

use std::hash::{Hash as _, Hasher as _};
use std::path::PathBuf;

use wasmtime::Engine;
use wasmtime::component::Component;

use crate::error::RuntimeError;

/// A directory of `<sha256>-<engine>.cwasm` files.
#[derive(Debug)]
pub(crate) struct PrecompiledCache {
    dir: PathBuf,
    engine_key: String,
}

impl PrecompiledCache {
    pub(crate) fn open(dir: PathBuf, engine: &Engine) -> Result<Self, RuntimeError> {
        std::fs::create_dir_all(&dir)
            .map_err(|source| RuntimeError::Cache { path: dir.clone(), source })?;
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        Ok(Self { dir, engine_key: format!("{:016x}", hasher.finish()) })
    }

    fn path_for(&self, digest: &str) -> PathBuf {
        self.dir.join(format!("{digest}-{}.cwasm", self.engine_key))
    }

    /// The cached compilation of the component with this digest, if any.
    #[expect(
        unsafe_code,
        reason = "deserializing trusts the file: it is only ever written by `store` below, \
                  named by the source's digest and this engine's compatibility hash, in a \
                  directory only the host writes"
    )]
    pub(crate) fn load(&self, engine: &Engine, digest: &str) -> Option<Component> {
        let path = self.path_for(digest);
        if !path.exists() {
            return None;
        }
        // SAFETY: see the reason above; wasmtime still checks the engine
        // compatibility header and refuses a mismatched file.
        match unsafe { Component::deserialize_file(engine, &path) } {
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
        let result = component.serialize().map_err(|err| err.to_string()).and_then(|bytes| {
            let tmp = path.with_extension(format!("tmp{}", std::process::id()));
            std::fs::write(&tmp, bytes)
                .and_then(|()| std::fs::rename(&tmp, &path))
                .map_err(|err| err.to_string())
        });
        if let Err(err) = result {
            tracing::warn!("cannot write cache file {}: {err}", path.display());
        }
    }
}
