//! Real parts for the libvirt capability and the kvm plugin: a private
//! `sshd` on a loopback port (its own host key, an authorized key, unix
//! socket forwarding allowed) and a private `libvirtd` serving libvirt's
//! `test` driver (domains, pools, metadata, addresses) and the real storage
//! driver (`storage:///system`, for uploads, which the test driver lacks)
//! on a unix socket in a temporary directory. Real SSH carries real libvirt
//! RPC between them. Both need root, as the tests run here.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The SSH daemon binary (Debian's `openssh-server`).
pub const SSHD: &str = "/usr/sbin/sshd";
/// The libvirt daemon binary (Debian's `libvirt-daemon`).
pub const LIBVIRTD: &str = "/usr/sbin/libvirtd";
/// Where Debian keeps libvirt's driver modules.
const DRIVER_DIR: &str = "/usr/lib/x86_64-linux-gnu/libvirt/connection-driver";

fn run(command: &mut Command) {
    let output = command.output().unwrap_or_else(|err| panic!("cannot run {command:?}: {err}"));
    assert!(
        output.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Generates an ed25519 key pair at `path` and `path.pub`.
pub fn keygen(path: &Path) {
    run(Command::new("ssh-keygen").args(["-q", "-t", "ed25519", "-N", ""]).arg("-f").arg(path));
}

fn wait_for(what: &str, timeout: Duration, mut ready: impl FnMut() -> bool) {
    let started = Instant::now();
    while !ready() {
        assert!(started.elapsed() < timeout, "{what} did not come up within {timeout:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every process below `pid`, children first.
fn descendants(pid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else { return found };
    for entry in entries.flatten() {
        let Some(child) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else { continue };
        // Fields after the parenthesised command: state, ppid, ...
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(pid) {
            found.extend(descendants(child));
            found.push(child);
        }
    }
    found
}

fn signal(pids: &[u32], signal: &str) {
    if pids.is_empty() {
        return;
    }
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .args(pids.iter().map(u32::to_string))
        .stderr(Stdio::null())
        .status();
}

/// A private `sshd` on 127.0.0.1 that lets one key in as root and forwards
/// unix sockets.
#[derive(Debug)]
pub struct Sshd {
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// The private key it accepts.
    pub user_key: PathBuf,
    /// A known_hosts file listing its host key for `[127.0.0.1]:port`.
    pub known_hosts: PathBuf,
    config: PathBuf,
    child: Option<Child>,
    dir: PathBuf,
}

impl Sshd {
    /// Starts one with fresh keys in `dir`.
    pub fn start(dir: &Path) -> Self {
        std::fs::create_dir_all(dir).expect("sshd dir");
        // sshd's privilege separation wants this directory to exist.
        std::fs::create_dir_all("/run/sshd").expect("/run/sshd");
        let host_key = dir.join("host_key");
        let user_key = dir.join("user_key");
        keygen(&host_key);
        keygen(&user_key);
        let authorized = dir.join("authorized_keys");
        std::fs::copy(dir.join("user_key.pub"), &authorized).expect("authorized_keys");
        let port = crate::ports::free_port();
        let config = dir.join("sshd_config");
        std::fs::write(
            &config,
            format!(
                "Port {port}\nListenAddress 127.0.0.1\nHostKey {host}\nPidFile {dir}/sshd.pid\n\
                 UsePAM no\nStrictModes no\nPermitRootLogin prohibit-password\n\
                 PubkeyAuthentication yes\nPasswordAuthentication no\n\
                 KbdInteractiveAuthentication no\nAuthorizedKeysFile {authorized}\n\
                 AllowStreamLocalForwarding yes\nAllowAgentForwarding no\nX11Forwarding no\n\
                 ClientAliveInterval 0\n",
                host = host_key.display(),
                dir = dir.display(),
                authorized = authorized.display(),
            ),
        )
        .expect("sshd_config");
        let known_hosts = dir.join("known_hosts");
        let public = std::fs::read_to_string(dir.join("host_key.pub")).expect("host key");
        let public: Vec<&str> = public.split_whitespace().take(2).collect();
        std::fs::write(&known_hosts, format!("[127.0.0.1]:{port} {}\n", public.join(" ")))
            .expect("known_hosts");
        let mut sshd =
            Self { port, user_key, known_hosts, config, child: None, dir: dir.to_owned() };
        sshd.restart();
        sshd
    }

    /// A known_hosts file that lists another key for this host.
    pub fn wrong_known_hosts(&self) -> PathBuf {
        let other = self.dir.join("other_host_key");
        if !other.exists() {
            keygen(&other);
        }
        let public = std::fs::read_to_string(self.dir.join("other_host_key.pub")).expect("key");
        let public: Vec<&str> = public.split_whitespace().take(2).collect();
        let path = self.dir.join("wrong_known_hosts");
        std::fs::write(&path, format!("[127.0.0.1]:{} {}\n", self.port, public.join(" ")))
            .expect("wrong known_hosts");
        path
    }

    /// Starts it again on the same port after [`Sshd::kill`].
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "sshd runs already");
        let child = Command::new(SSHD)
            .arg("-f")
            .arg(&self.config)
            .args(["-D", "-e"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("sshd starts (apt-get install openssh-server)");
        self.child = Some(child);
        let port = self.port;
        wait_for("sshd", Duration::from_secs(10), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
    }

    /// The processes serving established connections (not the listener).
    pub fn sessions(&self) -> Vec<u32> {
        self.child.as_ref().map(|c| descendants(c.id())).unwrap_or_default()
    }

    /// Freezes every established connection's server side: the peer
    /// stalls, the listener still accepts new connections.
    pub fn stall_sessions(&self) {
        signal(&self.sessions(), "STOP");
    }

    /// Lets stalled connections run on.
    pub fn resume_sessions(&self) {
        signal(&self.sessions(), "CONT");
    }

    /// Kills every established connection's server side, stalled or not
    /// (SIGKILL ends stopped processes too, without letting them run).
    pub fn kill_sessions(&self) {
        signal(&self.sessions(), "KILL");
    }

    /// Kills the listener and every connection.
    pub fn kill(&mut self) {
        self.kill_sessions();
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The private `libvirtd` of this test process: started on first use and
/// shared by its tests (the storage driver takes a host-wide lock, so one
/// daemon at a time), stopped when the process exits. Tests name their
/// domains and volumes uniquely.
#[derive(Debug)]
pub struct Libvirtd {
    /// The libvirt socket, as a grant's `socket`.
    pub socket: PathBuf,
    /// A directory the tests' storage pools live in.
    pub pool_dir: PathBuf,
    /// The shell that ends the daemon with this process.
    _watchdog: Child,
    /// Held for the life of the process; see `keep_test_driver_state`.
    _keeper: virt::connect::Connect,
    _dir: tempfile::TempDir,
}

/// The driver URI of libvirt's test driver, as a grant's `uri`.
pub const TEST_URI: &str = "test:///default";
/// The storage driver's URI, as a grant's `uri`.
pub const STORAGE_URI: &str = "storage:///system";
/// The pool the test driver starts with.
pub const TEST_POOL: &str = "default-pool";

impl Libvirtd {
    /// The shared daemon, started on first use.
    pub fn shared() -> &'static Libvirtd {
        static DAEMON: OnceLock<Libvirtd> = OnceLock::new();
        DAEMON.get_or_init(Self::start)
    }

    fn start() -> Self {
        let dir = tempfile::Builder::new().prefix("pf-libvirtd-").tempdir().expect("temp dir");
        let sock_dir = dir.path().join("sock");
        let drivers = dir.path().join("drivers");
        let pool_dir = dir.path().join("pools");
        for d in [&sock_dir, &drivers, &pool_dir] {
            std::fs::create_dir_all(d).expect("libvirtd dirs");
        }
        // Only the storage driver is loaded: the hypervisor drivers of a
        // stock install want users and devices a test machine lacks, and
        // the test driver is built into libvirt itself.
        std::os::unix::fs::symlink(
            Path::new(DRIVER_DIR).join("libvirt_driver_storage.so"),
            drivers.join("libvirt_driver_storage.so"),
        )
        .expect("driver link");
        let config = dir.path().join("libvirtd.conf");
        std::fs::write(
            &config,
            format!(
                "listen_tls = 0\nlisten_tcp = 0\nunix_sock_dir = \"{}\"\n\
                 unix_sock_rw_perms = \"0700\"\nauth_unix_rw = \"none\"\n\
                 auth_unix_ro = \"none\"\nkeepalive_interval = -1\n",
                sock_dir.display()
            ),
        )
        .expect("libvirtd.conf");
        let pid_file = dir.path().join("libvirtd.pid");
        // A watchdog ends the daemon when this test process exits, however
        // it exits: statics are never dropped.
        let script = format!(
            "LIBVIRT_DRIVER_DIR='{drivers}' {LIBVIRTD} --config '{config}' --pid-file '{pid}' \
             >'{log}' 2>&1 & daemon=$!; \
             while kill -0 {parent} 2>/dev/null && kill -0 $daemon 2>/dev/null; do sleep 0.5; done; \
             kill $daemon 2>/dev/null; wait $daemon",
            drivers = drivers.display(),
            config = config.display(),
            pid = pid_file.display(),
            log = dir.path().join("libvirtd.log").display(),
            parent = std::process::id(),
        );
        let socket = sock_dir.join("libvirt-sock");
        let log = dir.path().join("libvirtd.log");
        // The storage driver takes a host-wide lock: a daemon started while
        // another test process's daemon runs exits at once. It is started
        // again until the other is gone.
        let started = Instant::now();
        let patience = Duration::from_secs(180);
        let (watchdog, keeper) = 'spawn: loop {
            let mut watchdog = Command::new("sh")
                .args(["-c", &script])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("libvirtd starts (apt-get install libvirt-daemon)");
            loop {
                let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
                // The socket listens before the drivers start; a client's
                // open waits for them, so only an open proves the daemon
                // is up (and not about to exit for want of the lock).
                if std::os::unix::net::UnixStream::connect(&socket).is_ok() {
                    match keep_test_driver_state(&socket) {
                        Ok(keeper) => break 'spawn (watchdog, keeper),
                        Err(err) => {
                            // The watchdog notices a dead daemon within 0.5 s.
                            let noticed = Instant::now();
                            while matches!(watchdog.try_wait(), Ok(None))
                                && noticed.elapsed() < Duration::from_secs(2)
                            {
                                std::thread::sleep(Duration::from_millis(50));
                            }
                            assert!(
                                matches!(watchdog.try_wait(), Ok(Some(_))),
                                "cannot reach the test driver through libvirtd: {err}; its log: {}",
                                log_text()
                            );
                        }
                    }
                }
                if let Ok(Some(_)) = watchdog.try_wait() {
                    let text = log_text();
                    assert!(
                        text.contains("pid file") && started.elapsed() < patience,
                        "libvirtd exited; its log: {text}"
                    );
                    std::thread::sleep(Duration::from_millis(500));
                    continue 'spawn;
                }
                assert!(
                    started.elapsed() < patience,
                    "libvirtd did not come up within {patience:?}; its log: {}",
                    log_text()
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        };
        Self { socket, pool_dir, _watchdog: watchdog, _keeper: keeper, _dir: dir }
    }

    /// A client of the daemon without SSH, to check what tests did.
    pub fn direct(&self, driver: &str) -> virt::connect::Connect {
        let (scheme, rest) = driver.split_once("://").expect("a driver URI");
        let uri = format!("{scheme}+unix://{rest}?socket={}", self.socket.display());
        virt::connect::Connect::open(Some(&uri)).expect("a direct libvirt connection")
    }

    /// Creates a transient `dir` pool over a fresh directory through the
    /// storage driver, and answers its name (`prefix` and this process's
    /// id: the storage driver remembers transient pools across daemons)
    /// and directory.
    pub fn dir_pool(&self, prefix: &str) -> (String, PathBuf) {
        let name = format!("{prefix}-{}", std::process::id());
        let path = self.pool_dir.join(&name);
        std::fs::create_dir_all(&path).expect("pool dir");
        let mut conn = self.direct(STORAGE_URI);
        if let Ok(stale) = virt::storage_pool::StoragePool::lookup_by_name(&conn, &name) {
            let _ = stale.destroy();
        }
        let xml = format!(
            "<pool type='dir'><name>{name}</name><target><path>{}</path></target></pool>",
            path.display()
        );
        virt::storage_pool::StoragePool::create_xml(&conn, &xml, 0).expect("transient dir pool");
        let _ = conn.close();
        (name, path)
    }

    /// Stops a pool made by [`Libvirtd::dir_pool`]; transient, it is gone.
    pub fn remove_pool(&self, name: &str) {
        let mut conn = self.direct(STORAGE_URI);
        if let Ok(pool) = virt::storage_pool::StoragePool::lookup_by_name(&conn, name) {
            let _ = pool.destroy();
        }
        let _ = conn.close();
    }
}

/// The test driver drops its state when its last connection closes; one
/// connection held for the life of the process keeps what the tests create
/// across the connections they kill and redial.
fn keep_test_driver_state(socket: &Path) -> Result<virt::connect::Connect, virt::error::Error> {
    let uri = format!("test+unix:///default?socket={}", socket.display());
    virt::connect::Connect::open(Some(&uri))
}
