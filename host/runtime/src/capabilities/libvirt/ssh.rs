//! The SSH leg of a libvirt connection: TCP to the granted host, the host
//! key checked against the grant's known_hosts file (no trust on first use),
//! public-key authentication with a key read from its file on every dial,
//! and keepalives so a vanished peer is noticed.
//!
//! The TCP socket is kept twice: once inside the SSH session and once as a
//! plain handle whose only use is `shutdown`, so that closing a connection
//! never waits for a stalled peer: the transport goes away under whatever
//! is blocked on it.

use std::net::Shutdown;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use russh::client::{self, AuthResult, Handle};
use russh::keys::{PrivateKeyWithHashAlg, PublicKeyOrCertificate};

use super::LibvirtError;
use super::config::LibvirtGrant;

/// Keepalive probes are sent this often while the session is idle ...
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(15);
/// ... and the session is dropped after this many go unanswered.
const KEEPALIVE_MAX: usize = 3;

/// An authenticated SSH session to one host.
pub(crate) struct SshSession {
    pub(crate) handle: Handle<HostKeyCheck>,
    transport: std::net::TcpStream,
}

impl std::fmt::Debug for SshSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SshSession").field("peer", &self.transport.peer_addr().ok()).finish()
    }
}

impl SshSession {
    /// Closes the TCP connection under the session: reads and writes in
    /// flight fail at once, whatever state the peer is in.
    pub(crate) fn close_transport(&self) {
        let _ = self.transport.shutdown(Shutdown::Both);
    }
}

/// Accepts exactly the keys the known_hosts file lists for the host, and
/// remembers why it refused one so the caller can say so.
pub(crate) struct HostKeyCheck {
    host: String,
    port: u16,
    known_hosts: PathBuf,
    refusal: Arc<Mutex<Option<String>>>,
}

impl client::Handler for HostKeyCheck {
    type Error = russh::Error;

    async fn check_server_key(
        &mut self,
        server_public_key: &PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        let verdict = match server_public_key {
            PublicKeyOrCertificate::PublicKey { key, .. } => self.verify(key),
            PublicKeyOrCertificate::Certificate(_) => Err(format!(
                "{} offered a host certificate; list its plain host key in {}",
                self.host,
                self.known_hosts.display()
            )),
        };
        match verdict {
            Ok(()) => Ok(true),
            Err(why) => {
                *self.refusal.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
                Ok(false)
            }
        }
    }
}

impl HostKeyCheck {
    fn verify(&self, key: &russh::keys::PublicKey) -> Result<(), String> {
        // russh treats an unreadable file as an empty one; here that must
        // be an error of its own, not "host unknown".
        std::fs::metadata(&self.known_hosts).map_err(|err| {
            format!("cannot read known_hosts file {}: {err}", self.known_hosts.display())
        })?;
        let fingerprint = key.fingerprint(Default::default());
        match russh::keys::check_known_hosts_path(&self.host, self.port, key, &self.known_hosts) {
            Ok(true) => Ok(()),
            Ok(false) => Err(format!(
                "host key {fingerprint} of {} is not listed in {}; add the host's key there \
                 after checking it out of band (e.g. `ssh-keyscan -p {} {}`)",
                self.host,
                self.known_hosts.display(),
                self.port,
                self.host
            )),
            Err(russh::keys::Error::KeyChanged { line }) => Err(format!(
                "host key {fingerprint} of {} does not match the key on line {line} of {}: \
                 the host was reinstalled or someone is in the middle; check the key out of \
                 band before replacing it",
                self.host,
                self.known_hosts.display()
            )),
            Err(err) => Err(format!(
                "cannot check {} against {}: {err}",
                self.host,
                self.known_hosts.display()
            )),
        }
    }
}

/// Dials the grant's host and authenticates. Errors are `unauthorized` for
/// a refused host key, key file or login, `transient` for the network.
pub(crate) async fn dial(grant: &LibvirtGrant) -> Result<SshSession, LibvirtError> {
    let host = &grant.host;
    let tcp = tokio::net::TcpStream::connect((host.as_str(), grant.port)).await.map_err(|err| {
        LibvirtError::transient(format!("cannot reach {host}:{}: {err}", grant.port))
    })?;
    let _ = tcp.set_nodelay(true);
    let std_tcp = tcp
        .into_std()
        .map_err(|err| LibvirtError::transient(format!("socket to {host}: {err}")))?;
    let transport = std_tcp
        .try_clone()
        .map_err(|err| LibvirtError::transient(format!("socket to {host}: {err}")))?;
    let tcp = tokio::net::TcpStream::from_std(std_tcp)
        .map_err(|err| LibvirtError::transient(format!("socket to {host}: {err}")))?;

    let config = Arc::new(client::Config {
        keepalive_interval: Some(KEEPALIVE_INTERVAL),
        keepalive_max: KEEPALIVE_MAX,
        inactivity_timeout: None,
        nodelay: true,
        ..client::Config::default()
    });
    let refusal = Arc::new(Mutex::new(None));
    let check = HostKeyCheck {
        host: host.clone(),
        port: grant.port,
        known_hosts: grant.known_hosts_file.clone(),
        refusal: Arc::clone(&refusal),
    };
    let mut session =
        SshSession { handle: connect(config, tcp, check, &refusal, host).await?, transport };
    // From here on a failure must not leave the TCP connection behind.
    if let Err(err) = authenticate(&mut session, grant).await {
        session.close_transport();
        return Err(err);
    }
    Ok(session)
}

async fn connect(
    config: Arc<client::Config>,
    tcp: tokio::net::TcpStream,
    check: HostKeyCheck,
    refusal: &Mutex<Option<String>>,
    host: &str,
) -> Result<Handle<HostKeyCheck>, LibvirtError> {
    match client::connect_stream(config, tcp, check).await {
        Ok(handle) => Ok(handle),
        Err(err) => match refusal.lock().unwrap_or_else(|p| p.into_inner()).take() {
            Some(why) => Err(LibvirtError::Unauthorized(why)),
            None => {
                Err(LibvirtError::transient(format!("SSH handshake with {host} failed: {err}")))
            }
        },
    }
}

async fn authenticate(session: &mut SshSession, grant: &LibvirtGrant) -> Result<(), LibvirtError> {
    let key_file = &grant.key_file;
    // Read on every dial so a rotated key is used by the next connection.
    // The error names the file, never its content.
    let key = russh::keys::load_secret_key(key_file, None).map_err(|err| {
        LibvirtError::Unauthorized(format!(
            "cannot load the SSH key {} for {}: {err}",
            key_file.display(),
            grant.host
        ))
    })?;
    // Only RSA keys need a signature hash, and asking waits for the
    // server's extension info.
    let hash = if key.algorithm().is_rsa() {
        session.handle.best_supported_rsa_hash().await.ok().flatten().flatten()
    } else {
        None
    };
    let result = session
        .handle
        .authenticate_publickey(grant.user.clone(), PrivateKeyWithHashAlg::new(Arc::new(key), hash))
        .await;
    match result {
        Ok(AuthResult::Success) => Ok(()),
        Ok(AuthResult::Failure { .. }) => Err(LibvirtError::Unauthorized(format!(
            "{}@{} refused the key {}",
            grant.user,
            grant.host,
            key_file.display()
        ))),
        Err(err) => Err(LibvirtError::transient(format!(
            "SSH authentication with {} failed: {err}",
            grant.host
        ))),
    }
}
