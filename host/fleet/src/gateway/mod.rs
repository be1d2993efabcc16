//! The gateway: one proxy endpoint for crawlers that sends each request
//! through a healthy proxy of the fleet.
//!
//! It speaks HTTP/1.1 forward proxying: absolute-form requests
//! ([`forward`]) and CONNECT tunnels ([`tunnel`]). Each request:
//! 1. is authenticated: `Proxy-Authorization: Basic` with an API token as
//!    the password (407 otherwise);
//! 2. is routed by the username ([`route`]): pool, provider, labels,
//!    sticky session, strategy;
//! 3. has its target judged ([`target`]): names resolved here once, cloud
//!    metadata, loopback, private and the operator's own addresses refused
//!    unless allowed, and the proxy asked for the address, not the name;
//! 4. takes one of its client's slots ([`clients`]): at most
//!    [`GatewaySettings::max_per_client`] requests and tunnels per token;
//! 5. goes through a proxy the catalog picks (healthy, running, not
//!    quarantined, not banned for the request's site); a proxy that cannot
//!    be reached is counted as a failed probe and the request goes to
//!    another one, at most [`GatewaySettings::retries`] more times;
//! 6. is answered with the upstream's answer and an `X-Proxyfleet-Proxy`
//!    header naming the proxy's ID, for the discovery API's report route.
//!
//! An answer with one of [`GatewaySettings::ban_statuses`] bans the proxy
//! for that site only. Answers the gateway makes itself are JSON
//! `{"error": "..."}` with a status saying whose fault it is: 400 (the
//! request or its routing), 403 (a target crawlers may not reach), 407
//! (credentials), 404 (an unknown pool), 429 (the client holds all its
//! slots), 502 (no upstream could be reached, or the target's name does
//! not resolve), 503 (none available), 504 (the resolver did not answer).
//! The refusals about the target carry an RFC 9209 `Proxy-Status` header.
//!
//! The gateway reads the same catalog as the discovery API: the one
//! process in standalone mode, every replica in a cluster, where sessions
//! are shared through the lease store (see `docs/gateway.md`).

use std::convert::Infallible;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use tokio::net::{TcpListener, TcpStream};

use crate::auth::{Access, ApiAuth};
use crate::catalog::{CatalogError, Fleet, Picked, ReportKind, Session, site_of};

mod clients;
mod counted;
mod forward;
pub mod route;
mod settings;
pub mod target;
mod tunnel;

use clients::{ClientSlot, ClientSlots};
pub use route::{Route, RouteError};
pub use settings::GatewaySettings;
use target::{Resolve, SystemResolver, TargetRefusal};

use crate::server::Slot;

/// The header naming the proxy a request went through.
pub const PROXY_HEADER: &str = "x-proxyfleet-proxy";

/// RFC 9209's header, on the refusals about a request's target.
pub const PROXY_STATUS: &str = "proxy-status";

/// Every answer's body: the upstream's, streamed, or the gateway's own.
type Body = BoxBody<Bytes, hyper::Error>;

/// The gateway's shared state.
pub struct Gateway {
    fleet: Arc<Fleet>,
    auth: Arc<ApiAuth>,
    settings: GatewaySettings,
    resolver: Arc<dyn Resolve>,
    clients: Arc<ClientSlots>,
}

impl fmt::Debug for Gateway {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gateway").field("settings", &self.settings).finish_non_exhaustive()
    }
}

impl Gateway {
    /// A gateway over `fleet`, admitting the holders of `auth`'s tokens.
    pub fn new(fleet: Arc<Fleet>, auth: Arc<ApiAuth>, settings: GatewaySettings) -> Self {
        let clients = Arc::new(ClientSlots::new(settings.max_per_client));
        Self { fleet, auth, settings, resolver: Arc::new(SystemResolver), clients }
    }

    /// Resolves target names with `resolver` instead of the system's.
    #[must_use]
    pub fn with_resolver(mut self, resolver: Arc<dyn Resolve>) -> Self {
        self.resolver = resolver;
        self
    }
}

/// Serves `gateway` on `listener` until `shutdown` resolves, then drains
/// the connections (tunnels already open run on) and returns.
pub async fn serve(
    listener: TcpListener,
    gateway: Arc<Gateway>,
    shutdown: impl Future<Output = ()>,
) {
    let limits = gateway.settings.connections;
    let service = move |peer: SocketAddr, slot: Slot| {
        let gateway = Arc::clone(&gateway);
        hyper::service::service_fn(move |request: Request<Incoming>| {
            let gateway = Arc::clone(&gateway);
            let held = Held { connection: slot.clone(), client: None };
            async move { Ok::<_, Infallible>(handle(&gateway, peer.ip(), held, request).await) }
        })
    };
    crate::server::serve(listener, "gateway", limits, service, shutdown).await;
}

/// What a request holds while its upstream connection lives: its place
/// among the listener's connections (hyper lets go of a connection that
/// became a tunnel) and among its client's slots.
#[derive(Debug)]
struct Held {
    #[allow(dead_code, reason = "held for its lifetime, never read")]
    connection: Slot,
    client: Option<ClientSlot>,
}

/// An answer the gateway makes itself.
#[derive(Debug)]
pub(crate) struct Refusal {
    status: StatusCode,
    /// The `gateway_refused` reason.
    reason: &'static str,
    message: String,
    /// The proxy that answered, when one did.
    proxy: Option<String>,
    /// The RFC 9209 error type, for a `Proxy-Status` header.
    proxy_status: Option<&'static str>,
}

impl Refusal {
    fn new(status: StatusCode, reason: &'static str, message: impl Into<String>) -> Self {
        Self { status, reason, message: message.into(), proxy: None, proxy_status: None }
    }

    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "request", message)
    }

    fn into_response(self, gateway: &Gateway) -> Response<Body> {
        gateway.fleet.metrics().gateway().record_refused(self.reason);
        let body = serde_json::json!({ "error": self.message }).to_string();
        let mut response = Response::new(full(Bytes::from(body)));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(id) = &self.proxy {
            name_proxy(headers, id);
        }
        if let Some(error) = self.proxy_status
            && let Ok(value) = HeaderValue::from_str(&proxy_status(error, &self.message))
        {
            headers.insert(PROXY_STATUS, value);
        }
        if self.status == StatusCode::PROXY_AUTHENTICATION_REQUIRED {
            headers.insert(
                header::PROXY_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"proxyfleet\""),
            );
        }
        response
    }
}

impl From<TargetRefusal> for Refusal {
    fn from(refusal: TargetRefusal) -> Self {
        let status = match &refusal {
            TargetRefusal::MetadataName(_) | TargetRefusal::Prohibited { .. } => {
                StatusCode::FORBIDDEN
            }
            TargetRefusal::Unresolved { .. } => StatusCode::BAD_GATEWAY,
            TargetRefusal::ResolveTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
        };
        let mut answer = Self::new(status, "target", refusal.to_string());
        answer.proxy_status = Some(refusal.error_type());
        answer
    }
}

/// The `Proxy-Status` header (RFC 9209) of a refusal: this gateway's
/// name, the error type, and the message as its details (a structured
/// field string: printable ASCII, `"` and `\` escaped).
fn proxy_status(error: &str, details: &str) -> String {
    let mut value = format!("proxyfleet; error={error}; details=\"");
    for c in details.chars() {
        match c {
            '"' | '\\' => {
                value.push('\\');
                value.push(c);
            }
            ' '..='~' => value.push(c),
            _ => value.push('?'),
        }
    }
    value.push('"');
    value
}

impl From<CatalogError> for Refusal {
    fn from(err: CatalogError) -> Self {
        let (status, reason) = match &err {
            CatalogError::UnknownPool(_) => (StatusCode::NOT_FOUND, "routing"),
            CatalogError::Invalid { .. } => (StatusCode::BAD_REQUEST, "routing"),
            CatalogError::NoneAvailable(_)
            | CatalogError::StoreUnavailable(_)
            | CatalogError::NoProxy(_)
            | CatalogError::NoLease(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
        };
        Self::new(status, reason, err.to_string())
    }
}

fn full(bytes: Bytes) -> Body {
    Full::new(bytes).map_err(|never| match never {}).boxed()
}

async fn handle(
    gateway: &Gateway,
    peer: IpAddr,
    mut held: Held,
    request: Request<Incoming>,
) -> Response<Body> {
    let started = Instant::now();
    if !gateway.fleet.is_ready() {
        let refusal = Refusal::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "not ready: the first round of health probes has not finished, or (in a cluster) \
             this replica does not lead; retry shortly",
        );
        return refusal.into_response(gateway);
    }
    let admitted = admit(gateway, peer, request.headers()).and_then(|(route, client)| {
        held.client = Some(gateway.clients.take(client).ok_or_else(|| {
            Refusal::new(
                StatusCode::TOO_MANY_REQUESTS,
                "client-limit",
                format!(
                    "this client holds {} requests and tunnels through the gateway already, its \
                     most (--gateway-max-per-client); close some, or use another token",
                    gateway.clients.max()
                ),
            )
        })?);
        Ok(route)
    });
    let answer = match admitted {
        Err(refusal) => Err(refusal),
        Ok(route) if request.method() == Method::CONNECT => {
            tunnel::open(gateway, &route, held, request, started).await
        }
        Ok(route) => forward::send(gateway, &route, held, request, started).await,
    };
    answer.unwrap_or_else(|refusal| refusal.into_response(gateway))
}

/// Checks the credentials and reads the route from the username; the key
/// the request's slot is counted against.
fn admit(
    gateway: &Gateway,
    peer: IpAddr,
    headers: &HeaderMap,
) -> Result<(Route, clients::ClientKey), Refusal> {
    let credentials =
        headers.get(header::PROXY_AUTHORIZATION).map(basic_credentials).transpose()?;
    let (username, token) = match &credentials {
        Some((username, password)) => (username.as_str(), Some(password.as_bytes())),
        None => ("", None),
    };
    if !gateway.auth.allows_token(Access::Token, token) {
        let message = if token.is_some() {
            "the proxy password is not a token from the API token file"
        } else {
            "this gateway needs credentials: an API token as the proxy password, routing \
             parameters as the username (curl -x http://pool=NAMESPACE.NAME:TOKEN@HOST:PORT)"
        };
        return Err(Refusal::new(StatusCode::PROXY_AUTHENTICATION_REQUIRED, "auth", message));
    }
    let route = Route::parse(username)
        .map_err(|err| Refusal::new(StatusCode::BAD_REQUEST, "routing", err.to_string()))?;
    // Tokens are counted only where they are checked: on an open gateway
    // anyone may send any password, so the address counts.
    let token = token.filter(|_| gateway.auth.has_tokens());
    Ok((route, gateway.clients.key(token, peer)))
}

/// `Basic base64(username:password)` → (username, password).
fn basic_credentials(value: &HeaderValue) -> Result<(String, String), Refusal> {
    let refuse = |why: &str| {
        Refusal::new(
            StatusCode::PROXY_AUTHENTICATION_REQUIRED,
            "auth",
            format!(
                "Proxy-Authorization: {why}; send Basic credentials, an API token as the password"
            ),
        )
    };
    // The scheme name is case-insensitive (RFC 9110, 11.1).
    let bytes = value.as_bytes();
    let encoded = bytes
        .get(..6)
        .filter(|scheme| scheme.eq_ignore_ascii_case(b"basic "))
        .map(|_| &bytes[6..])
        .ok_or_else(|| refuse("not the Basic scheme"))?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim_ascii())
        .map_err(|_| refuse("not base64"))?;
    let decoded = String::from_utf8(decoded).map_err(|_| refuse("not UTF-8"))?;
    let (username, password) =
        decoded.split_once(':').ok_or_else(|| refuse("no ':' between username and password"))?;
    Ok((username.to_owned(), password.to_owned()))
}

/// A proxy picked for a request and a connection to it.
struct Upstream {
    picked: Picked,
    stream: TcpStream,
    /// Proxies the request failed on before this one.
    tried: Vec<String>,
    /// How long the connection took: a crawler going to the proxy itself
    /// would spend it too.
    connected_in: Duration,
}

impl Gateway {
    /// Picks a proxy for `route` to `site` and connects to it; a proxy that cannot be
    /// reached is reported and another one tried, at most
    /// [`GatewaySettings::retries`] more times. `tried` lists proxies an
    /// earlier attempt of the same request failed on.
    async fn connect(
        &self,
        route: &Route,
        site: &str,
        mut tried: Vec<String>,
    ) -> Result<Upstream, Refusal> {
        let mut selector = route.selector.clone();
        selector.site = Some(site.to_owned());
        let session =
            route.session.as_deref().map(|key| Session { key, ttl: self.settings.session_ttl });
        loop {
            let picked = match self.fleet.route(&selector, route.strategy, session, &tried) {
                Ok(picked) => picked,
                Err(CatalogError::NoneAvailable(_)) if !tried.is_empty() => {
                    return Err(self.exhausted(&tried));
                }
                Err(err) => return Err(err.into()),
            };
            let connecting = Instant::now();
            let connected = tokio::time::timeout(
                self.settings.connect_timeout,
                TcpStream::connect(picked.endpoint.addr()),
            )
            .await;
            let failure = match connected {
                Ok(Ok(stream)) => {
                    let _ = stream.set_nodelay(true);
                    return Ok(Upstream {
                        picked,
                        stream,
                        tried,
                        connected_in: connecting.elapsed(),
                    });
                }
                Ok(Err(err)) if is_local_shortage(&err) => {
                    // This host's shortage, not the proxy's fault: telling
                    // the health engine would turn the whole fleet unhealthy.
                    tracing::warn!("gateway: cannot open a connection: {err}");
                    return Err(Refusal::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "unavailable",
                        format!("the gateway cannot open a connection now ({err}); retry shortly"),
                    ));
                }
                Ok(Err(err)) => {
                    format!("gateway: cannot connect to {}: {err}", picked.endpoint.addr())
                }
                Err(_) => format!(
                    "gateway: no connection to {} within {:?}",
                    picked.endpoint.addr(),
                    self.settings.connect_timeout
                ),
            };
            self.failed_attempt(&picked, failure, &mut tried, true)?;
        }
    }

    /// One attempt of a request failed on `picked`: reported, and when
    /// `retry` allows and the budget is not spent, the caller tries another
    /// proxy (`Ok`); otherwise the crawler gets a 502 (`Err`).
    fn failed_attempt(
        &self,
        picked: &Picked,
        failure: String,
        tried: &mut Vec<String>,
        retry: bool,
    ) -> Result<(), Refusal> {
        tried.push(picked.id.clone());
        self.upstream_failed(picked, failure.clone());
        if !retry || tried.len() > self.settings.retries as usize {
            let mut refusal = if retry {
                self.exhausted(tried)
            } else {
                Refusal::new(StatusCode::BAD_GATEWAY, "upstream", failure)
            };
            refusal.proxy = Some(picked.id.clone());
            return Err(refusal);
        }
        self.fleet.metrics().gateway().record_retry(picked.pool.as_deref());
        Ok(())
    }

    /// Counts a failed upstream and tells the health engine.
    fn upstream_failed(&self, picked: &Picked, failure: String) {
        tracing::info!(proxy = %picked.id, name = %picked.name, "{failure}");
        self.fleet.metrics().gateway().record_upstream_error(picked.pool.as_deref(), &picked.name);
        self.fleet.record_upstream_failure(
            &picked.id,
            failure,
            self.settings.healthy_after,
            self.settings.unhealthy_after,
        );
    }

    /// The proxy wants a credential, or not its Proxy's: passed on, its 407
    /// would tell the crawler that the crawler's own credentials were wrong.
    fn refused_credential(picked: &Picked) -> Refusal {
        let mut refusal = Refusal::new(
            StatusCode::BAD_GATEWAY,
            "upstream",
            format!(
                "the proxy {} answered 407: it wants a credential, or not the one its Proxy names",
                picked.name
            ),
        );
        refusal.proxy = Some(picked.id.clone());
        refusal
    }

    fn exhausted(&self, tried: &[String]) -> Refusal {
        Refusal::new(
            StatusCode::BAD_GATEWAY,
            "upstream",
            format!(
                "no upstream proxy could be reached: {} tried, each failed; the health engine was told",
                tried.len()
            ),
        )
    }
}

/// Names the proxy an answer came through.
fn name_proxy(headers: &mut HeaderMap, id: &str) {
    if let Ok(id) = HeaderValue::from_str(id) {
        headers.insert(PROXY_HEADER, id);
    }
}

/// Bans `picked` for `site` when `status` is one of the ban statuses.
fn ban_on_status(gateway: &Gateway, picked: &Picked, site: &str, status: StatusCode, what: &str) {
    if gateway.settings.ban_statuses.contains(&status) {
        let reason = format!("gateway: {what} answered {status}");
        if let Err(err) = gateway.fleet.ban_site(&picked.id, site, ReportKind::Ban, &reason) {
            tracing::debug!(proxy = %picked.id, "gateway: no ban recorded: {err}");
        }
    }
}

/// Whether a failed connect is this host's shortage (file descriptors,
/// local ports, buffers) rather than the proxy's fault. Linux's numbers:
/// std gives EMFILE, ENFILE and ENOBUFS no stable `ErrorKind`.
fn is_local_shortage(err: &std::io::Error) -> bool {
    const ENFILE: i32 = 23;
    const EMFILE: i32 = 24;
    const ENOBUFS: i32 = 105;
    err.kind() == std::io::ErrorKind::AddrNotAvailable
        || matches!(err.raw_os_error(), Some(ENFILE | EMFILE | ENOBUFS))
}

/// The site of a request's target: its host, without user information.
fn site_of_authority(authority: &http::uri::Authority) -> Result<String, Refusal> {
    site_of("host", authority.host()).map_err(|err| Refusal::bad_request(err.to_string()))
}

impl Gateway {
    /// The address a request for `authority` goes to, judged by the
    /// target policy; `default_port` when the authority names none.
    async fn target(
        &self,
        authority: &http::uri::Authority,
        default_port: u16,
    ) -> Result<SocketAddr, Refusal> {
        let port = authority.port_u16().unwrap_or(default_port);
        let target = self
            .settings
            .targets
            .target(self.resolver.as_ref(), authority.host(), port, self.settings.connect_timeout)
            .await?;
        Ok(target)
    }
}

/// Headers that describe one hop, not the message: never passed on.
fn strip_hop_headers(headers: &mut HeaderMap) {
    let listed: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in listed {
        headers.remove(name);
    }
    for name in [
        header::CONNECTION,
        header::PROXY_AUTHORIZATION,
        header::PROXY_AUTHENTICATE,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
    ] {
        headers.remove(name);
    }
    headers.remove("proxy-connection");
    headers.remove("keep-alive");
}

/// The time the gateway itself spent on a request: all of it, less what
/// the upstream took.
fn added(started: Instant, upstream: Duration) -> Duration {
    started.elapsed().saturating_sub(upstream)
}

#[cfg(test)]
mod tests;
