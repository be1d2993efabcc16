//! `cargo xtask fresh-root`: the README's set-up as a new machine runs it.
//!
//! A Debian bookworm root made with `debootstrap` (minbase, plus what the
//! README asks of a machine: a C compiler and linker for rustup's
//! toolchain) is cached as a tarball outside the repo and unpacked anew
//! each run. Its apt sources name only `bookworm main` and its package
//! lists are as old as the tarball, the way a new machine's image is. The
//! repo (the files git tracks, and untracked ones it does not ignore) and
//! a copy of the rustup toolchain without the `wasm32-wasip2` target go
//! inside, and `chroot` runs, in order:
//!
//! 1. with `apt-get` hidden: `cargo xtask plugins` must fail with one line
//!    naming what to install by hand;
//! 2. with only `bookworm main`: `cargo xtask doctor` must exit 1 and name
//!    the suite that carries `rustc-web` >= the plugins' `rust-version`;
//! 3. with the host's security and updates suites added (lists still
//!    stale): `cargo xtask doctor` exits 0, `cargo xtask plugins` installs
//!    the toolchain and builds every plugin, and the doctor then finds the
//!    toolchain ok.
//!
//! Downloads are cached between runs (apt's archives, the cargo registry,
//! the plugins' target directory); the root itself never is.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};

use crate::apt::{self, Need};
use crate::process::{self, elapsed, step};
use crate::{Repo, cache, linker, plugins};

/// Bump when the way the root is made changes: a new tarball is made.
const RECIPE: u32 = 1;
const CODENAME: &str = "bookworm";
/// Packages besides minbase: the CA store (the machine's own CAs are
/// added to it) and the C compiler and linker rustup's toolchain links
/// host binaries with.
const INCLUDE: &str = "ca-certificates,gcc,libc6-dev";
/// Where the root is unpacked; removed again at the end.
const WORK: &str = "/var/tmp/proxyfleet-fresh-root";
/// Where the repo goes inside the root.
const REPO_INSIDE: &str = "/src/proxyfleet";
/// The rustup proxies copied into the root's `~/.cargo/bin`.
const RUSTUP_PROXIES: &[&str] =
    &["cargo", "rustc", "rustdoc", "rustfmt", "cargo-fmt", "cargo-clippy", "clippy-driver"];

pub fn run(repo: &Repo) -> Result<()> {
    let started = Instant::now();
    ensure!(apt::is_root(), "fresh-root needs root (debootstrap, mount, chroot)");
    step("debian packages", || apt::ensure(&[Need::any("debootstrap")]))?;
    let cache = cache::fresh_root()?;
    fs::create_dir_all(&cache).with_context(|| format!("creating {}", cache.display()))?;
    let tarball = cache.join(format!("{CODENAME}-minbase-r{RECIPE}.tar"));
    step("root tarball", || {
        if tarball.is_file() {
            eprintln!("xtask: cached: {}", tarball.display());
            Ok(())
        } else {
            make_tarball(&tarball)
        }
    })?;

    let mut root = Root::unpack(&tarball, Path::new(WORK))?;
    step("prepare the root", || prepare(repo, &mut root, &cache))?;

    step("without apt-get: one line naming what to install, exit non-zero", || {
        let run = root.run(
            "mv /usr/bin/apt-get /usr/bin/apt-get.hidden; cargo xtask plugins; status=$?; \
             mv /usr/bin/apt-get.hidden /usr/bin/apt-get; exit $status",
        )?;
        ensure!(!run.success, "`cargo xtask plugins` succeeded without apt-get");
        let errors: Vec<&str> = run.output.lines().filter(|line| line.contains("error")).collect();
        ensure!(
            errors.len() == 1
                && errors[0].contains("apt-get not found")
                && errors[0].contains("rustc-web"),
            "expected one error line naming apt-get and rustc-web, got:\n{}",
            run.output
        );
        Ok(())
    })?;

    step("sources name only bookworm main: the doctor names the missing suite, exit 1", || {
        let run = root.run("cargo xtask doctor")?;
        ensure!(!run.success, "the doctor passed although rustc-web cannot be installed");
        let security = format!("{CODENAME}-security");
        ensure!(
            run.output.lines().any(|line| line.starts_with("plugins")
                && line.contains("rustc-web")
                && line.contains("CANNOT INSTALL")
                && line.contains(&security)),
            "the doctor's rustc-web row does not name {security}:\n{}",
            run.output
        );
        Ok(())
    })?;

    step("security and updates suites added, lists still stale: doctor, plugins, doctor", || {
        add_update_suites(&root)?;
        let before = root.run("cargo xtask doctor")?;
        ensure!(before.success, "the doctor found something the commands cannot install");
        ensure!(
            before
                .output
                .lines()
                .any(|line| line.contains("rustc-web") && line.contains("missing")),
            "the doctor should report rustc-web missing before the build:\n{}",
            before.output
        );
        let build = root.run("cargo xtask plugins")?;
        ensure!(build.success, "`cargo xtask plugins` failed in the fresh root");
        for plugin in plugins::crates(repo)? {
            let output = root.path(REPO_INSIDE).join("target/plugins").join(&plugin.output);
            ensure!(output.is_file(), "{} was not built", plugin.output);
        }
        let after = root.run("cargo xtask doctor")?;
        ensure!(after.success, "the doctor failed after the build");
        for package in ["rustc-web", "cargo-web", "rust-web-src", "lld-16", "wasi-libc"] {
            ensure!(
                after.output.lines().any(|line| line.starts_with("plugins")
                    && line.split_whitespace().nth(1) == Some(package)
                    && line.trim_end().ends_with(" ok")),
                "the doctor does not find {package} ok after the build:\n{}",
                after.output
            );
        }
        ensure!(
            after
                .output
                .lines()
                .any(|line| line.contains(linker::NAME) && line.trim_end().ends_with(" ok")),
            "the doctor does not find {} ok after the build",
            linker::NAME
        );
        Ok(())
    })?;
    drop(root);
    eprintln!("xtask fresh-root: passed in {}", elapsed(started));
    Ok(())
}

/// `debootstrap --variant=minbase` from the mirror the host's own sources
/// name for the release, packed into `tarball`.
fn make_tarball(tarball: &Path) -> Result<()> {
    let mirror = apt::sources()
        .into_iter()
        .find(|source| source.suites.iter().any(|suite| suite == CODENAME))
        .map(|source| source.uri)
        .with_context(|| format!("no apt source names {CODENAME}: debootstrap needs its mirror"))?;
    let build = tarball.with_extension("build");
    remove_unmounted(&build)?;
    let mut debootstrap = Command::new("debootstrap");
    debootstrap
        .args(["--variant=minbase", &format!("--include={INCLUDE}"), CODENAME])
        .arg(&build)
        .arg(&mirror);
    process::run(&mut debootstrap)?;
    let partial = tarball.with_extension("tar.part");
    let mut pack = Command::new("tar");
    pack.arg("--numeric-owner").arg("-C").arg(&build).arg("-cf").arg(&partial).arg(".");
    process::run(&mut pack)?;
    fs::rename(&partial, tarball)?;
    remove_unmounted(&build)
}

fn prepare(repo: &Repo, root: &mut Root, cache: &Path) -> Result<()> {
    // The machine's trusted CAs, so that the root reaches the registries
    // the way the machine does.
    let local_cas = Path::new("/usr/local/share/ca-certificates");
    if local_cas.is_dir() {
        crate::tree::copy(local_cas, &root.path("/usr/local/share/ca-certificates"))?;
    }
    for file in ["/etc/resolv.conf", "/etc/hosts"] {
        fs::copy(file, root.path(file)).with_context(|| format!("copying {file} into the root"))?;
    }
    copy_rustup(root)?;
    copy_repo(repo, &root.path(REPO_INSIDE))?;
    root.mount_proc()?;
    root.bind(&cache.join("apt-archives"), "/var/cache/apt/archives")?;
    root.bind(&cache.join("cargo-registry"), "/root/.cargo/registry")?;
    root.bind(&cache.join("wasm-target"), "/root/.cache/proxyfleet/wasm-target")?;
    let run =
        root.run("update-ca-certificates >/dev/null && rustc --version && cargo --version")?;
    ensure!(run.success, "the rustup toolchain does not run in the root");
    Ok(())
}

/// The toolchain `rustc` on PATH runs from, without its docs, as the
/// root's only rustup toolchain, and the rustup proxies.
fn copy_rustup(root: &Root) -> Result<()> {
    let sysroot = process::first_line("rustc", &["--print", "sysroot"])
        .context("no rustc on PATH: fresh-root copies the rustup toolchain")?;
    let sysroot = PathBuf::from(sysroot);
    let name = sysroot
        .file_name()
        .and_then(|name| name.to_str())
        .context("the sysroot has no name")?
        .to_owned();
    let toolchain = root.path("/root/.rustup/toolchains").join(&name);
    fs::create_dir_all(&toolchain)?;
    let mut copy = Command::new("bash");
    copy.arg("-c")
        .arg("set -o pipefail; tar -C \"$1\" --exclude=./share/doc -cf - . | tar -C \"$2\" -xf -")
        .arg("copy")
        .arg(&sysroot)
        .arg(&toolchain);
    process::run(&mut copy)?;
    fs::write(
        root.path("/root/.rustup/settings.toml"),
        format!("version = \"12\"\ndefault_toolchain = \"{name}\"\nprofile = \"default\"\n"),
    )?;
    let rustup = process::output(Command::new("bash").args(["-c", "command -v rustup"]))
        .context("no rustup on PATH")?;
    let bin = root.path("/root/.cargo/bin");
    fs::create_dir_all(&bin)?;
    fs::copy(rustup.trim(), bin.join("rustup"))?;
    for proxy in RUSTUP_PROXIES {
        fs::hard_link(bin.join("rustup"), bin.join(proxy))?;
    }
    Ok(())
}

/// The files git tracks and the untracked ones it does not ignore.
fn copy_repo(repo: &Repo, inside: &Path) -> Result<()> {
    let listed = process::output(
        Command::new("git")
            .args(["ls-files", "-z", "--cached", "--others", "--exclude-standard"])
            .current_dir(&repo.root),
    )?;
    let mut list = String::new();
    for path in listed.split('\0').filter(|path| !path.is_empty()) {
        // A tracked file deleted in the work tree is not copied.
        if repo.root.join(path).symlink_metadata().is_ok() {
            let _ = write!(list, "{path}\0");
        }
    }
    let list_file = inside.with_extension("files");
    fs::create_dir_all(inside)?;
    fs::write(&list_file, list)?;
    let mut copy = Command::new("bash");
    copy.arg("-c")
        .arg("set -o pipefail; tar -C \"$1\" --null -T \"$2\" -cf - | tar -C \"$3\" -xf -")
        .arg("copy")
        .arg(&repo.root)
        .arg(&list_file)
        .arg(inside);
    process::run(&mut copy)?;
    fs::remove_file(&list_file)?;
    Ok(())
}

/// Adds the host's `-security` and `-updates` sources for the release,
/// without refreshing the lists: the state of a new machine.
fn add_update_suites(root: &Root) -> Result<()> {
    let wanted = [format!("{CODENAME}-security"), format!("{CODENAME}-updates")];
    let mut lines = String::new();
    for source in apt::sources() {
        for suite in source.suites.iter().filter(|suite| wanted.contains(suite)) {
            let _ = writeln!(lines, "deb {} {suite} {}", source.uri, source.components.join(" "));
        }
    }
    if lines.is_empty() {
        bail!("the host's apt sources name neither {} nor {}", wanted[0], wanted[1]);
    }
    fs::write(root.path("/etc/apt/sources.list.d/updates.list"), lines)?;
    Ok(())
}

/// What a command printed in the root, and whether it succeeded.
struct Ran {
    success: bool,
    output: String,
}

/// An unpacked root and what is mounted in it; unmounted and removed when
/// dropped.
struct Root {
    dir: PathBuf,
    mounts: Vec<PathBuf>,
}

impl Root {
    fn unpack(tarball: &Path, dir: &Path) -> Result<Self> {
        remove_unmounted(dir)?;
        fs::create_dir_all(dir)?;
        let root = Self { dir: dir.to_path_buf(), mounts: Vec::new() };
        let mut unpack = Command::new("tar");
        unpack.arg("--numeric-owner").arg("-C").arg(dir).arg("-xf").arg(tarball);
        process::run(&mut unpack)?;
        Ok(root)
    }

    /// `inside` (an absolute path in the root) as a host path.
    fn path(&self, inside: &str) -> PathBuf {
        self.dir.join(inside.trim_start_matches('/'))
    }

    fn mount_proc(&mut self) -> Result<()> {
        let target = self.path("/proc");
        fs::create_dir_all(&target)?;
        process::run(Command::new("mount").args(["-t", "proc", "proc"]).arg(&target))?;
        self.mounts.push(target);
        Ok(())
    }

    fn bind(&mut self, host: &Path, inside: &str) -> Result<()> {
        let target = self.path(inside);
        fs::create_dir_all(host)?;
        fs::create_dir_all(&target)?;
        process::run(Command::new("mount").arg("--bind").arg(host).arg(&target))?;
        self.mounts.push(target);
        Ok(())
    }

    /// Runs `script` with bash in the root, in the repo, with a clean
    /// environment; its output is shown as it comes and kept.
    fn run(&self, script: &str) -> Result<Ran> {
        let log = "/tmp/fresh-root-step.log";
        let wrapped = format!(
            "cd {REPO_INSIDE} && {{ {script} ; }} 2>&1 | tee {log}; exit ${{PIPESTATUS[0]}}"
        );
        let mut chroot = Command::new("chroot");
        chroot
            .arg(&self.dir)
            .args(["/usr/bin/env", "-i", "HOME=/root", "LANG=C.UTF-8", "TERM=dumb"])
            .arg("PATH=/root/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
            .args(["CARGO_TERM_COLOR=never", "CARGO_INCREMENTAL=0", "DEBIAN_FRONTEND=noninteractive"])
            .args(["/bin/bash", "-c", &wrapped]);
        eprintln!("xtask: in the root: {script}");
        let started = Instant::now();
        let status = chroot.status().context("cannot run chroot")?;
        let output = fs::read_to_string(self.path(log)).unwrap_or_default();
        eprintln!(
            "xtask: in the root: exit {} after {}",
            status.code().unwrap_or(-1),
            elapsed(started)
        );
        Ok(Ran { success: status.success(), output })
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        for target in self.mounts.iter().rev() {
            let _ = process::run(Command::new("umount").arg(target));
        }
        if let Err(error) = remove_unmounted(&self.dir) {
            eprintln!("xtask: warning: the root at {} was left: {error:#}", self.dir.display());
        }
    }
}

/// Removes `dir` only once nothing is mounted below it: unmounts what an
/// earlier run left, deepest first, and refuses to delete through a mount
/// that will not go.
fn remove_unmounted(dir: &Path) -> Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    let mut left = mounts_under(dir)?;
    left.sort_by_key(|mount| std::cmp::Reverse(mount.components().count()));
    for mount in &left {
        let _ = process::run(Command::new("umount").arg(mount));
    }
    let still = mounts_under(dir)?;
    ensure!(still.is_empty(), "still mounted, not removing {}: {still:?}", dir.display());
    fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))
}

/// Mount points at or below `dir`, from /proc/self/mountinfo.
fn mounts_under(dir: &Path) -> Result<Vec<PathBuf>> {
    let info =
        fs::read_to_string("/proc/self/mountinfo").context("reading /proc/self/mountinfo")?;
    Ok(info
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|point| PathBuf::from(point.replace("\\040", " ")))
        .filter(|point| point.starts_with(dir))
        .collect())
}
