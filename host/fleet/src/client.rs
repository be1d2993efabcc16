//! A minimal client of the discovery API, for the command line (`proxyfleet
//! plugin rollback`) and tests: plain HTTP, no proxy from the environment.

use http::{Method, header};

/// Why a call got no answer.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// `base` is not an `http://host:port` URL.
    #[error("{base:?} is not a plain http://host:port URL: {reason}")]
    Url {
        /// What was given.
        base: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No answer from the API (connection, protocol).
    #[error("no answer from {base}: {source}")]
    Send {
        /// Where it was sent.
        base: String,
        /// The transport's error.
        source: reqwest::Error,
    },
}

/// Sends `method path` with an optional JSON `body` and bearer `token` to
/// the API at `base` (`http://host:port`); answers (status, body).
pub async fn call(
    base: &str,
    method: Method,
    path: &str,
    body: Option<&str>,
    token: Option<&str>,
) -> Result<(u16, String), CallError> {
    let url_error = |reason: String| CallError::Url { base: base.to_owned(), reason };
    let url = reqwest::Url::parse(base).map_err(|err| url_error(err.to_string()))?;
    if url.scheme() != "http" {
        return Err(url_error("the API speaks plain http://".to_owned()));
    }
    let url = url.join(path).map_err(|err| url_error(format!("path {path:?}: {err}")))?;
    let send_error = |source| CallError::Send { base: base.to_owned(), source };
    // The API is on loopback or in the cluster: a proxy from the
    // environment would only be in the way.
    let client = reqwest::Client::builder().no_proxy().build().map_err(send_error)?;
    let mut request = client
        .request(method, url)
        .header(header::CONTENT_TYPE, "application/json")
        .body(body.unwrap_or("").to_owned());
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.map_err(send_error)?;
    let status = response.status().as_u16();
    let body = response.text().await.map_err(send_error)?;
    Ok((status, body))
}
