//! The few values set-up reads from Cargo manifests: a package's name and a
//! workspace's `rust-version`. Plain string values of one table are all it
//! needs, which keeps xtask free of a TOML parser and its build time.

/// The string value of `key` in the table `[table]` of a manifest.
pub fn value(manifest: &str, table: &str, key: &str) -> Option<String> {
    let header = format!("[{table}]");
    let mut in_table = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_table = line == header;
        } else if in_table
            && let Some(value) = line.strip_prefix(key).map(str::trim_start)
            && let Some(value) = value.strip_prefix('=')
        {
            return Some(value.trim().trim_matches('"').to_owned());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_package_name_only() {
        let manifest = "[workspace]\nname = \"no\"\n\n[package]\nname = \"fixture-noop\"\nversion.workspace = true\n\n[dependencies]\nname = \"nope\"\n";
        assert_eq!(value(manifest, "package", "name").as_deref(), Some("fixture-noop"));
        assert_eq!(value("[dependencies]\nname = \"x\"\n", "package", "name"), None);
    }

    #[test]
    fn reads_the_workspace_rust_version() {
        let manifest = "[workspace]\nresolver = \"3\"\n\n[workspace.package]\nversion = \"0.1.0\"\nrust-version = \"1.95\"\n";
        assert_eq!(value(manifest, "workspace.package", "rust-version").as_deref(), Some("1.95"));
    }
}
