//! A file tree built in memory and packed as a reproducible tar layer:
//! entries in path order, every timestamp 0, owner root, no user or group
//! names, so the same inputs give the same bytes.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use anyhow::{Context, Result, bail};

#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    Dir { mode: u32 },
    File { mode: u32, data: Vec<u8> },
    Symlink { target: String },
}

/// Paths are absolute in the image (`/usr/bin/x`) and stored without the
/// leading slash, as image layers name them.
#[derive(Debug, Default, Clone)]
pub struct Tree {
    entries: BTreeMap<String, Entry>,
}

impl Tree {
    pub fn new() -> Self {
        Self::default()
    }

    /// A directory (and its parents, 0755).
    pub fn dir(&mut self, path: &str, mode: u32) -> Result<()> {
        let path = relative(path)?;
        self.parents(&path)?;
        match self.entries.get(&path) {
            Some(Entry::Dir { .. }) | None => {
                self.entries.insert(path, Entry::Dir { mode });
                Ok(())
            }
            Some(_) => bail!("/{path} is already a file or link in the image"),
        }
    }

    /// A file with `data` (and its parent directories).
    pub fn file(&mut self, path: &str, mode: u32, data: Vec<u8>) -> Result<()> {
        let path = relative(path)?;
        self.parents(&path)?;
        if matches!(self.entries.get(&path), Some(Entry::Dir { .. })) {
            bail!("/{path} is already a directory in the image");
        }
        self.entries.insert(path, Entry::File { mode, data });
        Ok(())
    }

    /// The host file `host` (its content, links followed, and its mode) at
    /// `path`.
    pub fn copy(&mut self, host: &Path, path: &str) -> Result<()> {
        let data = fs::read(host).with_context(|| format!("reading {}", host.display()))?;
        let mode = fs::metadata(host)?.permissions().mode() & 0o7777;
        self.file(path, mode, data)
    }

    /// Every file below the host directory `host`, at `path`.
    pub fn copy_dir(&mut self, host: &Path, path: &str) -> Result<()> {
        let mut names: Vec<_> = fs::read_dir(host)
            .with_context(|| format!("listing {}", host.display()))?
            .collect::<Result<_, _>>()?;
        names.sort_by_key(fs::DirEntry::file_name);
        self.dir(path, 0o755)?;
        for entry in names {
            let name = entry.file_name();
            let name = name.to_str().context("a file name that is not UTF-8")?;
            let inside = format!("{}/{name}", path.trim_end_matches('/'));
            if entry.path().is_dir() {
                self.copy_dir(&entry.path(), &inside)?;
            } else {
                self.copy(&entry.path(), &inside)?;
            }
        }
        Ok(())
    }

    pub fn symlink(&mut self, path: &str, target: &str) -> Result<()> {
        let path = relative(path)?;
        self.parents(&path)?;
        self.entries.insert(path, Entry::Symlink { target: target.to_owned() });
        Ok(())
    }

    pub fn contains(&self, path: &str) -> bool {
        relative(path).is_ok_and(|path| self.entries.contains_key(&path))
    }

    fn parents(&mut self, path: &str) -> Result<()> {
        let ancestors: Vec<&Path> =
            Path::new(path).ancestors().skip(1).filter(|dir| !dir.as_os_str().is_empty()).collect();
        for dir in ancestors.into_iter().rev() {
            let dir = dir.to_str().context("a path that is not UTF-8")?.to_owned();
            match self.entries.get(&dir) {
                Some(Entry::Dir { .. }) => {}
                Some(_) => bail!("/{dir} is a file or link, not a directory, in the image"),
                None => {
                    self.entries.insert(dir, Entry::Dir { mode: 0o755 });
                }
            }
        }
        Ok(())
    }

    /// The layer as an uncompressed tar.
    pub fn tar(&self) -> Result<Vec<u8>> {
        let mut builder = tar::Builder::new(Vec::new());
        for (path, entry) in &self.entries {
            let mut header = tar::Header::new_gnu();
            header.set_mtime(0);
            header.set_uid(0);
            header.set_gid(0);
            match entry {
                Entry::Dir { mode } => {
                    header.set_entry_type(tar::EntryType::Directory);
                    header.set_mode(*mode);
                    header.set_size(0);
                    builder.append_data(&mut header, format!("{path}/"), std::io::empty())?;
                }
                Entry::File { mode, data } => {
                    header.set_entry_type(tar::EntryType::Regular);
                    header.set_mode(*mode);
                    header.set_size(data.len() as u64);
                    builder.append_data(&mut header, path, data.as_slice())?;
                }
                Entry::Symlink { target } => {
                    header.set_entry_type(tar::EntryType::Symlink);
                    header.set_mode(0o777);
                    header.set_size(0);
                    builder.append_link(&mut header, path, target)?;
                }
            }
        }
        Ok(builder.into_inner()?)
    }
}

/// `/a/b` as `a/b`; refuses relative paths and `..`.
fn relative(path: &str) -> Result<String> {
    let Some(rest) = path.strip_prefix('/') else { bail!("image path {path:?} is not absolute") };
    let rest = rest.trim_end_matches('/');
    if rest.is_empty() || rest.split('/').any(|part| part.is_empty() || part == "." || part == "..")
    {
        bail!("image path {path:?} is not a plain absolute path");
    }
    Ok(rest.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing(tar: &[u8]) -> Vec<(String, u64, u32)> {
        let mut archive = tar::Archive::new(tar);
        archive
            .entries()
            .expect("entries")
            .map(|entry| {
                let entry = entry.expect("entry");
                let header = entry.header();
                (
                    entry.path().expect("path").display().to_string(),
                    header.mtime().expect("mtime"),
                    header.mode().expect("mode"),
                )
            })
            .collect()
    }

    #[test]
    fn the_same_files_in_any_order_give_the_same_bytes() {
        let mut a = Tree::new();
        a.file("/usr/bin/tool", 0o755, b"tool".to_vec()).expect("file");
        a.file("/etc/passwd", 0o644, b"root:x:0:0::/:/sbin/nologin\n".to_vec()).expect("file");
        a.symlink("/bin", "usr/bin").expect("link");
        let mut b = Tree::new();
        b.symlink("/bin", "usr/bin").expect("link");
        b.file("/etc/passwd", 0o644, b"root:x:0:0::/:/sbin/nologin\n".to_vec()).expect("file");
        b.file("/usr/bin/tool", 0o755, b"tool".to_vec()).expect("file");
        assert_eq!(a.tar().expect("tar"), b.tar().expect("tar"));
    }

    #[test]
    fn parents_come_first_with_timestamps_zero() {
        let mut tree = Tree::new();
        tree.file("/usr/lib/x/y.so", 0o644, b"y".to_vec()).expect("file");
        tree.dir("/tmp", 0o1777).expect("dir");
        let listed = listing(&tree.tar().expect("tar"));
        let paths: Vec<&str> = listed.iter().map(|(path, _, _)| path.as_str()).collect();
        assert_eq!(paths, ["tmp/", "usr/", "usr/lib/", "usr/lib/x/", "usr/lib/x/y.so"]);
        assert!(listed.iter().all(|(_, mtime, _)| *mtime == 0));
        assert_eq!(listed[0].2, 0o1777);
    }

    #[test]
    fn refuses_relative_paths_and_files_over_directories() {
        let mut tree = Tree::new();
        assert!(tree.file("usr/bin/x", 0o755, Vec::new()).is_err());
        assert!(tree.file("/usr/../etc/x", 0o644, Vec::new()).is_err());
        tree.file("/usr/bin/x", 0o755, Vec::new()).expect("file");
        assert!(tree.file("/usr/bin", 0o644, Vec::new()).is_err());
        assert!(tree.file("/usr/bin/x/y", 0o644, Vec::new()).is_err());
    }
}
