//! `cargo xtask lint`'s contract check: `wit/provider.wit` against the last
//! released contract, `xtask/released-wit/<version>/provider.wit`.
//!
//! The rule is the one the WIT's header states (semver as the component
//! model's linking reads it):
//! - the same version: only comments and layout may differ;
//! - additions only (new interfaces, functions, resource methods, types,
//!   world items): the version must grow, a patch is enough;
//! - anything else (a changed or removed signature or type; a record,
//!   variant, enum or flags gaining or losing a case or field, since those
//!   are closed): the breaking part must grow, the minor below 1.0 and the
//!   major from 1.0 on.
//!
//! A release adds its snapshot: copy `wit/provider.wit` to
//! `xtask/released-wit/<version>/provider.wit`.
//!
//! The comparison reads the WIT's structure from its text, with no WIT
//! parser: items are statements and blocks, each named by the blocks that
//! hold it, and a closed type is one item with its whole body.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

use anyhow::{Context, Result, bail, ensure};

use crate::Repo;

/// A version as `major.minor.patch`.
type Version = (u64, u64, u64);

/// Checks `wit/provider.wit` against the newest snapshot.
pub fn check(repo: &Repo) -> Result<()> {
    let released_dir = repo.root.join("xtask/released-wit");
    let (released_version, released) = newest_snapshot(&released_dir)?;
    let current =
        fs::read_to_string(repo.wit().join("provider.wit")).context("reading wit/provider.wit")?;
    let verdict = compare(&released, &current)?;
    eprintln!(
        "xtask contract: wit/provider.wit against the released {}: {verdict}",
        show(released_version)
    );
    Ok(())
}

fn newest_snapshot(dir: &Path) -> Result<(Version, String)> {
    let mut newest: Option<(Version, String)> = None;
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let version = parse_version(&name)
            .with_context(|| format!("{}: {name:?} is not a version", dir.display()))?;
        if newest.as_ref().is_none_or(|(have, _)| version > *have) {
            let text = fs::read_to_string(entry.path().join("provider.wit"))
                .with_context(|| format!("reading {name}/provider.wit"))?;
            newest = Some((version, text));
        }
    }
    newest.with_context(|| format!("{} holds no released contract", dir.display()))
}

/// What the change from `released` to `current` is, or why it breaks the
/// rule.
fn compare(released: &str, current: &str) -> Result<&'static str> {
    let (old_version, old_items) = items(released).context("the released contract")?;
    let (new_version, new_items) = items(current).context("wit/provider.wit")?;
    let removed: Vec<&String> = old_items.difference(&new_items).collect();
    let added = new_items.len() > old_items.len() - removed.len();
    if new_version == old_version {
        ensure!(
            removed.is_empty() && !added,
            "wit/provider.wit changed the contract but keeps version {}: bump the patch version \
             for additions, the breaking one for a change{}",
            show(new_version),
            first(&removed)
        );
        return Ok("unchanged");
    }
    ensure!(
        new_version > old_version,
        "wit/provider.wit: version {} is below the released {}",
        show(new_version),
        show(old_version)
    );
    if removed.is_empty() {
        return Ok("additions under a higher version");
    }
    let breaking_bump = if old_version.0 == 0 {
        (new_version.0, new_version.1) > (old_version.0, old_version.1)
    } else {
        new_version.0 > old_version.0
    };
    if !breaking_bump {
        bail!(
            "wit/provider.wit changes the contract in a breaking way under {}, a compatible \
             version of {}: bump the {} version{}",
            show(new_version),
            show(old_version),
            if old_version.0 == 0 { "minor" } else { "major" },
            first(&removed)
        );
    }
    Ok("a breaking change under a breaking version")
}

fn first(removed: &[&String]) -> String {
    removed.first().map(|item| format!(" (changed or removed: `{item}`)")).unwrap_or_default()
}

fn show((major, minor, patch): Version) -> String {
    format!("{major}.{minor}.{patch}")
}

fn parse_version(text: &str) -> Option<Version> {
    let mut parts = text.split('.').map(|part| part.parse::<u64>().ok());
    let version = (parts.next()??, parts.next()??, parts.next()??);
    parts.next().is_none().then_some(version)
}

/// Blocks whose body is one item: their cases and fields are closed.
const CLOSED: [&str; 4] = ["record", "variant", "enum", "flags"];

/// The package version and the items of a WIT text.
fn items(text: &str) -> Result<(Version, BTreeSet<String>)> {
    let text: String = text
        .lines()
        .map(|line| line.split_once("//").map_or(line, |(code, _)| code))
        .collect::<Vec<_>>()
        .join(" ");
    let mut version = None;
    let mut items = BTreeSet::new();
    let mut path: Vec<String> = Vec::new();
    let mut segment = String::new();
    // Inside a closed block: its header's depth and its body so far.
    let mut closed: Option<(usize, String)> = None;
    // Inside the braces of `use iface.{a, b};`, which are no block.
    let mut use_list = false;
    for c in text.chars() {
        if use_list || (c == '{' && words(&segment).starts_with("use ")) {
            use_list = c != '}';
            segment.push(c);
            continue;
        }
        if let Some((depth, body)) = &mut closed {
            if c == '}' && path.len() == *depth {
                let body = words(&format!("{body} {segment}"));
                items.insert(format!("{} {{ {body} }}", path.join(" / ")));
                path.pop();
                closed = None;
                segment.clear();
            } else {
                body.push(c);
            }
            continue;
        }
        match c {
            '{' => {
                let header = words(&segment);
                ensure!(!header.is_empty(), "a block without a name");
                path.push(header.clone());
                items.insert(path.join(" / "));
                if CLOSED.iter().any(|kind| header.starts_with(&format!("{kind} "))) {
                    closed = Some((path.len(), String::new()));
                }
                segment.clear();
            }
            ';' => {
                let statement = words(&segment);
                if let Some(package) = statement.strip_prefix("package ") {
                    let (_, at) = package.split_once('@').context("the package has no version")?;
                    version = Some(parse_version(at).context("the package version")?);
                } else if !statement.is_empty() {
                    items.insert(format!("{} : {statement}", path.join(" / ")));
                }
                segment.clear();
            }
            '}' => {
                ensure!(words(&segment).is_empty(), "a statement without `;` before `}}`");
                ensure!(path.pop().is_some(), "a `}}` without its `{{`");
                segment.clear();
            }
            c => segment.push(c),
        }
    }
    ensure!(path.is_empty() && closed.is_none(), "a block is not closed");
    Ok((version.context("no `package ...@version;`")?, items))
}

/// Whitespace collapsed, and none beside punctuation, so layout does not
/// count.
fn words(text: &str) -> String {
    let joined = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut out = String::with_capacity(joined.len());
    let chars: Vec<char> = joined.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        let next_to_punct = |j: Option<&char>| j.is_some_and(|c| "(),<>:=".contains(*c));
        if c == ' '
            && (next_to_punct(chars.get(i + 1))
                || next_to_punct(i.checked_sub(1).and_then(|j| chars.get(j))))
        {
            continue;
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "/// docs\npackage a:b@0.3.0;\ninterface types {\n    record r {\n        x: u32,\n    }\n    enum e { one, two }\n}\ninterface provider {\n    use types.{r};\n    f: func(a: r) -> u32;\n}\nworld w {\n    export provider;\n}\n";

    fn with(version: &str, edit: impl Fn(&str) -> String) -> String {
        edit(BASE).replace("@0.3.0", &format!("@{version}"))
    }

    #[test]
    fn comments_and_layout_may_change_under_the_same_version() {
        let reworded = BASE
            .replace("/// docs", "/// other docs")
            .replace("f: func(a: r)", "f:  func( a : r )");
        assert_eq!(compare(BASE, &reworded).unwrap(), "unchanged");
        let err = compare(BASE, &BASE.replace("-> u32", "-> u64")).unwrap_err().to_string();
        assert!(err.contains("keeps version 0.3.0") && err.contains("f:func(a:r)->u32"), "{err}");
    }

    #[test]
    fn additions_need_a_higher_version_and_changes_a_breaking_one() {
        let added = |v: &str| with(v, |t| t.replace("    f: func", "    g: func();\n    f: func"));
        assert!(compare(BASE, &added("0.3.0")).is_err(), "an addition needs a bump");
        assert_eq!(compare(BASE, &added("0.3.1")).unwrap(), "additions under a higher version");
        // A record is closed: a new field breaks old plugins.
        let field = |v: &str| with(v, |t| t.replace("x: u32,", "x: u32,\n        y: u8,"));
        let err = compare(BASE, &field("0.3.1")).unwrap_err().to_string();
        assert!(err.contains("bump the minor version") && err.contains("record r"), "{err}");
        assert_eq!(
            compare(BASE, &field("0.4.0")).unwrap(),
            "a breaking change under a breaking version"
        );
        let case = with("0.3.1", |t| t.replace("one, two", "one, two, three"));
        assert!(compare(BASE, &case).is_err(), "an enum is closed too");
        let removed = with("0.3.1", |t| t.replace("    f: func(a: r) -> u32;\n", ""));
        assert!(compare(BASE, &removed).is_err());
        assert!(compare(BASE, &with("0.2.9", |t| t.to_owned())).is_err(), "never downwards");
        let one = BASE.replace("@0.3.0", "@1.2.0");
        let one_changed =
            |v: &str| one.replace("-> u32", "-> u64").replace("@1.2.0", &format!("@{v}"));
        assert!(compare(&one, &one_changed("1.3.0")).is_err(), "from 1.0 the major breaks");
        assert!(compare(&one, &one_changed("2.0.0")).is_ok());
    }

    #[test]
    fn the_repository_contract_follows_the_rule() {
        let repo = Repo::locate().unwrap();
        check(&repo).unwrap();
    }
}
