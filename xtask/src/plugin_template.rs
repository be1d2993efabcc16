//! `cargo xtask plugin-template`: what `proxyfleet plugin new` makes works
//! as made. A fresh project of each backend (outside the repository, so
//! that only its own settings apply) is formatted, lint-clean and tested
//! natively, and builds as a component with the plugins' toolchain. The
//! `http` one then passes the conformance suite against the backend it
//! declares; the `libvirt` one is kept as
//! `target/plugins/examples/template-libvirt.wasm` for the libvirt tier,
//! which runs the suite on its private libvirtd.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result};

use crate::process::{self, elapsed};
use crate::{Repo, cache, cargo, plugins};

pub fn check(repo: &Repo) -> Result<()> {
    let started = Instant::now();
    process::run(cargo().args(["build", "-p", "proxyfleet-operator", "--bin", "proxyfleet"]))?;
    let proxyfleet = repo.root.join("target/debug/proxyfleet");
    let parent =
        std::env::temp_dir().join(format!("proxyfleet-plugin-template.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&parent);
    std::fs::create_dir_all(&parent).with_context(|| format!("creating {}", parent.display()))?;
    let result = ["http", "libvirt"]
        .into_iter()
        .try_for_each(|backend| made(repo, &proxyfleet, &parent, backend));
    let _ = std::fs::remove_dir_all(&parent);
    result?;
    eprintln!("xtask plugin-template: both templates passed in {}", elapsed(started));
    Ok(())
}

/// Makes the `backend` project in `parent` and holds it to all of the
/// above.
fn made(repo: &Repo, proxyfleet: &Path, parent: &Path, backend: &str) -> Result<()> {
    let name = format!("example-{backend}");
    process::run(
        Command::new(proxyfleet)
            .args(["plugin", "new", &name, "--backend", backend, "--sdk"])
            .arg(&repo.root)
            .arg("--dir")
            .arg(parent),
    )?;
    let project = parent.join(&name);
    // Kept between runs, beside the plugins' own builds.
    let native_target = cache::wasm_target()?.with_file_name("plugin-template-native");
    let manifest = project.join("Cargo.toml");
    let in_project = |args: &[&str]| {
        let mut command = cargo();
        command
            .args(args)
            .arg("--manifest-path")
            .arg(&manifest)
            .env("CARGO_TARGET_DIR", &native_target)
            .current_dir(&project);
        command
    };
    process::run(&mut in_project(&["fmt", "--check"]))?;
    process::run(in_project(&["clippy", "--all-targets"]).args(["--", "-D", "warnings"]))?;
    process::run(&mut in_project(&["test"]))?;
    let component = plugins::build_project(repo, &project, &cache::wasm_target()?)?;
    let kept = repo.plugin_outputs().join(format!("examples/template-{backend}.wasm"));
    std::fs::create_dir_all(kept.parent().unwrap_or(Path::new(".")))?;
    std::fs::copy(&component, &kept)
        .with_context(|| format!("copying {} to {}", component.display(), kept.display()))?;
    if backend == "http" {
        process::run(
            Command::new(proxyfleet)
                .args(["plugin", "test"])
                .arg(&kept)
                .arg("--config")
                .arg(project.join("entry.yaml"))
                .arg("--backend")
                .arg(project.join("backend.yaml")),
        )?;
    }
    Ok(())
}
