//! Cross-site requests are refused: every POST of the console must come
//! from one of its own pages. Browsers say where a request comes from in
//! `Sec-Fetch-Site` (and in `Origin` on every POST); a request that says
//! neither is not a browser's and has the API with a bearer token instead.

use http::{HeaderMap, Response, StatusCode, header};

use super::{Body, page};

/// The refusal of a request that does not come from this origin.
pub(super) fn refusal(headers: &HeaderMap) -> Option<Response<Body>> {
    judge(headers).map(|why| page::plain(StatusCode::FORBIDDEN, format!("{why}\n")))
}

/// Why the request is refused, or `None`.
fn judge(headers: &HeaderMap) -> Option<String> {
    if let Some(site) = headers.get("sec-fetch-site") {
        return (site.as_bytes() != b"same-origin").then(|| {
            format!(
                "a console action must come from the console's own pages (Sec-Fetch-Site: {})",
                String::from_utf8_lossy(site.as_bytes())
            )
        });
    }
    let Some(origin) = headers.get(header::ORIGIN) else {
        return Some(
            "a console action must come from the console's own pages; scripts use the API \
             with `Authorization: Bearer <token>`"
                .to_owned(),
        );
    };
    let host = headers.get(header::HOST).map(|h| h.as_bytes()).unwrap_or_default();
    let origin = origin.as_bytes();
    let own = [b"http://".as_slice(), b"https://"]
        .iter()
        .any(|scheme| origin.strip_prefix(*scheme).is_some_and(|rest| rest == host));
    (!own).then(|| {
        format!(
            "a console action must come from the console's own pages (Origin: {})",
            String::from_utf8_lossy(origin)
        )
    })
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| (header::HeaderName::from_static(k), HeaderValue::from_static(v)))
            .collect()
    }

    #[test]
    fn only_the_consoles_own_pages_may_post() {
        assert!(judge(&headers(&[("sec-fetch-site", "same-origin")])).is_none());
        assert!(judge(&headers(&[("sec-fetch-site", "cross-site")])).is_some());
        assert!(judge(&headers(&[("sec-fetch-site", "same-site")])).is_some());
        assert!(
            judge(&headers(&[("host", "10.0.0.1:8480"), ("origin", "http://10.0.0.1:8480")]))
                .is_none()
        );
        assert!(
            judge(&headers(&[("host", "10.0.0.1:8480"), ("origin", "http://evil.example")]))
                .is_some()
        );
        assert!(judge(&headers(&[("host", "10.0.0.1:8480"), ("origin", "null")])).is_some());
        // curl and scripts: neither header.
        assert!(judge(&headers(&[("host", "10.0.0.1:8480")])).is_some());
    }
}
