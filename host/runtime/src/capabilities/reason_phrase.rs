//! The status line's reason phrase, which `wasi:http` has no field for,
//! handed to plugins as a response header.
//!
//! Some backends put an error's text only there: Proxmox VE before 8.4
//! answers `HTTP/1.1 500 VM 101 is locked (clone)` with a body of
//! `{"data":null}`, and pveproxy answers `595 No route to host` for a node
//! it cannot reach. The host copies a reason phrase that is not the
//! standard one for its code (hyper keeps only those) into [`HEADER`]. A
//! header of that name from the backend is dropped first, so what a plugin
//! reads there is always what the status line said.

use http::{HeaderName, HeaderValue, Response};
use hyper::ext::ReasonPhrase;

/// The response header that carries the reason phrase to the plugin.
pub const HEADER: HeaderName = HeaderName::from_static("proxyfleet-reason-phrase");

/// Moves the reason phrase a transport kept in `response`'s extensions into
/// [`HEADER`].
pub(crate) fn surface<B>(response: &mut Response<B>) {
    response.headers_mut().remove(&HEADER);
    let phrase = response
        .extensions()
        .get::<ReasonPhrase>()
        .and_then(|phrase| HeaderValue::from_bytes(phrase.as_bytes()).ok());
    if let Some(phrase) = phrase {
        response.headers_mut().insert(HEADER, phrase);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(phrase: Option<&'static str>, spoofed: Option<&'static str>) -> Response<()> {
        let mut builder = Response::builder().status(500);
        if let Some(phrase) = phrase {
            builder = builder.extension(ReasonPhrase::from_static(phrase.as_bytes()));
        }
        if let Some(spoofed) = spoofed {
            builder = builder.header(HEADER, spoofed);
        }
        builder.body(()).expect("a valid response")
    }

    #[test]
    fn a_custom_phrase_becomes_the_header() {
        let mut with = response(Some("VM 101 is locked (clone)"), None);
        surface(&mut with);
        assert_eq!(with.headers()[HEADER], "VM 101 is locked (clone)");
    }

    #[test]
    fn the_backend_cannot_set_the_header_itself() {
        let mut spoofed = response(None, Some("made up"));
        surface(&mut spoofed);
        assert!(spoofed.headers().get(HEADER).is_none());
        let mut both = response(Some("No route to host"), Some("made up"));
        surface(&mut both);
        let values: Vec<_> = both.headers().get_all(HEADER).iter().collect();
        assert_eq!(values, ["No route to host"]);
    }
}
