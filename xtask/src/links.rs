//! Links between the project's Markdown files (the ones git tracks): a
//! relative link must name a file or folder that exists, and a
//! `#fragment` a heading of the Markdown file it names (or of its own).
//! Links with a scheme are not followed: CI reaches no other address.
//! Links into `docs/sdk/` lead to the SDK's rustdoc, which `cargo xtask
//! book` generates there in the site (and checks). A page of the site
//! (under `docs/`) must not link a file outside `docs/`: the site does not
//! hold it, so such a link breaks there; it names the file in the
//! repository instead ([`REPOSITORY`]).

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, ensure};
use pulldown_cmark::{Event, HeadingLevel, Options, Parser, Tag, TagEnd};

use crate::{Repo, process};

/// Where the repository's files are browsed, for links from the site to
/// files outside `docs/` (book.toml's `git-repository-url` too).
const REPOSITORY: &str = "https://github.com/proxyfleet/proxyfleet";

pub fn check(repo: &Repo) -> Result<()> {
    let listed = process::output(
        Command::new("git").args(["ls-files", "--", "*.md"]).current_dir(&repo.root),
    )
    .context("listing the Markdown files git tracks")?;
    let files: Vec<PathBuf> = listed.lines().map(|line| repo.root.join(line)).collect();
    let mut broken = Vec::new();
    let mut links = 0;
    for file in &files {
        let text =
            fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        for (target, line) in relative_links(&text) {
            links += 1;
            if let Err(why) = resolve(&repo.root, file, &target) {
                let shown = file.strip_prefix(&repo.root).unwrap_or(file).display().to_string();
                broken.push(format!("{shown}:{line}: {target}: {why}"));
            }
        }
    }
    ensure!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    eprintln!("xtask links: {links} links in {} Markdown files, none broken", files.len());
    Ok(())
}

/// Whether `target`, linked from `file`, leads somewhere, on GitHub and,
/// for the pages under `docs/`, on the site.
fn resolve(root: &Path, file: &Path, target: &str) -> Result<(), String> {
    let (path, fragment) = match target.split_once('#') {
        Some((path, fragment)) => (path, Some(fragment)),
        None => (target, None),
    };
    let linked = if path.is_empty() {
        file.to_owned()
    } else {
        file.parent().unwrap_or(Path::new(".")).join(path)
    };
    let generated =
        file.parent().is_some_and(|dir| dir.ends_with("docs")) && path.starts_with("sdk/");
    if generated {
        return Ok(());
    }
    if !linked.exists() {
        return Err("no such file".to_owned());
    }
    let docs = root.join("docs");
    if file.starts_with(&docs) {
        let real = linked.canonicalize().map_err(|err| err.to_string())?;
        let docs = docs.canonicalize().map_err(|err| err.to_string())?;
        if !real.starts_with(&docs) {
            let inside =
                real.strip_prefix(root.canonicalize().unwrap_or_default()).unwrap_or(&real);
            let how = if real.is_dir() { "tree" } else { "blob" };
            return Err(format!(
                "leaves docs/, so it breaks on the site; link {REPOSITORY}/{how}/main/{}",
                inside.display()
            ));
        }
    }
    let Some(fragment) = fragment else { return Ok(()) };
    if linked.extension().is_none_or(|extension| extension != "md") {
        return Ok(());
    }
    let text = fs::read_to_string(&linked).map_err(|err| err.to_string())?;
    if anchors(&text).contains(fragment) {
        Ok(())
    } else {
        Err(format!("no heading #{fragment} there"))
    }
}

/// The relative links and images of a document, with their lines.
fn relative_links(text: &str) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    for (event, range) in Parser::new_ext(text, Options::all()).into_offset_iter() {
        let target = match event {
            Event::Start(Tag::Link { dest_url, .. } | Tag::Image { dest_url, .. }) => dest_url,
            _ => continue,
        };
        let external = target.contains("://") || target.starts_with("mailto:");
        if !external && !target.is_empty() {
            let line = text[..range.start].matches('\n').count() + 1;
            out.push((target.to_string(), line));
        }
    }
    out
}

/// The fragments a document's headings answer to, as GitHub and mdBook
/// make them: lowercase, letters, digits, `-` and `_` kept, spaces made
/// `-`, the rest dropped; a repeated one gets `-1`, `-2`, ...
fn anchors(text: &str) -> HashSet<String> {
    let mut anchors = HashSet::new();
    let mut heading: Option<String> = None;
    for event in Parser::new_ext(text, Options::all()) {
        match event {
            Event::Start(Tag::Heading { level, .. }) if level <= HeadingLevel::H6 => {
                heading = Some(String::new());
            }
            Event::Text(part) | Event::Code(part) => {
                if let Some(heading) = &mut heading {
                    heading.push_str(&part);
                }
            }
            Event::End(TagEnd::Heading(_)) => {
                if let Some(heading) = heading.take() {
                    let slug = slug(&heading);
                    let mut unique = slug.clone();
                    let mut n = 0;
                    while anchors.contains(&unique) {
                        n += 1;
                        unique = format!("{slug}-{n}");
                    }
                    anchors.insert(unique);
                }
            }
            _ => {}
        }
    }
    anchors
}

fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            c if c.is_whitespace() => Some('-'),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anchors_follow_the_github_rules() {
        let text = "# Title\n## 4. Run the `conformance` suite\n## Title\n### What's new?\n";
        let found = anchors(text);
        for wanted in ["title", "4-run-the-conformance-suite", "title-1", "whats-new"] {
            assert!(found.contains(wanted), "{wanted} in {found:?}");
        }
    }

    #[test]
    fn a_page_of_the_site_may_not_link_outside_docs_and_is_told_where_to() {
        let root = tempfile::tempdir().unwrap();
        let root = root.path();
        fs::create_dir_all(root.join("docs/providers")).unwrap();
        fs::create_dir_all(root.join("deploy/chart")).unwrap();
        fs::write(root.join("docs/a.md"), "# A\n").unwrap();
        fs::write(root.join("README.md"), "").unwrap();
        let page = root.join("docs/providers/p.md");
        assert_eq!(resolve(root, &page, "../a.md#a"), Ok(()));
        let why = resolve(root, &page, "../../deploy/chart").unwrap_err();
        assert!(
            why.ends_with("link https://github.com/proxyfleet/proxyfleet/tree/main/deploy/chart"),
            "{why}"
        );
        assert_eq!(
            resolve(root, &root.join("README.md"), "deploy/chart"),
            Ok(()),
            "outside the site"
        );
    }

    #[test]
    fn only_relative_links_are_checked_with_their_lines() {
        let text =
            "see [a](a.md#x)\n\n[web](https://example.com) `[not](code.md)`\n\n![img](i.png)\n";
        assert_eq!(relative_links(text), vec![("a.md#x".to_owned(), 1), ("i.png".to_owned(), 5)]);
    }
}
