//! The `proxyfleet` binary as a real process in a throw-away site: a
//! providers file, a plugin directory, Proxy manifests and a state file.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::plugin;

/// A folder laid out for `proxyfleet standalone`.
#[derive(Debug)]
pub struct Site {
    dir: tempfile::TempDir,
}

impl Site {
    /// A site with `providers` as its providers file, each `(file, built
    /// component)` of `plugins` in its plugin directory (e.g. `("static",
    /// "static")`), and `manifests` as `proxies/proxies.yaml`.
    ///
    /// # Panics
    /// When a component is not built or the folder cannot be written.
    pub fn new(providers: &str, plugins: &[(&str, &str)], manifests: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir(dir.path().join("plugins")).expect("plugins dir");
        for (file, component) in plugins {
            std::fs::copy(plugin(component), dir.path().join(format!("plugins/{file}.wasm")))
                .expect("copy the component");
        }
        std::fs::write(dir.path().join("providers.yaml"), providers).expect("providers file");
        std::fs::create_dir(dir.path().join("proxies")).expect("proxies dir");
        std::fs::write(dir.path().join("proxies/proxies.yaml"), manifests).expect("manifests");
        Self { dir }
    }

    /// A path inside the site.
    pub fn path(&self, rest: &str) -> PathBuf {
        self.dir.path().join(rest)
    }

    /// `binary standalone` on the site with `args` added, not started.
    pub fn command(&self, binary: &Path, args: &[&str]) -> Command {
        let mut command = Command::new(binary);
        command
            .args(["standalone", "--providers"])
            .arg(self.path("providers.yaml"))
            .arg("--plugin-dir")
            .arg(self.path("plugins"))
            .arg("--proxies")
            .arg(self.path("proxies"))
            .arg("--state")
            .arg(self.path("state.redb"))
            .args(args);
        command
    }

    /// Starts `binary standalone` on the site with `args` added; its log
    /// goes to [`Site::log`]. The process is killed when the handle drops.
    ///
    /// # Panics
    /// When the binary cannot be started.
    pub fn standalone(&self, binary: &Path, args: &[&str]) -> Running {
        let log = std::fs::File::create(self.path("operator.log")).expect("the operator's log");
        let child = self
            .command(binary, args)
            .args(["--log-format", "text"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start proxyfleet");
        Running(child)
    }

    /// The last `lines` lines the operator started by [`Site::standalone`]
    /// logged: what a failing test shows.
    pub fn log(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(self.path("operator.log")).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

/// A process killed (not stopped) when dropped.
#[derive(Debug)]
pub struct Running(pub Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Sends `child` SIGTERM, as a service manager or the kubelet stops a
/// process, and waits up to `timeout` for it to exit: its exit status, or
/// `None` when it is still running then.
///
/// # Panics
/// When `kill` cannot be run or the process cannot be polled.
pub async fn terminate(
    child: &mut Child,
    timeout: std::time::Duration,
) -> Option<std::process::ExitStatus> {
    let pid = child.id().to_string();
    let signalled = Command::new("kill").args(["-TERM", &pid]).status().expect("kill runs");
    assert!(signalled.success(), "kill -TERM {pid} failed");
    crate::wait_for(timeout, || {
        let exited = child.try_wait().expect("the process can be polled");
        async move { exited }
    })
    .await
}

/// One Proxy manifest on provider entry `provider`.
pub fn proxy_manifest(name: &str, provider: &str) -> String {
    format!(
        "apiVersion: proxyfleet.io/v1alpha1\nkind: Proxy\nmetadata: {{ name: {name} }}\nspec: {{ provider: {provider} }}\n---\n"
    )
}
