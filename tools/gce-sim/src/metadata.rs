//! The metadata server's token endpoint, as a pod on GKE with Workload
//! Identity (or a VM with an attached service account) sees it: plain
//! HTTP, `GET /computeMetadata/v1/instance/service-accounts/{account}/token`
//! with an optional `scopes` list, answering `{"access_token",
//! "expires_in", "token_type"}` for the bound service account. As the real
//! one, it refuses requests without `Metadata-Flavor: Google` and requests
//! that came through a proxy (`X-Forwarded-For`), marks every answer with
//! `Metadata-Flavor: Google`, and hands out the same token until it is
//! close to expiry, its `expires_in` counting down. `/email` names the
//! account. [`crate::Faults::metadata_iam_denied`] answers as GKE does when
//! the Kubernetes service account may not act as the Google one, and
//! [`crate::Faults::metadata_down`] as a metadata server that is not ready.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};

use crate::state::Shared;

const PREFIX: &str = "/computeMetadata/v1/instance/service-accounts/";
/// A cached token is handed out until this long before it expires (the
/// metadata server refreshes its tokens five minutes ahead).
const REFRESH_AHEAD: Duration = Duration::from_secs(300);

/// The account bound to the "pod", and the token it was last given.
#[derive(Debug)]
pub(crate) struct Metadata {
    email: String,
    cached: Mutex<Option<Cached>>,
}

#[derive(Debug, Clone)]
struct Cached {
    token: String,
    scopes: Vec<String>,
    expires_at: Instant,
    lifetime: Duration,
}

fn text(status: u16, body: String) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("metadata-flavor", "Google")
        .header("content-type", "text/html; charset=UTF-8")
        .body(Full::new(Bytes::from(body)))
        .expect("a valid response")
}

impl Metadata {
    pub(crate) fn new(email: String) -> Self {
        Self { email, cached: Mutex::new(None) }
    }

    pub(crate) async fn handle(
        &self,
        shared: &Arc<Shared>,
        request: Request<Incoming>,
    ) -> Response<Full<Bytes>> {
        let path = request.uri().path().to_owned();
        let line = match request.uri().query() {
            Some(query) => format!("GET {path}?{query}"),
            None => format!("GET {path}"),
        };
        shared.record_request(format!("metadata {line}"), false);
        let faults = shared.faults();
        let headers = request.headers();
        if headers.get("metadata-flavor").and_then(|v| v.to_str().ok()) != Some("Google") {
            return text(
                403,
                format!(
                    "Your client does not have permission to get URL {path} from this server. \
                     Missing Metadata-Flavor:Google header.\n"
                ),
            );
        }
        if headers.contains_key("x-forwarded-for") {
            return text(
                403,
                format!(
                    "Your client does not have permission to get URL {path} from this server. \
                     Request had an X-Forwarded-For header and was rejected.\n"
                ),
            );
        }
        if faults.metadata_down {
            return text(503, "Metadata server is not ready yet.\n".to_owned());
        }
        let Some(rest) = path.strip_prefix(PREFIX) else {
            return text(404, format!("{path} was not found on this server.\n"));
        };
        let (account, item) = rest.split_once('/').unwrap_or((rest, ""));
        if account != "default" && account != self.email {
            return text(404, format!("{path} was not found on this server.\n"));
        }
        match item {
            "email" => text(200, self.email.clone()),
            "token" => {
                if faults.metadata_iam_denied {
                    return text(
                        403,
                        format!(
                            "Unable to generate access token; IAM returned 403 Forbidden: \
                             Permission 'iam.serviceAccounts.getAccessToken' denied on resource \
                             (or it may not exist).\nThis error could be caused by a missing IAM \
                             policy binding on the target IAM service account.\nFor more \
                             information, refer to the Workload Identity documentation:\n\t\
                             https://cloud.google.com/kubernetes-engine/docs/how-to/workload-identity\n\n\
                             {}\n",
                            self.email
                        ),
                    );
                }
                let scopes = request
                    .uri()
                    .query()
                    .and_then(|query| {
                        query.split('&').find_map(|pair| pair.strip_prefix("scopes="))
                    })
                    .map(|list| {
                        crate::api::percent_decode(list)
                            .split(',')
                            .filter(|scope| !scope.is_empty())
                            .map(str::to_owned)
                            .collect::<Vec<_>>()
                    })
                    .filter(|scopes| !scopes.is_empty())
                    .unwrap_or_else(|| vec![crate::CLOUD_PLATFORM_SCOPE.to_owned()]);
                let (token, expires_in) = self.token(shared, scopes);
                let body = serde_json::json!({
                    "access_token": token,
                    "expires_in": expires_in.as_secs().max(1),
                    "token_type": "Bearer",
                });
                Response::builder()
                    .status(200)
                    .header("metadata-flavor", "Google")
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(body.to_string())))
                    .expect("a valid response")
            }
            _ => text(404, format!("{path} was not found on this server.\n")),
        }
    }

    /// The cached token for `scopes` while it is far enough from expiry,
    /// else a new one; and how long it has left.
    fn token(&self, shared: &Shared, scopes: Vec<String>) -> (String, Duration) {
        let mut cached = self.cached.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = Instant::now();
        if let Some(token) = cached.as_ref()
            && token.scopes == scopes
            && token.expires_at > now + REFRESH_AHEAD.min(token.lifetime / 2)
        {
            return (token.token.clone(), token.expires_at - now);
        }
        let (token, lifetime) = shared.oauth.issue(&self.email, scopes.clone());
        *cached =
            Some(Cached { token: token.clone(), scopes, expires_at: now + lifetime, lifetime });
        (token, lifetime)
    }
}

/// Serves the metadata endpoint over plain HTTP on `listener` until
/// aborted.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    metadata: Arc<Metadata>,
    shared: Arc<Shared>,
) {
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let (metadata, shared) = (Arc::clone(&metadata), Arc::clone(&shared));
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let (metadata, shared) = (Arc::clone(&metadata), Arc::clone(&shared));
                async move { Ok::<_, std::convert::Infallible>(metadata.handle(&shared, request).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
    }
}
