//! axe-core, the accessibility engine the browser tests run inside pages.
//! Debian does not package it; its `axe.min.js` is taken from the npm
//! package at a pinned version, checked against a pinned digest (the one
//! axe-core publishes for that release in its `sri-history.json`) and kept
//! in the cache.

use std::path::PathBuf;

use anyhow::Result;

use crate::{cache, npm};

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
    npm::cached(installed_path().ok()?, SHA256)
}

/// The pinned `axe.min.js`: cached, or unpacked from the npm registry.
pub fn provide() -> Result<PathBuf> {
    if let Some(path) = find() {
        return Ok(path);
    }
    let path = installed_path()?;
    let work = cache::tools()?.join(format!("axe-core-{VERSION}.download"));
    eprintln!("xtask: axe-core {VERSION}: unpacking it from the npm registry");
    let package = npm::unpack(PACKAGE, VERSION, &work)?;
    npm::install(
        &package.join("axe.min.js"),
        &path,
        SHA256,
        &format!("axe.min.js in {PACKAGE}@{VERSION}"),
    )?;
    let _ = std::fs::remove_dir_all(&work);
    Ok(path)
}
