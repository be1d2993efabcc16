//! The docs site: `docs/` as an mdBook (`book.toml`, `docs/SUMMARY.md`)
//! with the SDK's API reference (rustdoc) under `sdk/`, built into
//! `target/book/`. mdBook comes from crates.io, built at a pinned version
//! into the cache (search only: no file watcher, no server).

use std::fs;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, ensure};

use crate::{Repo, cache, process};

const VERSION: &str = "0.5.4";

fn install_root() -> Result<PathBuf> {
    Ok(cache::tools()?.join(format!("mdbook-{VERSION}")))
}

/// mdBook at the pinned version: cached, or built with `cargo install`.
fn provide() -> Result<PathBuf> {
    let root = install_root()?;
    let tool = root.join("bin/mdbook");
    let wanted = format!("mdbook v{VERSION}");
    if process::first_line(&tool, &["--version"]).as_deref() == Some(wanted.as_str()) {
        return Ok(tool);
    }
    eprintln!("xtask: mdBook {VERSION}: installing it with cargo into {}", root.display());
    // The HTML renderer and its search only: no file watcher, no server.
    cache::cargo_install(
        "mdbook",
        VERSION,
        &root,
        &["--no-default-features", "--features", "search"],
    )?;
    ensure!(tool.is_file(), "{} missing after cargo install", tool.display());
    Ok(tool)
}

/// Builds the site into `target/book/`: the book, then the rustdoc of the
/// SDK and its test kit into its `sdk/` (the page `docs/sdk.md` links
/// there).
pub fn build(repo: &Repo) -> Result<()> {
    let mdbook = provide()?;
    let out = repo.root.join("target/book");
    process::run(
        Command::new(&mdbook).arg("build").arg("--dest-dir").arg(&out).current_dir(&repo.root),
    )
    .context("mdbook build")?;
    let rustdoc_target = repo.root.join("target/sdk-doc");
    process::run(
        Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
            .args(["doc", "--no-deps", "-p", "proxyfleet-sdk", "-p", "proxyfleet-sdk-testkit"])
            .arg("--manifest-path")
            .arg(repo.plugins_manifest())
            .env("CARGO_TARGET_DIR", &rustdoc_target)
            // Broken intra-doc links fail the build, as broken links do.
            .env("RUSTDOCFLAGS", "-D warnings"),
    )
    .context("cargo doc for the SDK and its test kit")?;
    let sdk = out.join("sdk");
    let _ = fs::remove_dir_all(&sdk);
    crate::tree::copy(&rustdoc_target.join("doc"), &sdk)?;
    for krate in ["proxyfleet_sdk", "proxyfleet_sdk_testkit"] {
        ensure!(
            sdk.join(krate).join("index.html").is_file(),
            "the SDK's rustdoc has no {krate}/index.html"
        );
    }
    eprintln!("xtask book: {} (open index.html)", out.display());
    Ok(())
}
