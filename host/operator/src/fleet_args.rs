//! Flags of the fleet services (health probes and the discovery API), the
//! same in both modes, and starting the API server.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use ipnet::IpNet;
use proxyfleet_fleet::api::{Api, ConnectionLimits, ModeStatus, Refusal};
use proxyfleet_fleet::auth::ApiAuth;
use proxyfleet_fleet::gateway::target::{OwnAddresses, TargetPolicy};
use proxyfleet_fleet::gateway::{Gateway, GatewaySettings};

use crate::descriptors;
use proxyfleet_fleet::{CheckTarget, Fleet, FleetSettings, HealthSettings, ProbeMode, Strategy};

/// Health probes and the discovery API.
#[derive(Debug, clap::Args)]
pub struct FleetArgs {
    /// Where the discovery API (with /healthz, /readyz, /metrics and the
    /// /v1/echo check target) is served; port 0 picks a free one.
    #[arg(long, default_value = "127.0.0.1:8480")]
    pub api_addr: SocketAddr,
    /// A file of API bearer tokens, one per line (a mounted Secret key);
    /// read again every 30 s. Without it reads are open and requests that
    /// change state (reports, leases, rollbacks) are refused.
    #[arg(long)]
    pub api_token_file: Option<PathBuf>,
    /// Without --api-token-file: let anyone who reaches the API make
    /// requests that change state (reports, leases, rollbacks).
    #[arg(long, conflicts_with = "api_token_file")]
    pub api_open_writes: bool,
    /// With --api-token-file: leave the read-only proxy list open.
    #[arg(long)]
    pub api_open_read: bool,
    /// Client connections the API holds at once; further clients wait
    /// until one closes. Default 256, lowered to fit the open-file limit.
    #[arg(long)]
    pub api_max_connections: Option<usize>,
    /// How long the API and the gateway wait for a request head on a
    /// connection (a new one, or a kept-alive one between requests) before
    /// closing it.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub header_read_timeout: Duration,
    /// The plain-HTTP URL probes fetch through each proxy. Default: this
    /// process's own /v1/echo on --api-addr, which also reveals the exit
    /// address; proxies on other machines need an address they can reach.
    #[arg(long)]
    pub health_target: Option<String>,
    /// Which requests a probe sends through the proxy: get (absolute-form
    /// GET), connect (a CONNECT tunnel) or both.
    #[arg(long, default_value = "both")]
    pub health_mode: String,
    /// Time between two rounds of probes.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub health_interval: Duration,
    /// Budget of one probe.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub health_timeout: Duration,
    /// Probes in flight at once.
    #[arg(long, default_value_t = proxyfleet_fleet::health::DEFAULT_CONCURRENCY)]
    pub health_concurrency: usize,
    /// Passing probes in a row before a proxy is healthy.
    #[arg(long, default_value_t = 2)]
    pub health_healthy_after: u32,
    /// Failing probes in a row before a proxy is unhealthy.
    #[arg(long, default_value_t = 3)]
    pub health_unhealthy_after: u32,
    /// How long a proxy a crawler reported is kept from crawlers.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    pub quarantine: Duration,
    /// Reports after which a ProxyPool member is replaced.
    #[arg(long, default_value_t = 3)]
    pub replace_after: u32,
    /// How /v1/proxies/next and leases pick when a request names no
    /// strategy: round-robin, least-recently-used or random.
    #[arg(long, default_value = "round-robin")]
    pub discovery_strategy: String,
    /// Lease TTL when a request names none.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    pub lease_ttl: Duration,
    /// The longest lease TTL granted.
    #[arg(long, default_value = "24h", value_parser = humantime::parse_duration)]
    pub lease_max_ttl: Duration,
    #[command(flatten)]
    pub gateway: GatewayArgs,
}

/// The gateway: one proxy endpoint that sends each request through the
/// fleet (see docs/gateway.md).
#[derive(Debug, clap::Args)]
pub struct GatewayArgs {
    /// Where the gateway listens (HTTP/1.1 forward proxying and CONNECT);
    /// off without it. Crawlers send an API token as the proxy password.
    #[arg(long)]
    pub gateway_addr: Option<SocketAddr>,
    /// Without --api-token-file: let anyone who reaches --gateway-addr
    /// send requests through the fleet.
    #[arg(long, conflicts_with = "api_token_file")]
    pub gateway_open: bool,
    /// Other proxies a request is sent to after its proxy could not be
    /// reached.
    #[arg(long, default_value_t = 2)]
    pub gateway_retries: u32,
    /// Budget for reaching an upstream proxy (and its CONNECT answer).
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub gateway_connect_timeout: Duration,
    /// Budget for an upstream proxy's answer head to a forwarded request.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub gateway_response_timeout: Duration,
    /// Answer statuses that mean the site turned the proxy away, comma
    /// separated: the proxy is banned for that site only. Empty: none.
    #[arg(long, default_value = "403,429")]
    pub gateway_ban_status: String,
    /// How long a sticky session (`session=ID` in the proxy username)
    /// holds its proxy, from its first request.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    pub gateway_session_ttl: Duration,
    /// How long a CONNECT tunnel may carry nothing either way before the
    /// gateway closes it.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    pub gateway_tunnel_idle_timeout: Duration,
    /// Client connections the gateway holds at once (each may hold one
    /// more towards a proxy); further clients wait until one closes.
    /// Default 1024, lowered to fit the open-file limit.
    #[arg(long)]
    pub gateway_max_connections: Option<usize>,
    /// Requests in flight and CONNECT tunnels one API token holds at once
    /// (one client address, on an open gateway).
    #[arg(long, default_value_t = 256)]
    pub gateway_max_per_client: usize,
    /// Export the gateway's request, byte and error counters per upstream
    /// Proxy as well (an `upstream` label: one series per Proxy per
    /// counter), not only per pool.
    #[arg(long)]
    pub gateway_upstream_metrics: bool,
    /// Special-purpose addresses crawlers may reach through the gateway
    /// after all, comma separated IP addresses or CIDR ranges (e.g.
    /// 10.20.0.0/16 for an intranet crawl). Loopback, private, link-local
    /// and the like are refused without it; cloud metadata addresses and
    /// the operator's own listeners always.
    #[arg(long, value_delimiter = ',')]
    pub gateway_allow_targets: Vec<String>,
    /// Addresses crawlers may never reach through the gateway, public or
    /// not, comma separated IP addresses or CIDR ranges: the cluster's
    /// service and pod ranges, say. They win over --gateway-allow-targets.
    #[arg(long, value_delimiter = ',')]
    pub gateway_deny_targets: Vec<String>,
}

/// The validated settings and the bound API listener.
#[derive(Debug)]
pub struct FleetSetup {
    pub fleet: FleetSettings,
    pub health: HealthSettings,
    pub auth: Arc<ApiAuth>,
    pub listener: tokio::net::TcpListener,
    /// The API listener's bounds.
    pub api_limits: ConnectionLimits,
    /// The gateway's settings and listener, when it is on.
    pub gateway: Option<(GatewaySettings, tokio::net::TcpListener)>,
}

impl FleetArgs {
    /// Validates the flags and binds the API address now, so a bad flag or
    /// a taken port fails the start with a clear error. `metrics_addr` is
    /// the operator's metrics listener, which the gateway refuses as a
    /// target like its own.
    pub async fn setup(&self, metrics_addr: SocketAddr) -> anyhow::Result<FleetSetup> {
        if self.header_read_timeout.is_zero() || self.header_read_timeout > Duration::from_secs(300)
        {
            anyhow::bail!(
                "--header-read-timeout: {:?} must be above zero and at most 5m; give a time such as 10s",
                self.header_read_timeout
            );
        }
        let open_files = descriptors::raise_limit();
        let budget = descriptors::budget(
            open_files,
            self.api_max_connections,
            self.gateway.gateway_max_connections,
            self.gateway.gateway_addr.is_some(),
        )?;
        let api_limits = ConnectionLimits {
            max_connections: budget.api,
            header_read_timeout: self.header_read_timeout,
        };
        let listener = tokio::net::TcpListener::bind(self.api_addr).await.with_context(|| {
            format!("--api-addr {}: cannot listen; pick a free address", self.api_addr)
        })?;
        let bound = listener.local_addr()?;
        let target = match &self.health_target {
            Some(url) => CheckTarget::parse("--health-target", url)?,
            None => {
                // A wildcard bind is reachable on loopback too.
                let host = if bound.ip().is_unspecified() {
                    SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), bound.port())
                } else {
                    bound
                };
                CheckTarget::parse("--health-target", &format!("http://{host}/v1/echo"))?
            }
        };
        let health = HealthSettings {
            interval: self.health_interval,
            timeout: self.health_timeout,
            concurrency: self.health_concurrency,
            healthy_after: self.health_healthy_after,
            unhealthy_after: self.health_unhealthy_after,
            target,
            mode: ProbeMode::parse("--health-mode", &self.health_mode)?,
        };
        health.validate()?;
        if self.replace_after == 0 {
            anyhow::bail!("--replace-after: 0 reports; use 1 or more");
        }
        if self.lease_ttl.is_zero() || self.lease_ttl > self.lease_max_ttl {
            anyhow::bail!(
                "--lease-ttl: {:?} must be above zero and at most --lease-max-ttl ({:?})",
                self.lease_ttl,
                self.lease_max_ttl
            );
        }
        let fleet = FleetSettings {
            quarantine: self.quarantine,
            replace_after: self.replace_after,
            strategy: Strategy::parse("--discovery-strategy", &self.discovery_strategy)?,
            lease_ttl: self.lease_ttl,
            max_lease_ttl: self.lease_max_ttl,
        };
        let gateway = match self.gateway.gateway_addr {
            Some(addr) => {
                if self.api_token_file.is_none() && !self.gateway.gateway_open {
                    anyhow::bail!(
                        "--gateway-addr: without --api-token-file the gateway would send anyone's \
                         requests through the fleet; give --api-token-file (crawlers send a token \
                         as the proxy password) or, on a network only crawlers reach, --gateway-open"
                    );
                }
                let mut settings = self.gateway.settings(&health, self.lease_max_ttl)?;
                let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| {
                    format!("--gateway-addr {addr}: cannot listen; pick a free address")
                })?;
                settings.connections = ConnectionLimits {
                    max_connections: budget.gateway,
                    header_read_timeout: self.header_read_timeout,
                };
                settings.targets.own = OwnAddresses::new(
                    vec![bound, listener.local_addr()?, metrics_addr],
                    cluster_addresses(),
                );
                Some((settings, listener))
            }
            None => None,
        };
        let auth = match &self.api_token_file {
            Some(file) => {
                let auth = Arc::new(ApiAuth::from_file(file.clone(), self.api_open_read)?);
                auth.spawn_reloader(Duration::from_secs(30));
                auth
            }
            None if self.api_open_writes => Arc::new(ApiAuth::open()),
            None => Arc::new(ApiAuth::reads_only()),
        };
        Ok(FleetSetup { fleet, health, auth, listener, api_limits, gateway })
    }
}

/// Addresses of this operator's that a cluster gives it: its pod's IP
/// (`POD_IP`, from the downward API) and the Kubernetes API's
/// (`KUBERNETES_SERVICE_HOST`), refused as gateway targets on every port.
fn cluster_addresses() -> Vec<IpAddr> {
    ["POD_IP", "KUBERNETES_SERVICE_HOST"]
        .into_iter()
        .filter_map(|name| std::env::var(name).ok())
        .filter_map(|value| value.trim().parse().ok())
        .collect()
}

/// Comma separated IP addresses and CIDR ranges of `flag`.
fn ranges(flag: &str, texts: &[String]) -> anyhow::Result<Vec<IpNet>> {
    texts
        .iter()
        .map(|text| text.trim())
        .filter(|text| !text.is_empty())
        .map(|text| {
            text.parse::<IpNet>().or_else(|_| text.parse::<IpAddr>().map(IpNet::from)).map_err(
                |_| {
                    anyhow::anyhow!(
                        "{flag}: {text:?} is neither an IP address nor a CIDR range like 10.0.0.0/8"
                    )
                },
            )
        })
        .collect()
}

impl GatewayArgs {
    fn settings(
        &self,
        health: &HealthSettings,
        max_ttl: Duration,
    ) -> anyhow::Result<GatewaySettings> {
        let ban_statuses = self
            .gateway_ban_status
            .split(',')
            .map(str::trim)
            .filter(|code| !code.is_empty())
            .map(|code| {
                code.parse::<u16>()
                    .ok()
                    .and_then(|code| http::StatusCode::from_u16(code).ok())
                    .filter(|status| status.is_client_error() || status.is_server_error())
                    .with_context(|| {
                        format!("--gateway-ban-status: {code:?} is not a status from 400 to 599")
                    })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        if self.gateway_session_ttl.is_zero() || self.gateway_session_ttl > max_ttl {
            anyhow::bail!(
                "--gateway-session-ttl: {:?} must be above zero and at most --lease-max-ttl ({max_ttl:?})",
                self.gateway_session_ttl
            );
        }
        if self.gateway_connect_timeout.is_zero() {
            anyhow::bail!("--gateway-connect-timeout: 0s; give a budget such as 5s");
        }
        if self.gateway_response_timeout.is_zero() {
            anyhow::bail!("--gateway-response-timeout: 0s; give a budget such as 60s");
        }
        if self.gateway_tunnel_idle_timeout.is_zero()
            || self.gateway_tunnel_idle_timeout > Duration::from_secs(24 * 3600)
        {
            anyhow::bail!(
                "--gateway-tunnel-idle-timeout: {:?} must be above zero and at most 24h; give a time such as 5m",
                self.gateway_tunnel_idle_timeout
            );
        }
        if self.gateway_max_per_client == 0 {
            anyhow::bail!("--gateway-max-per-client: 0; give at least 1, such as 256");
        }
        let targets = TargetPolicy {
            allow: ranges("--gateway-allow-targets", &self.gateway_allow_targets)?,
            deny: ranges("--gateway-deny-targets", &self.gateway_deny_targets)?,
            ..TargetPolicy::default()
        };
        Ok(GatewaySettings {
            retries: self.gateway_retries,
            connect_timeout: self.gateway_connect_timeout,
            response_timeout: self.gateway_response_timeout,
            ban_statuses,
            session_ttl: self.gateway_session_ttl,
            tunnel_idle_timeout: self.gateway_tunnel_idle_timeout,
            healthy_after: health.healthy_after,
            unhealthy_after: health.unhealthy_after,
            targets,
            connections: ConnectionLimits::default(),
            max_per_client: self.gateway_max_per_client,
        })
    }
}

/// Serves the gateway in the background, when it is on, until `stop`.
pub fn serve_gateway(
    gateway: Option<(GatewaySettings, tokio::net::TcpListener)>,
    fleet: Arc<Fleet>,
    auth: Arc<ApiAuth>,
    stop: tokio_util::sync::CancellationToken,
) -> Option<tokio::task::JoinHandle<()>> {
    let (settings, listener) = gateway?;
    if let Ok(addr) = listener.local_addr() {
        tracing::info!("gateway at http://{addr}");
    }
    let gateway = Arc::new(Gateway::new(fleet, auth, settings));
    Some(tokio::spawn(proxyfleet_fleet::gateway::serve(listener, gateway, stop.cancelled_owned())))
}

/// Serves the discovery API in the background until `stop`; the handle
/// ends once the connections are drained.
pub fn serve_api(
    listener: tokio::net::TcpListener,
    limits: ConnectionLimits,
    fleet: Arc<Fleet>,
    auth: Arc<ApiAuth>,
    mode: Arc<dyn ModeStatus>,
    stop: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<()> {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!("discovery API at http://{addr}/v1/proxies, console at http://{addr}/ui/");
    }
    let api = Arc::new(Api::new(fleet, auth).with_mode(mode));
    tokio::spawn(proxyfleet_fleet::api::serve(listener, api, limits, stop.cancelled_owned()))
}

/// What the API shows of a Kubernetes-mode installation's providers: the
/// plugin revisions (check results are on the ClusterProxyProvider
/// objects); and
/// operators' actions, carried out and recorded as Events.
pub struct SourceStatus {
    /// The plugin registry.
    pub source: Arc<dyn proxyfleet_core::source::ProviderSource>,
    /// This replica's identity in the leader election.
    pub identity: String,
    /// Whether it leads now.
    pub leading: Arc<std::sync::atomic::AtomicBool>,
    /// Replacements and the Events of operators' actions.
    pub actions: proxyfleet_kube::actions::OperatorActions,
    /// The console's session key, derived from the installation's spec
    /// key: every replica signs alike, so a session outlives a failover.
    pub session_key: [u8; 32],
}

impl std::fmt::Debug for SourceStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceStatus")
            .field("installation", self.source.installation())
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl ModeStatus for SourceStatus {
    fn providers(&self) -> serde_json::Value {
        serde_json::json!({ "revisions": self.source.revisions() })
    }

    fn rollback(&self, entry: &str) -> Result<serde_json::Value, Refusal> {
        let active = proxyfleet_housekeeping::rollback(self.source.as_ref(), entry)?;
        Ok(serde_json::to_value(active).unwrap_or_default())
    }

    fn name(&self) -> &'static str {
        "Kubernetes"
    }

    fn revisions(&self) -> Vec<proxyfleet_core::revisions::EntryRevisions> {
        self.source.revisions()
    }

    fn replica(&self) -> Option<proxyfleet_fleet::mode::Replica> {
        Some(proxyfleet_fleet::mode::Replica {
            identity: self.identity.clone(),
            leading: self.leading.load(std::sync::atomic::Ordering::Acquire),
        })
    }

    fn session_key(&self) -> Option<[u8; 32]> {
        Some(self.session_key)
    }

    async fn replace(&self, proxy: &proxyfleet_fleet::action::ProxyRef) -> Result<(), Refusal> {
        self.actions.replace(proxy).await
    }

    async fn record(&self, action: &proxyfleet_fleet::action::Action) {
        self.actions.record(action).await;
    }
}
