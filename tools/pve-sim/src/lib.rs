//! A Proxmox VE API simulator: an HTTPS server that answers the parts of the
//! PVE REST API (`/api2/json`) the `proxmox` provider plugin uses, the way
//! PVE 8 and 9 answer them, so the plugin can be developed and tested
//! without a cluster.
//!
//! What it models, from the public API reference:
//!
//! - API token authentication (`Authorization: PVEAPIToken=USER@REALM!TOKENID=SECRET`)
//!   and the 401 PVE answers without it;
//! - `/version`, `/nodes`, `/nodes/{node}/status`, `/cluster/resources`,
//!   `/cluster/nextid`;
//! - VMs: clone (a worker task that holds `lock: clone` on a nameless new
//!   VM), config get/put, resize, start, stop, `status/current`, destroy,
//!   and the guest agent's `network-get-interfaces`;
//! - tasks: UPIDs of the form
//!   `UPID:{node}:{pid}:{pstart}:{starttime}:{type}:{id}:{user}:` (numbers
//!   as 8 hex digits) and `/nodes/{node}/tasks/{upid}/status` with
//!   `status` `running`/`stopped` and `exitstatus` (`OK`, `WARNINGS: n`, or
//!   the error);
//! - storage: listing ISO content, multipart upload, deleting a volume;
//! - errors as PVE's JSON formatter renders them: the text as the reason
//!   phrase, in the body's `message` (`{"data": null, "message": "...\n"}`)
//!   only from 8.4 on, and `{"errors": {param: reason}}` with 400 for
//!   parameter verification;
//! - offline nodes: listed `offline`, their VMs `unknown`, calls for them
//!   595 as pveproxy answers when it cannot reach a node.
//!
//! Each VM it starts opens a real forward proxy on its own loopback address
//! (`127.x.y.z`, derived from the VMID) at [`Simulator::proxy_port`], which
//! is the address the guest agent reports. [`Faults`] injects latency, 5xx
//! answers, lock timeouts, failing tasks, clones that leave a locked VM
//! behind, connections dropped mid-upload and volume deletes that fail.

mod api;
mod state;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;

pub use state::VmView;

/// Errors starting the simulator.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The certificate or key PEM did not parse, or rustls refused them.
    #[error("TLS setup: {0}")]
    Tls(String),
    /// Binding the API listener or picking a proxy port failed.
    #[error("cannot listen: {0}")]
    Listen(#[from] std::io::Error),
}

/// How the simulated cluster looks and how fast it works.
#[derive(Debug, Clone)]
pub struct SimOptions {
    /// The accepted token, as `USER@REALM!TOKENID=SECRET` (what follows
    /// `PVEAPIToken=` in the header).
    pub token: String,
    /// Cluster node names; all online.
    pub nodes: Vec<String>,
    /// Storages that hold ISO images, present on every node.
    pub iso_storages: Vec<String>,
    /// Reported by `/version` (`8.4.1`, `9.0.3`, ...). Before 8.4
    /// (pve-http-server 5.2) PVE put an error's text only in the reason
    /// phrase of the status line; since, the JSON body carries it as
    /// `message` too. See [`SimOptions::message_in_body`].
    pub version: String,
    /// How long a clone task runs (and holds `lock: clone`).
    pub clone_duration: Duration,
    /// How long other tasks (start, stop, destroy, resize, upload) run.
    pub task_duration: Duration,
    /// How long after start the guest agent begins to answer.
    pub agent_delay: Duration,
    /// Port the started VMs' proxies listen on; 0 picks a free one.
    pub proxy_port: u16,
}

impl Default for SimOptions {
    fn default() -> Self {
        Self {
            token: "root@pam!proxyfleet=00000000-0000-0000-0000-000000000000".to_owned(),
            nodes: vec!["pve1".to_owned()],
            iso_storages: vec!["local".to_owned()],
            version: "8.4.1".to_owned(),
            clone_duration: Duration::from_millis(500),
            task_duration: Duration::from_millis(100),
            agent_delay: Duration::from_millis(200),
            proxy_port: 0,
        }
    }
}

impl SimOptions {
    /// Whether error texts go in the body's `message` as well as in the
    /// reason phrase: from 8.4 on.
    pub fn message_in_body(&self) -> bool {
        let mut parts = self.version.split('.').map(|part| part.parse::<u32>().unwrap_or(0));
        let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        (major, minor) >= (8, 4)
    }
}

/// Faults to inject; [`Faults::default`] is a healthy cluster.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// Added before every API answer.
    pub latency: Duration,
    /// Every n-th API request answers 500 without doing anything (0: never).
    pub server_error_every: u32,
    /// Operations that take a VM's config lock fail as PVE does when the
    /// lock cannot be had within its timeout.
    pub lock_timeout: bool,
    /// Worker tasks end with an error exit status.
    pub failing_tasks: bool,
    /// Worker tasks succeed with `WARNINGS: n` (0: plain `OK`).
    pub task_warnings: u32,
    /// Clone tasks fail and leave the new VM behind with `lock: clone`.
    pub clone_leaves_locked_vm: bool,
    /// ISO uploads read part of the body and then drop the connection.
    pub drop_upload: bool,
    /// Deleting a volume fails as it does when the storage cannot unlink it.
    pub failing_volume_deletes: bool,
    /// Nodes that are down: the cluster lists them `offline` and their VMs
    /// with status `unknown`, and every `/nodes/{node}/…` call for them
    /// answers 595 with the reason only in the status line, as pveproxy
    /// does when it cannot reach a node.
    pub offline_nodes: Vec<String>,
}

/// A running simulator. Dropping it stops the server and every VM proxy.
#[derive(Debug)]
pub struct Simulator {
    addr: SocketAddr,
    proxy_port: u16,
    shared: Arc<state::Shared>,
    server: JoinHandle<()>,
    ticker: JoinHandle<()>,
}

impl Drop for Simulator {
    fn drop(&mut self) {
        self.server.abort();
        self.ticker.abort();
        self.shared.stop_all_proxies();
    }
}

impl Simulator {
    /// Serves HTTPS on 127.0.0.1 (a free port) with `cert_pem` (chain) and
    /// `key_pem`. Must run inside a Tokio runtime.
    pub async fn start(
        mut options: SimOptions,
        cert_pem: &str,
        key_pem: &str,
    ) -> Result<Self, SimError> {
        let tls = proxyfleet_sim_support::https::tls_acceptor(cert_pem, key_pem)
            .map_err(SimError::Tls)?;
        if options.proxy_port == 0 {
            options.proxy_port =
                std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?.local_addr()?.port();
        }
        let proxy_port = options.proxy_port;
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(state::Shared::new(options));
        let handler = {
            let shared = Arc::clone(&shared);
            move |request| {
                let shared = Arc::clone(&shared);
                async move { api::handle(&shared, request).await }
            }
        };
        let server = tokio::spawn(proxyfleet_sim_support::https::serve(listener, tls, handler));
        let ticker_shared = Arc::clone(&shared);
        let ticker = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(20)).await;
                ticker_shared.advance();
            }
        });
        Ok(Self { addr, proxy_port, shared, server, ticker })
    }

    /// Where the API listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The API base URL for host name `localhost`.
    pub fn base_url(&self) -> String {
        format!("https://localhost:{}", self.addr.port())
    }

    /// The port every started VM's proxy listens on.
    pub fn proxy_port(&self) -> u16 {
        self.proxy_port
    }

    /// Replaces the injected faults.
    pub fn set_faults(&self, faults: Faults) {
        *self.shared.faults.lock().expect("faults lock") = faults;
    }

    /// Adds a template VM (`template: 1`) with a boot disk `scsi0` of
    /// `disk_gib`.
    pub fn add_template(&self, node: &str, vmid: u32, name: &str, disk_gib: u64) {
        self.shared.add_vm(node, vmid, name, "", "", true, disk_gib);
    }

    /// Adds a stopped VM that is not ours (someone else's), with the given
    /// description and tags (`;`-separated).
    pub fn add_foreign_vm(&self, node: &str, vmid: u32, name: &str, description: &str, tags: &str) {
        self.shared.add_vm(node, vmid, name, description, tags, false, 8);
    }

    /// Sets or clears a VM's lock, as `qm set --lock` / `qm unlock` do.
    pub fn set_lock(&self, vmid: u32, lock: Option<&str>) {
        self.shared.set_lock(vmid, lock);
    }

    /// Hibernates a VM as `qm suspend --todisk` does: it stops, its state
    /// is saved, and it holds `lock: suspended` until it is started again
    /// (which resumes it).
    pub fn hibernate(&self, vmid: u32) {
        self.shared.hibernate(vmid);
    }

    /// Removes a VM as an administrator would after `qm unlock` and
    /// Every VM a destroy was accepted for, as it was then.
    pub fn destroyed(&self) -> Vec<VmView> {
        self.shared.destroyed()
    }

    /// `qm destroy`, whatever its state.
    pub fn remove_vm(&self, vmid: u32) {
        self.shared.remove_vm(vmid);
    }

    /// Every VM, templates included.
    pub fn vms(&self) -> Vec<VmView> {
        self.shared.advance();
        self.shared.vms()
    }

    /// One VM.
    pub fn vm(&self, vmid: u32) -> Option<VmView> {
        self.vms().into_iter().find(|vm| vm.vmid == vmid)
    }

    /// ISO file names in `storage` on `node`.
    pub fn isos(&self, node: &str, storage: &str) -> Vec<String> {
        self.shared.isos(node, storage)
    }

    /// The content of ISO `name` in `storage` on `node`.
    pub fn iso(&self, node: &str, storage: &str, name: &str) -> Option<Vec<u8>> {
        self.shared.iso(node, storage, name)
    }

    /// How many clone requests were accepted (tasks started).
    pub fn clones_started(&self) -> usize {
        self.shared.clones_started()
    }

    /// `METHOD path` of every API request received, in order.
    pub fn requests(&self) -> Vec<String> {
        self.shared.requests()
    }
}

/// The loopback address a VM's proxy listens on and its agent reports:
/// `127.x.y.z` from the VMID, so that every VM has its own.
pub fn vm_address(vmid: u32) -> Ipv4Addr {
    let [_, x, y, z] = vmid.to_be_bytes();
    // 127.0.0.1 is the API's own address; keep VMs off it.
    if (x, y, z) == (0, 0, 1) { Ipv4Addr::new(127, 255, 0, 1) } else { Ipv4Addr::new(127, x, y, z) }
}
