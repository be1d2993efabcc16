//! Build tasks, run as `cargo xtask <command>` from anywhere in the repo:
//!
//! - `plugins`: build the plugins workspace for `wasm32-wasip2` into
//!   `target/plugins/`, installing or upgrading the toolchain first;
//! - `sync-wit [--check]`: copy `wit/*.wit` into `sdk/wit/`, or only report
//!   a copy that drifted;
//! - `test`: everything CI runs, on a fresh machine;
//! - `lint`: rustfmt and clippy over both workspaces, and no module cycles;
//! - `demo`: the README's first command;
//! - `doctor`: every prerequisite of the README's commands, and whether
//!   they can install it;
//! - `fresh-root`: the README's set-up in a new Debian root, as a new
//!   machine would run it;
//! - `image`: OCI image archives of the operator and the proxy, built
//!   without Docker or a base image;
//! - `render [--check]`: `deploy/kubernetes/` rendered from the Helm chart;
//! - `node start|stop`, `e2e`: the one-node test cluster, and the tests
//!   that install the chart on it.
//!
//! Paths come from this crate's location, never from the current directory.

mod api_doc;
mod apt;
mod axe;
mod book;
mod cache;
mod chart;
mod contract;
mod demo;
mod doctor;
mod fresh_root;
mod helm;
mod image;
mod linker;
mod links;
mod manifest;
mod modules;
mod monitoring;
mod node;
mod npm;
mod packages;
mod plugin_template;
mod plugins;
mod process;
mod python;
mod registry;
mod shell_vars;
mod suite;
mod toolchain;
mod tree;
mod version;
mod wit;

use std::env;
use std::fs;
use std::path::PathBuf;
use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail, ensure};

use crate::version::Version;

const USAGE: &str = "usage: cargo xtask <command>

commands:
  plugins            build the plugins for wasm32-wasip2 into target/plugins/
  book               the docs site (mdBook, the SDK's rustdoc) into target/book/
  links              check the links between the Markdown files git tracks
  python-provider    build examples/python-provider (componentize-py from PyPI)
                     into target/plugins/examples/python-static.wasm
  plugin-template    what `proxyfleet plugin new` makes, for each backend: formatted,
                     lint-clean, tested, built into target/plugins/examples/template-*.wasm;
                     the http one passes the conformance suite (part of test)
  sync-wit [--check] copy wit/*.wit into sdk/wit/ (--check: only report drift)
  test               install what the tests need, then run every test
  lint               rustfmt and clippy over both workspaces, no module cycles
  demo [--keep]      the standalone mode on the static plugin against local tinyproxies:
                     health probes, the discovery API, requests through the proxies it hands out
  doctor             list every prerequisite with its version and source; exit 1 when
                     something is missing that the commands cannot install
  fresh-root         run doctor and plugins inside a new Debian bookworm root (CI)
  image [--push REGISTRY [--sign-key KEY]]  OCI image archives of the operator and of
                     tinyproxy in target/images/; --push copies them to REGISTRY (skopeo's
                     login), --sign-key signs them there (cosign's key, COSIGN_PASSWORD);
                     --push-check: the test build's images, the chart and the plugins
                     through a loopback registry, signed and verified (part of test)
  render [--check]   render deploy/kubernetes/ and deploy/monitoring/ from the Helm chart
                     and docs/discovery-api.md from its OpenAPI file (--check: lint,
                     report drift, promtool on the alerts and the dashboard)
  node start|stop [--purge]  the one-node test cluster of deploy/dev/node
  e2e [--keep|--release]  the chart and the operator's image on a fresh node (part of
                     test; --release: the image to ship rather than the test build)";

fn main() -> ExitCode {
    let args: Vec<String> = env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("xtask: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &[String]) -> Result<()> {
    let repo = Repo::locate()?;
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        ["plugins"] => plugins::build(&repo),
        ["python-provider"] => python::build(&repo),
        ["plugin-template"] => plugin_template::check(&repo),
        ["links"] => links::check(&repo),
        ["book"] => book::build(&repo),
        ["sync-wit"] => wit::sync(&repo, false),
        ["sync-wit", "--check"] => wit::sync(&repo, true),
        ["test"] => suite::test(&repo),
        ["lint"] => suite::lint(&repo),
        ["demo"] => demo::run(&repo, false),
        ["demo", "--keep"] => demo::run(&repo, true),
        ["doctor"] => doctor::run(&repo),
        ["fresh-root"] => fresh_root::run(&repo),
        ["image"] => image::run(&repo, None, None),
        ["image", "--push", registry] => image::run(&repo, Some(*registry), None),
        ["image", "--push", registry, "--sign-key", key] => {
            image::run(&repo, Some(*registry), Some(std::path::Path::new(key)))
        }
        ["image", "--push-check"] => image::push_check(&repo),
        ["node", "start"] => node::start(&repo).map(|env| eprintln!("{}", env.display())),
        ["node", "stop"] => node::stop(&repo, false),
        ["node", "stop", "--purge"] => node::stop(&repo, true),
        ["e2e"] => node::e2e(&repo, false, image::Profile::Dev),
        ["e2e", "--keep"] => node::e2e(&repo, true, image::Profile::Dev),
        ["e2e", "--release"] => node::e2e(&repo, false, image::Profile::Release),
        ["render"] => chart::render(&repo, false),
        ["render", "--check"] => chart::render(&repo, true),
        ["help" | "--help" | "-h"] => {
            eprintln!("{USAGE}");
            Ok(())
        }
        _ => bail!("unknown arguments {args:?}\n\n{USAGE}"),
    }
}

/// The repository's layout.
#[derive(Debug)]
struct Repo {
    root: PathBuf,
}

impl Repo {
    fn locate() -> Result<Self> {
        let manifest_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let root = manifest_dir.parent().context("xtask has no parent directory")?.to_path_buf();
        ensure!(
            root.join("wit").is_dir() && root.join("plugins/Cargo.toml").is_file(),
            "{} does not look like the proxyfleet repository",
            root.display()
        );
        Ok(Self { root })
    }

    fn wit(&self) -> PathBuf {
        self.root.join("wit")
    }

    fn sdk_wit(&self) -> PathBuf {
        self.root.join("sdk/wit")
    }

    fn plugins(&self) -> PathBuf {
        self.root.join("plugins")
    }

    fn plugins_manifest(&self) -> PathBuf {
        self.plugins().join("Cargo.toml")
    }

    fn plugin_outputs(&self) -> PathBuf {
        self.root.join("target/plugins")
    }

    /// The `rust-version` the plugins workspace declares: what the wasm
    /// toolchain must be at least.
    fn plugins_rust_version(&self) -> Result<Version> {
        rust_version(&self.plugins_manifest())
    }

    /// The `rust-version` the host workspace declares.
    fn host_rust_version(&self) -> Result<Version> {
        rust_version(&self.root.join("Cargo.toml"))
    }
}

fn rust_version(manifest: &std::path::Path) -> Result<Version> {
    let text =
        fs::read_to_string(manifest).with_context(|| format!("reading {}", manifest.display()))?;
    let value = manifest::value(&text, "workspace.package", "rust-version").with_context(|| {
        format!("no [workspace.package] rust-version in {}", manifest.display())
    })?;
    Version::parse(&value).with_context(|| {
        format!("rust-version {value:?} in {} is not a version", manifest.display())
    })
}

/// The cargo that runs xtask, for host-target work.
fn cargo() -> Command {
    Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// Every test tier's feature: plain `cargo test` runs the fast tier only
/// (tests/Cargo.toml lists the tiers and what each needs).
const TEST_TIERS: &str = "proxyfleet-tests/plugins,proxyfleet-tests/cluster,\
proxyfleet-tests/libvirt,proxyfleet-tests/browser,proxyfleet-operator/plugins,\
proxyfleet-operator/cluster,proxyfleet-operator/browser";

/// `cargo test --workspace` with every tier on. Every cargo run that
/// builds test binaries or the operator for the tests goes through here,
/// so that they share one feature resolution and nothing builds twice.
fn cargo_test_all_tiers() -> Command {
    let mut command = cargo();
    command.args(["test", "--workspace", "--features", TEST_TIERS]);
    command
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_workspaces_declare_a_rust_version() {
        let repo = Repo::locate().expect("inside the repository");
        let plugins = repo.plugins_rust_version().expect("plugins rust-version");
        let host = repo.host_rust_version().expect("host rust-version");
        assert!(plugins.at_least(&Version::parse("1.95").expect("v")), "{plugins}");
        assert!(host.at_least(&Version::parse("1.95").expect("v")), "{host}");
    }
}
