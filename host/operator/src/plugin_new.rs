//! `proxyfleet plugin new NAME`: a provider plugin project that builds as
//! it is and passes the conformance suite against the backend it declares
//! (`backend.yaml`), for a plugin author to change into theirs.

use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail, ensure};

/// The kind of backend the project's provider speaks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// A REST API over the HTTP capability.
    Http,
    /// libvirt domains on a hypervisor, over the libvirt capability.
    Libvirt,
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Http => "http",
            Self::Libvirt => "libvirt",
        })
    }
}

/// The files of a project for `backend`: path in the project, template.
fn templates(backend: Backend) -> &'static [(&'static str, &'static str)] {
    match backend {
        Backend::Http => &[
            ("Cargo.toml", include_str!("../templates/plugin-http/Cargo.toml")),
            ("README.md", include_str!("../templates/plugin-http/README.md")),
            (".gitignore", include_str!("../templates/plugin-http/gitignore")),
            ("entry.yaml", include_str!("../templates/plugin-http/entry.yaml")),
            ("backend.yaml", include_str!("../templates/plugin-http/backend.yaml")),
            ("src/lib.rs", include_str!("../templates/plugin-http/src/lib.rs")),
            ("src/api.rs", include_str!("../templates/plugin-http/src/api.rs")),
            ("src/config.rs", include_str!("../templates/plugin-http/src/config.rs")),
        ],
        Backend::Libvirt => &[
            ("Cargo.toml", include_str!("../templates/plugin-libvirt/Cargo.toml")),
            ("README.md", include_str!("../templates/plugin-libvirt/README.md")),
            (".gitignore", include_str!("../templates/plugin-libvirt/gitignore")),
            ("entry.yaml", include_str!("../templates/plugin-libvirt/entry.yaml")),
            ("src/lib.rs", include_str!("../templates/plugin-libvirt/src/lib.rs")),
            ("src/domain.rs", include_str!("../templates/plugin-libvirt/src/domain.rs")),
            ("src/config.rs", include_str!("../templates/plugin-libvirt/src/config.rs")),
        ],
    }
}

/// The SDK (and test kit) release the templates are written against: the
/// contract's minor, and no older patch, since they use what it added.
/// A test holds it to `sdk/Cargo.toml`.
const SDK_VERSION: &str = "0.5.0";

/// Longest plugin name: it also names the crate and the entry.
const NAME_MAX: usize = 40;

/// Checks a plugin name: lowercase letters, digits and `-`, starting with a
/// letter, as plugin names and crate names both allow.
fn check_name(name: &str) -> anyhow::Result<()> {
    let valid = name.len() <= NAME_MAX
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    ensure!(
        valid,
        "NAME `{name}`: use 1 to {NAME_MAX} lowercase letters, digits and `-`, starting with a \
         letter and not ending with `-` (it names the plugin and its crate)"
    );
    Ok(())
}

/// Where the project's SDK comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SdkSource {
    /// The SDK and its test kit in this proxyfleet checkout.
    Checkout(PathBuf),
    /// Their crates.io releases, which the templates need at
    /// [`SDK_VERSION`].
    CratesIo,
}

impl SdkSource {
    /// `--sdk`'s value: `crates.io`, or the root of a checkout.
    pub fn parse(value: &str) -> Self {
        match value {
            "crates.io" => Self::CratesIo,
            path => Self::Checkout(PathBuf::from(path)),
        }
    }

    /// Without `--sdk`: the checkout this binary was built in, found by
    /// walking up from the binary (`target/<profile>/proxyfleet` in a
    /// checkout). The SDK is not on crates.io yet, so a project that asked
    /// for it there would not build.
    ///
    /// # Errors
    /// When the binary is not in a checkout.
    pub fn beside(binary: &Path) -> anyhow::Result<Self> {
        let found = binary.ancestors().skip(1).find(|dir| is_checkout(dir));
        match found {
            Some(dir) => Ok(Self::Checkout(dir.to_owned())),
            None => bail!(
                "no proxyfleet checkout around {}, and proxyfleet-sdk {SDK_VERSION} is not \
                 published on crates.io yet: give --sdk PATH, the root of a proxyfleet checkout \
                 (the project then depends on its sdk/ and sdk-testkit/), or --sdk crates.io \
                 once the release is published",
                binary.display()
            ),
        }
    }
}

/// True for the root of a proxyfleet checkout: it holds the SDK, its test
/// kit and the contract.
fn is_checkout(dir: &Path) -> bool {
    ["sdk/Cargo.toml", "sdk-testkit/Cargo.toml", "wit/provider.wit"]
        .iter()
        .all(|file| dir.join(file).is_file())
}

/// The dependency lines for the SDK and its test kit: path dependencies on
/// a proxyfleet checkout, or the crates.io release the templates need.
fn dependencies(source: &SdkSource) -> anyhow::Result<(String, String)> {
    let checkout = match source {
        SdkSource::CratesIo => {
            let version = format!("\"{SDK_VERSION}\"");
            return Ok((version.clone(), version));
        }
        SdkSource::Checkout(checkout) => checkout,
    };
    let checkout = std::path::absolute(checkout)
        .with_context(|| format!("--sdk {}: cannot resolve it", checkout.display()))?;
    let path = |dir: &str| -> anyhow::Result<String> {
        let crate_dir = checkout.join(dir);
        ensure!(
            crate_dir.join("Cargo.toml").is_file(),
            "--sdk {}: no {dir}/Cargo.toml there; give the root of a proxyfleet checkout",
            checkout.display()
        );
        // TOML basic strings: backslashes and quotes escaped.
        let text = crate_dir.display().to_string().replace('\\', "\\\\").replace('"', "\\\"");
        Ok(format!("{{ path = \"{text}\" }}"))
    };
    Ok((path("sdk")?, path("sdk-testkit")?))
}

/// Makes the project `NAME` in `parent` (a new directory `parent/NAME`)
/// and returns its directory.
///
/// # Errors
/// A bad name, a directory that exists, a `--sdk` that is not a checkout,
/// or a file that cannot be written.
pub fn run(
    name: &str,
    backend: Backend,
    parent: &Path,
    sdk: &SdkSource,
) -> anyhow::Result<PathBuf> {
    check_name(name)?;
    let (sdk, testkit) = dependencies(sdk)?;
    let dir = parent.join(name);
    if dir.exists() {
        bail!("{} exists: choose another NAME or --dir", dir.display());
    }
    let crate_name = name.replace('-', "_");
    for (path, template) in templates(backend) {
        let text = template
            .replace("{{name}}", name)
            .replace("{{crate}}", &crate_name)
            .replace("{{sdk}}", &sdk)
            .replace("{{testkit}}", &testkit);
        let file = dir.join(path);
        if let Some(folder) = file.parent() {
            std::fs::create_dir_all(folder)
                .with_context(|| format!("cannot create {}", folder.display()))?;
        }
        std::fs::write(&file, text).with_context(|| format!("cannot write {}", file.display()))?;
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use proxyfleet_runtime::CONTRACT_VERSION;

    use super::*;

    #[test]
    fn names_are_plugin_and_crate_names() {
        for good in ["example", "my-cloud2", "a"] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in ["", "Example", "9lives", "my_cloud", "trailing-", &"x".repeat(41)] {
            let error = check_name(bad).expect_err(bad).to_string();
            assert!(error.starts_with("NAME `"), "{error}");
        }
    }

    #[test]
    fn every_placeholder_is_filled() {
        let parent = tempfile::tempdir().expect("a temporary directory");
        for backend in [Backend::Http, Backend::Libvirt] {
            let dir =
                run(&format!("example-{backend}"), backend, parent.path(), &SdkSource::CratesIo)
                    .expect("made");
            for (path, _) in templates(backend) {
                let text = std::fs::read_to_string(dir.join(path)).expect("written");
                assert!(!text.contains("{{"), "{backend}: {path} keeps a placeholder");
            }
        }
        let dir = parent.path().join("example-http");
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).expect("written");
        assert!(manifest.contains(&format!("proxyfleet-sdk = \"{SDK_VERSION}\"")), "{manifest}");
        assert!(dir.join(".gitignore").is_file());
    }

    #[test]
    fn an_existing_directory_is_left_alone() {
        let parent = tempfile::tempdir().expect("a temporary directory");
        std::fs::create_dir(parent.path().join("example")).expect("made");
        let error = run("example", Backend::Http, parent.path(), &SdkSource::CratesIo)
            .expect_err("refused");
        assert!(error.to_string().contains("exists"), "{error}");
    }

    #[test]
    fn a_checkout_gives_path_dependencies() {
        let checkout = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let (sdk, testkit) =
            dependencies(&SdkSource::Checkout(checkout)).expect("the repository is a checkout");
        assert!(sdk.starts_with("{ path = \"") && sdk.ends_with("/sdk\" }"), "{sdk}");
        assert!(testkit.ends_with("/sdk-testkit\" }"), "{testkit}");
        let elsewhere = tempfile::tempdir().expect("a temporary directory");
        assert!(dependencies(&SdkSource::Checkout(elsewhere.path().to_owned())).is_err());
        assert_eq!(SdkSource::parse("crates.io"), SdkSource::CratesIo);
    }

    /// Issue 47, item 9: `plugin new NAME && cargo test` failed, since the
    /// project asked crates.io for an SDK that is not published there.
    /// Without `--sdk`, a binary built in a checkout uses that checkout's
    /// SDK; one outside any checkout refuses, naming `--sdk`.
    #[test]
    fn issue_47_item_9_without_sdk_the_checkout_around_the_binary_is_used_or_it_refuses() {
        let checkout = std::path::absolute(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
            .expect("absolute");
        let binary = checkout.join("target/debug/proxyfleet");
        match SdkSource::beside(&binary).expect("found") {
            SdkSource::Checkout(found) => assert!(is_checkout(&found), "{}", found.display()),
            SdkSource::CratesIo => panic!("the checkout should be found"),
        }
        let elsewhere = tempfile::tempdir().expect("a temporary directory");
        let error = SdkSource::beside(&elsewhere.path().join("bin/proxyfleet"))
            .expect_err("no checkout")
            .to_string();
        assert!(error.contains("--sdk PATH") && error.contains("not published"), "{error}");
    }

    /// The release the templates ask for is the SDK's own version, whose
    /// minor is the contract's.
    #[test]
    fn the_sdk_version_is_the_sdks_and_follows_the_contract() {
        let manifest = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../sdk/Cargo.toml"),
        )
        .expect("the SDK's manifest");
        assert!(manifest.contains(&format!("\nversion = \"{SDK_VERSION}\"\n")), "{manifest}");
        let minor = |version: &str| version.rsplit_once('.').map(|(minor, _)| minor.to_owned());
        assert_eq!(minor(SDK_VERSION), minor(CONTRACT_VERSION));
    }
}
