//! Pushing image archives to a registry with Debian's `skopeo`, digests
//! preserved: the digest `cargo xtask image` prints is the one a cluster
//! pulls by.

use std::process::Command;

use anyhow::{Result, ensure};
use sha2::{Digest as _, Sha256};

use super::{Built, REPOSITORY};
use crate::process;

/// `ghcr.io/proxyfleet/proxyfleet:0.1.0` pushed to `registry` becomes
/// `registry/proxyfleet/proxyfleet:0.1.0`.
pub fn reference(built: &Built, registry: &str) -> String {
    let path = built.name.strip_prefix(REPOSITORY).unwrap_or(&built.name).trim_start_matches('/');
    format!("{}/proxyfleet/{path}", registry.trim_end_matches('/'))
}

/// Loopback registries speak plain HTTP; every other one TLS.
fn tls_verify(registry: &str) -> bool {
    let host = registry.rsplit_once(':').map_or(registry, |(host, _)| host);
    !matches!(host, "127.0.0.1" | "localhost" | "[::1]")
}

/// Pushes `built` to `registry` under its own name and tag, and checks
/// that the registry serves the same manifest digest. Credentials are
/// skopeo's own (`skopeo login REGISTRY`).
pub fn push(built: &Built, registry: &str) -> Result<String> {
    let reference = reference(built, registry);
    let destination = format!("docker://{reference}");
    let verify = tls_verify(registry);
    process::run(
        Command::new("skopeo")
            .args(["copy", "--quiet", "--preserve-digests"])
            .arg(format!("--dest-tls-verify={verify}"))
            .arg(format!("oci-archive:{}", built.archive.display()))
            .arg(&destination),
    )?;
    let manifest = process::output(
        Command::new("skopeo")
            .args(["inspect", "--raw"])
            .arg(format!("--tls-verify={verify}"))
            .arg(&destination),
    )?;
    let served = format!("sha256:{}", hex::encode(Sha256::digest(manifest.as_bytes())));
    ensure!(
        served == built.digest,
        "{reference}: the registry serves manifest {served}, the archive holds {}",
        built.digest
    );
    Ok(reference)
}

/// Packages the chart and pushes it with Helm to
/// `registry/proxyfleet/charts`; answers its reference.
pub fn push_chart(
    repo: &crate::Repo,
    helm: &std::path::Path,
    registry: &str,
    work: &std::path::Path,
) -> Result<String> {
    let chart = repo.root.join("deploy/helm/proxyfleet");
    process::run(Command::new(helm).arg("package").arg(&chart).arg("--destination").arg(work))?;
    let version = super::workspace_version(repo)?;
    let package = work.join(format!("proxyfleet-{version}.tgz"));
    ensure!(package.is_file(), "helm package wrote no {}", package.display());
    let mut push = Command::new(helm);
    push.arg("push").arg(&package).arg(format!("oci://{registry}/proxyfleet/charts"));
    if !tls_verify(registry) {
        push.arg("--plain-http");
    }
    process::run(&mut push)?;
    Ok(format!("{registry}/proxyfleet/charts/proxyfleet:{version}"))
}

/// Publishes the first-party plugin `name` (from `target/plugins/`) as
/// `reference` with the operator's `plugin push`.
pub fn push_plugin(
    binary: &std::path::Path,
    repo: &crate::Repo,
    name: &str,
    reference: &str,
) -> Result<()> {
    let mut push = Command::new(binary);
    push.args(["--log-format", "text", "plugin", "push"])
        .arg(repo.plugin_outputs().join(format!("{name}.wasm")))
        .arg(reference);
    if !tls_verify(reference.split('/').next().unwrap_or_default()) {
        push.arg("--plain-http");
    }
    process::output(&mut push).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_keep_the_image_name_under_the_registry() {
        let built = Built {
            name: "ghcr.io/proxyfleet/tinyproxy:0.1.0".into(),
            archive: "t.tar".into(),
            digest: "sha256:00".into(),
        };
        assert_eq!(
            reference(&built, "127.0.0.1:15000"),
            "127.0.0.1:15000/proxyfleet/tinyproxy:0.1.0"
        );
        assert!(!tls_verify("127.0.0.1:15000"));
        assert!(tls_verify("registry.example:443"));
    }
}
