//! A simulator's HTTPS endpoint: TLS from PEM strings, one task per
//! connection, and a way for a handler to drop the connection on purpose.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// Returned by a handler to make hyper drop the connection (a lost
/// response, an upload cut off), as fault injection asks.
#[derive(Debug)]
pub struct DropConnection;

impl std::fmt::Display for DropConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection dropped by fault injection")
    }
}

impl std::error::Error for DropConnection {}

/// A TLS acceptor presenting `cert_pem` (a chain) with `key_pem`; the
/// error says which part is wrong.
pub fn tls_acceptor(cert_pem: &str, key_pem: &str) -> Result<tokio_rustls::TlsAcceptor, String> {
    use rustls::pki_types::pem::PemObject;
    let certs = rustls::pki_types::CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| format!("certificate PEM: {error}"))?;
    let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
        .map_err(|error| format!("key PEM: {error}"))?;
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|error| error.to_string())?
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .map_err(|error| error.to_string())?;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// Accepts TLS connections on `listener` and answers each request with
/// `handle` until the task is aborted.
pub async fn serve<H, F>(listener: TcpListener, tls: tokio_rustls::TlsAcceptor, handle: H)
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Result<Response<Full<Bytes>>, DropConnection>> + Send + 'static,
{
    loop {
        let Ok((stream, _)) = listener.accept().await else { return };
        let (tls, handle) = (tls.clone(), handle.clone());
        tokio::spawn(async move {
            let Ok(stream) = tls.accept(stream).await else { return };
            let service = hyper::service::service_fn(handle);
            // Errors end only this connection (a dropped one on purpose).
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
