//! `proxyfleet plugin push` and `plugin pull`: a component to and from a
//! registry in the Wasm OCI layout, reached as a `registries[]` item of
//! the providers file would reach it (`--key`: its `verify.keys`).

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use proxyfleet_oci::{PluginReference, PullLimits, RawRegistry, RawVerify, Registries};

/// How to reach the registry a reference names; the flags mirror the keys
/// of a `registries[]` item.
#[derive(Debug, clap::Args)]
pub(crate) struct RegistryFlags {
    /// User name for basic auth.
    #[arg(long)]
    username: Option<String>,
    /// A file holding the user name, instead of --username.
    #[arg(long)]
    username_file: Option<PathBuf>,
    /// A file holding the password for basic auth.
    #[arg(long)]
    password_file: Option<PathBuf>,
    /// A file holding a bearer token, instead of basic auth.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// PEM certificates to trust for the registry besides the system's.
    #[arg(long)]
    ca_file: Option<PathBuf>,
    /// Speak plain HTTP (loopback registries only, unless --insecure).
    #[arg(long)]
    plain_http: bool,
    /// Allow --plain-http to a registry that is not on loopback.
    #[arg(long)]
    insecure: bool,
}

impl RegistryFlags {
    /// The registry item these flags describe; `keys` are the public keys
    /// a pulled build must be signed with (its `verify.keys`).
    pub(crate) fn registries(
        self,
        reference: &PluginReference,
        keys: Vec<PathBuf>,
    ) -> anyhow::Result<Registries> {
        let raw = RawRegistry {
            host: reference.registry().to_owned(),
            username: self.username,
            username_file: self.username_file,
            password_file: self.password_file,
            token_file: self.token_file,
            ca_file: self.ca_file,
            plain_http: self.plain_http,
            insecure: self.insecure,
            verify: (!keys.is_empty()).then_some(RawVerify { keys }),
        };
        // Flags, not a list: name the flag rather than `registries[0]`.
        Registries::validate(vec![raw]).map_err(|err| {
            let flag = match err.field {
                "host" => "REFERENCE",
                "username" => "--username",
                "usernameFile" => "--username-file",
                "passwordFile" => "--password-file",
                "tokenFile" => "--token-file",
                "caFile" => "--ca-file",
                "plainHttp" => "--plain-http",
                "insecure" => "--insecure",
                "verify" => "--key",
                other => other,
            };
            anyhow::anyhow!("{flag}: {}", err.reason)
        })
    }
}

pub(crate) fn parse_reference(text: &str) -> anyhow::Result<PluginReference> {
    // `oci://` may be left out on the command line, where nothing else
    // could be meant.
    let text = if text.starts_with(proxyfleet_oci::SCHEME) {
        text.to_owned()
    } else {
        format!("{}{text}", proxyfleet_oci::SCHEME)
    };
    Ok(PluginReference::parse(&text)?)
}

/// Pushes `file` and answers what to print.
pub(crate) async fn push(
    file: &Path,
    reference: &str,
    flags: RegistryFlags,
) -> anyhow::Result<serde_json::Value> {
    let reference = parse_reference(reference)?;
    if reference.digest().is_some() {
        anyhow::bail!(
            "{reference}: a build is pushed to a tag; the registry names it by its digest, \
             which this command prints"
        );
    }
    let registries = flags.registries(&reference, Vec::new())?;
    let bytes = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    let size = bytes.len();
    let pushed =
        proxyfleet_oci::push(&registries, &reference, &file.display().to_string(), bytes).await?;
    let pinned = format!(
        "{}{}/{}@{}",
        proxyfleet_oci::SCHEME,
        reference.registry(),
        reference.repository(),
        pushed.manifest_digest
    );
    Ok(serde_json::json!({
        "reference": reference.to_string(),
        "pinned": pinned,
        "manifestDigest": pushed.manifest_digest,
        "sha256": pushed.layer_digest.trim_start_matches("sha256:"),
        "bytes": size,
    }))
}

/// Pulls `reference` into memory, every digest and the layout checked,
/// and its signatures when `keys` are named: a build to look at before it
/// is installed. Answers too how its signatures stand.
pub(crate) async fn fetch(
    reference: &str,
    max_bytes: u64,
    keys: Vec<PathBuf>,
    flags: RegistryFlags,
) -> anyhow::Result<(PluginReference, proxyfleet_oci::Pulled, serde_json::Value)> {
    let reference = parse_reference(reference)?;
    let registries = flags.registries(&reference, keys)?;
    let limits = PullLimits { max_bytes };
    let pulled = proxyfleet_oci::pull(&registries, &reference, None, limits, &[]).await?;
    let signature = match &pulled.verified {
        Some(verified) => verified_json(&pulled.manifest_digest, verified),
        None => {
            let found =
                proxyfleet_oci::signatures(&registries, &reference, &pulled.manifest_digest)
                    .await?;
            serde_json::json!({
                "tag": proxyfleet_oci::signature_tag(&pulled.manifest_digest),
                "signatures": found,
                "verified": false,
                "hint": "name the public keys to check them against with --key",
            })
        }
    };
    Ok((reference, pulled, signature))
}

/// Pulls `reference` into `output` (by default the repository's last
/// segment, `.wasm`) and answers what to print.
pub(crate) async fn pull(
    reference: &str,
    output: Option<PathBuf>,
    max_bytes: u64,
    keys: Vec<PathBuf>,
    flags: RegistryFlags,
) -> anyhow::Result<serde_json::Value> {
    let reference = parse_reference(reference)?;
    let registries = flags.registries(&reference, keys)?;
    let limits = PullLimits { max_bytes };
    let pulled = proxyfleet_oci::pull(&registries, &reference, None, limits, &[]).await?;
    let output = output.unwrap_or_else(|| {
        let name = reference.repository().rsplit('/').next().unwrap_or("plugin");
        PathBuf::from(format!("{name}.wasm"))
    });
    std::fs::write(&output, &pulled.bytes)
        .with_context(|| format!("cannot write {}", output.display()))?;
    Ok(serde_json::json!({
        "reference": reference.to_string(),
        "manifestDigest": pulled.manifest_digest,
        "sha256": pulled.layer_digest.trim_start_matches("sha256:"),
        "bytes": pulled.bytes.len(),
        "file": output,
        "verified": pulled.verified.as_ref().map(|verified| {
            verified_json(&pulled.manifest_digest, verified)
        }),
    }))
}

/// How a verified build is printed.
pub(crate) fn verified_json(
    manifest_digest: &str,
    verified: &proxyfleet_oci::Verified,
) -> serde_json::Value {
    serde_json::json!({
        "tag": proxyfleet_oci::signature_tag(manifest_digest),
        "manifestDigest": manifest_digest,
        "verified": true,
        "by": verified
            .by
            .iter()
            .map(|(policy, key)| serde_json::json!({ "policy": policy, "key": key }))
            .collect::<Vec<_>>(),
    })
}
