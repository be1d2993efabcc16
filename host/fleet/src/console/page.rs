//! The frame every page shares (navigation, sign-in state, the live
//! indicator) and the headers every console response carries.

use http::{HeaderMap, HeaderValue, Response, StatusCode, header};
use maud::{DOCTYPE, Markup, html};

use super::{Body, Viewer, assets, respond};

/// No inline script or style, no other origin, no framing.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// The pages in the navigation: path and title.
const NAVIGATION: [(&str, &str); 4] = [
    ("/ui/", "Overview"),
    ("/ui/proxies", "Proxies"),
    ("/ui/providers", "Providers"),
    ("/ui/gateway", "Gateway"),
];

/// The headers of every console response.
pub(super) fn secure(headers: &mut HeaderMap) {
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.entry(header::CACHE_CONTROL).or_insert_with(|| HeaderValue::from_static("no-store"));
}

/// A page: `title`, the navigation with `current` marked, and `body`.
/// `refresh` asks the script to fetch the page again every so many
/// seconds besides the catalog's changes (for rates).
pub(super) fn frame(
    viewer: Viewer,
    current: &str,
    title: &str,
    refresh: Option<u32>,
    body: Markup,
) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · proxyfleet" }
                link rel="stylesheet" href=(assets::url("console.css"));
                script src=(assets::url("console.js")) defer {}
            }
            body {
                a.skip href="#content" { "Skip to content" }
                header.bar {
                    span.brand { "proxyfleet" }
                    nav aria-label="Console" {
                        ul {
                            @for (path, name) in NAVIGATION {
                                li {
                                    @if name == current {
                                        a href=(path) aria-current="page" { (name) }
                                    } @else {
                                        a href=(path) { (name) }
                                    }
                                }
                            }
                        }
                    }
                    span #live-status role="status" { "static" }
                    (who(viewer))
                }
                main #content data-refresh=[refresh] {
                    h1 { (title) }
                    (body)
                }
            }
        }
    }
}

/// Who is signed in, and the way in or out.
fn who(viewer: Viewer) -> Markup {
    html! {
        div.who {
            @if let Some(role) = viewer.role {
                span { "Signed in: " (role.as_str()) }
                form method="post" action="/ui/logout" {
                    button type="submit" { "Sign out" }
                }
            } @else if viewer.tokens {
                a href="/ui/login" { "Sign in" }
            } @else {
                span { "Read-only: this operator has no API tokens" }
            }
        }
    }
}

/// A page that says what went wrong.
pub(super) fn problem(viewer: Viewer, current: &str, message: &str) -> Markup {
    frame(viewer, current, current, None, html! { p.problem role="alert" { (message) } })
}

/// An HTML response.
pub(super) fn html(status: StatusCode, markup: Markup) -> Response<Body> {
    respond(status, "text/html; charset=utf-8", markup.into_string())
}

/// A plain-text response.
pub(super) fn plain(status: StatusCode, text: String) -> Response<Body> {
    respond(status, "text/plain; charset=utf-8", text)
}

/// `303 See Other` to `location`, a path of the console.
pub(super) fn see_other(location: &str) -> Response<Body> {
    let mut response = respond(StatusCode::SEE_OTHER, "text/plain; charset=utf-8", "");
    if let Ok(value) = HeaderValue::from_str(location) {
        response.headers_mut().insert(header::LOCATION, value);
    }
    response
}
