//! The one-node test cluster of `deploy/dev/node` (Kubernetes 1.20 built
//! from Debian's source, containerd, a bridge of its own), and the tier of
//! tests that runs on it:
//!
//! - `cargo xtask node start|stop [--purge]`;
//! - `cargo xtask e2e [--keep]`: images of the operator and tinyproxy,
//!   a fresh node, the images imported into its containerd, then the
//!   ignored test `on_node` (the Helm chart installed and exercised, the
//!   console in Chromium through the chart's Service), and
//!   the node stopped and purged again unless `--keep`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, ensure};

use crate::image::{self, Profile};
use crate::process::{self, step};
use crate::{Repo, axe, helm, shell_vars};

fn script(repo: &Repo, name: &str) -> PathBuf {
    repo.root.join("deploy/dev/node").join(name)
}

/// `PATH` with the pinned kubectl's directory first: the node's scripts
/// and the tests on it run `kubectl`.
fn path_with_kubectl() -> Result<std::ffi::OsString> {
    let kubectl = helm::provide_kubectl()?;
    let dir = kubectl.parent().context("kubectl has no directory")?.to_owned();
    let rest = std::env::var_os("PATH").unwrap_or_default();
    std::env::join_paths(std::iter::once(dir).chain(std::env::split_paths(&rest)))
        .context("joining PATH")
}

/// Starts the node (a no-op when it runs) and returns its env file.
pub fn start(repo: &Repo) -> Result<PathBuf> {
    let mut start = Command::new("bash");
    start.arg(script(repo, "start.sh")).env("PATH", path_with_kubectl()?).stderr(Stdio::inherit());
    eprintln!("xtask: $ {}", process::show(&start));
    let out = start.output().context("cannot run deploy/dev/node/start.sh")?;
    ensure!(out.status.success(), "deploy/dev/node/start.sh failed ({})", out.status);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let env = stdout.lines().last().map(str::trim).unwrap_or("");
    ensure!(Path::new(env).is_file(), "start.sh printed no env file (last line {env:?})");
    Ok(PathBuf::from(env))
}

pub fn stop(repo: &Repo, purge: bool) -> Result<()> {
    let mut stop = Command::new("bash");
    stop.arg(script(repo, "stop.sh"));
    if purge {
        stop.arg("--purge");
    }
    process::run(&mut stop)
}

pub fn e2e(repo: &Repo, keep: bool, profile: Profile) -> Result<()> {
    let images = image::build(repo, profile)?;
    let helm = helm::provide()?;
    let path = path_with_kubectl()?;
    // The console's check on the node runs axe-core in its pages.
    let axe_script = axe::provide()?;
    // A fresh cluster each run: nothing of an earlier run's install stays.
    step("node (fresh)", || stop(repo, true))?;
    let mut env_file = None;
    let started = step("node start", || {
        env_file = Some(start(repo)?);
        Ok(())
    });
    let env_file = match (started, env_file) {
        (Ok(()), Some(env_file)) => env_file,
        (started, _) => {
            // A start that failed half-way leaves parts running: undo them.
            let stopped = step("node stop", || stop(repo, true));
            return started.and(stopped).and(Err(anyhow::anyhow!("the node did not start")));
        }
    };
    let result = step("images into the node's containerd", || {
        let address = shell_vars::read(&env_file, "CONTAINERD_ADDRESS")
            .with_context(|| format!("CONTAINERD_ADDRESS missing from {}", env_file.display()))?;
        for image in &images {
            process::run(
                Command::new("ctr")
                    .args(["--address", &address, "-n", "k8s.io", "images", "import"])
                    .arg(&image.archive),
            )?;
        }
        Ok(())
    })
    .and_then(|()| {
        step("the chart on the node (on_node)", || {
            process::run(
                // The feature resolution of the test step, so nothing is
                // compiled again.
                crate::cargo_test_all_tiers()
                    .args(["--test", "operator", "--", "--ignored", "on_node::"])
                    .args(["--nocapture", "--test-threads", "1"])
                    .env("PROXYFLEET_NODE_ENV", &env_file)
                    .env("PROXYFLEET_HELM", &helm)
                    .env("PATH", &path)
                    .env(axe::ENV, &axe_script)
                    .current_dir(&repo.root),
            )
        })
    });
    let stopped = if keep {
        eprintln!("xtask e2e: the node keeps running; its env file is {}", env_file.display());
        Ok(())
    } else {
        step("node stop", || stop(repo, true))
    };
    // The test's failure, if any, is the one to report.
    result.and(stopped)
}
