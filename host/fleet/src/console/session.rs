//! Signing in: a token from the API token file, exchanged for a cookie.
//!
//! The cookie is `EXPIRES.TAG.MAC`: `TAG` names the token by an HMAC under
//! a key this process made (the token itself never leaves the form it was
//! typed into), `MAC` signs both. Nothing is stored: every request finds
//! the token the tag names among the file's current tokens and takes its
//! role, so a token removed from the file (or rotated) ends its sessions
//! at the next reload. Sessions last [`LIFETIME`]. The key is the mode's
//! (the same on every replica and after a restart, see
//! [`crate::mode::ModeStatus::session_key`]), or else one this process
//! made, whose sessions end with it.

use std::time::Duration;

use bytes::Bytes;
use hmac::{Hmac, Mac as _};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{BodyExt as _, Limited};
use hyper::body::Incoming;
use maud::{Markup, html};
use proxyfleet_core::clock::unix_now;
use sha2::Sha256;

use super::{Body, Console, Viewer, origin, page};
use crate::auth::{ApiAuth, Role};

/// The cookie's name.
const COOKIE: &str = "proxyfleet_console";

/// How long a sign-in lasts.
pub(super) const LIFETIME: Duration = Duration::from_secs(12 * 3600);

/// Bytes of HMAC that name a token.
const TAG_BYTES: usize = 16;

/// The sign-in form's body is one token.
const MAX_FORM: usize = 8 * 1024;

type HmacSha256 = Hmac<Sha256>;

/// The key sessions are signed with.
pub(super) struct Sessions {
    key: [u8; 32],
}

impl Sessions {
    /// Sessions under a key of this process alone.
    pub(super) fn new() -> Self {
        Self { key: rand::random() }
    }

    /// Sessions under `key`.
    pub(super) fn with_key(key: [u8; 32]) -> Self {
        Self { key }
    }

    fn mac(&self) -> HmacSha256 {
        HmacSha256::new_from_slice(&self.key).expect("HMAC takes a key of any length")
    }

    fn tag(&self, token: &[u8]) -> [u8; TAG_BYTES] {
        let mut mac = self.mac();
        mac.update(b"token\0");
        mac.update(token);
        let digest = mac.finalize().into_bytes();
        let mut tag = [0; TAG_BYTES];
        tag.copy_from_slice(&digest[..TAG_BYTES]);
        tag
    }

    fn signed(&self, expires: u64, tag: &str) -> HmacSha256 {
        let mut mac = self.mac();
        mac.update(b"session\0");
        mac.update(expires.to_string().as_bytes());
        mac.update(b".");
        mac.update(tag.as_bytes());
        mac
    }

    /// The cookie value for `token`, valid from `now` for [`LIFETIME`].
    pub(super) fn issue(&self, token: &[u8], now: u64) -> String {
        let expires = now + LIFETIME.as_secs();
        let tag = hex::encode(self.tag(token));
        let mac = hex::encode(self.signed(expires, &tag).finalize().into_bytes());
        format!("{expires}.{tag}.{mac}")
    }

    /// The role of the session `value` names at `now`, if it is one of ours,
    /// unexpired, and its token is still in the file.
    pub(super) fn verify(&self, value: &str, auth: &ApiAuth, now: u64) -> Option<Role> {
        let mut parts = value.split('.');
        let (expires, tag, mac) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        let expires: u64 = expires.parse().ok()?;
        let mac = hex::decode(mac).ok()?;
        self.signed(expires, tag).verify_slice(&mac).ok()?;
        if expires <= now {
            return None;
        }
        let tag = hex::decode(tag).ok()?;
        auth.role_where(|secret| self.tag(secret).as_slice() == tag.as_slice())
    }

    /// The role of the request's session, if it carries a valid one.
    pub(super) fn role(&self, headers: &HeaderMap, auth: &ApiAuth) -> Option<Role> {
        let value = cookie(headers, COOKIE)?;
        self.verify(value, auth, unix_now())
    }
}

/// The value of cookie `name` in the request's `Cookie` headers.
fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find_map(|(key, value)| (key == name).then_some(value))
}

/// The cookie's attributes; `Secure` when the request came over TLS to a
/// proxy in front (the API itself speaks plain HTTP).
fn attributes(headers: &HeaderMap, max_age: u64) -> String {
    let tls = headers
        .get("x-forwarded-proto")
        .is_some_and(|proto| proto.as_bytes().eq_ignore_ascii_case(b"https"));
    format!(
        "Path=/ui; HttpOnly; SameSite=Strict; Max-Age={max_age}{}",
        if tls { "; Secure" } else { "" }
    )
}

/// The sign-in page, with `problem` when the last attempt failed.
pub(super) fn login_page(console: &Console, problem: Option<&str>) -> Markup {
    let viewer = Viewer { role: None, tokens: console.auth.has_tokens() };
    let body = html! {
        @if !viewer.tokens {
            p {
                "This operator has no API tokens, so the console is read-only and there is \
                 nothing to sign in with. Start it with "
                code { "--api-token-file" }
                " to sign in and act."
            }
            p { a href="/ui/" { "Go to the overview" } }
        } @else {
            @if let Some(problem) = problem {
                p.problem role="alert" { (problem) }
            }
            form.login method="post" action="/ui/login" {
                label for="token" { "API token" }
                input #token type="password" name="token" autocomplete="current-password" required;
                p.hint {
                    "A token from the operator's API token file. A token with "
                    code { "role=operate" }
                    " may also act on proxies and providers."
                }
                button type="submit" { "Sign in" }
            }
        }
    };
    page::frame(viewer, "", "Sign in", None, body)
}

/// `POST /ui/login`: `token=...` from the form.
pub(super) async fn login(console: &Console, request: Request<Incoming>) -> Response<Body> {
    if let Some(refusal) = origin::refusal(request.headers()) {
        return refusal;
    }
    let headers = request.headers().clone();
    let form = match read_form(request).await {
        Ok(form) => form,
        Err(message) => {
            return page::html(StatusCode::BAD_REQUEST, login_page(console, Some(&message)));
        }
    };
    let token = form_urlencoded::parse(&form)
        .find_map(|(key, value)| (key == "token").then(|| value.trim().to_owned()))
        .unwrap_or_default();
    if !console.auth.has_tokens() {
        return page::html(StatusCode::FORBIDDEN, login_page(console, None));
    }
    if token.is_empty() || console.auth.role_of(token.as_bytes()).is_none() {
        return page::html(
            StatusCode::UNAUTHORIZED,
            login_page(console, Some("That token is not in the API token file.")),
        );
    }
    let value = console.sessions.issue(token.as_bytes(), unix_now());
    let mut response = page::see_other("/ui/");
    let cookie = format!("{COOKIE}={value}; {}", attributes(&headers, LIFETIME.as_secs()));
    if let Ok(cookie) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, cookie);
    }
    response
}

/// `POST /ui/logout`: the cookie is dropped.
pub(super) fn logout(request: Request<Incoming>) -> Response<Body> {
    if let Some(refusal) = origin::refusal(request.headers()) {
        return refusal;
    }
    let mut response = page::see_other("/ui/");
    let cookie = format!("{COOKIE}=; {}", attributes(request.headers(), 0));
    if let Ok(cookie) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, cookie);
    }
    response
}

/// A form body, read up to a bound.
pub(super) async fn read_form(request: Request<Incoming>) -> Result<Bytes, String> {
    Limited::new(request.into_body(), MAX_FORM)
        .collect()
        .await
        .map(http_body_util::Collected::to_bytes)
        .map_err(|_| format!("the form is larger than {MAX_FORM} bytes or was cut off"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth(tokens: &str) -> (tempfile::TempDir, ApiAuth) {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tokens");
        std::fs::write(&file, tokens).unwrap();
        let auth = ApiAuth::from_file(file, false).unwrap();
        (dir, auth)
    }

    #[test]
    fn a_session_names_its_token_by_digest_and_takes_its_role_at_each_request() {
        let (dir, auth) = auth("viewer role=read\noperator\n");
        let sessions = Sessions::new();
        let now = 1_000_000;
        let viewer = sessions.issue(b"viewer", now);
        let operator = sessions.issue(b"operator", now);
        assert!(!viewer.contains("viewer") && !operator.contains("operator"));
        assert_eq!(sessions.verify(&viewer, &auth, now), Some(Role::Read));
        assert_eq!(sessions.verify(&operator, &auth, now + 60), Some(Role::Operate));
        // Expired.
        assert_eq!(sessions.verify(&operator, &auth, now + LIFETIME.as_secs()), None);
        // Forged: another expiry, another tag, another process's key.
        let (_, rest) = operator.split_once('.').unwrap();
        assert_eq!(sessions.verify(&format!("{}.{rest}", now * 2), &auth, now), None);
        // The reader's tag under the operator's signature.
        let tag_of_viewer = viewer.split('.').nth(1).unwrap();
        let parts: Vec<&str> = operator.split('.').collect();
        assert_eq!(
            sessions.verify(&format!("{}.{}.{}", parts[0], tag_of_viewer, parts[2]), &auth, now),
            None
        );
        assert_eq!(Sessions::new().verify(&operator, &auth, now), None);
        assert_eq!(sessions.verify("garbage", &auth, now), None);
        // The token leaves the file: its session ends.
        std::fs::write(dir.path().join("tokens"), "viewer role=read\n").unwrap();
        auth.reload().unwrap();
        assert_eq!(sessions.verify(&operator, &auth, now), None);
        assert_eq!(sessions.verify(&viewer, &auth, now), Some(Role::Read));
    }

    #[test]
    fn the_cookie_is_read_among_others() {
        let mut headers = HeaderMap::new();
        headers.insert(header::COOKIE, HeaderValue::from_static("a=1; proxyfleet_console=x.y.z"));
        assert_eq!(cookie(&headers, COOKIE), Some("x.y.z"));
        assert_eq!(cookie(&headers, "b"), None);
    }
}
