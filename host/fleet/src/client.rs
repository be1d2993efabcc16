//! A minimal client of the discovery API, for the command line (`proxyfleet
//! plugin rollback`) and tests: one request per connection, plain HTTP.

use bytes::Bytes;
use http::{Method, Request, header};
use http_body_util::{BodyExt as _, Full};
use hyper_util::rt::TokioIo;

/// Sends `method path` with an optional JSON `body` and bearer `token` to
/// the API at `base` (`http://host:port`); answers (status, body).
pub async fn call(
    base: &str,
    method: Method,
    path: &str,
    body: Option<&str>,
    token: Option<&str>,
) -> Result<(u16, String), String> {
    let uri: http::Uri = base
        .parse()
        .map_err(|err| format!("{base:?} is not a URL ({err}); use http://host:port"))?;
    if uri.scheme_str() != Some("http") {
        return Err(format!("{base:?}: the API speaks plain http://"));
    }
    let authority = uri.authority().ok_or_else(|| format!("{base:?} has no host"))?.clone();
    let port = authority.port_u16().unwrap_or(80);
    let stream = tokio::net::TcpStream::connect((authority.host(), port))
        .await
        .map_err(|err| format!("cannot connect to {authority}: {err}"))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|err| err.to_string())?;
    tokio::spawn(connection);
    let mut request = Request::builder()
        .method(method)
        .uri(path)
        .header(header::HOST, authority.as_str())
        .header(header::CONTENT_TYPE, "application/json");
    if let Some(token) = token {
        request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let request = request
        .body(Full::new(Bytes::from(body.unwrap_or("").to_owned())))
        .map_err(|err| err.to_string())?;
    let response = sender.send_request(request).await.map_err(|err| err.to_string())?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.map_err(|err| err.to_string())?.to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}
