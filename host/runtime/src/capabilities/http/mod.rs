//! Outgoing HTTP for plugins (`wasi:http/outgoing-handler`), fail-closed.
//!
//! Every request a plugin sends passes, in order:
//! 0. the method: only GET, HEAD, POST, PUT, PATCH, DELETE and OPTIONS; so
//!    TRACE (and look-alikes such as TRACK) is refused, since a backend
//!    answering it reflects the injected credential back to the plugin, and
//!    CONNECT, since a tunnel would carry traffic the host cannot see;
//! 1. the allow-list: scheme, host and port must match a grant of the entry;
//! 2. the address policy: an IP literal, or every address a host name
//!    resolves to, must be public unless the grant names its range
//!    (loopback, private, link-local and cloud metadata addresses are
//!    refused otherwise, which also defeats DNS rebinding);
//! 3. credential injection: the grant's header, built from a secret read
//!    now (a file, or a Kubernetes Secret's key through the mode's short
//!    cache), so rotation needs no restart and the plugin never sees it;
//!    the answer to such a request has the credential taken out of its
//!    headers and body before the plugin reads it ([`reflected`]), in case
//!    the backend reflects requests;
//! 4. the in-flight caps: a call may have `httpInFlightPerCall` requests
//!    open (more fail at once), the entry `httpInFlight` (more wait), so
//!    one call cannot exhaust the host's sockets or starve other entries;
//!    a request stays open until its response body is read or dropped;
//! 5. the request body, counted while it streams in and refused past
//!    `httpRequestMiB`, so a plugin cannot make the host buffer more;
//! 6. a transport with connect and first-byte timeouts, no redirects (a
//!    redirect could leave the allow-list), a bounded connection pool and a
//!    response size cap.
//!
//! A response's non-standard reason phrase reaches the plugin as a header
//! ([`super::reason_phrase`]).
//!
//! Each request is a `plugin.http` span, a child of the call's
//! `provider.call` span, naming the method and the destination (scheme,
//! host, port) only: paths, queries and headers may carry credentials.

pub mod config;
pub mod host_refusal;
mod reflected;
pub(crate) mod secret;

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt as _;
use http::{HeaderValue, Request, Response};
use http_body_util::{BodyExt as _, StreamBody};
use hyper::body::Frame;
use ipnet::IpNet;
use proxyfleet_core::HttpDestination;
use proxyfleet_core::secret_store::SecretStore;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::Instrument as _;
use wasmtime_wasi_http::{RequestOptions, WasiHttpHooks};

pub use wasmtime_wasi_http::{Error as HttpError, WasiBody};

use self::config::{Credential, HttpGrant};
use super::Redactor;
use super::address::{AddressKind, literal_ip, refused_kind};
use super::loggable::REQUEST_LOG_TARGET;
use crate::limits::Limits;

/// The methods a plugin may use.
const ALLOWED_METHODS: [http::Method; 7] = [
    http::Method::GET,
    http::Method::HEAD,
    http::Method::POST,
    http::Method::PUT,
    http::Method::PATCH,
    http::Method::DELETE,
    http::Method::OPTIONS,
];

/// How a transport must send one request.
#[derive(Debug, Clone)]
pub struct SendPolicy {
    /// Address ranges the destination may resolve to despite the policy.
    pub allow_addresses: Vec<IpNet>,
    /// Budget from sending to the response headers.
    pub first_byte_timeout: Duration,
    /// Budget between two chunks of the response body.
    pub between_bytes_timeout: Duration,
}

/// Sends requests that passed the allow-list. The real one is
/// [`ReqwestTransport`]; the plugin test harness scripts its own.
#[async_trait]
pub trait HttpTransport: Send + Sync + fmt::Debug {
    /// Sends `request` and returns the response with a streaming body.
    async fn send(
        &self,
        request: Request<Bytes>,
        policy: &SendPolicy,
    ) -> Result<Response<WasiBody>, HttpError>;
}

/// A credential whose header the host obtains when a request needs it,
/// such as an access token exchanged for a key it holds. Implemented by
/// the Google service account; held per grant by [`EntryHttp`], so its
/// cache lives as long as the entry.
#[async_trait]
pub(crate) trait ObtainedCredential: Send + Sync + fmt::Debug {
    /// The `Authorization` value for a request to `grant`'s destination;
    /// when there is none, the answer the plugin gets instead.
    async fn authorize(
        &self,
        transport: &dyn HttpTransport,
        grant: &HttpGrant,
        limits: &Limits,
        redactor: &Redactor,
    ) -> Result<HeaderValue, Response<WasiBody>>;

    /// The destination refused the value (401): obtain a new one, within
    /// the credential's own rate limit.
    fn refused(&self);
}

/// One grant and, for a credential the host obtains, its live state.
#[derive(Debug)]
struct LiveGrant {
    grant: HttpGrant,
    obtained: Option<Arc<dyn ObtainedCredential>>,
}

/// The HTTP capability of one provider entry.
#[derive(Debug)]
pub struct EntryHttp {
    entry: Arc<str>,
    grants: Vec<LiveGrant>,
    limits: Limits,
    transport: Arc<dyn HttpTransport>,
    redactor: Arc<Redactor>,
    /// Reads the Secrets a grant's `secretRef` names; `None`: this mode
    /// has none.
    secrets: Option<Arc<dyn SecretStore>>,
    /// Requests of the entry open now, up to `limits.http_in_flight`.
    in_flight: Arc<Semaphore>,
}

/// The permits of one open request; dropped when its response body ends.
struct InFlight {
    _call: OwnedSemaphorePermit,
    _entry: OwnedSemaphorePermit,
}

impl EntryHttp {
    /// The capability of the entry named `entry`, with its HTTP grants and
    /// limits, reading `secretRef`s through `secrets`. `obtain` makes the
    /// live state of each grant whose credential the host obtains at
    /// request time.
    pub(crate) fn new(
        entry: &str,
        grants: &[HttpGrant],
        limits: &Limits,
        transport: Arc<dyn HttpTransport>,
        redactor: Arc<Redactor>,
        secrets: Option<Arc<dyn SecretStore>>,
        obtain: impl Fn(
            &Credential,
            Option<&Arc<dyn SecretStore>>,
        ) -> Option<Arc<dyn ObtainedCredential>>,
    ) -> Self {
        let grants = grants
            .iter()
            .map(|grant| LiveGrant {
                grant: grant.clone(),
                obtained: grant
                    .credential
                    .as_ref()
                    .and_then(|credential| obtain(credential, secrets.as_ref())),
            })
            .collect();
        Self {
            entry: entry.into(),
            grants,
            limits: limits.clone(),
            transport,
            redactor,
            secrets,
            in_flight: Arc::new(Semaphore::new(limits.http_in_flight)),
        }
    }

    /// The per-call cap on open requests, for a new call's hooks.
    pub(crate) fn call_in_flight(&self) -> Arc<Semaphore> {
        Arc::new(Semaphore::new(self.limits.http_in_flight_per_call))
    }

    fn grant_for(&self, destination: &HttpDestination) -> Option<&LiveGrant> {
        self.grants.iter().find(|LiveGrant { grant: g, .. }| {
            g.destination.scheme == destination.scheme
                && g.destination.host == destination.host
                && g.destination.effective_port() == destination.effective_port()
        })
    }

    /// The span of one request. Made when the plugin hands the request
    /// over, because `wasi:http` then runs the send on a task of its own,
    /// which would not know the call's span.
    fn span(&self, request: &Request<WasiBody>) -> tracing::Span {
        let destination = destination_of(request.uri());
        let (scheme, host, port) = destination
            .as_ref()
            .map_or(("", "", 0), |d| (d.scheme.as_str(), d.host.as_str(), d.effective_port()));
        tracing::info_span!(
            "plugin.http",
            entry = %self.entry,
            method = %request.method(),
            scheme,
            host,
            port,
            status = tracing::field::Empty,
            error = tracing::field::Empty,
            elapsed_ms = tracing::field::Empty,
        )
    }

    /// Sends `request` inside `span` and records how it ended: the status,
    /// or the error, and the time to the response headers.
    async fn send(
        &self,
        request: Request<WasiBody>,
        options: Option<RequestOptions>,
        call: Arc<Semaphore>,
        span: &tracing::Span,
    ) -> Result<Response<WasiBody>, HttpError> {
        let started = Instant::now();
        // The path is in the request's debug line only, never in the span,
        // and that line's target is kept from trace exporters: their
        // retention is not the operator's logs'.
        let path = tracing::enabled!(target: REQUEST_LOG_TARGET, tracing::Level::DEBUG)
            .then(|| super::loggable::path_and_query(request.uri(), &self.redactor));
        let result = match destination_of(request.uri()) {
            Some(destination) => self.send_in_span(request, options, destination, call, span).await,
            None => Err(HttpError::HttpRequestUriInvalid),
        };
        let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        span.record("elapsed_ms", elapsed_ms);
        let path = path.as_deref().unwrap_or_default();
        match &result {
            Ok(response) => {
                let status = response.status().as_u16();
                tracing::debug!(target: REQUEST_LOG_TARGET, path, status, elapsed_ms, "answered");
            }
            Err(err) => {
                span.record("error", tracing::field::debug(err));
                tracing::debug!(target: REQUEST_LOG_TARGET, path, error = ?err, elapsed_ms, "no answer");
            }
        }
        result
    }

    async fn send_in_span(
        &self,
        request: Request<WasiBody>,
        options: Option<RequestOptions>,
        destination: HttpDestination,
        call: Arc<Semaphore>,
        span: &tracing::Span,
    ) -> Result<Response<WasiBody>, HttpError> {
        let method = request.method();
        if !ALLOWED_METHODS.contains(method) {
            tracing::warn!(
                "refused: plugins may send only GET, HEAD, POST, PUT, PATCH, DELETE and OPTIONS"
            );
            return Err(HttpError::HttpRequestMethodInvalid);
        }
        let Some(LiveGrant { grant, obtained }) = self.grant_for(&destination) else {
            tracing::warn!("refused: {destination} is not among the entry's HTTP grants");
            return Err(HttpError::HttpRequestDenied);
        };
        // Read as the transport reads it: it dials a literal without the
        // resolver, where the policy would otherwise apply.
        if let Some(ip) = literal_ip(&destination.host)
            && let Some(kind) = refused_kind(ip, &grant.allow_addresses)
        {
            tracing::warn!(
                "refused: {ip} is a {kind} address; add it to the grant's allowAddresses to allow it"
            );
            return Err(HttpError::DestinationIpProhibited);
        }
        let Ok(call_permit) = call.try_acquire_owned() else {
            tracing::warn!(
                "refused: the call already has {} requests open (limits.httpInFlightPerCall)",
                self.limits.http_in_flight_per_call
            );
            return Err(HttpError::ConnectionLimitReached);
        };
        let entry_permit = match tokio::time::timeout(
            self.limits.http_first_byte_timeout,
            Arc::clone(&self.in_flight).acquire_owned(),
        )
        .await
        {
            Ok(Ok(permit)) => permit,
            Ok(Err(_)) | Err(_) => {
                tracing::warn!(
                    "refused: the entry's {} requests (limits.httpInFlight) stayed open",
                    self.limits.http_in_flight
                );
                return Err(HttpError::ConnectionLimitReached);
            }
        };
        let open = InFlight { _call: call_permit, _entry: entry_permit };
        // Read while the request holds its permits, so the bodies the host
        // holds are bounded by the in-flight caps too.
        let (mut parts, body) = request.into_parts();
        let body = collect_limited(&parts.headers, body, self.limits.http_request_bytes).await?;
        // The forms of the credential put into the request, to be taken
        // out of its answer.
        let mut injected = None;
        if let Some(obtained) = obtained {
            match obtained.authorize(&*self.transport, grant, &self.limits, &self.redactor).await {
                Ok(value) => {
                    injected = reflected::InjectedSecret::of_header(value.as_bytes(), None);
                    parts.headers.insert(http::header::AUTHORIZATION, value);
                }
                Err(refusal) => return Ok(refusal),
            }
        }
        if let Some(Credential::Header(credential)) = &grant.credential {
            let read = secret::read_secret(&credential.secret, self.secrets.as_ref()).await;
            let secret = match read.map(String::from_utf8) {
                Ok(Ok(secret)) => secret,
                Ok(Err(_)) => {
                    tracing::error!(
                        "credential for {destination} unavailable: {} is not UTF-8 text",
                        credential.secret
                    );
                    return Ok(host_refusal::credential_unavailable(format!(
                        "the host's credential for {destination} is not a valid header value"
                    )));
                }
                Err(err) => {
                    tracing::error!("credential for {destination} unavailable: {err}");
                    return Ok(host_refusal::credential_unavailable(format!(
                        "the host could not read the credential for {destination}"
                    )));
                }
            };
            let secret = secret.trim_end_matches(['\n', '\r']);
            let value = credential.value_template.replace("{secret}", secret);
            self.redactor.remember(secret);
            self.redactor.remember(&value);
            let Ok(mut value) = HeaderValue::from_str(&value) else {
                tracing::error!(
                    "credential for {destination}: {} holds bytes that cannot appear in a header",
                    credential.secret
                );
                return Ok(host_refusal::credential_unavailable(format!(
                    "the host's credential for {destination} is not a valid header value"
                )));
            };
            value.set_sensitive(true);
            injected =
                reflected::InjectedSecret::of_header(value.as_bytes(), Some(secret.as_bytes()));
            parts.headers.insert(credential.header.clone(), value);
        }
        if grant.credential.is_some() {
            reflected::ask_identity(&mut parts.headers);
        }
        let request = Request::from_parts(parts, body);
        let options = options.unwrap_or_default();
        let policy = SendPolicy {
            allow_addresses: grant.allow_addresses.clone(),
            first_byte_timeout: shorter(
                options.first_byte_timeout,
                self.limits.http_first_byte_timeout,
            ),
            between_bytes_timeout: shorter(
                options.between_bytes_timeout,
                self.limits.http_first_byte_timeout,
            ),
        };
        let mut response = match self.transport.send(request, &policy).await {
            Ok(response) => response,
            Err(err) => {
                tracing::warn!("failed: {err:?}");
                return Err(err);
            }
        };
        super::reason_phrase::surface(&mut response);
        host_refusal::strip(&mut response);
        if let Some(injected) = injected {
            response = reflected::redact_response(response, injected)?;
        }
        span.record("status", response.status().as_u16());
        if response.status() == http::StatusCode::UNAUTHORIZED
            && let Some(obtained) = obtained
        {
            obtained.refused();
        }
        cap_response(response, self.limits.http_response_bytes, open)
    }
}

fn shorter(asked: Option<Duration>, limit: Duration) -> Duration {
    asked.map_or(limit, |asked| asked.min(limit))
}

/// Scheme, host (lower case, without brackets) and port of a request URI.
fn destination_of(uri: &http::Uri) -> Option<HttpDestination> {
    let scheme = uri.scheme_str()?.to_ascii_lowercase();
    let host = uri.host()?.trim_matches(['[', ']']).trim_end_matches('.').to_ascii_lowercase();
    Some(HttpDestination { scheme, host, port: uri.port_u16() })
}

/// The request body, read frame by frame and refused as soon as it passes
/// `limit` (or declares a longer length), so the host never holds more.
async fn collect_limited(
    headers: &http::HeaderMap,
    mut body: WasiBody,
    limit: u64,
) -> Result<Bytes, HttpError> {
    let too_big = |length: u64| {
        tracing::warn!(
            "refused: a request body of {length} bytes or more is over limits.httpRequestMiB \
             ({limit} bytes)"
        );
        HttpError::HttpRequestBodySize(Some(length))
    };
    let declared = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(length) = declared
        && length > limit
    {
        return Err(too_big(length));
    }
    let mut collected = bytes::BytesMut::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            let length = collected.len() as u64 + data.len() as u64;
            if length > limit {
                return Err(too_big(length));
            }
            collected.extend_from_slice(&data);
        }
    }
    Ok(collected.freeze())
}

/// Refuses a response whose declared length is over `limit` and cuts a body
/// that grows past it, so a plugin never buffers more than the cap.
/// `open` is held until the body ends or is dropped.
fn cap_response(
    response: Response<WasiBody>,
    limit: u64,
    open: InFlight,
) -> Result<Response<WasiBody>, HttpError> {
    let declared = response
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(length) = declared
        && length > limit
    {
        tracing::warn!("response of {length} bytes is over the cap of {limit}");
        return Err(HttpError::HttpResponseBodySize(Some(length)));
    }
    let (parts, body) = response.into_parts();
    let stream = futures::stream::unfold(
        (body, 0u64, false, open),
        move |(mut body, seen, done, open)| async move {
            if done {
                return None;
            }
            match body.frame().await {
                None => None,
                Some(Err(err)) => Some((Err(err), (body, seen, true, open))),
                Some(Ok(frame)) => {
                    let seen = seen + frame.data_ref().map_or(0, |d| d.len() as u64);
                    if seen > limit {
                        tracing::warn!("response body passed the cap of {limit} bytes");
                        let error = HttpError::HttpResponseBodySize(Some(seen));
                        Some((Err(error), (body, seen, true, open)))
                    } else {
                        Some((Ok(frame), (body, seen, false, open)))
                    }
                }
            }
        },
    );
    Ok(Response::from_parts(parts, StreamBody::new(stream).boxed_unsync()))
}

/// The `wasi:http` hooks of one call: routes every request through the
/// entry's [`EntryHttp`].
pub(crate) struct HttpHooks {
    pub(crate) http: Arc<EntryHttp>,
    /// This call's requests open now, up to `limits.http_in_flight_per_call`.
    pub(crate) in_flight: Arc<Semaphore>,
}

impl WasiHttpHooks for HttpHooks {
    fn send_request(
        &mut self,
        request: Request<WasiBody>,
        options: Option<RequestOptions>,
        _fut: Box<dyn Future<Output = Result<(), HttpError>> + Send>,
    ) -> Box<
        dyn Future<
                Output = wasmtime_wasi_http::Result<(
                    Response<WasiBody>,
                    Box<dyn Future<Output = Result<(), HttpError>> + Send>,
                )>,
            > + Send,
    > {
        let http = Arc::clone(&self.http);
        let call = Arc::clone(&self.in_flight);
        let span = http.span(&request);
        Box::new(async move {
            let response =
                http.send(request, options, call, &span).instrument(span.clone()).await?;
            let io_done: Box<dyn Future<Output = Result<(), HttpError>> + Send> =
                Box::new(async { Ok(()) });
            Ok((response, io_done))
        })
    }
}

/// The real transport: reqwest over rustls, one client per entry.
#[derive(Debug)]
pub struct ReqwestTransport {
    client: reqwest::Client,
}

impl ReqwestTransport {
    /// A client for an entry's HTTP grants: its CA bundle (`ca_file`), its
    /// grants' address policy in the DNS resolver, its connect timeout and
    /// in-flight limit, no redirects and no proxy from the environment.
    pub fn for_entry(
        grants: &[HttpGrant],
        ca_file: Option<&Path>,
        limits: &Limits,
    ) -> Result<Self, String> {
        let resolver = GrantResolver {
            allowed: grants
                .iter()
                .map(|g| (g.destination.host.clone(), g.allow_addresses.clone()))
                .collect(),
        };
        let mut builder = reqwest::Client::builder()
            .use_rustls_tls()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .connect_timeout(limits.http_connect_timeout)
            // Never more idle connections than the entry may have open.
            .pool_max_idle_per_host(limits.http_in_flight)
            .dns_resolver(Arc::new(resolver));
        if let Some(ca_file) = ca_file {
            let pem = std::fs::read(ca_file).map_err(|err| {
                format!("grants.caFile: cannot read {}: {err}", ca_file.display())
            })?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|err| {
                format!("grants.caFile: {} is not a PEM bundle: {err}", ca_file.display())
            })?;
            if certs.is_empty() {
                return Err(format!("grants.caFile: {} holds no certificate", ca_file.display()));
            }
            for cert in certs {
                builder = builder.add_root_certificate(cert);
            }
        }
        let client = builder.build().map_err(|err| format!("cannot build HTTP client: {err}"))?;
        Ok(Self { client })
    }
}

#[async_trait]
impl HttpTransport for ReqwestTransport {
    async fn send(
        &self,
        request: Request<Bytes>,
        policy: &SendPolicy,
    ) -> Result<Response<WasiBody>, HttpError> {
        let (parts, body) = request.into_parts();
        let url = reqwest::Url::parse(&parts.uri.to_string())
            .map_err(|_| HttpError::HttpRequestUriInvalid)?;
        let mut headers = parts.headers;
        // reqwest sets Host itself from the URL.
        headers.remove(http::header::HOST);
        let request = self.client.request(parts.method, url).headers(headers).body(body);
        let response = tokio::time::timeout(policy.first_byte_timeout, request.send())
            .await
            .map_err(|_| HttpError::ConnectionReadTimeout)?
            .map_err(|err| classify_reqwest(&err))?;
        let status = response.status();
        let headers = response.headers().clone();
        let reason = response.extensions().get::<hyper::ext::ReasonPhrase>().cloned();
        let between = policy.between_bytes_timeout;
        let chunks = response.bytes_stream();
        let stream = futures::stream::unfold(Box::pin(chunks), move |mut chunks| async move {
            match tokio::time::timeout(between, chunks.next()).await {
                Err(_) => Some((Err(HttpError::ConnectionReadTimeout), chunks)),
                Ok(None) => None,
                Ok(Some(Ok(data))) => Some((Ok(Frame::data(data)), chunks)),
                Ok(Some(Err(err))) => Some((Err(classify_reqwest(&err)), chunks)),
            }
        });
        let mut builder = Response::builder().status(status);
        if let Some(h) = builder.headers_mut() {
            *h = headers;
        }
        if let Some(reason) = reason {
            builder = builder.extension(reason);
        }
        builder
            .body(StreamBody::new(stream).boxed_unsync())
            .map_err(|err| HttpError::InternalError(Some(err.to_string())))
    }
}

fn classify_reqwest(err: &reqwest::Error) -> HttpError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(cause) = source {
        if let Some(refused) = cause.downcast_ref::<AddressRefused>() {
            tracing::warn!("refused: {refused}");
            return HttpError::DestinationIpProhibited;
        }
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            match io.kind() {
                std::io::ErrorKind::ConnectionRefused => return HttpError::ConnectionRefused,
                std::io::ErrorKind::TimedOut => return HttpError::ConnectionTimeout,
                _ => {}
            }
        }
        let text = cause.to_string();
        if text.contains("certificate") || text.contains("UnknownIssuer") {
            return HttpError::TlsCertificateError;
        }
        source = cause.source();
    }
    if err.is_timeout() {
        HttpError::ConnectionTimeout
    } else if err.is_connect() {
        HttpError::ConnectionRefused
    } else if err.is_body() || err.is_decode() {
        HttpError::HttpResponseIncomplete
    } else {
        HttpError::HttpProtocolError
    }
}

/// Every address a host name resolved to was refused by the policy.
#[derive(Debug)]
struct AddressRefused {
    host: String,
    refused: Vec<(IpAddr, AddressKind)>,
}

impl fmt::Display for AddressRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} resolves only to refused addresses:", self.host)?;
        for (ip, kind) in &self.refused {
            write!(f, " {ip} ({kind})")?;
        }
        f.write_str("; add the range to the grant's allowAddresses to allow it")
    }
}

impl std::error::Error for AddressRefused {}

/// Resolves host names and drops addresses the entry's grants do not allow,
/// so the address actually dialled is the one that was checked.
#[derive(Debug)]
struct GrantResolver {
    allowed: Vec<(String, Vec<IpNet>)>,
}

impl reqwest::dns::Resolve for GrantResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().trim_end_matches('.').to_ascii_lowercase();
        let allowed: Vec<IpNet> = self
            .allowed
            .iter()
            .filter(|(h, _)| *h == host)
            .flat_map(|(_, nets)| nets.iter().copied())
            .collect();
        Box::pin(async move {
            let resolved: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0))
                .await
                .map_err(|err| -> Box<dyn std::error::Error + Send + Sync> { Box::new(err) })?
                .collect();
            let mut refused = Vec::new();
            let mut usable = Vec::new();
            for addr in resolved {
                match refused_kind(addr.ip(), &allowed) {
                    Some(kind) => refused.push((addr.ip(), kind)),
                    None => usable.push(addr),
                }
            }
            if usable.is_empty() && !refused.is_empty() {
                return Err(Box::new(AddressRefused { host, refused }) as _);
            }
            Ok(Box::new(usable.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destinations_are_normalised() {
        let uri: http::Uri = "HTTPS://API.Example.COM./x".parse().unwrap();
        let d = destination_of(&uri).unwrap();
        assert_eq!(
            (d.scheme.as_str(), d.host.as_str(), d.port),
            ("https", "api.example.com", None)
        );
        let uri: http::Uri = "http://[::1]:8080/".parse().unwrap();
        assert_eq!(destination_of(&uri).unwrap().host, "::1");
    }
}

impl EntryHttp {
    /// The capability of a call made before any entry is bound (`describe`):
    /// no grants, so every request is refused.
    pub(crate) fn for_describe(transport: Arc<dyn HttpTransport>) -> Self {
        Self {
            entry: "".into(),
            grants: Vec::new(),
            limits: Limits::default(),
            transport,
            redactor: Arc::new(Redactor::default()),
            secrets: None,
            in_flight: Arc::new(Semaphore::new(1)),
        }
    }
}

/// A transport that is never reached: stands in where no grant exists.
#[derive(Debug)]
pub(crate) struct DenyAll;

#[async_trait]
impl HttpTransport for DenyAll {
    async fn send(
        &self,
        _request: Request<Bytes>,
        _policy: &SendPolicy,
    ) -> Result<Response<WasiBody>, HttpError> {
        Err(HttpError::HttpRequestDenied)
    }
}

/// A response body holding `bytes` in one frame.
pub fn full_body(bytes: Bytes) -> WasiBody {
    http_body_util::Full::new(bytes).map_err(|never| match never {}).boxed_unsync()
}
