//! The web console: the fleet as pages, served on the API listener under
//! `/ui/`, live, with actions for tokens that may operate.
//!
//! Server-rendered HTML ([maud], escaped by construction) and one small
//! script that keeps the page current: it listens to [`live`]'s
//! server-sent events and fetches the page again when the catalog moved.
//! Every asset is compiled into the binary ([`assets`]), so the console
//! works air-gapped. Pages send a Content-Security-Policy without
//! `unsafe-inline`: no inline script or style anywhere.
//!
//! Who sees what: with no token file the console is read-only for anyone
//! who reaches it. With one, a token signs in ([`session`]: a signed,
//! `HttpOnly`, `SameSite=Strict` cookie naming the token by a keyed
//! digest, so removing the token from the file ends its sessions); its
//! role decides whether the actions show and are accepted. Every action
//! is a same-origin POST ([`origin`]).

mod actions;
mod assets;
mod chart;
mod events;
mod format;
mod gateway;
mod live;
mod origin;
mod overview;
mod page;
mod providers;
mod proxies;
mod query;
mod session;
mod traffic;

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;

use crate::auth::{Access, ApiAuth, Role};
use crate::catalog::Fleet;
use crate::mode::ModeStatus;

pub use traffic::Traffic;

/// A console response's body: whole pages, or the live event stream.
pub type Body = BoxBody<Bytes, Infallible>;

/// The console's shared state.
pub struct Console {
    fleet: Arc<Fleet>,
    auth: Arc<ApiAuth>,
    mode: Option<Arc<dyn ModeStatus>>,
    sessions: session::Sessions,
    traffic: Arc<Traffic>,
}

impl std::fmt::Debug for Console {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Console").finish_non_exhaustive()
    }
}

/// Who is looking, as far as the console is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Viewer {
    /// The role of the signed-in token; `None` when nobody signed in.
    pub role: Option<Role>,
    /// Whether the operator has API tokens at all (else the console is
    /// read-only and there is nothing to sign in with).
    pub tokens: bool,
}

impl Viewer {
    /// Whether this viewer may act.
    pub fn operates(self) -> bool {
        self.role == Some(Role::Operate)
    }
}

/// The purpose a mode derives the console's session key for, from the
/// installation's spec key ([`proxyfleet_core::spec_key::SpecKey::derive`]).
pub const SESSION_KEY_PURPOSE: &str = "proxyfleet console sessions";

impl Console {
    /// A console over `fleet`, guarded by `auth`, with the mode's view of
    /// providers, its actions and its session key when there is one.
    pub fn new(fleet: Arc<Fleet>, auth: Arc<ApiAuth>, mode: Option<Arc<dyn ModeStatus>>) -> Self {
        let traffic = Arc::new(Traffic::new(Arc::clone(&fleet)));
        let sessions = mode
            .as_ref()
            .and_then(|mode| mode.session_key())
            .map_or_else(session::Sessions::new, session::Sessions::with_key);
        Self { fleet, auth, mode, sessions, traffic }
    }

    /// Samples the gateway's counters for the rates and charts, until the
    /// returned task is aborted or the runtime ends.
    pub fn spawn_sampler(&self) -> tokio::task::JoinHandle<()> {
        Arc::clone(&self.traffic).spawn()
    }

    /// Whether `path` is the console's.
    pub fn owns(path: &str) -> bool {
        path == "/ui" || path.starts_with("/ui/")
    }

    /// Answers one request under `/ui`.
    pub async fn handle(&self, request: Request<Incoming>) -> Response<Body> {
        let mut response = self.route(request).await;
        page::secure(response.headers_mut());
        response
    }

    async fn route(&self, request: Request<Incoming>) -> Response<Body> {
        let method = request.method().clone();
        let path = request.uri().path().to_owned();
        let query = request.uri().query().unwrap_or("").to_owned();
        let segments: Vec<&str> =
            path.trim_start_matches("/ui").trim_matches('/').split('/').collect();
        let segments: Vec<&str> = segments.into_iter().filter(|s| !s.is_empty()).collect();

        // Assets and the sign-in page are for anyone.
        match (&method, segments.as_slice()) {
            (&Method::GET, ["assets", name]) => return assets::serve(name, request.headers()),
            (&Method::GET, ["login"]) => {
                return page::html(StatusCode::OK, session::login_page(self, None));
            }
            (&Method::POST, ["login"]) => return session::login(self, request).await,
            (&Method::POST, ["logout"]) => return session::logout(request),
            _ => {}
        }

        let viewer = self.viewer(request.headers());
        let may_view = viewer.role.is_some() || self.auth.allows(Access::ReadList, None);
        if !may_view {
            if method == Method::POST {
                return page::plain(
                    StatusCode::UNAUTHORIZED,
                    "sign in with a token of role operate\n".to_owned(),
                );
            }
            return page::see_other("/ui/login");
        }
        if method == Method::POST {
            return actions::handle(self, viewer, &segments, request).await;
        }
        if method != Method::GET && method != Method::HEAD {
            return page::plain(
                StatusCode::METHOD_NOT_ALLOWED,
                format!("{method} is not a console method; pages are GET, actions POST\n"),
            );
        }
        match segments.as_slice() {
            [] => page::html(StatusCode::OK, overview::render(self, viewer)),
            ["proxies"] => match query::ProxyQuery::parse(&query) {
                Ok(q) => page::html(StatusCode::OK, proxies::list(self, viewer, &q)),
                Err(message) => {
                    page::html(StatusCode::BAD_REQUEST, page::problem(viewer, "Proxies", &message))
                }
            },
            ["proxies", id] => match proxies::detail(self, viewer, id) {
                Some(markup) => page::html(StatusCode::OK, markup),
                None => page::html(
                    StatusCode::NOT_FOUND,
                    page::problem(viewer, "Proxies", &format!("no proxy with the ID {id:?}")),
                ),
            },
            ["providers"] => page::html(StatusCode::OK, providers::render(self, viewer)),
            ["gateway"] => page::html(StatusCode::OK, gateway::render(self, viewer)),
            ["live"] => live::stream(&self.fleet),
            _ => page::html(
                StatusCode::NOT_FOUND,
                page::problem(viewer, "Not found", &format!("no console page {path}")),
            ),
        }
    }

    fn viewer(&self, headers: &http::HeaderMap) -> Viewer {
        Viewer { role: self.sessions.role(headers, &self.auth), tokens: self.auth.has_tokens() }
    }
}

/// A whole response body.
pub(crate) fn full(body: impl Into<Bytes>) -> Body {
    Full::new(body.into()).boxed()
}

/// A response with `status`, `content_type` and `body`.
pub(crate) fn respond(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Body> {
    let mut response = Response::new(full(body));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

#[cfg(test)]
mod tests;
