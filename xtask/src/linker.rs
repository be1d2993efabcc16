//! The component linker, `wasm-component-ld`: rustc links every
//! `wasm32-wasip2` binary with it, and Debian's `rustc-web` does not ship
//! one. A rustup toolchain carries it in its sysroot; without one it is
//! built from crates.io at a pinned version into the cache.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, ensure};

use crate::cache;
use crate::process;
use crate::version::Version;

pub const NAME: &str = "wasm-component-ld";
/// The version `cargo install` builds when no toolchain carries one: the
/// one rustup's 1.95 toolchain ships, with which the plugins are built.
pub const PINNED: &str = "0.5.21";
/// The oldest accepted from a rustup sysroot.
pub fn minimum() -> Version {
    Version::parse(PINNED).expect("PINNED is a version")
}

/// Where a linker came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    RustupSysroot,
    CargoInstall,
}

impl Origin {
    pub fn describe(self) -> &'static str {
        match self {
            Origin::RustupSysroot => "the rustup toolchain's sysroot",
            Origin::CargoInstall => "cargo install (crates.io, pinned), in the cache",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Linker {
    pub path: PathBuf,
    pub version: Option<Version>,
    pub origin: Origin,
}

impl Linker {
    /// The directory to put first on PATH for the plugin build.
    pub fn dir(&self) -> &Path {
        self.path.parent().unwrap_or(Path::new("/"))
    }

    fn usable(&self) -> bool {
        self.version.as_ref().is_some_and(|version| version.at_least(&minimum()))
    }
}

/// The linker in the rustup toolchain's sysroot, whatever its version.
pub fn in_rustup_sysroot() -> Option<Linker> {
    let sysroot = process::first_line("rustc", &["--print", "sysroot"])?;
    let host = host_triple()?;
    let path = Path::new(&sysroot).join("lib/rustlib").join(host).join("bin").join(NAME);
    path.is_file().then(|| Linker {
        version: version_of(&path),
        path,
        origin: Origin::RustupSysroot,
    })
}

/// The pinned build in the cache, if it was installed before.
pub fn in_cache() -> Option<Linker> {
    let path = install_root().ok()?.join("bin").join(NAME);
    path.is_file().then(|| Linker {
        version: version_of(&path),
        path,
        origin: Origin::CargoInstall,
    })
}

/// A usable linker that exists now, without installing one.
pub fn find() -> Option<Linker> {
    [in_rustup_sysroot(), in_cache()].into_iter().flatten().find(Linker::usable)
}

/// A usable linker: found, or built with `cargo install --locked` at the
/// pinned version into the cache.
pub fn provide() -> Result<Linker> {
    if let Some(linker) = find() {
        return Ok(linker);
    }
    let root = install_root()?;
    eprintln!(
        "xtask: no {NAME} >= {PINNED} in the rustup toolchain: installing {NAME} {PINNED} into {}",
        root.display()
    );
    cache::cargo_install(NAME, PINNED, &root, &[])?;
    let linker = in_cache().with_context(|| format!("{NAME} missing after cargo install"))?;
    ensure!(linker.usable(), "{} does not report a version >= {PINNED}", linker.path.display());
    Ok(linker)
}

fn install_root() -> Result<PathBuf> {
    Ok(cache::tools()?.join(format!("{NAME}-{PINNED}")))
}

fn version_of(path: &Path) -> Option<Version> {
    process::first_line(path, &["--version"]).and_then(|line| Version::in_line(&line))
}

/// The host's target triple, from `rustc -vV`.
pub fn host_triple() -> Option<String> {
    let mut verbose = Command::new("rustc");
    verbose.arg("-vV");
    let out = process::output(&mut verbose).ok()?;
    out.lines().find_map(|line| line.strip_prefix("host:")).map(|host| host.trim().to_owned())
}
