//! Signatures on what a release publishes: the images, the chart (an OCI
//! artifact, as `helm push` stores it) and the first-party plugins, each
//! signed as `cosign sign --key` signs, by the operator's own `proxyfleet
//! plugin sign`, and checked with `plugin verify` against the public key,
//! as an entry with `verify: {keys: [...]}` checks a plugin.
//!
//! The test suite signs with a key made for the run; a release names its
//! key (`cargo xtask image --push REGISTRY --sign-key KEY`, its password
//! in `COSIGN_PASSWORD`).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, ensure};

use crate::process;

/// What signs: the operator binary and a key pair.
pub struct Signer {
    binary: PathBuf,
    key: PathBuf,
    /// The public key, when known (a key made here); a release's key is
    /// checked by whoever holds its public half.
    public: Option<PathBuf>,
    /// A file holding the key's password; without one, COSIGN_PASSWORD.
    password_file: Option<PathBuf>,
}

impl Signer {
    /// A key pair made in `dir` for this run, with a password of its own.
    pub fn for_test(binary: &Path, dir: &Path) -> Result<Self> {
        let password_file = dir.join("signing-password");
        std::fs::write(&password_file, "proxyfleet test signing key\n")?;
        let prefix = dir.join("test-signing");
        process::run(
            Command::new(binary)
                .args(["plugin", "keygen", "--output-prefix"])
                .arg(&prefix)
                .arg("--key-password-file")
                .arg(&password_file),
        )?;
        Ok(Self {
            binary: binary.to_owned(),
            key: prefix.with_extension("key"),
            public: Some(prefix.with_extension("pub")),
            password_file: Some(password_file),
        })
    }

    /// The release key `key`, its password in COSIGN_PASSWORD.
    pub fn release(binary: &Path, key: &Path) -> Result<Self> {
        ensure!(key.is_file(), "--sign-key: {} is not a file", key.display());
        ensure!(
            std::env::var_os("COSIGN_PASSWORD").is_some(),
            "--sign-key: set COSIGN_PASSWORD to the key's password (empty for none)"
        );
        Ok(Self {
            binary: binary.to_owned(),
            key: key.to_owned(),
            public: None,
            password_file: None,
        })
    }

    /// Signs `reference` (`REGISTRY/REPOSITORY:TAG`), then, with a known
    /// public key, checks that it verifies. Loopback registries are plain
    /// HTTP.
    pub fn sign(&self, reference: &str) -> Result<()> {
        let mut sign = self.command("sign", reference);
        sign.arg("--key").arg(&self.key);
        if let Some(password) = &self.password_file {
            sign.arg("--key-password-file").arg(password);
        }
        let signed = process::output(&mut sign)?;
        let Some(public) = &self.public else {
            eprintln!("xtask image: signed {reference}: {}", signed.trim());
            return Ok(());
        };
        let mut verify = self.command("verify", reference);
        verify.arg("--key").arg(public);
        let verified = process::output(&mut verify)
            .with_context(|| format!("{reference} was signed, but does not verify"))?;
        let verified: serde_json::Value = serde_json::from_str(&verified)
            .with_context(|| format!("plugin verify printed no JSON: {verified}"))?;
        ensure!(verified["verified"] == true, "{reference} does not verify: {verified}");
        eprintln!("xtask image: {reference} signed and verified ({})", verified["manifestDigest"]);
        Ok(())
    }

    /// `proxyfleet plugin SUBCOMMAND REFERENCE`, in plain HTTP for a
    /// loopback registry.
    fn command(&self, subcommand: &str, reference: &str) -> Command {
        let mut command = Command::new(&self.binary);
        command.args(["--log-format", "text", "plugin", subcommand, reference]);
        if is_loopback(reference) {
            command.arg("--plain-http");
        }
        command
    }
}

/// True for a reference on 127.0.0.1 or localhost.
fn is_loopback(reference: &str) -> bool {
    let host = reference.split('/').next().unwrap_or_default();
    let host = host.rsplit_once(':').map_or(host, |(host, _)| host);
    matches!(host, "127.0.0.1" | "localhost" | "[::1]")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_references_are_told_apart() {
        assert!(is_loopback("127.0.0.1:15000/proxyfleet/proxyfleet:0.1.0"));
        assert!(is_loopback("localhost/charts/proxyfleet:0.1.0"));
        assert!(!is_loopback("ghcr.io/proxyfleet/proxyfleet:0.1.0"));
    }
}
