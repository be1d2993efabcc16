//! Where set-up keeps what it builds once per machine: outside the repo,
//! shared by every checkout, under `~/.cache/proxyfleet` unless moved.

use std::env;
use std::path::PathBuf;

use anyhow::{Context, Result};

/// `~/.cache/proxyfleet`.
pub fn root() -> Result<PathBuf> {
    let home = env::var_os("HOME")
        .filter(|home| !home.is_empty())
        .context("HOME is not set: the caches live under $HOME/.cache/proxyfleet")?;
    Ok(PathBuf::from(home).join(".cache/proxyfleet"))
}

/// The plugins' cargo target directory, so that std is compiled for
/// `wasm32-wasip2` once per machine (`PROXYFLEET_WASM_TARGET_DIR` moves it).
pub fn wasm_target() -> Result<PathBuf> {
    overridable("PROXYFLEET_WASM_TARGET_DIR", "wasm-target")
}

/// Tools installed with `cargo install` (the component linker).
pub fn tools() -> Result<PathBuf> {
    Ok(root()?.join("tools"))
}

/// The Kubernetes binaries built from Debian's source
/// (`PROXYFLEET_KUBE_CACHE` moves it; `deploy/dev/kube-apiserver/build.sh`
/// reads the same variable).
pub fn kube() -> Result<PathBuf> {
    overridable("PROXYFLEET_KUBE_CACHE", "kube")
}

/// The current CRD-only API server and its etcd
/// (deploy/dev/current-apiserver/build.sh).
pub fn kube_current() -> Result<PathBuf> {
    overridable("PROXYFLEET_KUBE_CURRENT_CACHE", "kube-current")
}

/// The directory the environment variable `var` names, else `name` under
/// [`root`].
fn overridable(var: &str, name: &str) -> Result<PathBuf> {
    match env::var_os(var).filter(|dir| !dir.is_empty()) {
        Some(dir) => Ok(PathBuf::from(dir)),
        None => Ok(root()?.join(name)),
    }
}

/// The fresh-root job's root tarball and its download caches.
pub fn fresh_root() -> Result<PathBuf> {
    Ok(root()?.join("fresh-root"))
}

/// Builds crate `name` at `version` with `cargo install --locked` into
/// `root` (its binaries in `root/bin`), with `args` added, in a target
/// directory of its own so that nothing of the host build leaks in; that
/// directory is removed afterwards.
pub fn cargo_install(
    name: &str,
    version: &str,
    root: &std::path::Path,
    args: &[&str],
) -> Result<()> {
    let mut install =
        std::process::Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    install
        .args(["install", "--locked", "--version", version])
        .args(args)
        .arg("--root")
        .arg(root)
        .arg(name)
        .env("CARGO_TARGET_DIR", root.join("build"));
    crate::process::run(&mut install)
        .with_context(|| format!("installing {name} {version} with cargo"))?;
    let _ = std::fs::remove_dir_all(root.join("build"));
    Ok(())
}
