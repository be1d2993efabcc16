//! The OAuth 2.0 token endpoint for service accounts (RFC 7523's JWT-bearer
//! grant, as `oauth2.googleapis.com/token` runs it): service-account keys,
//! assertion checks, access tokens and their revocation.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::rand::SecureRandom as _;
use rsa::pkcs8::{EncodePrivateKey as _, LineEnding};
use rsa::traits::PublicKeyParts as _;
use serde_json::{Value, json};

use crate::SimError;
use crate::time::now_unix;

/// The grant type of a service-account assertion.
pub(crate) const JWT_BEARER: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
/// Longest `exp - iat` Google accepts.
const MAX_ASSERTION_LIFETIME: u64 = 3600;
/// Clock skew tolerated on `iat`.
const SKEW: u64 = 300;

/// A service-account key as the Cloud console downloads it.
#[derive(Clone)]
pub struct ServiceAccountKey {
    /// The account's e-mail, the assertion's `iss`.
    pub client_email: String,
    /// The key's ID, the assertion header's `kid`.
    pub private_key_id: String,
    /// The key file, JSON with `type`, `project_id`, `private_key_id`,
    /// `private_key` (PKCS#8 PEM), `client_email`, `token_uri`, ...
    pub json: String,
}

/// Names the key, never its material.
impl std::fmt::Debug for ServiceAccountKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceAccountKey")
            .field("client_email", &self.client_email)
            .field("private_key_id", &self.private_key_id)
            .finish_non_exhaustive()
    }
}

impl ServiceAccountKey {
    /// The PEM private key inside the key file, e.g. to assert that it
    /// appears nowhere it should not.
    pub fn private_key_pem(&self) -> String {
        serde_json::from_str::<Value>(&self.json)
            .ok()
            .and_then(|key| key["private_key"].as_str().map(str::to_owned))
            .unwrap_or_default()
    }
}

/// A token the endpoint issued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenGrant {
    /// The access token.
    pub access_token: String,
    /// The account it was issued to.
    pub client_email: String,
    /// The key whose assertion earned it.
    pub private_key_id: String,
    /// The scopes it carries.
    pub scopes: Vec<String>,
}

#[derive(Debug)]
struct PublicKey {
    client_email: String,
    n: Vec<u8>,
    e: Vec<u8>,
    revoked: bool,
}

#[derive(Debug)]
struct Token {
    grant: TokenGrant,
    expires_at: Instant,
}

#[derive(Debug, Default)]
struct Keys {
    by_id: HashMap<String, PublicKey>,
    tokens: HashMap<String, Token>,
    issued: Vec<TokenGrant>,
}

/// Why an API request's token is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TokenRefusal {
    /// Unknown, expired or revoked.
    Invalid,
    /// Valid, but without a scope that covers Compute Engine.
    InsufficientScope,
}

/// The token endpoint's keys and tokens.
#[derive(Debug)]
pub(crate) struct Oauth {
    token_uri: String,
    lifetime: Duration,
    keys: Mutex<Keys>,
    rng: ring::rand::SystemRandom,
}

/// An error answer of the token endpoint: status, `error`,
/// `error_description`.
pub(crate) type TokenError = (u16, &'static str, String);

fn random_hex(rng: &ring::rand::SystemRandom, bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    // SystemRandom only fails when the OS has no randomness to give.
    rng.fill(&mut buf).expect("the OS random source works");
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

impl Oauth {
    pub(crate) fn new(token_uri: String, lifetime: Duration) -> Self {
        Self {
            token_uri,
            lifetime,
            keys: Mutex::new(Keys::default()),
            rng: ring::rand::SystemRandom::new(),
        }
    }

    pub(crate) fn token_uri(&self) -> &str {
        &self.token_uri
    }

    fn keys(&self) -> std::sync::MutexGuard<'_, Keys> {
        self.keys.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn create_key(&self, client_email: &str) -> Result<ServiceAccountKey, SimError> {
        let private = rsa::RsaPrivateKey::new(&mut rsa::rand_core::OsRng, 2048)
            .map_err(|error| SimError::Key(error.to_string()))?;
        let pem = private
            .to_pkcs8_pem(LineEnding::LF)
            .map_err(|error| SimError::Key(error.to_string()))?;
        let private_key_id = random_hex(&self.rng, 20);
        let project = client_email
            .split_once('@')
            .and_then(|(_, domain)| domain.split_once('.'))
            .map_or("proxyfleet-test", |(project, _)| project);
        let json = json!({
            "type": "service_account",
            "project_id": project,
            "private_key_id": private_key_id,
            "private_key": pem.as_str(),
            "client_email": client_email,
            "client_id": "100000000000000000001",
            "auth_uri": "https://accounts.google.com/o/oauth2/auth",
            "token_uri": self.token_uri,
            "auth_provider_x509_cert_url": "https://www.googleapis.com/oauth2/v1/certs",
            "universe_domain": "googleapis.com",
        });
        let public = private.to_public_key();
        self.keys().by_id.insert(
            private_key_id.clone(),
            PublicKey {
                client_email: client_email.to_owned(),
                n: public.n().to_bytes_be(),
                e: public.e().to_bytes_be(),
                revoked: false,
            },
        );
        Ok(ServiceAccountKey {
            client_email: client_email.to_owned(),
            private_key_id,
            json: serde_json::to_string_pretty(&json).unwrap_or_default(),
        })
    }

    /// Issues a token to `client_email` without an assertion, as the
    /// metadata server does for the service account attached to a VM or
    /// bound to a pod (Workload Identity); its `private_key_id` is empty.
    pub(crate) fn issue(&self, client_email: &str, scopes: Vec<String>) -> (String, Duration) {
        let access_token = format!("ya29.sim-md-{}", random_hex(&self.rng, 24));
        let grant = TokenGrant {
            access_token: access_token.clone(),
            client_email: client_email.to_owned(),
            private_key_id: String::new(),
            scopes,
        };
        let mut keys = self.keys();
        keys.tokens.insert(
            access_token.clone(),
            Token { grant: grant.clone(), expires_at: Instant::now() + self.lifetime },
        );
        keys.issued.push(grant);
        (access_token, self.lifetime)
    }

    pub(crate) fn revoke_key(&self, private_key_id: &str) {
        let mut keys = self.keys();
        if let Some(key) = keys.by_id.get_mut(private_key_id) {
            key.revoked = true;
        }
        keys.tokens.retain(|_, token| token.grant.private_key_id != private_key_id);
    }

    pub(crate) fn grants(&self) -> Vec<TokenGrant> {
        self.keys().issued.clone()
    }

    /// Checks an API request's bearer token.
    pub(crate) fn authorize(&self, access_token: &str) -> Result<TokenGrant, TokenRefusal> {
        let keys = self.keys();
        let token = keys.tokens.get(access_token).ok_or(TokenRefusal::Invalid)?;
        if token.expires_at <= Instant::now() {
            return Err(TokenRefusal::Invalid);
        }
        let covered = token
            .grant
            .scopes
            .iter()
            .any(|scope| scope == crate::COMPUTE_SCOPE || scope == crate::CLOUD_PLATFORM_SCOPE);
        if covered { Ok(token.grant.clone()) } else { Err(TokenRefusal::InsufficientScope) }
    }

    /// Answers a token request's form parameters.
    pub(crate) fn exchange(&self, form: &HashMap<String, String>) -> Result<Value, TokenError> {
        let grant_type = form.get("grant_type").map(String::as_str).unwrap_or_default();
        if grant_type != JWT_BEARER {
            return Err((
                400,
                "unsupported_grant_type",
                format!("Invalid grant_type: {grant_type}"),
            ));
        }
        let assertion = form.get("assertion").ok_or_else(|| {
            (400, "invalid_request", "Missing required parameter: assertion".to_owned())
        })?;
        let grant = self.verify(assertion)?;
        let access_token = format!("ya29.sim-{}", random_hex(&self.rng, 24));
        let mut keys = self.keys();
        let grant = TokenGrant { access_token: access_token.clone(), ..grant };
        keys.tokens.insert(
            access_token.clone(),
            Token { grant: grant.clone(), expires_at: Instant::now() + self.lifetime },
        );
        keys.issued.push(grant);
        Ok(json!({
            "access_token": access_token,
            "expires_in": self.lifetime.as_secs().max(1),
            "token_type": "Bearer",
        }))
    }

    /// Checks an assertion: structure, key, signature, audience, times and
    /// scope. The token in the returned grant is still empty.
    fn verify(&self, assertion: &str) -> Result<TokenGrant, TokenError> {
        let invalid = |what: &str| (400, "invalid_grant", format!("Invalid JWT: {what}"));
        let bad_signature = || (400, "invalid_grant", "Invalid JWT Signature.".to_owned());
        let mut parts = assertion.split('.');
        let (Some(header), Some(claims), Some(signature), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(invalid("not a compact JWS (three dot-separated parts)"));
        };
        let decode = |part: &str| URL_SAFE_NO_PAD.decode(part).ok();
        let header: Value = decode(header)
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .ok_or_else(|| invalid("the header is not base64url JSON"))?;
        let claims: Value = decode(claims)
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .ok_or_else(|| invalid("the claims are not base64url JSON"))?;
        let signature = decode(signature).ok_or_else(bad_signature)?;
        if header["alg"] != "RS256" {
            return Err(invalid("alg must be RS256"));
        }
        let iss = claims["iss"].as_str().unwrap_or_default().to_owned();
        let signed = &assertion[..assertion.rfind('.').unwrap_or(0)];
        {
            let keys = self.keys();
            // With a `kid` only that key is tried; without one, every key
            // of the account (Google does the same).
            let candidates: Vec<&PublicKey> = match header["kid"].as_str() {
                Some(kid) => keys.by_id.get(kid).into_iter().collect(),
                None => keys.by_id.values().filter(|key| key.client_email == iss).collect(),
            };
            let verified = candidates.iter().any(|key| {
                key.client_email == iss
                    && !key.revoked
                    && ring::signature::RsaPublicKeyComponents { n: &key.n, e: &key.e }
                        .verify(
                            &ring::signature::RSA_PKCS1_2048_8192_SHA256,
                            signed.as_bytes(),
                            &signature,
                        )
                        .is_ok()
            });
            if !verified {
                return Err(bad_signature());
            }
        }
        if claims["aud"].as_str() != Some(self.token_uri.as_str()) {
            return Err(invalid(&format!(
                "Failed audience check. The right audience is {}",
                self.token_uri
            )));
        }
        let (Some(iat), Some(exp)) = (claims["iat"].as_u64(), claims["exp"].as_u64()) else {
            return Err(invalid("iat and exp must be numbers"));
        };
        let now = now_unix();
        if exp <= iat || exp - iat > MAX_ASSERTION_LIFETIME || iat > now + SKEW || exp <= now {
            return Err(invalid(
                "Token must be a short-lived token (60 minutes) and in a reasonable timeframe. \
                 Check your iat and exp values in the JWT claim.",
            ));
        }
        let scopes: Vec<String> = claims["scope"]
            .as_str()
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        if scopes.is_empty() {
            return Err((
                400,
                "invalid_scope",
                "Invalid OAuth scope or ID token audience provided.".to_owned(),
            ));
        }
        let private_key_id = header["kid"].as_str().unwrap_or_default().to_owned();
        Ok(TokenGrant { access_token: String::new(), client_email: iss, private_key_id, scopes })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Signs `claims` with the key the way a client does.
    fn assertion(key: &ServiceAccountKey, claims: &Value, kid: bool) -> String {
        use rustls::pki_types::pem::PemObject as _;
        let pem = key.private_key_pem();
        let der = rustls::pki_types::PrivatePkcs8KeyDer::from_pem_slice(pem.as_bytes())
            .expect("pkcs8 pem");
        let pair = ring::signature::RsaKeyPair::from_pkcs8(der.secret_pkcs8_der()).expect("rsa");
        let header = if kid {
            json!({"alg": "RS256", "typ": "JWT", "kid": key.private_key_id})
        } else {
            json!({"alg": "RS256", "typ": "JWT"})
        };
        let signed = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let mut signature = vec![0; pair.public().modulus_len()];
        pair.sign(
            &ring::signature::RSA_PKCS1_SHA256,
            &ring::rand::SystemRandom::new(),
            signed.as_bytes(),
            &mut signature,
        )
        .expect("sign");
        format!("{signed}.{}", URL_SAFE_NO_PAD.encode(signature))
    }

    fn form(assertion: &str) -> HashMap<String, String> {
        HashMap::from([
            ("grant_type".to_owned(), JWT_BEARER.to_owned()),
            ("assertion".to_owned(), assertion.to_owned()),
        ])
    }

    fn claims(oauth: &Oauth, key: &ServiceAccountKey, lifetime: u64) -> Value {
        let now = now_unix();
        json!({"iss": key.client_email, "scope": crate::COMPUTE_SCOPE, "aud": oauth.token_uri,
               "iat": now, "exp": now + lifetime})
    }

    #[test]
    fn a_signed_assertion_earns_a_token_that_authorizes() {
        let oauth = Oauth::new("https://localhost:1/token".into(), Duration::from_secs(60));
        let key = oauth.create_key("sa@proj.iam.gserviceaccount.com").unwrap();
        for kid in [true, false] {
            let answer = oauth.exchange(&form(&assertion(&key, &claims(&oauth, &key, 3600), kid)));
            let answer = answer.expect("accepted");
            assert_eq!(answer["token_type"], "Bearer");
            assert_eq!(answer["expires_in"], 60);
            let grant = oauth.authorize(answer["access_token"].as_str().unwrap()).unwrap();
            assert_eq!(grant.client_email, key.client_email);
        }
        assert_eq!(oauth.authorize("ya29.made-up"), Err(TokenRefusal::Invalid));
    }

    #[test]
    fn wrong_audience_long_lifetime_and_foreign_signatures_are_refused() {
        let oauth = Oauth::new("https://localhost:1/token".into(), Duration::from_secs(60));
        let key = oauth.create_key("sa@proj.iam.gserviceaccount.com").unwrap();
        let other = Oauth::new("https://localhost:1/token".into(), Duration::from_secs(60))
            .create_key("sa@proj.iam.gserviceaccount.com")
            .unwrap();

        let mut wrong_aud = claims(&oauth, &key, 3600);
        wrong_aud["aud"] = json!("https://elsewhere/token");
        let (_, error, text) =
            oauth.exchange(&form(&assertion(&key, &wrong_aud, true))).unwrap_err();
        assert_eq!(error, "invalid_grant");
        assert!(text.contains("audience"), "{text}");

        let too_long = claims(&oauth, &key, 7200);
        let (_, _, text) = oauth.exchange(&form(&assertion(&key, &too_long, true))).unwrap_err();
        assert!(text.contains("short-lived"), "{text}");

        // Same e-mail, a key this endpoint does not know.
        let forged = assertion(&other, &claims(&oauth, &key, 3600), false);
        let (_, _, text) = oauth.exchange(&form(&forged)).unwrap_err();
        assert_eq!(text, "Invalid JWT Signature.");
    }

    #[test]
    fn revoking_a_key_refuses_it_and_ends_its_tokens() {
        let oauth = Oauth::new("https://localhost:1/token".into(), Duration::from_secs(60));
        let key = oauth.create_key("sa@proj.iam.gserviceaccount.com").unwrap();
        let signed = assertion(&key, &claims(&oauth, &key, 3600), true);
        let answer = oauth.exchange(&form(&signed)).unwrap();
        let token = answer["access_token"].as_str().unwrap().to_owned();
        oauth.revoke_key(&key.private_key_id);
        assert_eq!(oauth.authorize(&token), Err(TokenRefusal::Invalid));
        let (status, error, _) = oauth.exchange(&form(&signed)).unwrap_err();
        assert_eq!((status, error), (400, "invalid_grant"));
    }

    #[test]
    fn tokens_without_a_compute_scope_are_insufficient() {
        let oauth = Oauth::new("https://localhost:1/token".into(), Duration::from_secs(60));
        let key = oauth.create_key("sa@proj.iam.gserviceaccount.com").unwrap();
        let mut narrow = claims(&oauth, &key, 600);
        narrow["scope"] = json!("https://www.googleapis.com/auth/devstorage.read_only");
        let answer = oauth.exchange(&form(&assertion(&key, &narrow, true))).unwrap();
        let token = answer["access_token"].as_str().unwrap();
        assert_eq!(oauth.authorize(token), Err(TokenRefusal::InsufficientScope));
    }
}
