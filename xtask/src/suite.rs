//! `cargo xtask test` (the README's test command) and `cargo xtask lint`.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use anyhow::Result;

use crate::process::{self, elapsed, step};
use crate::{
    Repo, apt, axe, cargo, cargo_test_all_tiers, chart, node, packages, plugins, python, wit,
};

pub fn test(repo: &Repo) -> Result<()> {
    let started = Instant::now();
    step("debian packages", || apt::ensure(&packages::tests()))?;
    // The browser tier injects it into the pages it checks.
    let mut axe_script = PathBuf::new();
    step(&format!("axe-core {}", axe::VERSION), || {
        axe_script = axe::provide()?;
        Ok(())
    })?;
    step("sync-wit --check", || wit::sync(repo, true))?;
    step("chart: helm lint, rendered manifests", || chart::render(repo, true))?;
    step("plugins", || plugins::build(repo))?;
    step("the provider in Python", || python::build(repo))?;
    step("a plugin project as `proxyfleet plugin new` makes it", || {
        crate::plugin_template::check(repo)
    })?;
    step("docs site (mdBook, the SDK's rustdoc)", || crate::book::build(repo))?;
    // Builds Kubernetes 1.20 from Debian's source once (cached outside the
    // repo), then starts etcd, kube-apiserver and kube-controller-manager
    // on loopback for the tests that need a real API server.
    step("test API server", || {
        process::run(Command::new("bash").arg(repo.root.join("deploy/dev/kube-apiserver/start.sh")))
    })?;
    // A current CRD-only API server (apiextensions-apiserver 1.36 or later
    // and etcd 3.5, from Debian sid's packages, built once and cached
    // outside the repo): the CRD and controller checks against current API
    // machinery and CEL rules.
    step("current API server (apiextensions-apiserver)", || {
        process::run(
            Command::new("bash").arg(repo.root.join("deploy/dev/current-apiserver/start.sh")),
        )
    })?;
    step("host tests, every tier", || {
        process::run(cargo_test_all_tiers().env(axe::ENV, &axe_script).current_dir(&repo.root))
    })?;
    // Faults at scale, as a check: 100 Proxies under random faults,
    // SIGKILLs and churn beside a second installation, standalone and as
    // two replicas against the test API server; exits non-zero on any
    // broken invariant (host/operator/benches/chaos.rs).
    for mode in ["standalone", "kube"] {
        step(&format!("chaos, {mode} (100 Proxies)"), || {
            process::run(
                cargo()
                    .args(["bench", "--profile", "dev", "-p", "proxyfleet-operator"])
                    // The operator binary the test step built.
                    .args(["--features", "plugins,cluster,browser"])
                    .args(["--bench", "chaos", "--", "--mode", mode, "--proxies", "100"])
                    .args(["--chaos-secs", "30", "--settle-secs", "600"])
                    .current_dir(&repo.root),
            )
        })?;
    }
    step("plugins native tests", || {
        process::run(
            cargo()
                .arg("test")
                .arg("--manifest-path")
                .arg(repo.plugins_manifest())
                .current_dir(repo.plugins()),
        )
    })?;
    // What a plugin author gets from crates.io: the SDK and its test kit
    // as packaged, each built from its package alone (the SDK's WIT
    // travels in it; the kit builds against the SDK's package).
    step("sdk: cargo package", || {
        process::run(
            cargo()
                // A working tree with changes is packaged as it is.
                .args(["package", "--allow-dirty"])
                .args(["--package", "proxyfleet-sdk", "--package", "proxyfleet-sdk-testkit"])
                .arg("--manifest-path")
                .arg(repo.plugins_manifest())
                .current_dir(repo.plugins()),
        )
    })?;
    // The chart, the operator's image and the kubernetes plugin's proxies
    // on a real node (deploy/dev/node).
    step("in-cluster tests on a node", || node::e2e(repo, false, crate::image::Profile::Dev))?;
    step("images, chart and plugins through a registry on loopback, signed", || {
        crate::image::push_check(repo)
    })?;
    eprintln!("xtask test: all steps passed in {}", elapsed(started));
    Ok(())
}

pub fn lint(repo: &Repo) -> Result<()> {
    let manifest = repo.plugins_manifest();
    step("debian packages", || apt::ensure(&packages::host_build()))?;
    step("fmt (host)", || {
        process::run(cargo().args(["fmt", "--all", "--check"]).current_dir(&repo.root))
    })?;
    step("clippy (host)", || {
        process::run(
            cargo()
                // --all-features: the test tiers' binaries too.
                .args(["clippy", "--workspace", "--all-targets", "--all-features"])
                .args(["--", "-D", "warnings"])
                .current_dir(&repo.root),
        )
    })?;
    step("fmt (plugins)", || {
        process::run(
            cargo()
                .args(["fmt", "--all", "--check", "--manifest-path"])
                .arg(&manifest)
                .current_dir(repo.plugins()),
        )
    })?;
    step("clippy (plugins, host target)", || {
        process::run(
            cargo()
                .args(["clippy", "--workspace", "--all-targets", "--manifest-path"])
                .arg(&manifest)
                .args(["--", "-D", "warnings"])
                .current_dir(repo.plugins()),
        )
    })?;
    step("module cycles", || crate::modules::check(&repo.root))?;
    step("contract version against the last release", || crate::contract::check(repo))?;
    step("links between the Markdown files", || crate::links::check(repo))?;
    eprintln!("xtask lint: clean");
    Ok(())
}
