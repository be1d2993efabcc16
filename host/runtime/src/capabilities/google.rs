//! Google service-account credentials, kept entirely in the host.
//!
//! A grant with `credential: { kind: google-service-account, keyFile,
//! scopes }` gets `Authorization: Bearer <access token>` on every request.
//! The token comes from the key's `token_uri` by the JWT-bearer grant
//! (RFC 7523, as Google runs it): the host reads the JSON key file, signs
//! an RS256 assertion (`iss` = `client_email`, `scope`, `aud` = `token_uri`,
//! `iat`, `exp` one hour later) with the key's private key, exchanges it,
//! and keeps the token until shortly before it expires. The key file is
//! read again on every exchange, so a rotated key is picked up without a
//! restart. The plugin sees neither the key nor the token.
//!
//! The exchange goes through the entry's own transport: its CA bundle, its
//! connect and first-byte limits, and its address policy, with the
//! `allowAddresses` of the grant the credential belongs to (a `token_uri`
//! on a loopback or private address must be allowed there, and, when it is
//! a host name, granted as well, because the resolver only lets granted
//! hosts reach such addresses).
//!
//! When no token can be had, the plugin's request is not sent: the host
//! answers it with a Google-style JSON error, 401 `UNAUTHENTICATED` when
//! the key is unusable or refused (the plugin reports `unauthorized` with
//! the reason) or 503 `UNAVAILABLE` when the token endpoint cannot be
//! reached (retried as transient). Neither the key nor any token appears in
//! those answers or in logs; tokens are also handed to the entry's
//! redactor, in case a backend echoes one back.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::BodyExt as _;
use serde_json::{Value, json};

use super::Redactor;
use super::address::{literal_ip, refused_kind};
use super::http::config::{Credential, GoogleCredential, HttpGrant};
use super::http::host_refusal::{self, HostRefusal};
use super::http::{HttpTransport, ObtainedCredential, SendPolicy, WasiBody, full_body};
use crate::limits::Limits;

/// `grant_type` of the exchange.
const JWT_BEARER: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
/// How long an assertion is valid; Google accepts at most an hour.
const ASSERTION_LIFETIME: Duration = Duration::from_secs(3600);
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

/// A service-account credential of one grant, with its cached token.
pub struct GoogleServiceAccount {
    key_file: PathBuf,
    scopes: Vec<String>,
    /// Held across an exchange, so concurrent calls wait for one token
    /// instead of each fetching their own.
    state: tokio::sync::Mutex<TokenState>,
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
impl ObtainedCredential for GoogleServiceAccount {
    async fn authorize(
        &self,
        transport: &dyn HttpTransport,
        grant: &HttpGrant,
        limits: &Limits,
        redactor: &Redactor,
    ) -> Result<HeaderValue, Response<WasiBody>> {
        GoogleServiceAccount::authorize(self, transport, grant, limits, redactor).await
    }

    fn refused(&self) {
        self.token_refused();
    }
}

/// Names the key file and scopes, never the token.
impl fmt::Debug for GoogleServiceAccount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GoogleServiceAccount")
            .field("key_file", &self.key_file)
            .field("scopes", &self.scopes)
            .finish_non_exhaustive()
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

/// The fields of a key file the exchange needs.
struct Key {
    client_email: String,
    private_key_id: Option<String>,
    token_uri: String,
    pair: ring::signature::RsaKeyPair,
}

/// The live credential of a grant's `credential`, when the host obtains
/// it at request time: a service account with an empty token cache.
pub(crate) fn obtain(credential: &Credential) -> Option<Arc<dyn ObtainedCredential>> {
    match credential {
        Credential::GoogleServiceAccount(google) => {
            Some(Arc::new(GoogleServiceAccount::from_config(google)))
        }
        Credential::Header(_) => None,
    }
}

impl GoogleServiceAccount {
    /// A credential reading its key from `key_file` and asking for `scopes`.
    pub fn new(key_file: PathBuf, scopes: Vec<String>) -> Self {
        Self { key_file, scopes, state: tokio::sync::Mutex::new(TokenState::default()) }
    }

    /// The credential a grant configures, with an empty token cache.
    pub fn from_config(config: &GoogleCredential) -> Self {
        Self::new(config.key_file.clone(), config.scopes.clone())
    }

    /// The JSON key file.
    pub fn key_file(&self) -> &Path {
        &self.key_file
    }

    /// The OAuth scopes asked for.
    pub fn scopes(&self) -> &[String] {
        &self.scopes
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
                    key_file = %self.key_file.display(),
                    "no access token for the grant's service account: {error}"
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

    /// The `Bearer` header, cached or newly exchanged.
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
        let exchanged = async {
            let key = self.read_key().await?;
            let (token, lifetime) = exchange(&key, &self.scopes, transport, grant, limits).await?;
            Ok::<_, TokenError>((key, token, lifetime))
        };
        let (key, token, lifetime) = match exchanged.await {
            Ok(exchanged) => exchanged,
            Err(error) => {
                state.failure = Some((Instant::now(), error.clone()));
                // The API refused the stale token already: it is not used
                // again, and the failure answers until the next try.
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
                "the token endpoint {} answered a token that cannot be sent in a header",
                key.token_uri
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
            client_email = %key.client_email,
            expires_in_s = lifetime.as_secs(),
            "obtained an access token for the grant's service account"
        );
        Ok(header)
    }

    async fn read_key(&self) -> Result<Key, TokenError> {
        let path = self.key_file.display();
        let text = tokio::fs::read_to_string(&self.key_file).await.map_err(|err| {
            TokenError::Refused(format!("cannot read the key file {path}: {err}"))
        })?;
        parse_key(&text).map_err(|why| TokenError::Refused(format!("the key file {path} {why}")))
    }
}

/// Parses a service-account key file. Errors say what is wrong without
/// quoting the file (it holds the private key).
fn parse_key(text: &str) -> Result<Key, String> {
    let value: Value = serde_json::from_str(text)
        .map_err(|err| format!("is not JSON (line {}, column {})", err.line(), err.column()))?;
    let field = |name: &str| {
        value.get(name).and_then(Value::as_str).filter(|v| !v.is_empty()).ok_or_else(|| {
            format!("has no `{name}`; download a new JSON key of the service account")
        })
    };
    let kind = field("type")?;
    if kind != "service_account" {
        return Err(format!(
            "is a `{kind}` credential; a service-account key (`type: service_account`) is needed"
        ));
    }
    let client_email = field("client_email")?.to_owned();
    let token_uri = field("token_uri")?.to_owned();
    let uri: http::Uri = token_uri
        .parse()
        .map_err(|_| format!("has a `token_uri` that is not a URL: {token_uri:?}"))?;
    if uri.scheme_str() != Some("https") || uri.host().is_none() {
        return Err(format!("has a `token_uri` that is not an https:// URL: {token_uri:?}"));
    }
    let pem = field("private_key")?;
    use rustls_pki_types::pem::PemObject as _;
    let der = rustls_pki_types::PrivatePkcs8KeyDer::from_pem_slice(pem.as_bytes())
        .map_err(|_| "has a `private_key` that is not a PKCS#8 PEM key".to_owned())?;
    let pair = ring::signature::RsaKeyPair::from_pkcs8(der.secret_pkcs8_der()).map_err(|_| {
        "has a `private_key` that is not an RSA key of 2048 bits or more".to_owned()
    })?;
    let private_key_id = value.get("private_key_id").and_then(Value::as_str).map(str::to_owned);
    Ok(Key { client_email, private_key_id, token_uri, pair })
}

/// The signed assertion for `key`, valid from `iat` for an hour.
fn assertion(key: &Key, scopes: &[String], iat: u64) -> Result<String, TokenError> {
    let mut header = json!({"alg": "RS256", "typ": "JWT"});
    if let Some(kid) = &key.private_key_id {
        header["kid"] = json!(kid);
    }
    let claims = json!({
        "iss": key.client_email,
        "scope": scopes.join(" "),
        "aud": key.token_uri,
        "iat": iat,
        "exp": iat + ASSERTION_LIFETIME.as_secs(),
    });
    let signed = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let mut signature = vec![0; key.pair.public().modulus_len()];
    key.pair
        .sign(
            &ring::signature::RSA_PKCS1_SHA256,
            &ring::rand::SystemRandom::new(),
            signed.as_bytes(),
            &mut signature,
        )
        .map_err(|_| TokenError::Refused("signing the assertion with the key failed".to_owned()))?;
    Ok(format!("{signed}.{}", URL_SAFE_NO_PAD.encode(signature)))
}

/// Exchanges an assertion for a token at the key's `token_uri`; returns
/// the token and how long it lives.
async fn exchange(
    key: &Key,
    scopes: &[String],
    transport: &dyn HttpTransport,
    grant: &HttpGrant,
    limits: &Limits,
) -> Result<(String, Duration), TokenError> {
    let endpoint = &key.token_uri;
    let uri: http::Uri = endpoint
        .parse()
        .map_err(|_| TokenError::Refused(format!("token_uri {endpoint:?} is not a URL")))?;
    let host = uri.host().unwrap_or_default().trim_matches(['[', ']']);
    if let Some(ip) = literal_ip(host)
        && let Some(kind) = refused_kind(ip, &grant.allow_addresses)
    {
        return Err(TokenError::Refused(format!(
            "the token endpoint {endpoint} is on a {kind} address; add it to the grant's \
             allowAddresses to allow it"
        )));
    }
    let iat = proxyfleet_core::clock::unix_now();
    let assertion = assertion(key, scopes, iat)?;
    let body = format!("grant_type={}&assertion={assertion}", form_encode(JWT_BEARER));
    let request = Request::post(uri)
        .header(http::header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .header(http::header::ACCEPT, "application/json")
        .body(Bytes::from(body))
        .map_err(|err| TokenError::Refused(format!("cannot build the token request: {err}")))?;
    let policy = SendPolicy {
        allow_addresses: grant.allow_addresses.clone(),
        first_byte_timeout: limits.http_first_byte_timeout,
        between_bytes_timeout: limits.http_first_byte_timeout,
    };
    let response = transport.send(request, &policy).await.map_err(|err| {
        let text = format!("the token request to {endpoint} failed: {err:?}");
        match err {
            super::http::HttpError::DestinationIpProhibited
            | super::http::HttpError::HttpRequestDenied
            | super::http::HttpError::TlsCertificateError => TokenError::Refused(format!(
                "{text} (the token endpoint must be reachable under the entry's address \
                 policy and caFile)"
            )),
            _ => TokenError::Unavailable(text),
        }
    })?;
    let status = response.status();
    let body = http_body_util::Limited::new(response.into_body(), MAX_TOKEN_RESPONSE)
        .collect()
        .await
        .map_err(|err| {
            TokenError::Unavailable(format!("reading the answer of {endpoint} failed: {err}"))
        })?
        .to_bytes();
    let answer: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    if !status.is_success() {
        let error = answer.get("error").and_then(Value::as_str).unwrap_or("no error code");
        let description = answer.get("error_description").and_then(Value::as_str).unwrap_or("");
        let text = format!(
            "the token endpoint {endpoint} refused the key of {} (HTTP {}): {error}{}{description}",
            key.client_email,
            status.as_u16(),
            if description.is_empty() { "" } else { ": " },
        );
        return Err(if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS {
            TokenError::Unavailable(text)
        } else {
            TokenError::Refused(text)
        });
    }
    let token = answer.get("access_token").and_then(Value::as_str).filter(|t| !t.is_empty());
    let Some(token) = token else {
        return Err(TokenError::Unavailable(format!(
            "the token endpoint {endpoint} answered without an access_token"
        )));
    };
    let lifetime = answer.get("expires_in").and_then(Value::as_u64).unwrap_or(3600).max(1);
    Ok((token.to_owned(), Duration::from_secs(lifetime)))
}

/// `application/x-www-form-urlencoded` for a value of RFC 3986's
/// unreserved characters and `:` (all `JWT_BEARER` has).
fn form_encode(text: &str) -> String {
    text.replace(':', "%3A")
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
