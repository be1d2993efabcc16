//! The provider written in Python (`examples/python-provider`), built into
//! a component with componentize-py from PyPI: a pinned wheel, checked by
//! its digest, in a virtual environment of Debian's Python kept in the
//! cache. The component is rebuilt only when its sources or the contract
//! change.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result};
use sha2::{Digest as _, Sha256};

use crate::apt::{self, Need};
use crate::{Repo, cache, process};

pub const COMPONENTIZE_PY: &str = "0.25.1";
/// sha256 of `componentize_py-0.25.1-cp39-abi3-manylinux_2_28_x86_64.whl`.
const WHEEL_SHA256: &str = "8623cd8cab8453cb0cd8bf03f3c7103420d06f2f3d360186a280a70a1ca5e89f";
/// Debian's interpreter, never one a version manager put first on PATH.
const PYTHON: &str = "/usr/bin/python3";
/// The world the example targets, in its `wit/`.
const WORLD: &str = "python-provider";
/// Where the component goes, under `target/plugins/`.
pub const OUTPUT: &str = "examples/python-static.wasm";

fn venv() -> Result<PathBuf> {
    Ok(cache::tools()?.join(format!("componentize-py-{COMPONENTIZE_PY}")))
}

/// The installed componentize-py, if it is the pinned version.
pub fn find() -> Option<PathBuf> {
    let tool = venv().ok()?.join("bin/componentize-py");
    let wanted = format!("componentize-py {COMPONENTIZE_PY}");
    (process::first_line(&tool, &["--version"]).as_deref() == Some(wanted.as_str())).then_some(tool)
}

/// componentize-py, installed into its environment when missing.
pub fn provide() -> Result<PathBuf> {
    if let Some(tool) = find() {
        return Ok(tool);
    }
    let venv = venv()?;
    let tool = venv.join("bin/componentize-py");
    apt::ensure(&[Need::any("python3"), Need::any("python3-venv")])?;
    let _ = fs::remove_dir_all(&venv);
    eprintln!(
        "xtask: componentize-py {COMPONENTIZE_PY}: installing it from PyPI into {}",
        venv.display()
    );
    process::run(Command::new(PYTHON).args(["-m", "venv"]).arg(&venv))?;
    let requirements = venv.join("requirements.txt");
    fs::write(
        &requirements,
        format!("componentize-py=={COMPONENTIZE_PY} --hash=sha256:{WHEEL_SHA256}\n"),
    )?;
    process::run(
        Command::new(venv.join("bin/pip"))
            .args([
                "install",
                "--quiet",
                "--no-deps",
                "--require-hashes",
                "--only-binary",
                ":all:",
                "-r",
            ])
            .arg(&requirements),
    )
    .context("installing componentize-py from PyPI")?;
    Ok(tool)
}

/// Builds `examples/python-provider` into `target/plugins/` unless the
/// component there was built from the same sources.
pub fn build(repo: &Repo) -> Result<()> {
    let started = Instant::now();
    let example = repo.root.join("examples/python-provider");
    let contract = repo.wit().join("provider.wit");
    let sources = [example.join("app.py"), example.join("wit/world.wit"), contract.clone()];
    let mut hasher = Sha256::new();
    hasher.update(COMPONENTIZE_PY.as_bytes());
    for source in &sources {
        hasher.update(fs::read(source).with_context(|| format!("reading {}", source.display()))?);
    }
    let stamp = hex::encode(hasher.finalize());
    let output = repo.plugin_outputs().join(OUTPUT);
    let stamp_file = output.with_extension("sources");
    if output.exists() && fs::read_to_string(&stamp_file).ok().as_deref() == Some(stamp.as_str()) {
        eprintln!("xtask plugins: {OUTPUT} is up to date");
        return Ok(());
    }
    let tool = provide()?;
    // componentize-py reads a WIT directory: the example's world, and the
    // contract as its dependency.
    let wit = repo.root.join("target/python-provider-wit");
    let _ = fs::remove_dir_all(&wit);
    let deps = wit.join("deps/proxyfleet-provider");
    fs::create_dir_all(&deps)?;
    fs::copy(example.join("wit/world.wit"), wit.join("world.wit"))?;
    fs::copy(&contract, deps.join("provider.wit"))?;
    fs::create_dir_all(output.parent().context("output has a folder")?)?;
    componentize(&tool, &wit, &example, &output)?;
    fs::write(&stamp_file, stamp)?;
    let size = fs::metadata(&output).map(|meta| meta.len()).unwrap_or(0);
    eprintln!(
        "xtask plugins: examples/python-provider -> target/plugins/{OUTPUT} ({} KiB) in {:.1}s",
        size.div_ceil(1024),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn componentize(tool: &Path, wit: &Path, example: &Path, output: &Path) -> Result<()> {
    process::run(
        Command::new(tool)
            .arg("-d")
            .arg(wit)
            .args(["-w", WORLD, "componentize", "app", "-o"])
            .arg(output)
            // No __pycache__ in the source tree.
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .current_dir(example),
    )
    .context("componentize-py could not build examples/python-provider")
}
