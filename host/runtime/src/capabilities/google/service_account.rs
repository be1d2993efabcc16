//! A service-account key exchanged for access tokens: the host reads the
//! JSON key (a file, or a Secret's key), signs an RS256 assertion (`iss` =
//! `client_email`, `scope`, `aud` = `token_uri`, `iat`, `exp` one hour
//! later) with the key's private key, and exchanges it at `token_uri` by
//! the JWT-bearer grant (RFC 7523, as Google runs it). The key is read
//! again on every exchange, so a rotated key is picked up without a
//! restart.
//!
//! The exchange goes through the entry's own transport: its CA bundle, its
//! connect and first-byte limits, and its address policy, with the
//! `allowAddresses` of the grant the credential belongs to (a `token_uri`
//! on a loopback or private address must be allowed there, and, when it is
//! a host name, granted as well, because the resolver only lets granted
//! hosts reach such addresses).

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::BodyExt as _;
use proxyfleet_core::secret_store::SecretStore;
use serde_json::{Value, json};

use super::{Fetched, MAX_TOKEN_RESPONSE, TokenError};
use crate::capabilities::address::{literal_ip, refused_kind};
use crate::capabilities::http::config::{HttpGrant, SecretSource};
use crate::capabilities::http::secret::{SecretUnavailable, read_secret};
use crate::capabilities::http::{HttpTransport, SendPolicy};
use crate::limits::Limits;

/// `grant_type` of the exchange.
const JWT_BEARER: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
/// How long an assertion is valid; Google accepts at most an hour.
const ASSERTION_LIFETIME: Duration = Duration::from_secs(3600);

/// A key (in a file or a Secret) and the scopes its tokens are asked for.
#[derive(Debug)]
pub(super) struct ServiceAccount {
    pub(super) key: SecretSource,
    /// Reads a key given by `secretRef`.
    pub(super) secrets: Option<Arc<dyn SecretStore>>,
    pub(super) scopes: Vec<String>,
}

/// The fields of a key file the exchange needs.
struct Key {
    client_email: String,
    private_key_id: Option<String>,
    token_uri: String,
    pair: ring::signature::RsaKeyPair,
}

impl ServiceAccount {
    /// A new token: the key read, an assertion signed and exchanged.
    pub(super) async fn fetch(
        &self,
        transport: &dyn HttpTransport,
        grant: &HttpGrant,
        limits: &Limits,
    ) -> Result<Fetched, TokenError> {
        let key = self.read_key().await?;
        let (token, lifetime) = exchange(&key, &self.scopes, transport, grant, limits).await?;
        Ok(Fetched { token, lifetime, account: key.client_email })
    }

    /// What the log and errors name: where the key is, never the key.
    pub(super) fn describe(&self) -> String {
        match &self.key {
            SecretSource::File(path) => format!("the key file {}", path.display()),
            SecretSource::Ref(at) => format!("the key in {at}"),
        }
    }

    async fn read_key(&self) -> Result<Key, TokenError> {
        let bytes = read_secret(&self.key, self.secrets.as_ref()).await.map_err(|unavailable| {
            // The cause alone: `describe` names the key's place.
            let why: &dyn std::fmt::Display = match &unavailable {
                SecretUnavailable::File { error, .. } => error,
                SecretUnavailable::Ref(error) => error,
            };
            TokenError::Refused(format!("cannot read {}: {why}", self.describe()))
        })?;
        let text = String::from_utf8(bytes)
            .map_err(|_| TokenError::Refused(format!("{} is not UTF-8 text", self.describe())))?;
        parse_key(&text).map_err(|why| TokenError::Refused(format!("{} {why}", self.describe())))
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
            crate::capabilities::http::HttpError::DestinationIpProhibited
            | crate::capabilities::http::HttpError::HttpRequestDenied
            | crate::capabilities::http::HttpError::TlsCertificateError => {
                TokenError::Refused(format!(
                    "{text} (the token endpoint must be reachable under the entry's address \
                 policy and caFile)"
                ))
            }
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
