//! `cargo xtask plugins`: build the plugins workspace for `wasm32-wasip2`
//! and copy the components to `target/plugins/<name>.wasm` and
//! `target/plugins/fixtures/<name>.wasm`.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, ensure};

use crate::Repo;
use crate::cache;
use crate::manifest;
use crate::process::{self, elapsed};
use crate::toolchain::{
    self, DEBIAN_CARGO, DEBIAN_RUSTC, DEBIAN_WASI_LIBC, Toolchain, WASM_TARGET,
};

/// Where a plugin crate's name starts, and what its output file drops.
const PLUGIN_CRATE_PREFIX: &str = "proxyfleet-plugin-";
const FIXTURE_CRATE_PREFIX: &str = "fixture-";

/// Environment variables through which the toolchain that runs `cargo xtask`
/// would leak into the plugins build: a pinned rustup toolchain, host
/// compiler flags, wrappers, a target or target dir set for the host build.
const LEAKY_ENV: &[&str] = &[
    "RUSTUP_TOOLCHAIN",
    "RUSTC",
    "RUSTDOC",
    "RUSTC_WRAPPER",
    "RUSTC_WORKSPACE_WRAPPER",
    "RUSTFLAGS",
    "RUSTDOCFLAGS",
    "CARGO",
    "CARGO_ENCODED_RUSTFLAGS",
    "CARGO_ENCODED_RUSTDOCFLAGS",
    "CARGO_BUILD_RUSTC",
    "CARGO_BUILD_RUSTC_WRAPPER",
    "CARGO_BUILD_RUSTFLAGS",
    "CARGO_BUILD_TARGET",
    "CARGO_BUILD_TARGET_DIR",
    "CARGO_TARGET_DIR",
    "CARGO_MAKEFLAGS",
    "CARGO_MANIFEST_DIR",
    "CARGO_MANIFEST_PATH",
];

pub fn build(repo: &Repo) -> Result<()> {
    let started = Instant::now();
    let target_dir = cache::wasm_target()?;
    let mut build = wasm_build(repo)?;
    build
        .arg("--manifest-path")
        .arg(repo.plugins_manifest())
        .env("CARGO_TARGET_DIR", &target_dir)
        .current_dir(repo.plugins());
    eprintln!(
        "xtask plugins: building {} into {} (a first build also compiles std: minutes)",
        repo.plugins_manifest().display(),
        target_dir.display()
    );
    process::run(&mut build)?;
    eprintln!("xtask plugins: compiled in {}", elapsed(started));

    let artifacts = target_dir.join(WASM_TARGET).join("release");
    let outputs = repo.plugin_outputs();
    fs::create_dir_all(outputs.join("fixtures"))
        .with_context(|| format!("creating {}", outputs.display()))?;
    for plugin in crates(repo)? {
        let built = artifacts.join(format!("{}.wasm", plugin.crate_name.replace('-', "_")));
        let output = outputs.join(&plugin.output);
        fs::copy(&built, &output)
            .with_context(|| format!("copying {} to {}", built.display(), output.display()))?;
        let size = fs::metadata(&output).map(|meta| meta.len()).unwrap_or(0);
        eprintln!(
            "xtask plugins: {} -> target/plugins/{} ({} KiB)",
            plugin.crate_name,
            plugin.output,
            size.div_ceil(1024)
        );
    }
    eprintln!("xtask plugins: done in {}", elapsed(started));
    Ok(())
}

/// Builds the plugin project in `dir` (a crate of its own, as `proxyfleet
/// plugin new` makes) for `wasm32-wasip2` with the toolchain the plugins
/// workspace builds with, into `target_dir`; returns the component.
pub fn build_project(repo: &Repo, dir: &Path, target_dir: &Path) -> Result<PathBuf> {
    let manifest = dir.join("Cargo.toml");
    let text =
        fs::read_to_string(&manifest).with_context(|| format!("reading {}", manifest.display()))?;
    let crate_name = manifest::value(&text, "package", "name")
        .with_context(|| format!("no package name in {}", manifest.display()))?;
    let mut build = wasm_build(repo)?;
    build
        .arg("--manifest-path")
        .arg(&manifest)
        .env("CARGO_TARGET_DIR", target_dir)
        .current_dir(dir);
    process::run(&mut build)?;
    let built = target_dir
        .join(WASM_TARGET)
        .join("release")
        .join(format!("{}.wasm", crate_name.replace('-', "_")));
    ensure!(built.is_file(), "{} missing after the build", built.display());
    Ok(built)
}

/// `cargo build --release` for `wasm32-wasip2` with the plugins'
/// toolchain: rustup's when it has the target, else Debian's with
/// `-Zbuild-std`; no manifest or target directory set yet.
fn wasm_build(repo: &Repo) -> Result<Command> {
    let rust = repo.plugins_rust_version()?;
    let build = match toolchain::prepare(&rust)? {
        Toolchain::Rustup { version } => {
            eprintln!(
                "xtask plugins: toolchain: rustup rustc {version}, target {WASM_TARGET} installed"
            );
            let mut build = Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
            for name in LEAKY_ENV.iter().filter(|name| **name != "RUSTUP_TOOLCHAIN") {
                build.env_remove(name);
            }
            build.args(["build", "--release", "--target", WASM_TARGET]);
            build
        }
        Toolchain::Debian { version, linker } => {
            eprintln!(
                "xtask plugins: toolchain: Debian rustc {version} with -Zbuild-std (no usable rustup \
                 target {WASM_TARGET}); {} {} from {}",
                crate::linker::NAME,
                linker.version.as_ref().map(ToString::to_string).unwrap_or_default(),
                linker.origin.describe()
            );
            let mut build = Command::new(DEBIAN_CARGO);
            for name in LEAKY_ENV {
                build.env_remove(name);
            }
            build
                .env("PATH", toolchain::debian_path(&linker)?)
                .env("RUSTC", DEBIAN_RUSTC)
                // -Zbuild-std is unstable; the stable Debian compiler allows
                // it with this switch.
                .env("RUSTC_BOOTSTRAP", "1")
                .env("RUSTFLAGS", format!("-L {DEBIAN_WASI_LIBC}"))
                .args(["build", "--release", "--target", WASM_TARGET])
                .arg("-Zbuild-std=std,panic_abort");
            build
        }
    };
    Ok(build)
}

pub struct PluginCrate {
    pub crate_name: String,
    /// Path under `target/plugins/`.
    pub output: String,
}

/// Every `cdylib` crate of the plugins workspace: `plugins/<dir>` (plugins)
/// and `plugins/fixtures/<dir>` (fixtures), matching its member globs.
pub fn crates(repo: &Repo) -> Result<Vec<PluginCrate>> {
    let mut crates = Vec::new();
    for (dir, is_fixture) in [(repo.plugins(), false), (repo.plugins().join("fixtures"), true)] {
        for manifest in child_manifests(&dir)? {
            let text = fs::read_to_string(&manifest)
                .with_context(|| format!("reading {}", manifest.display()))?;
            if !text.contains("\"cdylib\"") {
                continue;
            }
            let crate_name = manifest::value(&text, "package", "name")
                .with_context(|| format!("no package name in {}", manifest.display()))?;
            let output = if is_fixture {
                let name = crate_name.strip_prefix(FIXTURE_CRATE_PREFIX).unwrap_or(&crate_name);
                format!("fixtures/{name}.wasm")
            } else {
                let name = crate_name.strip_prefix(PLUGIN_CRATE_PREFIX).unwrap_or(&crate_name);
                format!("{name}.wasm")
            };
            crates.push(PluginCrate { crate_name, output });
        }
    }
    ensure!(!crates.is_empty(), "no plugin crates under {}", repo.plugins().display());
    Ok(crates)
}

/// `<dir>/*/Cargo.toml`, sorted.
fn child_manifests(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut manifests = Vec::new();
    for entry in fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let manifest = entry?.path().join("Cargo.toml");
        if manifest.is_file() {
            manifests.push(manifest);
        }
    }
    manifests.sort();
    Ok(manifests)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_every_plugin_crate() {
        let repo = Repo::locate().expect("inside the repository");
        let crates = crates(&repo).expect("listed");
        let outputs: Vec<&str> = crates.iter().map(|plugin| plugin.output.as_str()).collect();
        for plugin in ["static", "proxmox", "kubernetes", "gcp", "kvm"] {
            assert!(outputs.contains(&format!("{plugin}.wasm").as_str()), "{outputs:?}");
        }
        assert!(outputs.contains(&"fixtures/noop.wasm"), "{outputs:?}");
        assert!(outputs.contains(&"fixtures/wrong-major.wasm"), "{outputs:?}");
    }
}
