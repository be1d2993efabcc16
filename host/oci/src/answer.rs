//! A registry's answers read with a bound: a body is read whole only up to
//! a size fixed before the request (a manifest, a token, an error's
//! account), and a status that is not success becomes the registry
//! client's error, as oci-client reports it (its own conversion is private).
//!
//! A body declared larger than its bound is refused before any of it is
//! read; one without a declaration is cut off at the bound. Either way an
//! answer costs the bound and at most one chunk of the transport's buffer,
//! whatever the registry sends.

use futures::{Stream, StreamExt as _};
use oci_client::errors::{OciDistributionError, OciEnvelope};
use reqwest_oci::{Response, StatusCode};

/// The most of an error's body kept for its account.
const ERROR_BODY_BYTES: u64 = 64 << 10;

/// How a body went past its bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overrun {
    /// Its `Content-Length` declared this many bytes; none was read.
    Declared(u64),
    /// It was cut off once this many bytes had arrived.
    Read(u64),
}

impl std::fmt::Display for Overrun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Declared(size) => write!(f, "declares {size} bytes"),
            Self::Read(size) => write!(f, "was cut off after {size} bytes"),
        }
    }
}

/// Why a bounded read stopped.
#[derive(Debug)]
pub(crate) enum BoundedError<E> {
    /// The body is larger than the bound.
    Over(Overrun),
    /// The transport failed.
    Transport(E),
}

/// Reads `chunks` whole if they fit in `bound` bytes: refused unread when
/// `declared` is larger, cut off as soon as they run past it.
pub(crate) async fn read_bounded<B: AsRef<[u8]>, E>(
    declared: Option<u64>,
    chunks: impl Stream<Item = Result<B, E>>,
    bound: u64,
) -> Result<Vec<u8>, BoundedError<E>> {
    if let Some(size) = declared
        && size > bound
    {
        return Err(BoundedError::Over(Overrun::Declared(size)));
    }
    let mut chunks = std::pin::pin!(chunks);
    let mut body = Vec::with_capacity(usize::try_from(declared.unwrap_or(0)).unwrap_or(0));
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(BoundedError::Transport)?;
        let chunk = chunk.as_ref();
        let size = body.len() as u64 + chunk.len() as u64;
        if size > bound {
            return Err(BoundedError::Over(Overrun::Read(size)));
        }
        body.extend_from_slice(chunk);
    }
    Ok(body)
}

/// A response body read whole within `bound`.
pub(crate) async fn read_response(
    response: Response,
    bound: u64,
) -> Result<Vec<u8>, BoundedError<reqwest_oci::Error>> {
    read_bounded(response.content_length(), response.bytes_stream(), bound).await
}

/// The error a registry's answer that is not `200 OK` stands for, with its
/// account read up to a bound; `url` is the request's, without its query.
pub(crate) async fn refusal(response: Response) -> OciDistributionError {
    let status = response.status();
    let url = shown_url(response.url());
    if status == StatusCode::UNAUTHORIZED {
        return OciDistributionError::UnauthorizedError { url };
    }
    let body = match account(response).await {
        Ok(body) => body,
        Err(err) => return OciDistributionError::RequestError(err),
    };
    if status.is_success() {
        return OciDistributionError::SpecViolationError(format!(
            "expected HTTP status 200 OK, got {status}"
        ));
    }
    if status.is_client_error()
        && let Ok(envelope) = serde_json::from_slice::<OciEnvelope>(&body)
    {
        return OciDistributionError::RegistryError { envelope, url };
    }
    OciDistributionError::ServerError {
        code: status.as_u16(),
        url,
        message: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// The body of an answer that is not success, as its account: up to a
/// bound, past which only its size is told.
pub(crate) async fn account(response: Response) -> Result<Vec<u8>, reqwest_oci::Error> {
    match read_response(response, ERROR_BODY_BYTES).await {
        Ok(body) => Ok(body),
        Err(BoundedError::Over(over)) => Ok(format!("(an account that {over})").into_bytes()),
        Err(BoundedError::Transport(err)) => Err(without_query(err)),
    }
}

/// `url` as errors show it: without user, password, query or fragment,
/// where a storage service's signed URL keeps its signature.
pub(crate) fn shown_url(url: &reqwest_oci::Url) -> String {
    let mut url = url.clone();
    let _ = url.set_username("");
    let _ = url.set_password(None);
    url.set_query(None);
    url.set_fragment(None);
    url.to_string()
}

/// A transport error whose URL is shown as [`shown_url`] shows it.
pub(crate) fn without_query(mut err: reqwest_oci::Error) -> reqwest_oci::Error {
    if let Some(url) = err.url_mut() {
        *url = reqwest_oci::Url::parse(&shown_url(url)).unwrap_or_else(|_| url.clone());
    }
    err
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    /// A body of `total` bytes in `chunk`-byte pieces that counts what was
    /// taken from it.
    fn counted(
        total: u64,
        chunk: usize,
    ) -> (impl Stream<Item = Result<Vec<u8>, std::io::Error>>, Arc<AtomicU64>) {
        let taken = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&taken);
        let stream = futures::stream::unfold(0u64, move |sent| {
            let counter = Arc::clone(&counter);
            async move {
                if sent >= total {
                    return None;
                }
                let size = (chunk as u64).min(total - sent);
                counter.fetch_add(size, Ordering::Relaxed);
                Some((Ok(vec![b'{'; size as usize]), sent + size))
            }
        });
        (stream, taken)
    }

    const BOUND: u64 = 4 << 20;

    /// Issue 43, item 6: a body declared larger than the bound is refused
    /// before any of it is read, and one without a declaration is cut off
    /// at the bound.
    #[tokio::test]
    async fn issue_43_item_6_a_body_over_its_bound_is_refused_unread_or_cut_off() {
        let (stream, taken) = counted(512 << 20, 64 << 10);
        let err = read_bounded(Some(512 << 20), stream, BOUND).await.unwrap_err();
        assert!(matches!(err, BoundedError::Over(Overrun::Declared(size)) if size == 512 << 20));
        assert_eq!(taken.load(Ordering::Relaxed), 0, "nothing read");

        let (stream, taken) = counted(512 << 20, 64 << 10);
        let err = read_bounded(None, stream, BOUND).await.unwrap_err();
        let read = taken.load(Ordering::Relaxed);
        assert!(matches!(err, BoundedError::Over(Overrun::Read(size)) if size == read));
        assert_eq!(read, BOUND + (64 << 10), "one chunk past the bound, then no more");

        // A body that lies in its declaration is cut off all the same.
        let (stream, _) = counted(BOUND + 1, 64 << 10);
        let err = read_bounded(Some(10), stream, BOUND).await.unwrap_err();
        assert!(matches!(err, BoundedError::Over(Overrun::Read(_))));

        let (stream, _) = counted(BOUND, 64 << 10);
        assert_eq!(read_bounded(Some(BOUND), stream, BOUND).await.unwrap().len() as u64, BOUND);
    }

    #[test]
    fn urls_in_errors_keep_no_signature() {
        let url = reqwest_oci::Url::parse(
            "https://user:pw@bucket.s3.amazonaws.com/blob?X-Amz-Signature=abc#frag",
        )
        .unwrap();
        assert_eq!(shown_url(&url), "https://bucket.s3.amazonaws.com/blob");
    }
}
