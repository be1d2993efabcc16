//! `proxyfleet plugin keygen`, `plugin sign` and `plugin verify`: cosign's
//! key files and signatures for published builds, so that an entry (or a
//! registry item) with `verify: {keys: [...]}` serves only builds signed
//! with one of its keys. cosign itself reads and writes the same keys and
//! signatures.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use proxyfleet_oci::PrivateKey;

use crate::registry_args::{RegistryFlags, parse_reference, verified_json};

/// The variable cosign reads a key's password from.
const PASSWORD_ENV: &str = "COSIGN_PASSWORD";

/// Where a private key's password comes from.
#[derive(Debug, clap::Args)]
pub(crate) struct PasswordFlags {
    /// A file holding the private key's password (a trailing newline is
    /// not part of it). Without it, the variable COSIGN_PASSWORD, which may
    /// be set empty for a key without a password.
    #[arg(long)]
    key_password_file: Option<PathBuf>,
}

impl PasswordFlags {
    fn read(&self) -> anyhow::Result<zeroize::Zeroizing<Vec<u8>>> {
        if let Some(path) = &self.key_password_file {
            let mut text = std::fs::read(path)
                .with_context(|| format!("--key-password-file: cannot read {}", path.display()))?;
            while text.last().is_some_and(|byte| *byte == b'\n' || *byte == b'\r') {
                text.pop();
            }
            return Ok(zeroize::Zeroizing::new(text));
        }
        match std::env::var_os(PASSWORD_ENV) {
            Some(value) => Ok(zeroize::Zeroizing::new(value.into_encoded_bytes())),
            None => anyhow::bail!(
                "the key's password: set {PASSWORD_ENV} (empty for none) or --key-password-file"
            ),
        }
    }
}

/// Writes a new key pair: `PREFIX.key` (cosign's encrypted private key)
/// and `PREFIX.pub`; existing files are never replaced.
pub(crate) fn keygen(prefix: &Path, password: &PasswordFlags) -> anyhow::Result<serde_json::Value> {
    let password = password.read()?;
    let key = PrivateKey::generate()?;
    let private = with_extension(prefix, "key");
    let public = with_extension(prefix, "pub");
    let pem = key.to_encrypted_pem(&password)?;
    write_new(&private, pem.as_bytes(), 0o600)?;
    if let Err(err) = write_new(&public, key.public().to_pem().as_bytes(), 0o644) {
        let _ = std::fs::remove_file(&private);
        return Err(err);
    }
    Ok(serde_json::json!({
        "privateKey": private,
        "publicKey": public,
        "fingerprint": key.public().fingerprint(),
    }))
}

/// Signs the build `reference` names with the key in `key`.
pub(crate) async fn sign(
    reference: &str,
    key: &Path,
    password: &PasswordFlags,
    flags: RegistryFlags,
) -> anyhow::Result<serde_json::Value> {
    let reference = parse_reference(reference)?;
    let password = password.read()?;
    let key = PrivateKey::read(key, &password).context("--key")?;
    let registries = flags.registries(&reference, Vec::new())?;
    let signed = proxyfleet_oci::sign(&registries, &reference, &key).await?;
    Ok(serde_json::json!({
        "reference": reference.to_string(),
        "manifestDigest": signed.manifest_digest,
        "tag": signed.tag,
        "key": signed.key,
        "added": signed.added,
        "signatures": signed.signatures,
    }))
}

/// Checks the signatures of the build `reference` names against `keys`;
/// an error when none verifies.
pub(crate) async fn verify(
    reference: &str,
    keys: Vec<PathBuf>,
    flags: RegistryFlags,
) -> anyhow::Result<serde_json::Value> {
    let reference = parse_reference(reference)?;
    let registries = flags.registries(&reference, keys)?;
    let manifest_digest = proxyfleet_oci::resolve(&registries, &reference).await?;
    let policies = proxyfleet_oci::policies(&registries, &reference, &[]);
    let verified = proxyfleet_oci::verify(&registries, &reference, &manifest_digest, &policies)
        .await?
        .context("name the public keys to verify with, --key cosign.pub")?;
    let mut out = verified_json(&manifest_digest, &verified);
    out["reference"] = serde_json::Value::String(reference.to_string());
    Ok(out)
}

fn with_extension(prefix: &Path, extension: &str) -> PathBuf {
    let mut name = prefix.as_os_str().to_owned();
    name.push(".");
    name.push(extension);
    PathBuf::from(name)
}

fn write_new(path: &Path, bytes: &[u8], mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .with_context(|| {
        format!("cannot write {} (an existing key is never replaced)", path.display())
    })?;
    file.write_all(bytes).with_context(|| format!("cannot write {}", path.display()))
}
