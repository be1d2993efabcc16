//! The toolchain the plugins build with, for `wasm32-wasip2`.
//!
//! rustup's own toolchain is used when its `wasm32-wasip2` target is
//! installed and new enough. Otherwise (`rustup target add` cannot
//! download on every machine) Debian's `rustc-web` builds the standard
//! library from `rust-web-src` with `-Zbuild-std`, linking with lld-16's
//! `wasm-ld` through the component linker. Every piece is judged by its
//! version against the plugins workspace's `rust-version`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Result, bail};

use crate::apt::{self, Need};
use crate::linker::{self, Linker};
use crate::process;
use crate::version::Version;

pub const WASM_TARGET: &str = "wasm32-wasip2";

/// Files of the Debian toolchain.
pub const DEBIAN_RUSTC: &str = "/usr/bin/rustc";
pub const DEBIAN_CARGO: &str = "/usr/bin/cargo";
pub const DEBIAN_LLD_BIN: &str = "/usr/lib/llvm-16/bin";
pub const DEBIAN_WASI_LIBC: &str = "/usr/lib/wasm32-wasi";

/// The Debian packages of the fallback toolchain, given the Rust version
/// the plugins need. Bookworm's main suite has rustc-web 1.85; newer ones
/// arrive through the security suite.
pub fn debian_needs(rust: &Version) -> Vec<Need> {
    vec![
        Need::at_least("rustc-web", rust.clone(), "security"),
        Need::at_least("cargo-web", rust.clone(), "security"),
        Need::at_least("rust-web-src", rust.clone(), "security"),
        Need::any("lld-16"),
        Need::any("wasi-libc"),
    ]
}

/// How the plugins get compiled.
#[derive(Debug)]
pub enum Toolchain {
    /// rustup's toolchain with the target installed.
    Rustup { version: Version },
    /// Debian's `rustc-web` with `-Zbuild-std`, and a component linker.
    Debian { version: Version, linker: Linker },
}

/// rustup's rustc version when its `wasm32-wasip2` target is installed.
pub fn rustup_target() -> Option<Version> {
    let installed = process::first_line("rustup", &["--version"]).and_then(|_| {
        let mut list = Command::new("rustup");
        list.args(["target", "list", "--installed"]);
        process::output(&mut list).ok()
    })?;
    if !installed.lines().any(|line| line.trim() == WASM_TARGET) {
        return None;
    }
    host_rustc()
}

/// The version of the `rustc` on PATH (rustup's, where rustup runs).
pub fn host_rustc() -> Option<Version> {
    process::first_line("rustc", &["--version"]).and_then(|line| Version::in_line(&line))
}

/// The version `/usr/bin/rustc` reports.
pub fn debian_rustc() -> Option<Version> {
    process::first_line(DEBIAN_RUSTC, &["--version"]).and_then(|line| Version::in_line(&line))
}

/// Finds, installs or upgrades what the plugin build needs.
pub fn prepare(rust: &Version) -> Result<Toolchain> {
    if let Some(version) = rustup_target() {
        if version.at_least(rust) {
            return Ok(Toolchain::Rustup { version });
        }
        eprintln!(
            "xtask: rustup's {WASM_TARGET} target is on rustc {version}, below {rust}: using Debian's toolchain"
        );
    }
    apt::ensure(&debian_needs(rust))?;
    check_debian_toolchain(rust)?;
    let linker = linker::provide()?;
    let version = debian_rustc().unwrap_or_else(|| rust.clone());
    Ok(Toolchain::Debian { version, linker })
}

/// What the packages say is not enough: the compiler must run and report
/// the version, and the std source must be the compiler's own.
fn check_debian_toolchain(rust: &Version) -> Result<()> {
    match debian_rustc() {
        Some(version) if version.at_least(rust) => {}
        Some(version) => bail!(
            "{DEBIAN_RUSTC} reports {version}, below {rust}, although rustc-web is installed: \
             another package owns it (check `dpkg -S {DEBIAN_RUSTC}`)"
        ),
        None => bail!("{DEBIAN_RUSTC} does not run (`{DEBIAN_RUSTC} --version` failed)"),
    }
    let compiler = apt::installed("rustc-web");
    let source = apt::installed("rust-web-src");
    if compiler != source {
        bail!(
            "rust-web-src {} does not match rustc-web {}: -Zbuild-std needs the compiler's own \
             source; run `apt-get install rust-web-src={}`",
            source.as_deref().unwrap_or("(missing)"),
            compiler.as_deref().unwrap_or("(missing)"),
            compiler.as_deref().unwrap_or("VERSION")
        );
    }
    for (path, package) in [(DEBIAN_LLD_BIN, "lld-16"), (DEBIAN_WASI_LIBC, "wasi-libc")] {
        if !Path::new(path).exists() {
            bail!(
                "{path} is missing although {package} is installed: run `apt-get install --reinstall {package}`"
            );
        }
    }
    Ok(())
}

/// `PATH` for the Debian build: the component linker, then lld-16's
/// `wasm-ld` (which the component linker calls), then the rest.
pub fn debian_path(linker: &Linker) -> Result<std::ffi::OsString> {
    let current = std::env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![linker.dir().to_path_buf(), PathBuf::from(DEBIAN_LLD_BIN)];
    paths.extend(std::env::split_paths(&current));
    Ok(std::env::join_paths(paths)?)
}
