//! One health probe: HTTP requests through a proxy's port to a check
//! target, the way a crawler would use the proxy.
//!
//! A plain `GET` is sent in absolute form (`GET http://target/path`), which
//! is how clients speak to a forward proxy; `CONNECT` opens a tunnel to the
//! target and the same `GET` goes through it in origin form, which is how
//! HTTPS traffic uses the proxy. A target that answers with JSON carrying
//! `ip` (the operator's own `/v1/echo` does) tells the probe the proxy's
//! exit address.

use std::net::SocketAddr;
use std::pin::pin;
use std::str::FromStr as _;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderValue, Method, Request, StatusCode, header};
use http_body_util::{BodyExt as _, Empty, Limited};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::endpoint::Endpoint;
use crate::error::{Error, Result};

/// Bodies longer than this are not the check target's answer.
const MAX_BODY: usize = 4096;

/// Where probes go through the proxy to: a plain-HTTP URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckTarget {
    /// `host:port`, as sent in the request line and `Host`.
    authority: String,
    /// Path and query, starting with `/`.
    path: String,
}

impl CheckTarget {
    /// Parses `http://host[:port][/path]`; `setting` names the flag or key
    /// in the error.
    pub fn parse(setting: &str, url: &str) -> Result<Self> {
        let uri = http::Uri::from_str(url).map_err(|err| {
            Error::setting(
                setting,
                format!("{url:?} is not a URL ({err}); use http://host:port/path"),
            )
        })?;
        if uri.scheme_str() != Some("http") {
            return Err(Error::setting(
                setting,
                format!(
                    "{url:?} must be a plain http:// URL: the probe sends it through the proxy \
                     in absolute form and through a CONNECT tunnel without TLS"
                ),
            ));
        }
        let Some(authority) = uri.authority() else {
            return Err(Error::setting(setting, format!("{url:?} has no host")));
        };
        let authority = match authority.port_u16() {
            Some(_) => authority.to_string(),
            None => format!("{}:80", authority.host()),
        };
        let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
        Ok(Self { authority, path })
    }

    /// The target as a URL.
    pub fn url(&self) -> String {
        format!("http://{}{}", self.authority, self.path)
    }
}

/// Which requests a probe sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProbeMode {
    /// An absolute-form GET only.
    Get,
    /// A CONNECT tunnel only.
    Connect,
    /// Both; the probe passes only when both do.
    #[default]
    Both,
}

impl ProbeMode {
    /// Parses `get`, `connect` or `both`.
    pub fn parse(setting: &str, text: &str) -> Result<Self> {
        match text {
            "get" => Ok(Self::Get),
            "connect" => Ok(Self::Connect),
            "both" => Ok(Self::Both),
            other => Err(Error::setting(
                setting,
                format!("{other:?} is not a mode; use get, connect or both"),
            )),
        }
    }
}

/// A passing probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbePass {
    /// From the first byte sent to the last byte of the slower request.
    pub latency: Duration,
    /// The exit address the check target saw, when it says.
    pub exit_ip: Option<String>,
}

/// Why a probe failed, for people: it becomes the proxy's `lastError`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ProbeFailure(pub String);

/// Probes the proxy at `endpoint`, with its credential when it asks for
/// one. The caller bounds the time.
pub async fn probe(
    endpoint: &Endpoint,
    target: &CheckTarget,
    mode: ProbeMode,
) -> Result<ProbePass, ProbeFailure> {
    let started = Instant::now();
    let proxy = endpoint.addr();
    let authorization = endpoint.proxy_authorization();
    let mut exit_ip = None;
    if matches!(mode, ProbeMode::Get | ProbeMode::Both) {
        exit_ip = probe_get(proxy, authorization.clone(), target).await?;
    }
    if matches!(mode, ProbeMode::Connect | ProbeMode::Both) {
        let tunnelled = probe_connect(proxy, authorization, target).await?;
        exit_ip = exit_ip.or(tunnelled);
    }
    Ok(ProbePass { latency: started.elapsed(), exit_ip })
}

async fn dial(proxy: SocketAddr) -> Result<TcpStream, ProbeFailure> {
    let stream = TcpStream::connect(proxy)
        .await
        .map_err(|err| ProbeFailure(format!("cannot connect to the proxy port {proxy}: {err}")))?;
    // Probes are tiny request/response pairs: Nagle would only add delay.
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// What a 407 means here.
fn credential_hint(status: StatusCode) -> &'static str {
    if status == StatusCode::PROXY_AUTHENTICATION_REQUIRED {
        " (the proxy wants a credential, or not the one the Proxy names: see spec.proxyAuthFile or spec.proxyAuthSecretRef)"
    } else {
        ""
    }
}

async fn probe_get(
    proxy: SocketAddr,
    authorization: Option<HeaderValue>,
    target: &CheckTarget,
) -> Result<Option<String>, ProbeFailure> {
    let stream = dial(proxy).await?;
    let mut request = Request::builder()
        .method(Method::GET)
        .uri(target.url())
        .header(header::HOST, &target.authority)
        .header(header::CONNECTION, "close")
        .body(Empty::<Bytes>::new())
        .map_err(|err| ProbeFailure(format!("cannot build the probe request: {err}")))?;
    if let Some(value) = authorization {
        request.headers_mut().insert(header::PROXY_AUTHORIZATION, value);
    }
    let (status, body) = exchange(TokioIo::new(stream), request)
        .await
        .map_err(|err| ProbeFailure(format!("GET through the proxy: {err}")))?;
    if !status.is_success() {
        return Err(ProbeFailure(format!(
            "GET {} through the proxy answered {status}{}",
            target.url(),
            credential_hint(status)
        )));
    }
    Ok(exit_ip(&body))
}

async fn probe_connect(
    proxy: SocketAddr,
    authorization: Option<HeaderValue>,
    target: &CheckTarget,
) -> Result<Option<String>, ProbeFailure> {
    let stream = dial(proxy).await?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|err| ProbeFailure(format!("CONNECT: {err}")))?;
    let mut request = Request::builder()
        .method(Method::CONNECT)
        .uri(&target.authority)
        .header(header::HOST, &target.authority)
        .body(Empty::<Bytes>::new())
        .map_err(|err| ProbeFailure(format!("cannot build the CONNECT request: {err}")))?;
    if let Some(value) = authorization {
        request.headers_mut().insert(header::PROXY_AUTHORIZATION, value);
    }
    let connection = connection.with_upgrades();
    let tunnel = async {
        let response = sender
            .send_request(request)
            .await
            .map_err(|err| format!("CONNECT {}: {err}", target.authority))?;
        if response.status() != StatusCode::OK {
            let hint = match credential_hint(response.status()) {
                "" => " (does the proxy allow CONNECT to that port?)",
                hint => hint,
            };
            return Err(format!(
                "CONNECT {} answered {}{hint}",
                target.authority,
                response.status()
            ));
        }
        hyper::upgrade::on(response)
            .await
            .map_err(|err| format!("CONNECT {}: the tunnel did not open: {err}", target.authority))
    };
    let upgraded = drive(connection, tunnel).await.map_err(ProbeFailure)?;
    let request = Request::builder()
        .method(Method::GET)
        .uri(&target.path)
        .header(header::HOST, &target.authority)
        .header(header::CONNECTION, "close")
        .body(Empty::<Bytes>::new())
        .map_err(|err| ProbeFailure(format!("cannot build the probe request: {err}")))?;
    let (status, body) = exchange(upgraded, request)
        .await
        .map_err(|err| ProbeFailure(format!("GET through the CONNECT tunnel: {err}")))?;
    if !status.is_success() {
        return Err(ProbeFailure(format!(
            "GET {} through the CONNECT tunnel answered {status}",
            target.url()
        )));
    }
    Ok(exit_ip(&body))
}

/// Sends one request on a fresh HTTP/1 connection over `io` and reads the
/// whole (bounded) body.
async fn exchange<T>(io: T, request: Request<Empty<Bytes>>) -> Result<(StatusCode, Bytes), String>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(io).await.map_err(|err| err.to_string())?;
    let exchange = async {
        let response: hyper::Response<Incoming> =
            sender.send_request(request).await.map_err(|err| err.to_string())?;
        let status = response.status();
        let body = Limited::new(response.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|err| format!("reading the answer: {err}"))?
            .to_bytes();
        Ok((status, body))
    };
    drive(connection, exchange).await
}

/// Polls `work` while driving the connection it talks over. The connection
/// is polled in this future rather than a spawned task, so a probe that
/// times out and is dropped leaves nothing running behind it.
async fn drive<C, W, T>(connection: C, work: W) -> Result<T, String>
where
    C: Future<Output = hyper::Result<()>>,
    W: Future<Output = Result<T, String>>,
{
    let mut connection = pin!(connection);
    let mut work = pin!(work);
    tokio::select! {
        result = &mut work => result,
        ended = &mut connection => match ended {
            // Closed after a complete answer (or handed over to an
            // upgrade): what was read is still there for `work`.
            Ok(()) => work.await,
            Err(err) => Err(err.to_string()),
        },
    }
}

/// The `ip` of a JSON answer, or the whole body when it is one address.
fn exit_ip(body: &[u8]) -> Option<String> {
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(body) {
        return value.get("ip").and_then(|ip| ip.as_str()).map(str::to_owned);
    }
    let text = std::str::from_utf8(body).ok()?.trim();
    text.parse::<std::net::IpAddr>().ok().map(|ip| ip.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_into_authority_and_path() {
        let target =
            CheckTarget::parse("--health-target", "http://127.0.0.1:9465/v1/echo").unwrap();
        assert_eq!(target.authority, "127.0.0.1:9465");
        assert_eq!(target.path, "/v1/echo");
        let target = CheckTarget::parse("--health-target", "http://check.example").unwrap();
        assert_eq!(target.url(), "http://check.example:80/");
        let err = CheckTarget::parse("--health-target", "https://check.example/").unwrap_err();
        assert!(err.to_string().starts_with("--health-target: "), "{err}");
        assert!(err.to_string().contains("plain http://"), "{err}");
        assert!(CheckTarget::parse("--health-target", "not a url").is_err());
    }

    #[test]
    fn the_exit_address_comes_from_json_or_a_bare_address() {
        assert_eq!(exit_ip(br#"{"ip":"203.0.113.9","port":4000}"#).as_deref(), Some("203.0.113.9"));
        assert_eq!(exit_ip(b"2001:db8::1\n").as_deref(), Some("2001:db8::1"));
        assert_eq!(exit_ip(b"<html>hello</html>"), None);
        assert_eq!(exit_ip(br#"{"origin":"x"}"#), None);
    }

    #[test]
    fn modes_parse_and_name_the_choices() {
        assert_eq!(ProbeMode::parse("m", "both").unwrap(), ProbeMode::Both);
        let err = ProbeMode::parse("--health-mode", "head").unwrap_err().to_string();
        assert!(err.contains("get, connect or both"), "{err}");
    }
}
