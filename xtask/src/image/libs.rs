//! The shared libraries a dynamically linked binary loads, as `ldd` finds
//! them on this machine: they go into an image at the same paths, beside
//! the dynamic loader, so that no base image is needed.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::process;

/// The paths `ldd binary` resolves, the loader included.
pub fn of(binary: &Path) -> Result<Vec<PathBuf>> {
    let mut ldd = Command::new("ldd");
    ldd.arg(binary);
    let out = process::output(&mut ldd)
        .with_context(|| format!("`ldd {}` failed: is it a dynamic binary?", binary.display()))?;
    parse(&out)
}

fn parse(ldd: &str) -> Result<Vec<PathBuf>> {
    let mut paths = Vec::new();
    for line in ldd.lines().map(str::trim).filter(|line| !line.is_empty()) {
        // `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)`,
        // `/lib64/ld-linux-x86-64.so.2 (0x…)`, `linux-vdso.so.1 (0x…)`.
        let target = match line.split_once("=>") {
            Some((name, rest)) => {
                let rest = rest.trim();
                if rest.starts_with("not found") {
                    bail!("ldd: {} not found", name.trim());
                }
                rest.split_whitespace().next().unwrap_or("")
            }
            None => line.split_whitespace().next().unwrap_or(""),
        };
        if target.starts_with('/') {
            paths.push(PathBuf::from(target));
        }
    }
    paths.sort();
    paths.dedup();
    Ok(paths)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_ldd_output() {
        let out = "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibvirt.so.0 => /lib/x86_64-linux-gnu/libvirt.so.0 (0x00007f)\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)\n\t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n";
        let paths = parse(out).expect("parsed");
        assert_eq!(
            paths,
            [
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib/x86_64-linux-gnu/libvirt.so.0"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2"),
            ]
        );
        assert!(parse("\tlibnope.so.1 => not found\n").is_err());
    }
}
