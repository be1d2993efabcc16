//! Google access tokens, kept entirely in the host.
//!
//! A grant with a Google credential gets `Authorization: Bearer <access
//! token>` on every request. The token comes from one of two sources:
//! - `kind: google-service-account` ([`service_account`]): a JSON key
//!   file, exchanged at its `token_uri` by the JWT-bearer grant;
//! - `kind: google-metadata` ([`metadata`]): the metadata server, for the
//!   VM's service account or the one a GKE pod is bound to by Workload
//!   Identity, with no key at all.
//!
//! Either way the host keeps the token until shortly before it expires,
//! and the plugin sees neither a key nor a token.
//!
//! When no token can be had, the plugin's request is not sent: the host
//! answers it with a Google-style JSON error, 401 `UNAUTHENTICATED` when
//! the credential is unusable or refused (the plugin reports
//! `unauthorized` with the reason) or 503 `UNAVAILABLE` when the token
//! source cannot be reached (retried as transient). Neither keys nor
//! tokens appear in those answers or in logs; tokens are also handed to
//! the entry's redactor, in case a backend echoes one back.

mod metadata;
mod service_account;

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};
use proxyfleet_core::secret_store::SecretStore;
use serde_json::json;

use super::Redactor;
use super::http::config::{Credential, GoogleCredential, GoogleMetadataCredential, HttpGrant};
use super::http::host_refusal::{self, HostRefusal};
use super::http::{HttpTransport, ObtainedCredential, WasiBody, full_body};
use crate::limits::Limits;

/// A token is renewed this long before it expires, so that a request never
/// leaves with one that runs out on the way.
const REFRESH_MARGIN: Duration = Duration::from_secs(60);
/// A plugin decides which requests are sent, so it can draw any number of
/// 401s. A 401 marks the token stale, but a stale token is exchanged again
/// at most once per this interval (the first time at once), and a failed
/// exchange is answered from memory for as long: no plugin can make the
/// host hammer the token endpoint.
const EXCHANGE_INTERVAL: Duration = Duration::from_secs(10);
/// Largest token answer read.
const MAX_TOKEN_RESPONSE: usize = 64 * 1024;
/// The error domain of the answers the host makes up itself.
const HOST_DOMAIN: &str = "proxyfleet.host";

/// The Google credential of one grant, with its cached token.
pub struct GoogleAccessToken {
    source: Source,
    /// Held across an exchange, so concurrent calls wait for one token
    /// instead of each fetching their own.
    state: tokio::sync::Mutex<TokenState>,
}

/// Where tokens come from.
#[derive(Debug)]
enum Source {
    ServiceAccount(service_account::ServiceAccount),
    Metadata(metadata::MetadataServer),
}

/// A token just obtained.
struct Fetched {
    token: String,
    lifetime: Duration,
    /// The account it is for, for the log.
    account: String,
}

impl Source {
    async fn fetch(
        &self,
        transport: &dyn HttpTransport,
        grant: &HttpGrant,
        limits: &Limits,
    ) -> Result<Fetched, TokenError> {
        match self {
            Source::ServiceAccount(account) => account.fetch(transport, grant, limits).await,
            Source::Metadata(server) => server.fetch(limits).await,
        }
    }

    /// What the log names: a file or a server, never a secret.
    fn describe(&self) -> String {
        match self {
            Source::ServiceAccount(account) => account.describe(),
            Source::Metadata(server) => format!(
                "the metadata server {} (account {})",
                server.config.metadata_host, server.config.service_account
            ),
        }
    }
}

/// The token and what limits how often it is exchanged.
#[derive(Default)]
struct TokenState {
    token: Option<CachedToken>,
    /// The API refused the token (401) since it was obtained.
    stale: bool,
    /// When a stale token was last exchanged early.
    last_forced: Option<Instant>,
    /// The last exchange failed, then, and why.
    failure: Option<(Instant, TokenError)>,
    /// Tokens replaced before they expired, with when they do: still
    /// redacted until then, since a backend may have echoed one to the
    /// plugin.
    retired: Vec<(String, Instant)>,
}

impl TokenState {
    /// Moves the current token to the retired ones, and forgets those that
    /// expired.
    fn retire(&mut self, now: Instant, redactor: &Redactor) {
        if let Some(old) = self.token.take() {
            self.retired.push((old.token, old.expires_at));
        }
        self.retired.retain(|(token, expires_at)| {
            let live = now < *expires_at;
            if !live {
                redactor.forget(token);
                redactor.forget(&format!("Bearer {token}"));
            }
            live
        });
    }
}

struct CachedToken {
    token: String,
    header: HeaderValue,
    refresh_at: Instant,
    expires_at: Instant,
}

#[async_trait::async_trait]
impl ObtainedCredential for GoogleAccessToken {
    async fn authorize(
        &self,
        transport: &dyn HttpTransport,
        grant: &HttpGrant,
        limits: &Limits,
        redactor: &Redactor,
    ) -> Result<HeaderValue, Response<WasiBody>> {
        GoogleAccessToken::authorize(self, transport, grant, limits, redactor).await
    }

    fn refused(&self) {
        self.token_refused();
    }
}

/// Names the token's source, never the token.
impl fmt::Debug for GoogleAccessToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GoogleAccessToken").field("source", &self.source).finish_non_exhaustive()
    }
}

/// Why no token could be had. Messages name files, fields and endpoints,
/// never key material or tokens.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// The key is unusable or the token endpoint refused it: a config or
    /// IAM change is needed.
    #[error("{0}")]
    Refused(String),
    /// The token endpoint could not be reached or failed; worth retrying.
    #[error("{0}")]
    Unavailable(String),
}

/// The live credential of a grant's `credential`, when the host obtains
/// it at request time: a Google credential with an empty token cache.
pub(crate) fn obtain(
    credential: &Credential,
    secrets: Option<&Arc<dyn SecretStore>>,
) -> Option<Arc<dyn ObtainedCredential>> {
    match credential {
        Credential::GoogleServiceAccount(google) => {
            Some(Arc::new(GoogleAccessToken::service_account(google, secrets.cloned())))
        }
        Credential::GoogleMetadata(google) => Some(Arc::new(GoogleAccessToken::metadata(google))),
        Credential::Header(_) => None,
    }
}

impl GoogleAccessToken {
    fn new(source: Source) -> Self {
        Self { source, state: tokio::sync::Mutex::new(TokenState::default()) }
    }

    /// Tokens of a service-account key, read from a file or through
    /// `secrets`, with an empty token cache.
    pub fn service_account(
        config: &GoogleCredential,
        secrets: Option<Arc<dyn SecretStore>>,
    ) -> Self {
        Self::new(Source::ServiceAccount(service_account::ServiceAccount {
            key: config.key.clone(),
            secrets,
            scopes: config.scopes.clone(),
        }))
    }

    /// Tokens of the metadata server, with an empty token cache.
    pub fn metadata(config: &GoogleMetadataCredential) -> Self {
        Self::new(Source::Metadata(metadata::MetadataServer { config: config.clone() }))
    }

    /// The `Authorization` value for a request to `grant`'s destination,
    /// from the cache or a new exchange; when there is none, the answer
    /// the plugin gets instead.
    pub(crate) async fn authorize(
        &self,
        transport: &dyn HttpTransport,
        grant: &HttpGrant,
        limits: &Limits,
        redactor: &Redactor,
    ) -> Result<HeaderValue, Response<WasiBody>> {
        match self.header(transport, grant, limits, redactor).await {
            Ok(header) => Ok(header),
            Err(error) => {
                tracing::warn!(
                    destination = %grant.destination,
                    source = %self.source.describe(),
                    "no access token for the grant's Google credential: {error}"
                );
                Err(refusal_response(&error))
            }
        }
    }

    /// Marks the token stale after the API answered 401 to it (a key
    /// deleted or an account disabled ends its tokens early): the next
    /// request exchanges it again, within [`EXCHANGE_INTERVAL`]'s limit.
    pub(crate) fn token_refused(&self) {
        if let Ok(mut state) = self.state.try_lock() {
            state.stale = state.token.is_some();
        }
    }

    /// The `Bearer` header, cached or newly obtained.
    pub async fn header(
        &self,
        transport: &dyn HttpTransport,
        grant: &HttpGrant,
        limits: &Limits,
        redactor: &Redactor,
    ) -> Result<HeaderValue, TokenError> {
        let mut state = self.state.lock().await;
        let now = Instant::now();
        if let Some(token) = &state.token
            && now < token.refresh_at
        {
            let may_force = state
                .last_forced
                .is_none_or(|forced| now.duration_since(forced) >= EXCHANGE_INTERVAL);
            if !state.stale || !may_force {
                return Ok(token.header.clone());
            }
            state.last_forced = Some(now);
        }
        if let Some((failed_at, error)) = &state.failure
            && now.duration_since(*failed_at) < EXCHANGE_INTERVAL
        {
            return Err(error.clone());
        }
        let Fetched { token, lifetime, account } =
            match self.source.fetch(transport, grant, limits).await {
                Ok(fetched) => fetched,
                Err(error) => {
                    state.failure = Some((Instant::now(), error.clone()));
                    // The API refused the stale token already: it is not
                    // used again, and the failure answers until the next
                    // try.
                    if state.stale {
                        state.stale = false;
                        state.retire(now, redactor);
                    }
                    return Err(error);
                }
            };
        state.failure = None;
        state.stale = false;
        let bearer = format!("Bearer {token}");
        redactor.remember(&token);
        redactor.remember(&bearer);
        let mut header = HeaderValue::from_str(&bearer).map_err(|_| {
            TokenError::Refused(format!(
                "{} answered a token that cannot be sent in a header",
                self.source.describe()
            ))
        })?;
        header.set_sensitive(true);
        state.retire(now, redactor);
        let margin = REFRESH_MARGIN.min(lifetime / 2);
        state.token = Some(CachedToken {
            token,
            header: header.clone(),
            refresh_at: now + lifetime.saturating_sub(margin),
            expires_at: now + lifetime,
        });
        tracing::debug!(
            account = %account,
            expires_in_s = lifetime.as_secs(),
            "obtained an access token for the grant's Google credential"
        );
        Ok(header)
    }
}

/// The answer a plugin gets instead of its request when no token can be
/// had: Google's JSON error format, so Google API clients report it.
fn refusal_response(error: &TokenError) -> Response<WasiBody> {
    let (code, status) = match error {
        TokenError::Refused(_) => (StatusCode::UNAUTHORIZED, "UNAUTHENTICATED"),
        TokenError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE"),
    };
    let message = format!("the host could not get an access token for this request: {error}");
    let body = json!({"error": {
        "code": code.as_u16(),
        "message": message,
        "errors": [{"domain": HOST_DOMAIN, "reason": "credentialUnavailable", "message": message}],
        "status": status,
    }});
    let mut response = Response::new(full_body(Bytes::from(body.to_string())));
    *response.status_mut() = code;
    host_refusal::mark(&mut response, HostRefusal::CredentialUnavailable);
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json; charset=UTF-8"),
    );
    response
}

#[cfg(test)]
mod tests;
