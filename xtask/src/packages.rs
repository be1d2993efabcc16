//! The Debian packages each command needs, besides the plugin toolchain
//! (`toolchain::debian_needs`).

use crate::apt::Need;
use crate::version::Version;

/// Every build of the host crates: libvirt's C client library, and
/// pkg-config, which its -sys crate finds it with.
pub fn host_build() -> Vec<Need> {
    vec![Need::any("libvirt-dev"), Need::any("pkgconf")]
}

/// What the test suite runs.
pub fn tests() -> Vec<Need> {
    let mut needs = host_build();
    needs.extend([
        // The proxy the end-to-end tests run.
        Need::any("tinyproxy"),
        // isoinfo, the independent reader the SDK's ISO builder is checked with.
        Need::any("genisoimage"),
        // The libvirt capability's tests: a private libvirtd (test and
        // storage drivers) and a private sshd.
        Need::any("libvirt-daemon"),
        Need::any("openssh-server"),
        // qemu-img: the storage driver makes qcow2 overlays and copies bases
        // with it, and the kvm plugin's tests make their images with it.
        Need::any("qemu-utils"),
        Need::any("curl"),
        // The images go through a private registry with skopeo.
        Need::any("skopeo"),
        Need::any("docker-registry"),
        // The browser tier drives headless Chromium (the console's pages,
        // axe-core's checks) through chromedriver, which must be the
        // browser's own build. Debian updates Chromium only in the security
        // suite; the release's main suite keeps an older major than the one
        // the tier is run with.
        Need::at_least("chromium", chromium(), "security"),
        Need::at_least("chromium-driver", chromium(), "security"),
        // promtool checks the alerts and runs their unit tests.
        Need::any("prometheus"),
        // The current API server's build checks sid's packages with it
        // (deploy/dev/current-apiserver/build.sh).
        Need::any("debian-archive-keyring"),
        Need::any("openssl"),
    ]);
    needs
}

/// The Chromium major the browser tier is run with, bookworm-security's.
fn chromium() -> Version {
    Version::parse("156").expect("a version")
}

/// What the demo runs: the proxies, the origin web server (Python's
/// `http.server`) and the crawler's side (curl).
pub fn demo() -> Vec<Need> {
    let mut needs = host_build();
    needs.extend([Need::any("tinyproxy"), Need::any("curl"), Need::any("python3")]);
    needs
}

/// What `deploy/dev/kube-apiserver/build.sh` installs to build Kubernetes
/// and what its `start.sh` runs (listed for the doctor; the script installs
/// them itself).
pub fn kube() -> Vec<Need> {
    [
        "golang-1.19-go",
        "golang-1.19-src",
        "golang-github-modern-go-reflect2-dev",
        "dpkg-dev",
        "etcd-server",
        "openssl",
    ]
    .into_iter()
    .map(Need::any)
    .collect()
}

/// What `deploy/dev/node/start.sh` installs for the in-cluster tests'
/// node (listed for the doctor; the script installs them itself).
pub fn node() -> Vec<Need> {
    ["containerd", "runc", "containernetworking-plugins", "iptables", "nftables", "conntrack"]
        .into_iter()
        .map(Need::any)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The doctor's list of the Kubernetes build's packages stays the one
    /// the script installs.
    #[test]
    fn kube_packages_are_the_build_scripts() {
        let repo = crate::Repo::locate().expect("inside the repository");
        let script = std::fs::read_to_string(repo.root.join("deploy/dev/kube-apiserver/build.sh"))
            .expect("build.sh")
            .replace("$GO_PKG_VERSION", "1.19");
        for need in kube() {
            assert!(script.contains(need.package), "build.sh does not install {}", need.package);
        }
    }

    /// The doctor's list of the node's packages stays the one its script
    /// installs.
    #[test]
    fn node_packages_are_the_node_scripts() {
        let repo = crate::Repo::locate().expect("inside the repository");
        let lib =
            std::fs::read_to_string(repo.root.join("deploy/dev/node/lib.sh")).expect("lib.sh");
        let line = lib
            .lines()
            .find(|line| line.starts_with("NODE_APT_PACKAGES=("))
            .expect("NODE_APT_PACKAGES in lib.sh");
        let listed: Vec<&str> = line
            .trim_start_matches("NODE_APT_PACKAGES=(")
            .trim_end_matches(')')
            .split_whitespace()
            .collect();
        let ours: Vec<&str> = node().iter().map(|need| need.package).collect();
        assert_eq!(ours, listed);
    }
}
