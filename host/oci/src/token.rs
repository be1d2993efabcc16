//! The authorization a registry asks a pull for, by the distribution
//! spec's token flow: `GET /v2/` names the scheme in `WWW-Authenticate`.
//! For `Bearer`, a token for `repository:REPO:pull` comes from the realm
//! the challenge names (asked with the basic credentials, when there are
//! some); for another scheme the basic credentials go on every request;
//! without a challenge nothing does. A `tokenFile` is sent as the bearer
//! token without asking.
//!
//! This is oci-client's flow written again: oci-client runs it on its own
//! HTTP client, which follows redirects and resolves names with no policy
//! of ours, and keeps the token inside that client. The challenge is
//! parsed by http-auth, as oci-client parses it. The realm is a destination
//! the registry names, judged as a redirect is, and the token's answer is
//! read within a bound.

use oci_client::errors::OciDistributionError;
use oci_client::secrets::RegistryAuth;
use reqwest_oci::header::WWW_AUTHENTICATE;
use reqwest_oci::{Client, RequestBuilder, StatusCode, Url};
use serde::Deserialize;

use crate::answer::{BoundedError, account, read_response};
use crate::destination::Destinations;
use crate::error::OciError;
use crate::reference::PluginReference;

/// The largest token answer read; registries' tokens are a few KiB.
const TOKEN_BYTES: u64 = 1 << 20;

/// What goes on each request of a pull.
pub(crate) enum Authorization {
    /// Nothing.
    Anonymous,
    /// Basic credentials.
    Basic {
        /// The user.
        username: String,
        /// The password.
        password: String,
    },
    /// A bearer token.
    Bearer(String),
}

impl std::fmt::Debug for Authorization {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Anonymous => "Anonymous",
            Self::Basic { .. } => "Basic(<redacted>)",
            Self::Bearer(_) => "Bearer(<redacted>)",
        })
    }
}

impl Authorization {
    /// `request` carrying this authorization (marked sensitive, so no
    /// debug output shows it).
    pub(crate) fn apply(&self, request: RequestBuilder) -> RequestBuilder {
        match self {
            Self::Anonymous => request,
            Self::Basic { username, password } => request.basic_auth(username, Some(password)),
            Self::Bearer(token) => request.bearer_auth(token),
        }
    }
}

/// A token server's answer: `token`, or OAuth2's `access_token`.
#[derive(Deserialize)]
struct TokenAnswer {
    token: Option<String>,
    access_token: Option<String>,
}

/// The authorization `registry_root` (`SCHEME://REGISTRY/`) asks for
/// pulling `reference`, with the credentials `auth`.
pub(crate) async fn authorize(
    http: &Client,
    registry_root: &Url,
    auth: RegistryAuth,
    reference: &PluginReference,
    destinations: &Destinations,
) -> Result<Authorization, OciError> {
    let client_error = |source| OciError::from_client(reference, source);
    let (username, password) = match auth {
        RegistryAuth::Bearer(token) => return Ok(Authorization::Bearer(token)),
        RegistryAuth::Basic(username, password) => (Some(username), password),
        RegistryAuth::Anonymous => (None, String::new()),
    };
    let basic = || match &username {
        Some(username) => {
            Authorization::Basic { username: username.clone(), password: password.clone() }
        }
        None => Authorization::Anonymous,
    };
    let version_check = registry_root.join("v2/").map_err(|err| {
        client_error(OciDistributionError::UrlParseError(format!("{registry_root}v2/: {err}")))
    })?;
    let answer = http
        .get(version_check)
        .send()
        .await
        .map_err(|err| OciError::from_transport(reference, err))?;
    let challenges: Vec<String> = answer
        .headers()
        .get_all(WWW_AUTHENTICATE)
        .iter()
        .filter_map(|value| value.to_str().ok().map(str::to_owned))
        .collect();
    drop(answer);
    if challenges.is_empty() {
        return Ok(Authorization::Anonymous);
    }
    let Some((realm, service)) = challenges.iter().find_map(|text| bearer_challenge(text)) else {
        return Ok(basic());
    };
    let mut url = Url::parse(&realm)
        .ok()
        .filter(|url| matches!(url.scheme(), "https" | "http"))
        .ok_or_else(|| {
            client_error(OciDistributionError::AuthenticationFailure(format!(
                "the registry's token realm {realm:?} is not an HTTP URL"
            )))
        })?;
    destinations.check(&url).map_err(|source| OciError::Refused {
        reference: reference.to_string(),
        registry: reference.registry().to_owned(),
        source,
    })?;
    url.query_pairs_mut()
        .append_pair("scope", &format!("repository:{}:pull", reference.repository()));
    if let Some(service) = &service {
        url.query_pairs_mut().append_pair("service", service);
    }
    let answer = basic()
        .apply(http.get(url))
        .send()
        .await
        .map_err(|err| OciError::from_transport(reference, err))?;
    let status = answer.status();
    if status != StatusCode::OK {
        let body = account(answer).await.map_err(|err| OciError::from_transport(reference, err))?;
        return Err(client_error(OciDistributionError::AuthenticationFailure(format!(
            "the token server answered {status}: {}",
            String::from_utf8_lossy(&body)
        ))));
    }
    let body = read_response(answer, TOKEN_BYTES).await.map_err(|err| match err {
        BoundedError::Over(over) => client_error(OciDistributionError::RegistryTokenDecodeError(
            format!("the token server's answer {over}, over {TOKEN_BYTES} bytes"),
        )),
        BoundedError::Transport(err) => OciError::from_transport(reference, err),
    })?;
    // The answer holds the token: its text never goes into an error.
    let decoded: TokenAnswer = serde_json::from_slice(&body).map_err(|err| {
        client_error(OciDistributionError::RegistryTokenDecodeError(format!(
            "not a token answer (at line {}, column {})",
            err.line(),
            err.column()
        )))
    })?;
    decoded.token.or(decoded.access_token).map(Authorization::Bearer).ok_or_else(|| {
        client_error(OciDistributionError::RegistryTokenDecodeError(
            "the token server's answer holds neither `token` nor `access_token`".to_owned(),
        ))
    })
}

/// The realm and service of the first `Bearer` challenge in `header`.
fn bearer_challenge(header: &str) -> Option<(String, Option<String>)> {
    http_auth::ChallengeParser::new(header).filter_map(Result::ok).find_map(|challenge| {
        if !challenge.scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        let param = |name: &str| {
            challenge
                .params
                .iter()
                .find(|(key, _)| key.eq_ignore_ascii_case(name))
                .map(|(_, value)| value.to_unescaped())
        };
        Some((param("realm")?, param("service")))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_challenges_are_read_with_their_realm_and_service() {
        assert_eq!(
            bearer_challenge(
                r#"Bearer realm="https://auth.example.com/token",service="registry.example.com",scope="repository:p:pull""#
            ),
            Some((
                "https://auth.example.com/token".to_owned(),
                Some("registry.example.com".to_owned())
            ))
        );
        assert_eq!(
            bearer_challenge(r#"Basic realm="x", Bearer realm="https://a/t""#),
            Some(("https://a/t".to_owned(), None))
        );
        assert_eq!(bearer_challenge(r#"Basic realm="proxyfleet-test""#), None);
        assert_eq!(bearer_challenge("Bearer service=\"no-realm\""), None);
    }

    #[test]
    fn an_authorization_never_shows_its_secret() {
        let shown = format!(
            "{:?} {:?}",
            Authorization::Bearer("tok-123".into()),
            Authorization::Basic { username: "u".into(), password: "pw-456".into() }
        );
        assert!(!shown.contains("tok-123") && !shown.contains("pw-456"), "{shown}");
    }
}
