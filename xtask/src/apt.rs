//! Debian packages: what is installed, what apt would install, and
//! installing what is missing or too old.
//!
//! Versions, not file presence, decide: a package below its minimum is
//! upgraded like a missing one. Whenever something must be installed the
//! package lists are refreshed first, once per run, since a new machine's
//! lists are as old as its image (and would install, say, rustc-web 1.85
//! where the security suite has 1.96).

use std::fs;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result, bail};

use crate::process;
use crate::shell_vars;
use crate::version::Version;

/// A Debian package a command needs, at least at `minimum` when given.
#[derive(Debug, Clone)]
pub struct Need {
    pub package: &'static str,
    /// Upstream version the package must have at least.
    pub minimum: Option<Version>,
    /// The suite, after the release's codename, that carries versions at
    /// or above `minimum` when the release's main suite does not
    /// (`security` for `bookworm-security`).
    pub newer_in: Option<&'static str>,
}

impl Need {
    pub fn any(package: &'static str) -> Self {
        Self { package, minimum: None, newer_in: None }
    }

    pub fn at_least(package: &'static str, minimum: Version, newer_in: &'static str) -> Self {
        Self { package, minimum: Some(minimum), newer_in: Some(newer_in) }
    }

    /// Whether `installed` (a Debian version, `None` when absent) meets
    /// this need.
    pub fn judge(&self, installed: Option<&str>) -> Judgement {
        let Some(installed) = installed else { return Judgement::Missing };
        match &self.minimum {
            Some(minimum)
                if !Version::of_debian(installed).is_some_and(|have| have.at_least(minimum)) =>
            {
                Judgement::TooOld
            }
            _ => Judgement::Ok,
        }
    }

    fn wanted(&self) -> String {
        match &self.minimum {
            Some(minimum) => format!("{} >= {minimum}", self.package),
            None => self.package.to_owned(),
        }
    }
}

/// How an installed package compares with what is needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Judgement {
    Ok,
    Missing,
    TooOld,
}

/// The installed version of `package`, if it is installed.
pub fn installed(package: &str) -> Option<String> {
    let mut query = Command::new("dpkg-query");
    query.args(["-W", "-f=${Status}\t${Version}", package]);
    let out = process::output(&mut query).ok()?;
    let (status, version) = out.split_once('\t')?;
    (status.ends_with("install ok installed") && !version.is_empty()).then(|| version.to_owned())
}

/// The version `apt-get install` would pick from the current lists.
pub fn candidate(package: &str) -> Option<String> {
    let mut policy = Command::new("apt-cache");
    policy.args(["policy", package]);
    let out = process::output(&mut policy).ok()?;
    out.lines()
        .find_map(|line| line.trim().strip_prefix("Candidate:"))
        .map(str::trim)
        .filter(|version| *version != "(none)" && !version.is_empty())
        .map(str::to_owned)
}

pub fn apt_get_available() -> bool {
    process::first_line("apt-get", &["--version"]).is_some()
}

pub fn is_root() -> bool {
    process::first_line("id", &["-u"]).as_deref() == Some("0")
}

/// The release's codename (`bookworm`), from /etc/os-release.
pub fn codename() -> Option<String> {
    shell_vars::read(Path::new("/etc/os-release"), "VERSION_CODENAME")
}

static UPDATED: AtomicBool = AtomicBool::new(false);

/// `apt-get update`, at most once per run.
pub fn update_once() -> Result<()> {
    if UPDATED.load(Ordering::SeqCst) {
        return Ok(());
    }
    let mut update = Command::new("apt-get");
    update.args(["-o", "DPkg::Lock::Timeout=600", "update"]);
    process::run(&mut update).context(
        "refreshing the package lists failed: `apt-get update` must work before packages can be \
         installed (check /etc/apt/sources.list and /etc/apt/sources.list.d/)",
    )?;
    UPDATED.store(true, Ordering::SeqCst);
    Ok(())
}

/// Installs every need that is missing or below its minimum: the lists are
/// refreshed first, every candidate is checked against its minimum, then
/// one `apt-get install` runs and the result is checked again.
pub fn ensure(needs: &[Need]) -> Result<()> {
    let versions: Vec<Option<String>> = needs.iter().map(|need| installed(need.package)).collect();
    let todo: Vec<&Need> = needs
        .iter()
        .zip(&versions)
        .filter(|(need, version)| need.judge(version.as_deref()) != Judgement::Ok)
        .map(|(need, _)| need)
        .collect();
    if todo.is_empty() {
        let present: Vec<String> = needs
            .iter()
            .zip(&versions)
            .map(|(need, version)| format!("{} {}", need.package, version.as_deref().unwrap_or("")))
            .collect();
        eprintln!("xtask: Debian packages present: {}", present.join(", "));
        return Ok(());
    }
    let wanted: Vec<String> = todo.iter().map(|need| need.wanted()).collect();
    if !apt_get_available() {
        bail!(
            "apt-get not found: this is not a Debian machine; install by hand: {}",
            wanted.join(", ")
        );
    }
    if !is_root() {
        bail!(
            "installing Debian packages needs root; run as root, or first: sudo apt-get install {}",
            todo.iter().map(|need| need.package).collect::<Vec<_>>().join(" ")
        );
    }
    eprintln!("xtask: Debian packages to install or upgrade: {}", wanted.join(", "));
    update_once()?;
    for need in &todo {
        check_candidate(need)?;
    }
    let packages: Vec<&str> = todo.iter().map(|need| need.package).collect();
    let mut install = Command::new("apt-get");
    install
        .args(["-o", "DPkg::Lock::Timeout=600", "install", "-y", "--no-install-recommends"])
        .args(&packages)
        .env("DEBIAN_FRONTEND", "noninteractive");
    let shown = process::show(&install);
    process::run(&mut install)
        .with_context(|| format!("installing {} failed: `{shown}`", packages.join(" ")))?;
    for need in &todo {
        let now = installed(need.package);
        if need.judge(now.as_deref()) != Judgement::Ok {
            bail!(
                "{} is {} after `{shown}`, but {} is needed",
                need.package,
                now.as_deref().unwrap_or("still not installed"),
                need.wanted()
            );
        }
    }
    Ok(())
}

/// Fails, naming the fix, when the freshly refreshed lists do not offer a
/// version that meets `need`.
fn check_candidate(need: &Need) -> Result<()> {
    let offered = candidate(need.package);
    let Some(offered) = offered else {
        bail!(
            "apt has no package {} even after `apt-get update`: {}",
            need.package,
            missing_suite_hint(need)
        );
    };
    if need.judge(Some(&offered)) == Judgement::TooOld {
        bail!(
            "{} is needed, but the newest version apt offers is {offered} (after `apt-get update`): {}",
            need.wanted(),
            missing_suite_hint(need)
        );
    }
    Ok(())
}

/// What to add to the apt sources for `need`.
pub fn missing_suite_hint(need: &Need) -> String {
    let codename = codename().unwrap_or_else(|| "bookworm".to_owned());
    match need.newer_in {
        Some(suite) => {
            let suite = format!("{codename}-{suite}");
            if sources_name_suite(&suite) {
                format!(
                    "the apt sources name {suite}, which should carry it; check that the mirror \
                     is reachable and run `apt-get update`"
                )
            } else {
                format!(
                    "Debian publishes it in the suite {suite}, which no apt source names: add \
                     {suite} (component main) of your Debian mirror to /etc/apt/sources.list.d/ \
                     and run the command again"
                )
            }
        }
        None => format!("check that the apt sources name Debian {codename} main"),
    }
}

/// One `deb` source: a mirror and the suites and components taken from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    pub uri: String,
    pub suites: Vec<String>,
    pub components: Vec<String>,
}

/// Every enabled `deb` source in /etc/apt (one-line and deb822 files).
pub fn sources() -> Vec<Source> {
    let mut found = Vec::new();
    if let Ok(text) = fs::read_to_string("/etc/apt/sources.list") {
        found.extend(parse_one_line(&text));
    }
    let dir = Path::new("/etc/apt/sources.list.d");
    let mut files: Vec<_> = fs::read_dir(dir)
        .map(|entries| entries.filter_map(|entry| entry.ok().map(|entry| entry.path())).collect())
        .unwrap_or_default();
    files.sort();
    for file in files {
        let Ok(text) = fs::read_to_string(&file) else { continue };
        match file.extension().and_then(|ext| ext.to_str()) {
            Some("list") => found.extend(parse_one_line(&text)),
            Some("sources") => found.extend(parse_deb822(&text)),
            // apt ignores every other name (e.g. `.disabled`).
            _ => {}
        }
    }
    found
}

pub fn sources_name_suite(suite: &str) -> bool {
    sources().iter().any(|source| source.suites.iter().any(|named| named == suite))
}

/// `deb [options] URI SUITE COMPONENT…` lines.
fn parse_one_line(text: &str) -> Vec<Source> {
    let mut found = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        let Some(rest) = line.strip_prefix("deb ").or_else(|| line.strip_prefix("deb\t")) else {
            continue;
        };
        let mut rest = rest.trim_start();
        if rest.starts_with('[') {
            let Some(end) = rest.find(']') else { continue };
            rest = rest[end + 1..].trim_start();
        }
        let mut words = rest.split_whitespace();
        let (Some(uri), Some(suite)) = (words.next(), words.next()) else { continue };
        found.push(Source {
            uri: uri.to_owned(),
            suites: vec![suite.to_owned()],
            components: words.map(str::to_owned).collect(),
        });
    }
    found
}

/// deb822 stanzas (`Types:`, `URIs:`, `Suites:`, `Components:`,
/// `Enabled:`), separated by blank lines.
fn parse_deb822(text: &str) -> Vec<Source> {
    let mut found = Vec::new();
    for stanza in text.split("\n\n") {
        let field = |name: &str| -> Vec<String> {
            stanza
                .lines()
                .filter(|line| !line.trim_start().starts_with('#'))
                .find_map(|line| {
                    let (key, value) = line.split_once(':')?;
                    key.trim().eq_ignore_ascii_case(name).then(|| value.to_owned())
                })
                .map(|value| value.split_whitespace().map(str::to_owned).collect())
                .unwrap_or_default()
        };
        if !field("Types").iter().any(|kind| kind == "deb")
            || field("Enabled").first().is_some_and(|enabled| enabled == "no")
        {
            continue;
        }
        let suites = field("Suites");
        let components = field("Components");
        for uri in field("URIs") {
            found.push(Source { uri, suites: suites.clone(), components: components.clone() });
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn judges_by_version_not_presence() {
        let need = Need::at_least("rustc-web", Version::parse("1.95").expect("v"), "security");
        assert_eq!(need.judge(None), Judgement::Missing);
        assert_eq!(need.judge(Some("1.85.0+dfsg3-1~deb12u3")), Judgement::TooOld);
        assert_eq!(need.judge(Some("1.96.0+dfsg1-1~deb12u2")), Judgement::Ok);
        assert_eq!(Need::any("tinyproxy").judge(Some("1.11.1-2.1+deb12u1")), Judgement::Ok);
    }

    #[test]
    fn reads_deb822_sources() {
        let text = "Types: deb\n# a comment\nURIs: http://mirror.invalid/debian\nSuites: bookworm bookworm-updates\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\nTypes: deb\nURIs: http://mirror.invalid/debian-security\nSuites: bookworm-security\nComponents: main\n\nTypes: deb-src\nURIs: http://mirror.invalid/debian\nSuites: bookworm\nComponents: main\n\nTypes: deb\nEnabled: no\nURIs: http://off.invalid/\nSuites: x\nComponents: main\n";
        let sources = parse_deb822(text);
        assert_eq!(sources.len(), 2, "{sources:?}");
        assert_eq!(sources[0].suites, ["bookworm", "bookworm-updates"]);
        assert_eq!(sources[1].uri, "http://mirror.invalid/debian-security");
        assert_eq!(sources[1].suites, ["bookworm-security"]);
    }

    #[test]
    fn reads_one_line_sources() {
        let text = "# comment\ndeb http://mirror.invalid/debian bookworm main contrib\ndeb [signed-by=/k.gpg arch=amd64] http://mirror.invalid/debian-security bookworm-security main\ndeb-src http://mirror.invalid/debian bookworm main\n";
        let sources = parse_one_line(text);
        assert_eq!(sources.len(), 2, "{sources:?}");
        assert_eq!(sources[0].components, ["main", "contrib"]);
        assert_eq!(sources[1].uri, "http://mirror.invalid/debian-security");
        assert_eq!(sources[1].suites, ["bookworm-security"]);
    }
}
