//! Answers the host makes itself instead of sending a plugin's request,
//! marked as the host's in [`HEADER`] so that a plugin tells them from the
//! backend's by a name, not by their wording: the SDK reads the header into
//! its failure kind (`FailureKind::Host`) and a check reports the matching
//! health reason. A header of that name from a backend is dropped, so only
//! the host can set it.

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Response, StatusCode};

use super::{WasiBody, full_body};

/// The response header naming why the host answered itself.
pub const HEADER: HeaderName = HeaderName::from_static("proxyfleet-host-refusal");

/// Why the host answered a request itself; the header's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostRefusal {
    /// The credential the host adds for the destination could not be read
    /// or obtained.
    CredentialUnavailable,
}

impl HostRefusal {
    /// The header value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::CredentialUnavailable => "credential-unavailable",
        }
    }
}

/// Marks `response` as the host's own answer for `refusal`.
pub(crate) fn mark<B>(response: &mut Response<B>, refusal: HostRefusal) {
    response.headers_mut().insert(HEADER, HeaderValue::from_static(refusal.as_str()));
}

/// Drops a [`HEADER`] a backend sent.
pub(crate) fn strip<B>(response: &mut Response<B>) {
    response.headers_mut().remove(&HEADER);
}

/// A 503 with `message` as its text, marked: the host could not add the
/// destination's credential, so it sent nothing.
pub(crate) fn credential_unavailable(message: String) -> Response<WasiBody> {
    let mut response = Response::new(full_body(Bytes::from(message)));
    *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    response
        .headers_mut()
        .insert(http::header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    mark(&mut response, HostRefusal::CredentialUnavailable);
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backend_cannot_pass_for_the_host() {
        let mut response = Response::builder()
            .status(503)
            .header(HEADER, "credential-unavailable")
            .body(())
            .expect("a valid response");
        strip(&mut response);
        assert!(response.headers().get(HEADER).is_none());
    }

    #[test]
    fn the_credential_refusal_is_a_marked_503() {
        let response = credential_unavailable("the host could not read it".into());
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[HEADER], "credential-unavailable");
    }
}
