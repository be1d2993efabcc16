//! Build tasks, run as `cargo xtask <command>` from anywhere in the repo:
//!
//! - `plugins`: build the plugins workspace for `wasm32-wasip2` and copy the
//!   components to `target/plugins/<name>.wasm` and
//!   `target/plugins/fixtures/<name>.wasm`;
//! - `sync-wit [--check]`: copy `wit/*.wit` into `sdk/wit/`, or only report
//!   a copy that drifted;
//! - `test`: everything CI runs, on a fresh machine;
//! - `lint`: rustfmt and clippy over both workspaces;
//! - `demo`: the README's first command.
//!
//! Paths come from this crate's location, never from the current directory.

use std::collections::BTreeSet;
use std::env;
use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

const WASM_TARGET: &str = "wasm32-wasip2";

/// Debian packages the test suite needs: the wasm toolchain fallback
/// (compiler, cargo, std source for `-Zbuild-std`, linker, libc) and the
/// proxy the end-to-end tests run.
const DEBIAN_TEST_PACKAGES: &[&str] = &[
    "rustc-web",
    "cargo-web",
    "rust-web-src",
    "lld-16",
    "wasi-libc",
    "tinyproxy",
    // isoinfo, the independent reader the SDK's ISO builder is checked with.
    "genisoimage",
    // The libvirt capability's tests: a private libvirtd (test and storage
    // drivers), the C client the host links, and a private sshd.
    "libvirt-daemon",
    "libvirt-dev",
    "pkgconf",
    "openssh-server",
    // qemu-img: the storage driver makes qcow2 overlays and copies bases
    // with it, and the kvm plugin's tests make their images with it.
    "qemu-utils",
];

/// Debian packages every build of the host crates needs: libvirt's C client
/// library and pkg-config, which its -sys crate finds it with.
const DEBIAN_HOST_BUILD_PACKAGES: &[&str] = &["libvirt-dev", "pkgconf"];

/// The Debian packages of the wasm fallback toolchain.
const DEBIAN_WASM_PACKAGES: &[&str] =
    &["rustc-web", "cargo-web", "rust-web-src", "lld-16", "wasi-libc"];

/// Files of the Debian toolchain; any missing one means installing it.
const DEBIAN_RUSTC: &str = "/usr/bin/rustc";
const DEBIAN_CARGO: &str = "/usr/bin/cargo";
const DEBIAN_STD_SOURCE: &str = "/usr/lib/rustlib/src/rust/library/Cargo.lock";
const DEBIAN_LLD_BIN: &str = "/usr/lib/llvm-16/bin";
const DEBIAN_WASI_LIBC: &str = "/usr/lib/wasm32-wasi";

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

const USAGE: &str = "usage: cargo xtask <command>

commands:
  plugins            build the plugins for wasm32-wasip2 into target/plugins/
  sync-wit [--check] copy wit/*.wit into sdk/wit/ (--check: only report drift)
  test               install what the tests need, then run every test
  lint               rustfmt and clippy over both workspaces
  demo [--keep]      the standalone mode on the static plugin against local tinyproxies:
                     health probes, the discovery API, requests through the proxies it hands out";

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
        ["plugins"] => build_plugins(&repo),
        ["sync-wit"] => sync_wit(&repo, false),
        ["sync-wit", "--check"] => sync_wit(&repo, true),
        ["test"] => test(&repo),
        ["lint"] => lint(&repo),
        ["demo"] => demo(&repo, false),
        ["demo", "--keep"] => demo(&repo, true),
        ["help" | "--help" | "-h"] => {
            eprintln!("{USAGE}");
            Ok(())
        }
        _ => bail!("unknown arguments {args:?}\n\n{USAGE}"),
    }
}

/// The repository's layout.
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
}

// ---------------------------------------------------------------- plugins

/// How the plugins get compiled for `wasm32-wasip2`.
enum Toolchain {
    /// rustup's toolchain has the target installed.
    Rustup,
    /// Debian's `rustc-web` builds std for the target from source.
    Debian,
}

fn build_plugins(repo: &Repo) -> Result<()> {
    let started = Instant::now();
    let target_dir = wasm_target_dir()?;
    let toolchain = if rustup_has_wasm_target() {
        Toolchain::Rustup
    } else {
        ensure_debian_wasm_toolchain()?;
        Toolchain::Debian
    };

    let mut build = match toolchain {
        Toolchain::Rustup => {
            eprintln!("xtask plugins: toolchain: rustup, target {WASM_TARGET} installed");
            let mut build = Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
            for name in LEAKY_ENV.iter().filter(|name| **name != "RUSTUP_TOOLCHAIN") {
                build.env_remove(name);
            }
            build.args(["build", "--release", "--target", WASM_TARGET]);
            build
        }
        Toolchain::Debian => {
            eprintln!(
                "xtask plugins: toolchain: Debian {} with -Zbuild-std (no rustup target {WASM_TARGET})",
                command_line_output(Command::new(DEBIAN_RUSTC).arg("--version"))
                    .unwrap_or_else(|_| DEBIAN_RUSTC.to_owned())
                    .trim()
            );
            let mut build = Command::new(DEBIAN_CARGO);
            for name in LEAKY_ENV {
                build.env_remove(name);
            }
            // The linker wasm-component-ld calls `wasm-ld`, which lld-16
            // installs under its own bin directory.
            let path = env::var_os("PATH").unwrap_or_default();
            let mut paths = vec![PathBuf::from(DEBIAN_LLD_BIN)];
            paths.extend(env::split_paths(&path));
            build
                .env("PATH", env::join_paths(paths).context("joining PATH")?)
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
    run_command(&mut build)?;
    eprintln!("xtask plugins: compiled in {}", elapsed(started));

    let artifacts = target_dir.join(WASM_TARGET).join("release");
    let outputs = repo.plugin_outputs();
    fs::create_dir_all(outputs.join("fixtures"))
        .with_context(|| format!("creating {}", outputs.display()))?;
    for plugin in plugin_crates(repo)? {
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

/// `PROXYFLEET_WASM_TARGET_DIR`, or a cache directory outside the repo
/// shared by every checkout, so that std is compiled once per machine.
fn wasm_target_dir() -> Result<PathBuf> {
    if let Some(dir) = env::var_os("PROXYFLEET_WASM_TARGET_DIR").filter(|dir| !dir.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    let home = env::var_os("HOME")
        .filter(|home| !home.is_empty())
        .context("neither PROXYFLEET_WASM_TARGET_DIR nor HOME is set")?;
    Ok(PathBuf::from(home).join(".cache/proxyfleet/wasm-target"))
}

fn rustup_has_wasm_target() -> bool {
    let mut list = Command::new("rustup");
    list.args(["target", "list", "--installed"]);
    command_line_output(&mut list)
        .map(|installed| installed.lines().any(|line| line.trim() == WASM_TARGET))
        .unwrap_or(false)
}

fn ensure_debian_wasm_toolchain() -> Result<()> {
    let needed = [DEBIAN_RUSTC, DEBIAN_CARGO, DEBIAN_STD_SOURCE, DEBIAN_LLD_BIN, DEBIAN_WASI_LIBC];
    let missing: Vec<&str> = needed.into_iter().filter(|path| !Path::new(path).exists()).collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!(
        "xtask plugins: no rustup {WASM_TARGET} target and {} missing: installing Debian's toolchain",
        missing.join(", ")
    );
    apt_install(DEBIAN_WASM_PACKAGES)
}

struct PluginCrate {
    crate_name: String,
    /// Path under `target/plugins/`.
    output: String,
}

/// Every `cdylib` crate of the plugins workspace: `plugins/<dir>` (plugins)
/// and `plugins/fixtures/<dir>` (fixtures), matching its member globs.
fn plugin_crates(repo: &Repo) -> Result<Vec<PluginCrate>> {
    let mut crates = Vec::new();
    for (dir, is_fixture) in [(repo.plugins(), false), (repo.plugins().join("fixtures"), true)] {
        for manifest in child_manifests(&dir)? {
            let text = fs::read_to_string(&manifest)
                .with_context(|| format!("reading {}", manifest.display()))?;
            if !text.contains("\"cdylib\"") {
                continue;
            }
            let crate_name = package_name(&text)
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

/// The `name` of the `[package]` table of a manifest.
fn package_name(manifest: &str) -> Option<String> {
    let mut in_package = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_package = line == "[package]";
        } else if in_package
            && let Some(value) = line.strip_prefix("name").map(str::trim_start)
            && let Some(value) = value.strip_prefix('=')
        {
            return Some(value.trim().trim_matches('"').to_owned());
        }
    }
    None
}

// ---------------------------------------------------------------- sync-wit

fn sync_wit(repo: &Repo, check: bool) -> Result<()> {
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

// ---------------------------------------------------------------- test, lint

fn test(repo: &Repo) -> Result<()> {
    let started = Instant::now();
    step("debian packages", || ensure_debian_packages(DEBIAN_TEST_PACKAGES))?;
    step("sync-wit --check", || sync_wit(repo, true))?;
    step("plugins", || build_plugins(repo))?;
    // Builds Kubernetes 1.20 from Debian's source once (cached outside the
    // repo), then starts etcd, kube-apiserver and kube-controller-manager
    // on loopback for the tests that need a real API server.
    step("test API server", || {
        run_command(Command::new("bash").arg(repo.root.join("deploy/dev/kube-apiserver/start.sh")))
    })?;
    step("host tests", || {
        run_command(cargo().args(["test", "--workspace"]).current_dir(&repo.root))
    })?;
    step("plugins native tests", || {
        run_command(
            cargo()
                .arg("test")
                .arg("--manifest-path")
                .arg(repo.plugins_manifest())
                .current_dir(repo.plugins()),
        )
    })?;
    eprintln!("xtask test: all steps passed in {}", elapsed(started));
    Ok(())
}

fn lint(repo: &Repo) -> Result<()> {
    let plugins = repo.plugins_manifest();
    step("debian packages", || ensure_debian_packages(DEBIAN_HOST_BUILD_PACKAGES))?;
    step("fmt (host)", || {
        run_command(cargo().args(["fmt", "--all", "--check"]).current_dir(&repo.root))
    })?;
    step("clippy (host)", || {
        run_command(
            cargo()
                .args(["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"])
                .current_dir(&repo.root),
        )
    })?;
    step("fmt (plugins)", || {
        run_command(
            cargo()
                .args(["fmt", "--all", "--check", "--manifest-path"])
                .arg(&plugins)
                .current_dir(repo.plugins()),
        )
    })?;
    step("clippy (plugins, host target)", || {
        run_command(
            cargo()
                .args(["clippy", "--workspace", "--all-targets", "--manifest-path"])
                .arg(&plugins)
                .args(["--", "-D", "warnings"])
                .current_dir(repo.plugins()),
        )
    })?;
    eprintln!("xtask lint: clean");
    Ok(())
}

/// The README's first command: the standalone mode on the static plugin
/// against two real tinyproxy instances on loopback, then a request through
/// each proxy it reports.
fn demo(repo: &Repo, keep: bool) -> Result<()> {
    let mut packages = DEBIAN_WASM_PACKAGES.to_vec();
    packages.extend(DEMO_PACKAGES);
    packages.extend(DEBIAN_HOST_BUILD_PACKAGES);
    step("debian packages", || ensure_debian_packages(&packages))?;
    step("plugins", || build_plugins(repo))?;
    step("proxyfleet binary", || {
        run_command(cargo().args(["build", "-p", "proxyfleet-operator"]).current_dir(&repo.root))
    })?;
    let work = repo.root.join("target/demo");
    if work.exists() {
        fs::remove_dir_all(&work).with_context(|| format!("clearing {}", work.display()))?;
    }
    fs::create_dir_all(work.join("www"))?;
    fs::write(work.join("www/hello.txt"), "hello from the origin, through a proxyfleet proxy\n")?;
    let mut services = Services::default();
    step("origin and proxies on loopback", || {
        services.start(
            "origin",
            Command::new("python3")
                .args(["-m", "http.server", DEMO_ORIGIN_PORT, "--bind", "127.0.0.1"])
                .current_dir(work.join("www")),
            &work,
        )?;
        for port in DEMO_PROXY_PORTS {
            let config = work.join(format!("tinyproxy-{port}.conf"));
            fs::write(
                &config,
                format!(
                    "User nobody\nGroup nogroup\nPort {port}\nListen 127.0.0.1\nTimeout 60\n\
                     MaxClients 50\nAllow 127.0.0.1\nLogLevel Warning\n"
                ),
            )?;
            services.start(
                &format!("tinyproxy-{port}"),
                Command::new("tinyproxy").arg("-d").arg("-c").arg(&config),
                &work,
            )?;
        }
        std::thread::sleep(Duration::from_millis(500));
        Ok(())
    })?;
    let binary = repo.root.join("target/debug/proxyfleet");
    step("proxyfleet standalone (reconciler, health engine, discovery API)", || {
        services.start(
            "proxyfleet",
            Command::new(&binary)
                .args(["--log-format", "text", "standalone", "--providers"])
                .arg(repo.root.join("deploy/standalone/providers.yaml"))
                .arg("--proxies")
                .arg(repo.root.join("deploy/standalone/proxies"))
                .arg("--state")
                .arg(work.join("state.redb"))
                .arg("--plugin-dir")
                .arg(repo.plugin_outputs())
                .arg("--cache-dir")
                .arg(repo.root.join("target/plugin-cache"))
                .args(["--api-addr", DEMO_API, "--metrics-addr", "127.0.0.1:0"])
                .args(["--health-interval", "2s", "--health-timeout", "2s"]),
            &work,
        )?;
        eprintln!("xtask: its log is {}", work.join("proxyfleet.log").display());
        Ok(())
    })?;
    let api = format!("http://{DEMO_API}");
    step("the health engine probes both proxies through their ports", || {
        let started = Instant::now();
        let mut last = String::new();
        loop {
            let healthy = command_line_output(Command::new("curl").args([
                "-sS",
                "--max-time",
                "5",
                &format!("{api}/v1/proxies?healthy=true"),
            ]))
            .unwrap_or_default();
            let count = healthy.matches("\"healthy\":true").count();
            let progress = format!("{count} of {} healthy", DEMO_PROXY_PORTS.len());
            if progress != last {
                eprintln!("xtask: {progress} after {}", elapsed(started));
                last = progress;
            }
            if count == DEMO_PROXY_PORTS.len() {
                return Ok(());
            }
            ensure!(
                started.elapsed() < Duration::from_secs(120),
                "the proxies did not turn healthy within 2 min; see {}",
                work.join("proxyfleet.log").display()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    })?;
    step("a crawler asks the discovery API for proxies and fetches through them", || {
        let mut handed = Vec::new();
        for _ in DEMO_PROXY_PORTS {
            let next = format!("{api}/v1/proxies/next?format=url");
            eprintln!("xtask: $ curl -s '{next}'");
            let proxy = command_line_output(Command::new("curl").args(["-sS", &next]))?;
            let proxy = proxy.trim().to_owned();
            eprintln!("{proxy}");
            let url = format!("http://127.0.0.1:{DEMO_ORIGIN_PORT}/hello.txt");
            run_command(Command::new("curl").args([
                "-sS",
                "--max-time",
                "10",
                "-x",
                &proxy,
                &url,
            ]))?;
            handed.push(proxy);
        }
        handed.sort();
        handed.dedup();
        ensure!(
            handed.len() == DEMO_PROXY_PORTS.len(),
            "round robin should hand out each proxy once, got {handed:?}"
        );
        Ok(())
    })?;
    step("a sticky session: an exclusive lease for 60 s", || {
        run_command(Command::new("curl").args([
            "-sS",
            "-X",
            "POST",
            "-d",
            "{\"ttlSeconds\":60}",
            &format!("{api}/v1/leases"),
        ]))?;
        eprintln!();
        Ok(())
    })?;
    if keep {
        eprintln!(
            "xtask: the demo keeps running; try `curl -s {api}/v1/proxies` or \
             `curl -x \"$(curl -s '{api}/v1/proxies/next?format=url')\" http://127.0.0.1:{DEMO_ORIGIN_PORT}/hello.txt`. \
             Ctrl-C stops it."
        );
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
    Ok(())
}

/// Where the demo serves the discovery API.
const DEMO_API: &str = "127.0.0.1:8480";

/// Debian packages the demo runs besides the wasm toolchain.
const DEMO_PACKAGES: &[&str] = &["tinyproxy", "curl"];
/// Must match the endpoints in deploy/standalone/providers.yaml.
const DEMO_PROXY_PORTS: [u16; 2] = [8888, 8889];
const DEMO_ORIGIN_PORT: &str = "18080";

/// Background processes the demo started; stopped when dropped.
#[derive(Default)]
struct Services {
    children: Vec<(String, std::process::Child)>,
}

impl Services {
    fn start(&mut self, name: &str, command: &mut Command, logs: &Path) -> Result<()> {
        let log = fs::File::create(logs.join(format!("{name}.log")))?;
        let child = command
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start {name}: `{}`", show(command)))?;
        eprintln!("xtask: started {name} (pid {})", child.id());
        self.children.push((name.to_owned(), child));
        Ok(())
    }
}

impl Drop for Services {
    fn drop(&mut self) {
        for (name, child) in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
            eprintln!("xtask: stopped {name}");
        }
    }
}

/// Runs one named step, announcing it and naming it in its failure.
fn step(name: &str, run: impl FnOnce() -> Result<()>) -> Result<()> {
    let started = Instant::now();
    eprintln!("xtask: ==> {name}");
    run().with_context(|| format!("step `{name}` failed"))?;
    eprintln!("xtask: <== {name} ({})", elapsed(started));
    Ok(())
}

/// The cargo that runs xtask, for host-target work.
fn cargo() -> Command {
    Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

fn ensure_debian_packages(packages: &[&str]) -> Result<()> {
    let missing: Vec<&str> =
        packages.iter().copied().filter(|package| !debian_package_installed(package)).collect();
    if missing.is_empty() {
        eprintln!("xtask: Debian packages present: {}", packages.join(" "));
        return Ok(());
    }
    apt_install(&missing)
}

fn debian_package_installed(package: &str) -> bool {
    let mut query = Command::new("dpkg-query");
    query.args(["-W", "-f=${Status}", package]);
    command_line_output(&mut query).is_ok_and(|status| status.ends_with("install ok installed"))
}

/// `apt-get install -y`, refreshing the package lists only when the first
/// attempt fails (they are usually fresh enough, and an update is slow).
fn apt_install(packages: &[&str]) -> Result<()> {
    let install = || {
        let mut command = Command::new("apt-get");
        command
            .args(["install", "-y", "--no-install-recommends"])
            .args(packages)
            .env("DEBIAN_FRONTEND", "noninteractive");
        command
    };
    if run_command(&mut install()).is_ok() {
        return Ok(());
    }
    eprintln!("xtask: apt-get install failed; running apt-get update and retrying");
    run_command(Command::new("apt-get").arg("update"))?;
    run_command(&mut install())
        .with_context(|| format!("installing Debian packages {}", packages.join(" ")))
}

/// Runs `command` with inherited output, failing on a non-zero exit.
fn run_command(command: &mut Command) -> Result<()> {
    let shown = show(command);
    eprintln!("xtask: $ {shown}");
    let status = command.status().with_context(|| format!("cannot start `{shown}`"))?;
    ensure!(status.success(), "`{shown}` failed ({status})");
    Ok(())
}

/// Runs `command` quietly and returns its stdout.
fn command_line_output(command: &mut Command) -> Result<String> {
    let shown = show(command);
    let output = command
        .stderr(std::process::Stdio::null())
        .output()
        .with_context(|| format!("cannot start `{shown}`"))?;
    ensure!(output.status.success(), "`{shown}` failed ({})", output.status);
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn show(command: &Command) -> String {
    let mut shown = command.get_program().to_string_lossy().into_owned();
    for arg in command.get_args() {
        shown.push(' ');
        shown.push_str(&arg.to_string_lossy());
    }
    shown
}

fn elapsed(started: Instant) -> String {
    format_duration(started.elapsed())
}

/// `12.3s` below a minute, `5m07s` from there.
fn format_duration(duration: Duration) -> String {
    let seconds = duration.as_secs();
    if seconds >= 60 {
        format!("{}m{:02}s", seconds / 60, seconds % 60)
    } else {
        format!("{:.1}s", duration.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_package_name_only() {
        let manifest = "[workspace]\nname = \"no\"\n\n[package]\nname = \"fixture-noop\"\nversion.workspace = true\n\n[dependencies]\nname = \"nope\"\n";
        assert_eq!(package_name(manifest).as_deref(), Some("fixture-noop"));
        assert_eq!(package_name("[dependencies]\nname = \"x\"\n"), None);
    }

    #[test]
    fn finds_every_plugin_crate() {
        let repo = Repo::locate().expect("inside the repository");
        let crates = plugin_crates(&repo).expect("listed");
        let outputs: Vec<&str> = crates.iter().map(|plugin| plugin.output.as_str()).collect();
        assert!(outputs.contains(&"static.wasm"), "{outputs:?}");
        assert!(outputs.contains(&"fixtures/noop.wasm"), "{outputs:?}");
        assert!(outputs.contains(&"fixtures/wrong-major.wasm"), "{outputs:?}");
    }

    #[test]
    fn formats_durations() {
        assert_eq!(format_duration(Duration::from_millis(12_340)), "12.3s");
        assert_eq!(format_duration(Duration::from_secs(307)), "5m07s");
    }
}
