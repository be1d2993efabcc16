//! axe-core, the accessibility engine the browser tests run inside pages.
//! Debian does not package it; its `axe.min.js` is taken from the npm
//! package at a pinned version, checked against a pinned digest (the one
//! axe-core publishes for that release in its `sri-history.json`) and kept
//! in the cache.

use std::fs;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, ensure};
use sha2::{Digest as _, Sha256};

use crate::apt::{self, Need};
use crate::{cache, process};

const PACKAGE: &str = "axe-core";
pub const VERSION: &str = "4.14.1";
/// sha256 of `axe.min.js` in that package.
const SHA256: &str = "29348999450cdf2849a8e70b7912fc2da85a849da39c0d0d5394f51d4a9ed95c";

/// The environment variable the browser tests find the script by
/// (`tests/src/browser.rs`).
pub const ENV: &str = "PROXYFLEET_AXE";

fn installed_path() -> Result<PathBuf> {
    Ok(cache::tools()?.join(format!("axe-core-{VERSION}")).join("axe.min.js"))
}

/// The cached script, if it is there and is the pinned release.
pub fn find() -> Option<PathBuf> {
    let path = installed_path().ok()?;
    let data = fs::read(&path).ok()?;
    (hex::encode(Sha256::digest(&data)) == SHA256).then_some(path)
}

/// The pinned `axe.min.js`: cached, or unpacked from the npm registry.
pub fn provide() -> Result<PathBuf> {
    if let Some(path) = find() {
        return Ok(path);
    }
    if process::first_line("npm", &["--version"]).is_none() {
        apt::ensure(&[Need::any("npm")])?;
    }
    let path = installed_path()?;
    let dir = path.parent().context("axe-core path has no parent")?;
    let work = cache::tools()?.join(format!("axe-core-{VERSION}.download"));
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work)?;
    eprintln!("xtask: axe-core {VERSION}: unpacking it from the npm registry");
    let mut pack = Command::new("npm");
    pack.args(["pack", "--silent", &format!("{PACKAGE}@{VERSION}")]).current_dir(&work);
    let tarball = process::output(&mut pack)
        .with_context(|| format!("`npm pack {PACKAGE}@{VERSION}` failed"))?;
    let tarball = work.join(tarball.trim());
    process::run(
        Command::new("tar")
            .arg("-xzf")
            .arg(&tarball)
            .arg("-C")
            .arg(&work)
            .arg("package/axe.min.js"),
    )?;
    let unpacked = work.join("package/axe.min.js");
    let digest = hex::encode(Sha256::digest(fs::read(&unpacked)?));
    ensure!(
        digest == SHA256,
        "axe.min.js in {PACKAGE}@{VERSION} has sha256 {digest}, not the pinned {SHA256}"
    );
    fs::create_dir_all(dir)?;
    fs::copy(&unpacked, &path)?;
    let _ = fs::remove_dir_all(&work);
    Ok(path)
}
