//! `cargo xtask image`: OCI image archives without Docker and without a
//! base image, in `target/images/`:
//!
//! - `proxyfleet.oci.tar`: the operator's release build (stripped), the
//!   shared libraries it links and the loader, the first-party plugins in
//!   `/usr/lib/proxyfleet/plugins`, the machine's CA bundle, and a
//!   non-root user (65532). Nothing in it needs a writable root.
//! - `tinyproxy.oci.tar`: Debian's tinyproxy with a minimal config and
//!   `/bin/sh` (dash), which the kubernetes plugin's launcher runs, as
//!   `nobody` (65534).
//!
//! The same inputs give the same digests (see `tree` and `oci`); the
//! archives load with `ctr images import`, and `--push REGISTRY` copies
//! them to a registry with their digests unchanged (see `push`), signed
//! with `--sign-key KEY` (see `sign`).

mod libs;
mod oci;
mod push;
mod sign;
mod tree;

use std::fs;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result};
use serde_json::json;

use crate::apt::{self, Need};
use crate::process::{self, step};
use crate::{Repo, cargo, manifest, plugins};

use oci::Image;
use tree::Tree;

/// Where the images are named from; nothing is pulled from there.
const REPOSITORY: &str = "ghcr.io/proxyfleet";
/// The operator's user: not root, not a user the node has.
const OPERATOR_UID: u32 = 65532;
const NOBODY_UID: u32 = 65534;
/// The plugins shipped in the operator image (fixtures are not).
const FIRST_PARTY: &[&str] = &["static", "proxmox", "kubernetes", "gcp", "kvm"];
const PLUGIN_DIR: &str = "/usr/lib/proxyfleet/plugins";
const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Which build of the operator goes into its image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// `--release`: the image to ship.
    Release,
    /// The dev build the test suite already made: the in-cluster tests use
    /// it so that CI does not compile the whole operator a second time.
    Dev,
}

impl Profile {
    fn dir(self) -> &'static str {
        match self {
            Profile::Release => "release",
            Profile::Dev => "debug",
        }
    }
}

/// An image archive written to `target/images/`.
#[derive(Debug)]
pub struct Built {
    pub name: String,
    pub archive: std::path::PathBuf,
    pub digest: String,
}

/// `cargo xtask image [--push REGISTRY [--sign-key KEY]]`: the release
/// images, and what they are; pushed to `push_to` when given, and signed
/// there with `sign_key` (cosign's key file, its password in
/// COSIGN_PASSWORD).
pub fn run(repo: &Repo, push_to: Option<&str>, sign_key: Option<&Path>) -> Result<()> {
    let images = build(repo, Profile::Release)?;
    let signer = sign_key
        .map(|key| sign::Signer::release(&operator_binary(repo, Profile::Release), key))
        .transpose()?;
    for built in images {
        eprintln!("xtask image: {} {} ({})", built.name, built.digest, built.archive.display());
        if let Some(registry) = push_to {
            let reference = push::push(&built, registry)?;
            eprintln!("xtask image: pushed {reference}@{}", built.digest);
            if let Some(signer) = &signer {
                signer.sign(&reference)?;
            }
        }
    }
    Ok(())
}

/// The test suite's check of what a release publishes, through a private
/// registry on loopback: the test build's images with their digests, the
/// chart as `helm push` stores it, and the first-party plugins, each
/// signed with a key made for the run and verified.
pub fn push_check(repo: &Repo) -> Result<()> {
    step("debian packages", || apt::ensure(&[Need::any("skopeo"), Need::any("docker-registry")]))?;
    let images = build(repo, Profile::Dev)?;
    let helm = crate::helm::provide()?;
    let registry = crate::registry::Registry::start()?;
    let work = tempfile_dir(repo, "signing")?;
    let signer = sign::Signer::for_test(&operator_binary(repo, Profile::Dev), &work)?;
    for built in &images {
        let reference = push::push(built, &registry.host)?;
        eprintln!("xtask image: pushed {reference}@{}", built.digest);
        signer.sign(&reference)?;
    }
    let version = workspace_version(repo)?;
    let chart = push::push_chart(repo, &helm, &registry.host, &work)?;
    signer.sign(&chart)?;
    for plugin in FIRST_PARTY {
        let reference = format!("{}/proxyfleet/plugins/{plugin}:{version}", registry.host);
        push::push_plugin(&operator_binary(repo, Profile::Dev), repo, plugin, &reference)?;
        signer.sign(&reference)?;
    }
    std::fs::remove_dir_all(&work).ok();
    Ok(())
}

/// The operator binary of `profile`'s build.
fn operator_binary(repo: &Repo, profile: Profile) -> std::path::PathBuf {
    repo.root.join("target").join(profile.dir()).join("proxyfleet")
}

/// An empty directory under `target/images/` for `what`.
fn tempfile_dir(repo: &Repo, what: &str) -> Result<std::path::PathBuf> {
    let dir = repo.root.join("target/images").join(what);
    if dir.exists() {
        fs::remove_dir_all(&dir)?;
    }
    fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Builds the operator (`profile`) and both images.
pub fn build(repo: &Repo, profile: Profile) -> Result<Vec<Built>> {
    step("debian packages", || {
        let mut needs = crate::packages::host_build();
        needs.extend(["tinyproxy", "dash", "binutils", "ca-certificates"].map(Need::any));
        apt::ensure(&needs)
    })?;
    step("plugins", || plugins::build(repo))?;
    step(&format!("operator build ({})", profile.dir()), || {
        let mut build = match profile {
            Profile::Release => {
                let mut build = cargo();
                build.args(["build", "--release", "-p", "proxyfleet-operator"]);
                build
            }
            // The binary the test suite links its tests against: the same
            // feature resolution as the test step, so after it this builds
            // nothing.
            Profile::Dev => {
                let mut build = crate::cargo_test_all_tiers();
                build.arg("--no-run");
                build
            }
        };
        build.current_dir(&repo.root);
        process::run(&mut build)
    })?;
    let version = workspace_version(repo)?;
    let out = repo.root.join("target/images");
    let work = out.join("work");
    fs::create_dir_all(&work)?;
    let images = [
        ("proxyfleet.oci.tar", operator(repo, profile, &version, &work)?),
        ("tinyproxy.oci.tar", tinyproxy(&version)?),
    ];
    let mut built = Vec::new();
    for (file, image) in images {
        let path = out.join(file);
        let written = oci::write(&image, &path)?;
        eprintln!(
            "xtask image: {} -> target/images/{file}: {} ({} KiB compressed layers)",
            image.name,
            written.digest,
            written.layers_size.div_ceil(1024)
        );
        built.push(Built { name: image.name, archive: path, digest: written.digest });
    }
    Ok(built)
}

fn workspace_version(repo: &Repo) -> Result<String> {
    let text = fs::read_to_string(repo.root.join("Cargo.toml"))?;
    manifest::value(&text, "workspace.package", "version")
        .context("no [workspace.package] version in Cargo.toml")
}

/// `/etc/passwd`, `/etc/group` and `/etc/nsswitch.conf` naming only root
/// and `user` (uid = gid).
fn users(tree: &mut Tree, user: &str, uid: u32) -> Result<()> {
    let passwd = format!(
        "root:x:0:0:root:/root:/sbin/nologin\n{user}:x:{uid}:{uid}:{user}:/nonexistent:/sbin/nologin\n"
    );
    let group = format!("root:x:0:\n{user}:x:{uid}:\n");
    tree.file("/etc/passwd", 0o644, passwd.into_bytes())?;
    tree.file("/etc/group", 0o644, group.into_bytes())?;
    tree.file(
        "/etc/nsswitch.conf",
        0o644,
        b"passwd: files\ngroup: files\nhosts: files dns\n".to_vec(),
    )?;
    tree.dir("/tmp", 0o1777)?;
    Ok(())
}

/// `binary` and every library it links, at their paths.
fn dynamic(tree: &mut Tree, host: &Path, path: &str) -> Result<()> {
    tree.copy(host, path)?;
    for library in libs::of(host)? {
        let inside = library.to_str().context("a library path that is not UTF-8")?;
        if !tree.contains(inside) {
            tree.copy(&library, inside)?;
        }
    }
    Ok(())
}

/// The operator's binaries: `proxyfleet`, and the libvirt helper it
/// starts from its own directory for entries with a libvirt grant.
const OPERATOR_BINARIES: [&str; 2] = ["proxyfleet", "proxyfleet-libvirt"];

fn operator(repo: &Repo, profile: Profile, version: &str, work: &Path) -> Result<Image> {
    let mut tree = Tree::new();
    users(&mut tree, "proxyfleet", OPERATOR_UID)?;
    for binary in OPERATOR_BINARIES {
        let built = repo.root.join("target").join(profile.dir()).join(binary);
        let stripped = work.join(binary);
        fs::copy(&built, &stripped).with_context(|| format!("copying {}", built.display()))?;
        process::run(Command::new("strip").arg("--strip-all").arg(&stripped))?;
        dynamic(&mut tree, &stripped, &format!("/usr/bin/{binary}"))?;
    }
    tree.copy(Path::new(CA_BUNDLE), CA_BUNDLE)?;
    for plugin in FIRST_PARTY {
        let file = repo.plugin_outputs().join(format!("{plugin}.wasm"));
        tree.copy(&file, &format!("{PLUGIN_DIR}/{plugin}.wasm"))?;
    }
    Ok(Image {
        name: format!("{REPOSITORY}/proxyfleet:{version}"),
        runtime: json!({
            "User": format!("{OPERATOR_UID}:{OPERATOR_UID}"),
            "Entrypoint": ["/usr/bin/proxyfleet"],
            "Cmd": ["--help"],
            "Env": [
                "PATH=/usr/bin:/bin",
                format!("SSL_CERT_FILE={CA_BUNDLE}"),
            ],
            "WorkingDir": "/",
            "ExposedPorts": { "8480/tcp": {}, "9464/tcp": {} },
            "Labels": {
                "org.opencontainers.image.title": "proxyfleet",
                "org.opencontainers.image.version": version,
                "io.proxyfleet.plugin-dir": PLUGIN_DIR,
            },
        }),
        layers: vec![tree],
    })
}

/// The port tinyproxy's own config listens on; the kubernetes plugin's
/// launcher writes its own config with the Proxy's port instead.
const TINYPROXY_PORT: u16 = 8888;

fn tinyproxy(version: &str) -> Result<Image> {
    let mut tree = Tree::new();
    users(&mut tree, "nobody", NOBODY_UID)?;
    dynamic(&mut tree, Path::new("/usr/bin/tinyproxy"), "/usr/bin/tinyproxy")?;
    dynamic(&mut tree, Path::new("/bin/dash"), "/bin/dash")?;
    tree.symlink("/bin/sh", "dash")?;
    let templates = Path::new("/usr/share/tinyproxy");
    if templates.is_dir() {
        tree.copy_dir(templates, "/usr/share/tinyproxy")?;
    }
    let config = format!("Port {TINYPROXY_PORT}\nTimeout 600\nMaxClients 1024\nLogLevel Warning\n");
    tree.file("/etc/tinyproxy/tinyproxy.conf", 0o644, config.into_bytes())?;
    let tinyproxy = apt::installed("tinyproxy").unwrap_or_default();
    Ok(Image {
        name: format!("{REPOSITORY}/tinyproxy:{version}"),
        runtime: json!({
            "User": format!("{NOBODY_UID}:{NOBODY_UID}"),
            "Entrypoint": ["/usr/bin/tinyproxy", "-d", "-c", "/etc/tinyproxy/tinyproxy.conf"],
            "Env": ["PATH=/usr/bin:/bin"],
            "WorkingDir": "/",
            "ExposedPorts": { format!("{TINYPROXY_PORT}/tcp"): {} },
            "Labels": {
                "org.opencontainers.image.title": "tinyproxy",
                "org.opencontainers.image.version": version,
                "io.proxyfleet.tinyproxy-debian-version": tinyproxy,
            },
        }),
        layers: vec![tree],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kubernetes plugin's default proxy image is the one built here.
    #[test]
    fn the_kubernetes_plugins_default_image_is_ours() {
        let repo = Repo::locate().expect("inside the repository");
        let config = fs::read_to_string(repo.root.join("plugins/kubernetes/src/config.rs"))
            .expect("the plugin's config");
        let version = workspace_version(&repo).expect("version");
        let ours = format!("pub const DEFAULT_IMAGE: &str = \"{REPOSITORY}/tinyproxy:{version}\";");
        assert!(config.contains(&ours), "plugins/kubernetes/src/config.rs should hold {ours}");
    }
}
