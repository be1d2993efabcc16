//! The console's stylesheet and script, compiled into the binary and
//! served with a digest in their URL, so a browser may keep them for good
//! and a new build is fetched anew.

use std::sync::LazyLock;

use http::{HeaderMap, HeaderValue, StatusCode, header};
use sha2::{Digest as _, Sha256};

use super::{Body, respond};

struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static str,
    /// The first 16 hex digits of its sha256.
    digest: String,
}

static ASSETS: LazyLock<Vec<Asset>> = LazyLock::new(|| {
    [
        ("console.css", "text/css; charset=utf-8", include_str!("assets/console.css")),
        ("console.js", "text/javascript; charset=utf-8", include_str!("assets/console.js")),
    ]
    .into_iter()
    .map(|(name, content_type, body)| Asset {
        name,
        content_type,
        body,
        digest: hex::encode(Sha256::digest(body.as_bytes()))[..16].to_owned(),
    })
    .collect()
});

/// The URL of asset `name`, with its digest.
pub(super) fn url(name: &str) -> String {
    match ASSETS.iter().find(|asset| asset.name == name) {
        Some(asset) => format!("/ui/assets/{}?v={}", asset.name, asset.digest),
        None => format!("/ui/assets/{name}"),
    }
}

/// `GET /ui/assets/{name}`.
pub(super) fn serve(name: &str, request: &HeaderMap) -> http::Response<Body> {
    let Some(asset) = ASSETS.iter().find(|asset| asset.name == name) else {
        return respond(StatusCode::NOT_FOUND, "text/plain; charset=utf-8", "no such asset\n");
    };
    let etag = format!("\"{}\"", asset.digest);
    let fresh =
        request.get(header::IF_NONE_MATCH).is_some_and(|tag| tag.as_bytes() == etag.as_bytes());
    let mut response = if fresh {
        respond(StatusCode::NOT_MODIFIED, asset.content_type, "")
    } else {
        respond(StatusCode::OK, asset.content_type, asset.body)
    };
    let headers = response.headers_mut();
    if let Ok(value) = HeaderValue::from_str(&etag) {
        headers.insert(header::ETAG, value);
    }
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=31536000, immutable"),
    );
    response
}
