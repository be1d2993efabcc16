//! `proxyfleet plugin watch`: a plugin author's loop. Whenever a file of
//! the project changes, the project is built, the conformance suite runs
//! against the build (as `plugin test` runs it), and a build that passes
//! is copied into a plugin directory, where a running operator (`proxyfleet
//! standalone --plugin-dir`) picks it up and hot-swaps it. A build that
//! fails, or fails the suite, changes nothing there.
//!
//! Changes are found by looking at every file under the project (its
//! `target/`, its dot-directories and the build's output aside) at an
//! interval: editors that replace files, and files added or removed, count
//! alike, and no watch limit of the system is involved. A file counts as
//! changed when its content does (a file whose size and modification time
//! moved is read again and hashed), so a build that rewrites generated
//! sources with what they already held does not start another round, while
//! an edit saved during a round starts the next one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use proxyfleet_runtime::RuntimeOptions;

use crate::plugin_test::{self, Files};

/// What a watch does.
#[derive(Debug)]
pub(crate) struct Watch {
    /// The project's directory.
    pub project: PathBuf,
    /// The build, run by `sh -c` in the project.
    pub build: String,
    /// The component the build writes (relative to the project).
    pub output: Option<PathBuf>,
    /// The provider entry the suite binds.
    pub entry: PathBuf,
    /// The suite's Proxy spec.
    pub spec: Option<PathBuf>,
    /// The backend the suite's calls are answered from.
    pub backend: Option<PathBuf>,
    /// The plugin directory a passing build is copied into.
    pub install_to: Option<PathBuf>,
    /// How often the project is looked at.
    pub interval: Duration,
    /// One round, then exit with its outcome.
    pub once: bool,
    /// How long a deleted instance may take to be gone.
    pub delete_wait: Duration,
}

/// The default build: what the template's README runs.
pub(crate) const DEFAULT_BUILD: &str = "cargo build --release --target wasm32-wasip2";

/// Runs the loop; returns only with `once`, or on an error that leaves
/// nothing to watch.
pub(crate) async fn run(watch: Watch, runtime: RuntimeOptions) -> anyhow::Result<ExitCode> {
    let output = match &watch.output {
        Some(output) => watch.project.join(output),
        None => default_output(&watch.project)?,
    };
    let entry = plugin_test::read_entry(&watch.entry)?;
    let installed = watch.install_to.as_ref().map(|dir| dir.join(format!("{}.wasm", entry.plugin)));
    if let Some(dir) = &watch.install_to {
        anyhow::ensure!(
            entry.oci.is_none(),
            "--install-to: the entry names {}, a registry build; name a plugin file (its \
             `plugin:` without oci://) to install into a plugin directory",
            entry.plugin
        );
        anyhow::ensure!(dir.is_dir(), "--install-to: {} is not a directory", dir.display());
    }
    let mut seen: Option<Snapshot> = None;
    loop {
        let now = Snapshot::take(&watch.project, &output, seen.as_ref())?;
        if seen.as_ref().is_some_and(|seen| seen.same_content(&now)) {
            // Kept so that the next look hashes only what moved since.
            seen = Some(now);
            tokio::time::sleep(watch.interval).await;
            continue;
        }
        // Taken before the round: what the round is built from. An edit
        // saved while it runs differs from this and starts the next one.
        seen = Some(now);
        let passed = round(&watch, &output, installed.as_deref(), runtime.clone()).await;
        if watch.once {
            return Ok(if passed { ExitCode::SUCCESS } else { ExitCode::FAILURE });
        }
        say(&format!("watch: waiting for a change in {}", watch.project.display()));
    }
}

/// One build, suite and install; true when the build passed the suite.
async fn round(
    watch: &Watch,
    output: &Path,
    installed: Option<&Path>,
    runtime: RuntimeOptions,
) -> bool {
    say(&format!("watch: building ({})", watch.build));
    let status = Command::new("sh")
        .arg("-c")
        .arg(&watch.build)
        .current_dir(&watch.project)
        .stdin(Stdio::null())
        .status();
    match status {
        Ok(status) if status.success() => {}
        Ok(status) => {
            say(&format!("watch: the build failed ({status}); nothing is installed"));
            return false;
        }
        Err(err) => {
            say(&format!("watch: the build could not run: {err}; nothing is installed"));
            return false;
        }
    }
    let files = Files {
        component: output,
        entry: &watch.entry,
        spec: watch.spec.as_deref(),
        backend: watch.backend.as_deref(),
    };
    let passed = match plugin_test::run(files, None, watch.delete_wait, runtime).await {
        Ok(code) => code == ExitCode::SUCCESS,
        Err(err) => {
            say(&format!("watch: the suite could not run: {err:#}"));
            false
        }
    };
    match (passed, installed) {
        (true, Some(installed)) => match install(output, installed) {
            Ok(()) => say(&format!(
                "watch: installed as {}; an operator on that directory swaps it in",
                installed.display()
            )),
            Err(err) => say(&format!("watch: cannot install: {err:#}")),
        },
        (false, Some(_)) => say("watch: the suite failed; nothing is installed"),
        (_, None) => {}
    }
    passed
}

/// Copies `from` to `to` by a rename in `to`'s directory, so the operator
/// never reads half a file.
fn install(from: &Path, to: &Path) -> anyhow::Result<()> {
    let dir = to.parent().context("the install path has no directory")?;
    let staging = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("cannot write into {}", dir.display()))?;
    std::fs::copy(from, staging.path())
        .with_context(|| format!("cannot copy {}", from.display()))?;
    staging.persist(to).with_context(|| format!("cannot replace {}", to.display()))?;
    Ok(())
}

/// `<target dir>/wasm32-wasip2/release/<crate>.wasm`, as `cargo metadata`
/// names the project's package and target directory (which
/// `CARGO_TARGET_DIR` may have moved).
fn default_output(project: &Path) -> anyhow::Result<PathBuf> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(cargo)
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .current_dir(project)
        .stderr(Stdio::piped())
        .output()
        .context("cannot run cargo metadata: name the build's component with --output")?;
    anyhow::ensure!(
        output.status.success(),
        "cargo metadata failed in {} ({}): name the build's component with --output",
        project.display(),
        String::from_utf8_lossy(&output.stderr).trim()
    );
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout)
        .context("cargo metadata printed no JSON: name the component with --output")?;
    let name = metadata["packages"][0]["name"].as_str();
    let target = metadata["target_directory"].as_str();
    let (Some(name), Some(target)) = (name, target) else {
        anyhow::bail!("cargo metadata names no package: name the component with --output");
    };
    Ok(Path::new(target)
        .join("wasm32-wasip2/release")
        .join(format!("{}.wasm", name.replace('-', "_"))))
}

/// What is known of one file: its size and modification time, and a
/// hash of its content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    len: u64,
    modified: Option<SystemTime>,
    content: u64,
}

/// Every file under a project but the build's output, `target/` and
/// dot-directories.
#[derive(Debug)]
struct Snapshot(BTreeMap<PathBuf, Stamp>);

impl Snapshot {
    /// Looks at the project; a file whose size and modification time are
    /// those of `previous` keeps its hash, every other file is read.
    fn take(project: &Path, output: &Path, previous: Option<&Self>) -> anyhow::Result<Self> {
        let mut files = BTreeMap::new();
        let mut dirs = vec![project.to_owned()];
        while let Some(dir) = dirs.pop() {
            let listing = std::fs::read_dir(&dir)
                .with_context(|| format!("cannot read {}", dir.display()))?;
            for item in listing.flatten() {
                let name = item.file_name();
                let path = item.path();
                let skipped = name.to_string_lossy().starts_with('.')
                    || (dir == project && name == "target")
                    || path == output;
                let Ok(meta) = item.metadata() else { continue };
                if skipped {
                    continue;
                }
                if meta.is_dir() {
                    dirs.push(path);
                    continue;
                }
                let (len, modified) = (meta.len(), meta.modified().ok());
                let known = previous
                    .and_then(|previous| previous.0.get(&path))
                    .filter(|stamp| stamp.len == len && stamp.modified == modified);
                let content = match known {
                    Some(stamp) => stamp.content,
                    // A file that vanished between the listing and the
                    // read is left to the next look.
                    None => match std::fs::read(&path) {
                        Ok(bytes) => hash(&bytes),
                        Err(_) => continue,
                    },
                };
                files.insert(path, Stamp { len, modified, content });
            }
        }
        Ok(Self(files))
    }

    /// The same files with the same content, whatever their times.
    fn same_content(&self, other: &Self) -> bool {
        self.0.len() == other.0.len()
            && self
                .0
                .iter()
                .zip(&other.0)
                .all(|((a, x), (b, y))| a == b && x.len == y.len && x.content == y.content)
    }
}

/// A hash to tell contents apart within one run (not stored anywhere).
fn hash(bytes: &[u8]) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut hasher);
    hasher.finish()
}

/// One line of the loop's account, on stdout beside the suite's report.
fn say(line: &str) {
    crate::print_text(&format!("{line}\n"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_anywhere_but_target_dot_directories_and_the_output_counts() {
        let dir = tempfile::tempdir().unwrap();
        let output = dir.path().join("out/plugin.wasm");
        std::fs::create_dir_all(dir.path().join("src")).unwrap();
        std::fs::create_dir_all(dir.path().join("out")).unwrap();
        std::fs::create_dir_all(dir.path().join("target/wasm32-wasip2")).unwrap();
        std::fs::create_dir_all(dir.path().join(".git")).unwrap();
        std::fs::write(dir.path().join("src/lib.rs"), "// one").unwrap();
        let before = Snapshot::take(dir.path(), &output, None).unwrap();
        std::fs::write(dir.path().join("target/wasm32-wasip2/out.wasm"), "built").unwrap();
        std::fs::write(dir.path().join(".git/index"), "staged").unwrap();
        std::fs::write(&output, "built").unwrap();
        let now = Snapshot::take(dir.path(), &output, Some(&before)).unwrap();
        assert!(now.same_content(&before));
        std::fs::write(dir.path().join("src/lib.rs"), "// two, longer").unwrap();
        assert!(!Snapshot::take(dir.path(), &output, Some(&now)).unwrap().same_content(&before));
        std::fs::write(dir.path().join("src/new.rs"), "").unwrap();
        assert!(!Snapshot::take(dir.path(), &output, Some(&now)).unwrap().same_content(&now));
    }

    /// A build that rewrites generated sources with what they held
    /// already (bindings, say) must not start round after round.
    #[test]
    fn a_file_rewritten_with_its_content_does_not_count() {
        let dir = tempfile::tempdir().unwrap();
        let output = dir.path().join("plugin.wasm");
        let bindings = dir.path().join("bindings.rs");
        std::fs::write(&bindings, "// generated").unwrap();
        let before = Snapshot::take(dir.path(), &output, None).unwrap();
        std::fs::remove_file(&bindings).unwrap();
        std::fs::write(&bindings, "// generated").unwrap();
        assert!(Snapshot::take(dir.path(), &output, Some(&before)).unwrap().same_content(&before));
        // Same size, other content: still a change.
        std::fs::write(&bindings, "// Generated").unwrap();
        assert!(!Snapshot::take(dir.path(), &output, Some(&before)).unwrap().same_content(&before));
    }

    #[test]
    fn the_default_output_is_named_after_the_crate() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("src")).unwrap();
        std::fs::write(dir.path().join("src/lib.rs"), "").unwrap();
        std::fs::write(
            dir.path().join("Cargo.toml"),
            "[package]\nname = \"my-cloud\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\
             [workspace]\n",
        )
        .unwrap();
        let output = default_output(dir.path()).unwrap();
        assert!(output.ends_with("wasm32-wasip2/release/my_cloud.wasm"), "{output:?}");
        std::fs::remove_file(dir.path().join("Cargo.toml")).unwrap();
        let err = default_output(dir.path()).unwrap_err().to_string();
        assert!(err.contains("--output"), "{err}");
    }
}
