//! `lint`'s module-cycle check: in every crate of the repository, no two
//! sibling modules may depend on each other, directly or around a loop.
//!
//! A module depends on a sibling when code anywhere below it names a path
//! below the sibling (`crate::a::b`, `super::b`, a `use crate::{a, b}`
//! group). Paths are read from the text, comments dropped; `tests`
//! modules are left out, since a test may reach across its crate. It reads
//! names, not types, so a path inside a macro counts as well.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

type ModPath = Vec<String>;

/// Fails naming every loop, the crate and one reference of each edge.
pub fn check(root: &Path) -> Result<()> {
    let mut problems = Vec::new();
    for src in crate_sources(root)? {
        for cycle in cycles(&src)? {
            problems.push(format!("{}: {cycle}", src.display()));
        }
    }
    if problems.is_empty() {
        return Ok(());
    }
    bail!(
        "module cycles (make one side the other's user only, or move what both need into a \
         module of its own):\n  {}",
        problems.join("\n  ")
    )
}

/// The `src` folder of every crate below `root`, build output left out.
fn crate_sources(root: &Path) -> Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let entries = fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?;
        for entry in entries {
            let path = entry?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            if path.is_dir() && !matches!(name, "target" | "node_modules") && !name.starts_with('.')
            {
                pending.push(path);
            }
        }
        if dir.join("Cargo.toml").is_file() && dir.join("src").is_dir() {
            found.push(dir.join("src"));
        }
    }
    found.sort();
    Ok(found)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            rust_files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// The module a file holds: `a/b.rs` and `a/b/mod.rs` are `a::b`.
fn module_of(src: &Path, file: &Path) -> ModPath {
    let relative = file.strip_prefix(src).unwrap_or(file).with_extension("");
    let mut path: ModPath =
        relative.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
    if path.last().is_some_and(|last| matches!(last.as_str(), "mod" | "lib" | "main")) {
        path.pop();
    }
    path
}

/// The loops among siblings in the crate at `src`, each as `a -> b -> a`
/// with the reference behind every edge.
fn cycles(src: &Path) -> Result<Vec<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files)?;
    let modules: BTreeMap<ModPath, PathBuf> =
        files.iter().map(|file| (module_of(src, file), file.clone())).collect();
    // parent -> (child -> (sibling child -> one reference behind the edge))
    let mut graphs: BTreeMap<ModPath, BTreeMap<String, BTreeMap<String, String>>> = BTreeMap::new();
    for (module, file) in &modules {
        if module.last().is_some_and(|last| last == "tests") {
            continue;
        }
        let text =
            fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        for named in references(&text, module) {
            let Some(target) = (1..=named.len())
                .rev()
                .map(|n| &named[..n])
                .find(|prefix| modules.contains_key(*prefix))
            else {
                continue;
            };
            let common = module.iter().zip(target).take_while(|(a, b)| a == b).count();
            if common < module.len() && common < target.len() {
                graphs
                    .entry(module[..common].to_vec())
                    .or_default()
                    .entry(module[common].clone())
                    .or_default()
                    .entry(target[common].clone())
                    .or_insert_with(|| format!("{} names {}", module.join("::"), named.join("::")));
            }
        }
    }
    let mut found = Vec::new();
    for (parent, graph) in &graphs {
        for component in strongly_connected(graph) {
            let mut edges = Vec::new();
            for from in &component {
                for (to, why) in &graph[from] {
                    if component.contains(to) {
                        edges.push(format!("{from} -> {to} ({why})"));
                    }
                }
            }
            let at = if parent.is_empty() { "crate".to_owned() } else { parent.join("::") };
            found.push(format!("in {at}: {}", edges.join("; ")));
        }
    }
    Ok(found)
}

/// Every path the text names below the crate root, as written
/// (`crate::a::b`, `crate::{a, b::c}`) or relative to `module`
/// (`super::b`).
fn references(text: &str, module: &ModPath) -> BTreeSet<ModPath> {
    let code: String = text
        .lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let mut found = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let (head, rest) = path_at(&code[at + "crate::".len()..]);
        if let Some(group) = rest.strip_prefix('{') {
            let group = &group[..matching_brace(group)];
            for item in group.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')) {
                let item: ModPath =
                    item.split("::").filter(|s| !s.is_empty()).map(str::to_owned).collect();
                if !item.is_empty() {
                    found.insert(head.iter().cloned().chain(item).collect());
                }
            }
        } else if !head.is_empty() {
            found.insert(head);
        }
    }
    for (at, _) in code.match_indices("super::") {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let (path, _) = path_at(&code[at..]);
        let ups = path.iter().take_while(|s| *s == "super").count();
        if ups > module.len() {
            continue;
        }
        let base = &module[..module.len() - ups];
        found.insert(base.iter().cloned().chain(path[ups..].iter().cloned()).collect());
    }
    found
}

/// The `a::b::` path at the start of `text` and what follows it.
fn path_at(text: &str) -> (ModPath, &str) {
    let mut path = Vec::new();
    let mut rest = text;
    loop {
        let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(rest.len());
        if end == 0 {
            return (path, rest);
        }
        path.push(rest[..end].to_owned());
        match rest[end..].strip_prefix("::") {
            Some(after) => rest = after,
            None => return (path, &rest[end..]),
        }
    }
}

/// Where the group that `text` opens (just after its `{`) closes.
fn matching_brace(text: &str) -> usize {
    let mut depth = 1;
    for (at, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return at;
                }
            }
            _ => {}
        }
    }
    text.len()
}

/// Tarjan's strongly connected components of more than one node.
fn strongly_connected(graph: &BTreeMap<String, BTreeMap<String, String>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        graph: &'a BTreeMap<String, BTreeMap<String, String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, node: &'a str) {
            let n = self.index.len();
            self.index.insert(node, n);
            self.low.insert(node, n);
            self.stack.push(node);
            for next in self.graph.get(node).into_iter().flat_map(|edges| edges.keys()) {
                if !self.index.contains_key(next.as_str()) {
                    self.visit(next);
                    let low = self.low[node].min(self.low[next.as_str()]);
                    self.low.insert(node, low);
                } else if self.stack.contains(&next.as_str()) {
                    let low = self.low[node].min(self.index[next.as_str()]);
                    self.low.insert(node, low);
                }
            }
            if self.low[node] == self.index[node] {
                let mut component = Vec::new();
                while let Some(top) = self.stack.pop() {
                    component.push(top.to_owned());
                    if top == node {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for node in graph.keys() {
        if !walk.index.contains_key(node.as_str()) {
            walk.visit(node);
        }
    }
    walk.found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(text: &str) -> ModPath {
        text.split("::").map(str::to_owned).collect()
    }

    #[test]
    fn reads_plain_grouped_and_relative_paths() {
        let text = "use crate::a::B;\nuse crate::{b::C, c};\nuse super::d::E; // crate::z\n\
                    let x = mycrate::y;\n";
        let found = references(text, &path("m::n"));
        let expected: BTreeSet<ModPath> =
            [path("a::B"), path("b::C"), path("c"), path("m::d::E")].into_iter().collect();
        assert_eq!(found, expected);
    }

    #[test]
    fn finds_a_loop_between_siblings_and_not_a_child_naming_its_parent() {
        let dir = std::env::temp_dir().join(format!("xtask-modules-{}", std::process::id()));
        let src = dir.join("src");
        fs::create_dir_all(src.join("a")).unwrap();
        fs::write(src.join("lib.rs"), "mod a;\nmod b;\n").unwrap();
        fs::write(src.join("a/mod.rs"), "mod inner;\nuse crate::b::Thing;\n").unwrap();
        fs::write(src.join("a/inner.rs"), "use super::Shared;\n").unwrap();
        fs::write(src.join("b.rs"), "pub struct Thing;\n").unwrap();
        assert!(cycles(&src).unwrap().is_empty());
        fs::write(src.join("b.rs"), "use crate::a::inner::X;\n").unwrap();
        let found = cycles(&src).unwrap();
        fs::remove_dir_all(&dir).unwrap();
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("a -> b") && found[0].contains("b -> a"), "{found:?}");
    }
}
