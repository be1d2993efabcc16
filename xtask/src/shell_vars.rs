//! `KEY=value` files in shell syntax, as /etc/os-release and the dev
//! clusters' env files are written: the value of one key, quotes dropped.

use std::path::Path;

/// The value of `key` in `text`, or `None` when absent or empty.
pub fn value(text: &str, key: &str) -> Option<String> {
    text.lines()
        .find_map(|line| line.strip_prefix(key)?.strip_prefix('='))
        .map(|value| value.trim().trim_matches('"').to_owned())
        .filter(|value| !value.is_empty())
}

/// The value of `key` in the file at `path`.
pub fn read(path: &Path, key: &str) -> Option<String> {
    value(&std::fs::read_to_string(path).ok()?, key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_os_release_and_env_files() {
        let text = "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nVERSION_CODENAME=bookworm\nID=debian\nKUBECONFIG=/x/kubeconfig\n";
        assert_eq!(value(text, "VERSION_CODENAME").as_deref(), Some("bookworm"));
        assert_eq!(value(text, "PRETTY_NAME").as_deref(), Some("Debian GNU/Linux 12 (bookworm)"));
        assert_eq!(value(text, "ID").as_deref(), Some("debian"));
        assert_eq!(value(text, "KUBECONFIG").as_deref(), Some("/x/kubeconfig"));
        assert_eq!(value(text, "NOPE"), None);
        assert_eq!(value("VERSION=\n", "VERSION"), None);
    }
}
