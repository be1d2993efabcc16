//! A private OCI registry on loopback: Debian's `docker-registry` (the
//! CNCF distribution registry) with its own config and storage in a
//! temporary directory, stopped and removed when dropped. Plain HTTP, on
//! 127.0.0.1 only.

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// Debian's registry binary (package `docker-registry`).
const BINARY: &str = "/usr/bin/docker-registry";
/// Below the tests' port range and the kernel's ephemeral one.
const PORT: u16 = 15000;

/// A running registry; stopped when dropped.
pub struct Registry {
    child: Child,
    /// `127.0.0.1:PORT`, as image references name it.
    pub host: String,
    dir: PathBuf,
}

impl Registry {
    /// Starts a registry and waits until it answers.
    pub fn start() -> Result<Self> {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, PORT));
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            bail!("{addr} is taken already; stop what listens there (an earlier registry?)");
        }
        let dir = std::env::temp_dir().join(format!("proxyfleet-registry-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("storage"))?;
        let config = dir.join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n\
                 http:\n  addr: {addr}\n",
                dir.join("storage").display()
            ),
        )?;
        let log = std::fs::File::create(dir.join("registry.log"))?;
        let child = Command::new(BINARY)
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start {BINARY} (apt-get install docker-registry)"))?;
        let registry = Self { child, host: addr.to_string(), dir };
        let started = Instant::now();
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            if started.elapsed() > Duration::from_secs(20) {
                let log =
                    std::fs::read_to_string(registry.dir.join("registry.log")).unwrap_or_default();
                bail!("the registry did not listen on {addr} within 20 s:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(registry)
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
