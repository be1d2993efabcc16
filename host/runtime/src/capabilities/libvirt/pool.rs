//! One pooled libvirt connection per granted host, and the budget every
//! call runs under.
//!
//! A connection ([`Link`]) is an SSH session, a private unix socket in a
//! 0700 temporary directory whose every connection is forwarded to the
//! host's libvirt socket over a `direct-streamlocal` channel, and a libvirt
//! client (in the helper process) connected to that private socket. Calls
//! block, so every call runs on a blocking thread; the async side only
//! waits for it under the call's budget.
//!
//! A call that overruns its budget kills its connection (only that one):
//! the transport is shut down, which makes whatever is blocked on it fail
//! at once, and the next call dials anew. A call that is cancelled (its
//! caller stopped waiting, as a provider check cut off at its bound does)
//! leaves the connection alone: other calls share it, libvirt's client
//! takes RPCs from several threads, and the abandoned RPC ends on its
//! blocking thread, its answer dropped. Its budget still holds: a watchdog
//! waits for it, and kills the connection if it runs over. A call that
//! fails on a connection that is no longer alive is `transient`, never an
//! answer.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::task::AbortHandle;
use tracing::Instrument as _;

use super::client::{Connect, VirtError};
use super::config::LibvirtGrant;
use super::helper::LibvirtHelper;
use super::ssh::{self, SshSession};
use super::{LibvirtError, classify};

/// The libvirt clients of a link a call gets: domains go to the grant's
/// `uri`, pools and volumes to its `storageUri` (the same client unless the
/// grant names another driver).
pub(crate) struct Clients {
    domains: Connect,
    storage: Connect,
}

impl Clients {
    /// The client for domains.
    pub(crate) fn domains(&self) -> &Connect {
        &self.domains
    }

    /// The client for storage pools and volumes.
    pub(crate) fn storage(&self) -> &Connect {
        &self.storage
    }

    fn alive(&self) -> bool {
        [&self.domains, &self.storage].iter().all(|c| c.is_alive().unwrap_or(false))
    }
}

/// How the work of a call fails: libvirt refused it (classified by the
/// caller, unless the connection died), or the host's own checks did.
#[derive(Debug)]
pub(crate) enum CallError {
    /// libvirt's error.
    Virt(VirtError),
    /// The host refused it; passed to the plugin as is.
    Refused(LibvirtError),
}

impl From<VirtError> for CallError {
    fn from(err: VirtError) -> Self {
        Self::Virt(err)
    }
}

/// One live connection to a host.
pub(crate) struct Link {
    host: String,
    ssh: SshSession,
    conn: Mutex<Option<Connect>>,
    storage: Mutex<Option<Connect>>,
    /// The bridge's accept loop and its forwarding tasks.
    tasks: Mutex<Vec<AbortHandle>>,
    dead: AtomicBool,
    /// Holds the private socket; removed with the link.
    _dir: tempfile::TempDir,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("host", &self.host)
            .field("dead", &self.dead.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Link {
    /// Whether calls may still use this link.
    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// Kills the link without waiting for anyone: the transport is shut
    /// down and the forwarding tasks aborted, so calls blocked on it fail
    /// at once. Never talks to the peer.
    pub(crate) fn kill(&self) {
        if self.dead.swap(true, Ordering::AcqRel) {
            return;
        }
        tracing::debug!(host = %self.host, "closing libvirt connection");
        self.ssh.close_transport();
        for task in self.tasks.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
            task.abort();
        }
        for slot in [&self.conn, &self.storage] {
            // Released without waiting: the helper closes it.
            drop(slot.lock().unwrap_or_else(|p| p.into_inner()).take());
        }
    }

    fn clients(&self) -> Option<Clients> {
        let domains = self.conn.lock().unwrap_or_else(|p| p.into_inner()).clone()?;
        let storage = self.storage.lock().unwrap_or_else(|p| p.into_inner()).clone()?;
        Some(Clients { domains, storage })
    }

    fn track(&self, task: AbortHandle) {
        let mut tasks = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
        if self.is_dead() {
            task.abort();
        } else {
            tasks.retain(|t| !t.is_finished());
            tasks.push(task);
        }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The blocking task of a call, watched after its caller stopped waiting:
/// if it runs over the call's budget, the connection dies as it would
/// have had the caller waited.
struct Abandoned<R: Send + 'static> {
    task: Option<tokio::task::JoinHandle<R>>,
    link: Arc<Link>,
    deadline: tokio::time::Instant,
}

impl<R: Send + 'static> Drop for Abandoned<R> {
    fn drop(&mut self) {
        let Some(task) = self.task.take() else { return };
        let (link, deadline) = (Arc::clone(&self.link), self.deadline);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if tokio::time::timeout_at(deadline, task).await.is_err() {
                    link.kill();
                }
            });
        }
    }
}

/// The pooled connection to one granted host.
pub struct HostPool {
    grant: LibvirtGrant,
    /// The entry whose domains this pool's calls see (see `owner`).
    entry: String,
    /// Makes the libvirt calls.
    helper: Arc<LibvirtHelper>,
    link: tokio::sync::Mutex<Option<Arc<Link>>>,
}

impl std::fmt::Debug for HostPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostPool").field("host", &self.grant.host).finish_non_exhaustive()
    }
}

impl HostPool {
    /// A pool for one grant of entry `entry`, its libvirt calls made by
    /// `helper`; nothing is dialled until the first call.
    pub fn new(grant: LibvirtGrant, entry: &str, helper: Arc<LibvirtHelper>) -> Self {
        Self { grant, entry: entry.to_owned(), helper, link: tokio::sync::Mutex::new(None) }
    }

    /// The host as granted.
    pub fn grant(&self) -> &LibvirtGrant {
        &self.grant
    }

    /// The entry whose domains this pool's calls see.
    pub fn entry(&self) -> &str {
        &self.entry
    }

    /// Kills the current connection, if any; the next call dials anew.
    pub async fn disconnect(&self) {
        if let Some(link) = self.link.lock().await.take() {
            link.kill();
        }
    }

    /// Runs `f` on a blocking thread with a client of this host, under the
    /// grant's call budget (which includes dialling). One `libvirt.call`
    /// span per call.
    pub(crate) async fn call<T, F>(&self, op: &'static str, f: F) -> Result<T, LibvirtError>
    where
        T: Send + 'static,
        F: FnOnce(&Clients) -> Result<T, CallError> + Send + 'static,
    {
        self.spanned(op, async {
            let deadline = self.deadline();
            let link = self.link_by(deadline).await?;
            self.run_on(&link, deadline, op, f).await
        })
        .await
    }

    /// Runs `work` in one `libvirt.call` span (host, operation, result).
    pub(crate) async fn spanned<T>(
        &self,
        op: &'static str,
        work: impl Future<Output = Result<T, LibvirtError>>,
    ) -> Result<T, LibvirtError> {
        let span = tracing::info_span!(
            "libvirt.call",
            host = %self.grant.host,
            op,
            result = tracing::field::Empty,
        );
        let started = Instant::now();
        let outcome = work.instrument(span.clone()).await;
        let result = outcome.as_ref().map_or_else(LibvirtError::kind, |_| "ok");
        span.record("result", result);
        // One line per call, so a create can be followed call by call.
        let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        match &outcome {
            Ok(_) => tracing::debug!(parent: &span, result, elapsed_ms, "libvirt call"),
            Err(err) => {
                tracing::debug!(parent: &span, result, elapsed_ms, "libvirt call failed: {err}");
            }
        }
        outcome
    }

    /// When a call starting now must have ended.
    pub(crate) fn deadline(&self) -> tokio::time::Instant {
        tokio::time::Instant::from_std(Instant::now() + self.grant.call_timeout)
    }

    /// The pooled link, dialled within `deadline` if need be.
    pub(crate) async fn link_by(
        &self,
        deadline: tokio::time::Instant,
    ) -> Result<Arc<Link>, LibvirtError> {
        let budget = self.grant.call_timeout;
        let host = &self.grant.host;
        tokio::time::timeout_at(deadline, self.link()).await.map_err(|_| {
            LibvirtError::Timeout(format!(
                "connecting to {host} took longer than the {budget:?} budget"
            ))
        })?
    }

    /// Runs `f` on a blocking thread with `link`'s clients, until
    /// `deadline`. Running over it or finding the connection dead kills
    /// `link`; being cancelled does not.
    pub(crate) async fn run_on<T, F>(
        &self,
        link: &Arc<Link>,
        deadline: tokio::time::Instant,
        op: &'static str,
        f: F,
    ) -> Result<T, LibvirtError>
    where
        T: Send + 'static,
        F: FnOnce(&Clients) -> Result<T, CallError> + Send + 'static,
    {
        let budget = self.grant.call_timeout;
        let host = &self.grant.host;
        let Some(clients) = link.clients() else {
            return Err(LibvirtError::transient(format!("the connection to {host} was closed")));
        };
        let task = tokio::task::spawn_blocking(move || {
            let outcome = f(&clients);
            let alive = !matches!(outcome, Err(CallError::Virt(_))) || clients.alive();
            (outcome, alive)
        });
        let mut watched = Abandoned { task: None, link: Arc::clone(link), deadline };
        let result = tokio::time::timeout_at(deadline, watched.task.insert(task)).await;
        // Ended or over budget: handled here, not by the watchdog.
        watched.task = None;
        match result {
            Err(_) => {
                link.kill();
                self.forget(link).await;
                Err(LibvirtError::Timeout(format!(
                    "{op} on {host} did not finish within its {budget:?} budget; its connection \
                     was closed"
                )))
            }
            Ok(Err(join)) => {
                link.kill();
                self.forget(link).await;
                Err(LibvirtError::Failed(format!("{op} on {host} failed in the client: {join}")))
            }
            Ok(Ok((Ok(value), _))) => Ok(value),
            Ok(Ok((Err(CallError::Refused(err)), _))) => Err(err),
            Ok(Ok((Err(CallError::Virt(err)), alive))) => {
                if !alive || link.is_dead() {
                    link.kill();
                    self.forget(link).await;
                    return Err(LibvirtError::transient(format!(
                        "the connection to {host} was lost during {op}: {}",
                        err.message
                    )));
                }
                Err(classify(op, host, &err))
            }
        }
    }

    /// Drops `link` from the pool unless another call already replaced it.
    async fn forget(&self, link: &Arc<Link>) {
        let mut slot = self.link.lock().await;
        if slot.as_ref().is_some_and(|current| Arc::ptr_eq(current, link)) {
            *slot = None;
        }
    }

    /// The live pooled link, dialled when there is none.
    async fn link(&self) -> Result<Arc<Link>, LibvirtError> {
        let mut slot = self.link.lock().await;
        if let Some(link) = slot.as_ref() {
            // A session that ended under an idle link (the peer went away)
            // is redialled now rather than failing the call that finds it.
            if !link.is_dead() && !link.ssh.handle.is_closed() {
                return Ok(Arc::clone(link));
            }
            link.kill();
        }
        *slot = None;
        let link = self.dial().await?;
        *slot = Some(Arc::clone(&link));
        Ok(link)
    }

    async fn dial(&self) -> Result<Arc<Link>, LibvirtError> {
        let grant = &self.grant;
        let ssh = ssh::dial(grant).await?;
        let dir = tempfile::Builder::new()
            .prefix("proxyfleet-libvirt-")
            .tempdir()
            .map_err(|err| LibvirtError::Failed(format!("cannot make a private socket: {err}")))?;
        let path = dir.path().join("libvirt.sock");
        let listener = tokio::net::UnixListener::bind(&path)
            .map_err(|err| LibvirtError::Failed(format!("cannot make a private socket: {err}")))?;
        let link = Link {
            host: grant.host.clone(),
            ssh,
            conn: Mutex::new(None),
            storage: Mutex::new(None),
            tasks: Mutex::new(Vec::new()),
            dead: AtomicBool::new(false),
            _dir: dir,
        };
        let link = Arc::new(link);
        let accept = tokio::spawn(bridge(listener, Arc::downgrade(&link), grant.socket.clone()));
        link.track(accept.abort_handle());

        let socket = path.to_string_lossy().into_owned();
        let open =
            |uri: &str| open_client(&self.helper, &link, &grant.host, client_uri(uri, &socket));
        let conn = open(&grant.uri).await?;
        let storage = if grant.storage_uri == grant.uri {
            conn.clone()
        } else {
            open(&grant.storage_uri).await?
        };
        *link.conn.lock().unwrap_or_else(|p| p.into_inner()) = Some(conn);
        *link.storage.lock().unwrap_or_else(|p| p.into_inner()) = Some(storage);
        tracing::debug!(host = %grant.host, "libvirt connection open");
        Ok(link)
    }
}

/// Opens a libvirt client at `uri` (through the link's private socket);
/// a failure kills the link.
async fn open_client(
    helper: &Arc<LibvirtHelper>,
    link: &Link,
    host: &str,
    uri: String,
) -> Result<Connect, LibvirtError> {
    let helper = Arc::clone(helper);
    let opened = tokio::task::spawn_blocking(move || Connect::open(&helper, &uri)).await;
    match opened {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(err)) => {
            link.kill();
            Err(match classify("connect", host, &err) {
                LibvirtError::Failed(message) => LibvirtError::transient(message),
                other => other,
            })
        }
        Err(join) => {
            link.kill();
            Err(LibvirtError::Failed(format!("connecting to libvirt: {join}")))
        }
    }
}

/// `qemu:///system` becomes `qemu+unix:///system?socket=<path>`: the
/// driver of the grant, reached through the private socket.
pub(crate) fn client_uri(driver_uri: &str, socket: &str) -> String {
    let (scheme, rest) = driver_uri.split_once("://").unwrap_or((driver_uri, "/"));
    let separator = if rest.contains('?') { '&' } else { '?' };
    format!("{scheme}+unix://{rest}{separator}socket={socket}")
}

/// Forwards every connection to the private socket over its own SSH
/// channel to the host's libvirt socket, until the link dies.
async fn bridge(listener: tokio::net::UnixListener, link: std::sync::Weak<Link>, socket: String) {
    loop {
        let Ok((mut local, _)) = listener.accept().await else { return };
        let Some(strong) = link.upgrade() else { return };
        let channel = match strong.ssh.handle.channel_open_direct_streamlocal(socket.clone()).await
        {
            Ok(channel) => channel,
            Err(err) => {
                // libvirt's client sees its socket close and reports the
                // call as failed; the link is dead for further calls.
                tracing::warn!(host = %strong.host, socket, "cannot forward to libvirt: {err}");
                strong.kill();
                return;
            }
        };
        let forward = tokio::spawn(async move {
            let mut remote = channel.into_stream();
            let _ = tokio::io::copy_bidirectional(&mut local, &mut remote).await;
        });
        strong.track(forward.abort_handle());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_uri_routes_the_driver_through_the_socket() {
        assert_eq!(
            client_uri("qemu:///system", "/tmp/x/l.sock"),
            "qemu+unix:///system?socket=/tmp/x/l.sock"
        );
        assert_eq!(client_uri("test:///default", "/s"), "test+unix:///default?socket=/s");
        assert_eq!(
            client_uri("qemu:///system?mode=legacy", "/s"),
            "qemu+unix:///system?mode=legacy&socket=/s"
        );
    }
}
