//! Real forward proxies for the tests: Debian's tinyproxy on a loopback
//! port, started and killed at will.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A tinyproxy process listening on 127.0.0.1.
#[derive(Debug)]
pub struct Tinyproxy {
    addr: SocketAddr,
    config: PathBuf,
    child: Option<Child>,
    _dir: tempfile::TempDir,
}

impl Tinyproxy {
    /// Starts one on a free loopback port and waits until it accepts.
    ///
    /// # Panics
    /// When tinyproxy is not installed (the README's test command installs
    /// it) or does not start.
    pub fn start() -> Self {
        Self::start_with("")
    }

    /// Like [`Tinyproxy::start`], with `extra` lines appended to its config.
    ///
    /// # Panics
    /// As [`Tinyproxy::start`].
    pub fn start_with(extra: &str) -> Self {
        let port = crate::ports::free_port();
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("tinyproxy.conf");
        // No ConnectPort line: CONNECT is allowed to every port, which the
        // health probe's tunnel to a loopback check target needs. `User`
        // lets it start as root, as on CI.
        std::fs::write(
            &config,
            format!(
                "User nobody\nGroup nogroup\nPort {port}\nListen 127.0.0.1\nTimeout 30\n\
                 MaxClients 200\nAllow 127.0.0.1\nLogLevel Error\n{extra}"
            ),
        )
        .unwrap();
        let mut proxy =
            Self { addr: SocketAddr::from(([127, 0, 0, 1], port)), config, child: None, _dir: dir };
        proxy.restart();
        proxy
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its process ID, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills it; connections to its port are refused until [`restart`].
    ///
    /// [`restart`]: Tinyproxy::restart
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        // It is gone once nothing accepts on the port.
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(self.addr).is_ok() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts it again on the same port.
    ///
    /// # Panics
    /// When it does not accept within 10 s.
    pub fn restart(&mut self) {
        self.kill();
        let child = Command::new("tinyproxy")
            .arg("-d")
            .arg("-c")
            .arg(&self.config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("tinyproxy is not installed: run the README's test command (it installs it)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(self.addr).is_err() {
            assert!(Instant::now() < deadline, "tinyproxy did not start on {}", self.addr);
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Tinyproxy {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
