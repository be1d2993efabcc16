//! A Compute Engine API simulator: an HTTPS server that answers the parts of
//! the Compute Engine v1 REST API the `gcp` provider plugin uses, plus an
//! OAuth 2.0 token endpoint for service-account keys, the way Google answers
//! them, so the plugin and the host's credential can be developed and tested
//! without a Google Cloud project.
//!
//! What it models, from the public API reference:
//!
//! - the token endpoint (`POST /token`): the JWT-bearer grant
//!   (`grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer`) with an RS256
//!   assertion signed by a service-account key, checked against the key's
//!   public half (signature, `iss`, `aud`, `iat`/`exp` at most an hour
//!   apart, `scope`), answering `{"access_token", "expires_in",
//!   "token_type"}` or `{"error": "invalid_grant", "error_description"}`;
//!   keys are made by [`Simulator::create_key`] and can be revoked, which
//!   also invalidates the tokens issued for them;
//! - `Authorization: Bearer` on every API request, with Google's 401
//!   `UNAUTHENTICATED` and 403 insufficient-scope answers;
//! - `projects/{project}`, `zones/{zone}`, images (by name and by family,
//!   in any project, as public images are), instance templates;
//! - instances: `insert` (validating the name, labels, machine type, boot
//!   disk and metadata), `get`, `delete`, and `list` with `filter`
//!   (`labels.KEY:*`, `labels.KEY = "VALUE"`, `name = "NAME"`, joined by
//!   `AND`) and `maxResults`/`pageToken`;
//! - zone operations that go `PENDING` → `RUNNING` → `DONE` over
//!   [`SimOptions::operation_duration`], with `error.errors[].code` when
//!   they fail; `get` and `wait` on them;
//! - `requestId`: a repeated ID returns the operation the first request
//!   made, and does nothing else;
//! - errors in Google's JSON format: `{"error": {"code", "message",
//!   "errors": [{"domain", "reason", "message"}], "status"}}`.
//!
//! Every instance that reaches `RUNNING` opens a real forward proxy on its
//! own port on 127.0.0.1. The simulator reports `127.0.0.1` as both the
//! internal (`networkIP`) and the external (`natIP`) address, and the port
//! in the instance metadata item `proxyfleet-port`, which only the
//! simulator sets (real instances never carry it). [`Faults`] injects
//! latency, 5xx and 429 answers, insert responses that are lost after the
//! instance was created, quota and zone-capacity failures, and a failing
//! token endpoint.
//!
//! [`Simulator::serve_metadata`] adds the metadata server's token endpoint
//! (plain HTTP, as on a VM or a GKE pod with Workload Identity): tokens for
//! the bound service account without any key, which the API accepts.

mod api;
mod metadata;
mod oauth;
mod state;
mod time;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;

pub use oauth::{ServiceAccountKey, TokenGrant};
pub use state::{Deletion, InstanceView, OperationView};

/// The scope the `gcp` plugin needs.
pub const COMPUTE_SCOPE: &str = "https://www.googleapis.com/auth/compute";
/// The broad scope that includes every other.
pub const CLOUD_PLATFORM_SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";
/// The metadata item the simulator sets to the port of a running
/// instance's proxy.
pub const PORT_METADATA_KEY: &str = "proxyfleet-port";

/// Errors starting the simulator.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The certificate or key PEM did not parse, or rustls refused them.
    #[error("TLS setup: {0}")]
    Tls(String),
    /// Binding the API listener failed.
    #[error("cannot listen: {0}")]
    Listen(#[from] std::io::Error),
    /// Making a service-account key failed.
    #[error("cannot make a service-account key: {0}")]
    Key(String),
}

/// A public image the simulator serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimImage {
    /// The project it lives in, e.g. `debian-cloud`.
    pub project: String,
    /// Its name.
    pub name: String,
    /// The family it belongs to, if any (`global/images/family/{family}`
    /// resolves to it).
    pub family: Option<String>,
}

/// How the simulated cloud looks and how fast it works.
#[derive(Debug, Clone)]
pub struct SimOptions {
    /// Projects that exist; tokens of any key may use them.
    pub projects: Vec<String>,
    /// Zones that exist in every project.
    pub zones: Vec<String>,
    /// Images that exist.
    pub images: Vec<SimImage>,
    /// Instance templates that exist, as (project, name).
    pub instance_templates: Vec<(String, String)>,
    /// How long an access token lives (`expires_in`).
    pub token_lifetime: Duration,
    /// How long a zone operation takes from insert to `DONE` (a quarter of
    /// it `PENDING`, the rest `RUNNING`).
    pub operation_duration: Duration,
    /// How long an instance stays `STAGING` after its insert is done,
    /// before it is `RUNNING` with an address.
    pub boot_duration: Duration,
}

impl Default for SimOptions {
    fn default() -> Self {
        Self {
            projects: vec!["proxyfleet-test".to_owned()],
            zones: vec!["europe-west1-b".to_owned(), "europe-west1-c".to_owned()],
            images: vec![SimImage {
                project: "debian-cloud".to_owned(),
                name: "debian-12-bookworm-v20250610".to_owned(),
                family: Some("debian-12".to_owned()),
            }],
            instance_templates: Vec::new(),
            token_lifetime: Duration::from_secs(3600),
            operation_duration: Duration::from_millis(400),
            boot_duration: Duration::from_millis(200),
        }
    }
}

/// Faults to inject; [`Faults::default`] is a healthy cloud.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// Added before every answer (API and token endpoint).
    pub latency: Duration,
    /// Every n-th API request answers 503 `backendError` without doing
    /// anything (0: never).
    pub server_error_every: u32,
    /// Every n-th API request answers 429 `rateLimitExceeded` without doing
    /// anything (0: never).
    pub rate_limit_every: u32,
    /// This many of the next inserts are carried out (instance and
    /// operation made) but their response is lost: the connection drops
    /// without an answer.
    pub lose_insert_responses: u32,
    /// Likewise for this many of the next deletes: the instance is going,
    /// the answer never comes.
    pub lose_delete_responses: u32,
    /// Insert operations end with `QUOTA_EXCEEDED` (and no instance).
    pub quota_exceeded: bool,
    /// Insert operations in these zones end with
    /// `ZONE_RESOURCE_POOL_EXHAUSTED` (and no instance).
    pub exhausted_zones: Vec<String>,
    /// The token endpoint answers 503.
    pub token_endpoint_down: bool,
    /// The metadata server refuses tokens as GKE does when the Kubernetes
    /// service account may not act as the Google one (403, IAM's
    /// `iam.serviceAccounts.getAccessToken` denied).
    pub metadata_iam_denied: bool,
    /// The metadata server answers 503 (not ready).
    pub metadata_down: bool,
}

/// A running simulator. Dropping it stops the server and every instance's
/// proxy.
#[derive(Debug)]
pub struct Simulator {
    addr: SocketAddr,
    shared: Arc<state::Shared>,
    server: JoinHandle<()>,
    ticker: JoinHandle<()>,
    /// The metadata servers [`Simulator::serve_metadata`] started.
    metadata: std::sync::Mutex<Vec<JoinHandle<()>>>,
}

impl Drop for Simulator {
    fn drop(&mut self) {
        self.server.abort();
        self.ticker.abort();
        for server in self.metadata.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner) {
            server.abort();
        }
        self.shared.stop_all_proxies();
    }
}

impl Simulator {
    /// Serves HTTPS on 127.0.0.1 (a free port) with `cert_pem` (chain) and
    /// `key_pem`. Must run inside a Tokio runtime.
    pub async fn start(
        options: SimOptions,
        cert_pem: &str,
        key_pem: &str,
    ) -> Result<Self, SimError> {
        let tls = proxyfleet_sim_support::https::tls_acceptor(cert_pem, key_pem)
            .map_err(SimError::Tls)?;
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let token_uri = format!("https://localhost:{}/token", addr.port());
        let shared = Arc::new(state::Shared::new(options, token_uri));
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
        Ok(Self { addr, shared, server, ticker, metadata: std::sync::Mutex::default() })
    }

    /// Starts a metadata server on 127.0.0.1 (a free port, plain HTTP)
    /// whose token endpoint gives tokens of `client_email`, as the service
    /// account bound to the caller; returns its `host:port`.
    pub async fn serve_metadata(&self, client_email: &str) -> Result<SocketAddr, SimError> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let metadata = Arc::new(metadata::Metadata::new(client_email.to_owned()));
        let server = tokio::spawn(metadata::serve(listener, metadata, Arc::clone(&self.shared)));
        self.metadata.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(server);
        Ok(addr)
    }

    /// Where the server listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The API endpoint for host name `localhost` (what the plugin's
    /// `endpoint` config key takes); the API is under `/compute/v1`.
    pub fn endpoint(&self) -> String {
        format!("https://localhost:{}", self.addr.port())
    }

    /// The token endpoint, as service-account keys name it in `token_uri`.
    pub fn token_uri(&self) -> String {
        self.shared.oauth.token_uri().to_owned()
    }

    /// Makes a new service-account key for `client_email` whose
    /// `token_uri` is this simulator's token endpoint.
    pub fn create_key(&self, client_email: &str) -> Result<ServiceAccountKey, SimError> {
        self.shared.oauth.create_key(client_email)
    }

    /// Revokes the key `private_key_id`: assertions it signs are refused
    /// from now on, and the tokens it was issued stop working.
    pub fn revoke_key(&self, private_key_id: &str) {
        self.shared.oauth.revoke_key(private_key_id);
    }

    /// Every token the endpoint issued, oldest first.
    pub fn tokens_issued(&self) -> Vec<TokenGrant> {
        self.shared.oauth.grants()
    }

    /// Replaces the injected faults.
    pub fn set_faults(&self, faults: Faults) {
        *self.shared.faults.lock().expect("faults lock") = faults;
    }

    /// Adds an instance made by someone else (no labels of ours), already
    /// running, in `zone` of `project`.
    pub fn add_foreign_instance(
        &self,
        project: &str,
        zone: &str,
        name: &str,
        labels: &[(&str, &str)],
    ) {
        self.shared.add_foreign_instance(project, zone, name, labels);
    }

    /// Every accepted delete so far, with the instance's labels then.
    pub fn deletions(&self) -> Vec<Deletion> {
        self.shared.deletions()
    }

    /// Every instance, in every project and zone.
    pub fn instances(&self) -> Vec<InstanceView> {
        self.shared.advance();
        self.shared.instances()
    }

    /// One instance by zone and name.
    pub fn instance(&self, zone: &str, name: &str) -> Option<InstanceView> {
        self.instances().into_iter().find(|i| i.zone == zone && i.name == name)
    }

    /// Every operation, oldest first.
    pub fn operations(&self) -> Vec<OperationView> {
        self.shared.advance();
        self.shared.operations()
    }

    /// `METHOD path?query` of every request received, in order (the
    /// token endpoint's included, its body not).
    pub fn requests(&self) -> Vec<String> {
        self.shared.requests()
    }
}
