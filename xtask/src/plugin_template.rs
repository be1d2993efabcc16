//! `cargo xtask plugin-template`: what `proxyfleet plugin new` makes works
//! as made. A fresh project (outside the repository, so that only its own
//! settings apply) is formatted, lint-clean and tested natively, builds as
//! a component with the plugins' toolchain, and passes the conformance
//! suite against the backend it declares.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};

use crate::process::{self, elapsed};
use crate::{Repo, cache, cargo, plugins};

/// The project's name: it names the crate and the plugin.
const NAME: &str = "example-api";

pub fn check(repo: &Repo) -> Result<()> {
    let started = Instant::now();
    process::run(cargo().args(["build", "-p", "proxyfleet-operator", "--bin", "proxyfleet"]))?;
    let proxyfleet = repo.root.join("target/debug/proxyfleet");
    let parent =
        std::env::temp_dir().join(format!("proxyfleet-plugin-template.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&parent);
    std::fs::create_dir_all(&parent).with_context(|| format!("creating {}", parent.display()))?;
    let result = made(repo, &proxyfleet, &parent);
    let _ = std::fs::remove_dir_all(&parent);
    result?;
    eprintln!("xtask plugin-template: {NAME} passed in {}", elapsed(started));
    Ok(())
}

/// Makes the project in `parent` and holds it to all of the above.
fn made(repo: &Repo, proxyfleet: &Path, parent: &Path) -> Result<()> {
    process::run(
        std::process::Command::new(proxyfleet)
            .args(["plugin", "new", NAME, "--backend", "http", "--sdk"])
            .arg(&repo.root)
            .arg("--dir")
            .arg(parent),
    )?;
    let project = parent.join(NAME);
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
    conformance(proxyfleet, &project, &component)
}

/// `proxyfleet plugin test` on the built component, the project's entry
/// and its declared backend.
fn conformance(proxyfleet: &Path, project: &Path, component: &Path) -> Result<()> {
    process::run(
        std::process::Command::new(proxyfleet)
            .args(["plugin", "test"])
            .arg(component)
            .arg("--config")
            .arg(project.join("entry.yaml"))
            .arg("--backend")
            .arg(project.join("backend.yaml")),
    )
}
