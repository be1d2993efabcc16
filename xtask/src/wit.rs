//! `cargo xtask sync-wit [--check]`: copy `wit/*.wit` into `sdk/wit/`, or
//! only report a copy that drifted.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::fs;
use std::path::Path;

use anyhow::{Context, Result, ensure};

use crate::Repo;

pub fn sync(repo: &Repo, check: bool) -> Result<()> {
    let sources = wit_files(&repo.wit())?;
    ensure!(!sources.is_empty(), "no .wit files in {}", repo.wit().display());
    let copies_dir = repo.sdk_wit();
    let copies: BTreeSet<String> = if copies_dir.is_dir() {
        wit_files(&copies_dir)?.into_iter().collect()
    } else {
        BTreeSet::new()
    };

    let mut drift = Vec::new();
    for name in &sources {
        let source =
            fs::read(repo.wit().join(name)).with_context(|| format!("reading wit/{name}"))?;
        let copy = fs::read(copies_dir.join(name)).ok();
        if copy.as_deref() != Some(source.as_slice()) {
            drift.push(match copy {
                None => format!("sdk/wit/{name} is missing"),
                Some(_) => format!("sdk/wit/{name} differs from wit/{name}"),
            });
            if !check {
                fs::create_dir_all(&copies_dir)
                    .with_context(|| format!("creating {}", copies_dir.display()))?;
                fs::write(copies_dir.join(name), &source)
                    .with_context(|| format!("writing sdk/wit/{name}"))?;
            }
        }
    }
    for stale in copies.iter().filter(|name| !sources.contains(name)) {
        drift.push(format!("sdk/wit/{stale} has no counterpart in wit/"));
        if !check {
            fs::remove_file(copies_dir.join(stale))
                .with_context(|| format!("removing sdk/wit/{stale}"))?;
        }
    }

    if check {
        ensure!(
            drift.is_empty(),
            "the SDK's copy of the contract drifted (run `cargo xtask sync-wit`):\n  {}",
            drift.join("\n  ")
        );
        eprintln!("xtask sync-wit: sdk/wit matches wit/ ({} files)", sources.len());
    } else if drift.is_empty() {
        eprintln!("xtask sync-wit: sdk/wit already matches wit/");
    } else {
        for line in &drift {
            eprintln!("xtask sync-wit: updated: {line}");
        }
    }
    Ok(())
}

/// Names of the `.wit` files directly in `dir`, sorted.
fn wit_files(dir: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry?.path();
        if path.is_file()
            && path.extension() == Some(OsStr::new("wit"))
            && let Some(name) = path.file_name().and_then(OsStr::to_str)
        {
            names.push(name.to_owned());
        }
    }
    names.sort();
    Ok(names)
}
