//! HTTP answered from what the test declares: each [`Exchange`] names a
//! method and a URL (or a URL prefix) and the [`Reply`] to give, once, a
//! number of times or always; a route closure answers what no exchange
//! does, for a backend with state of its own.

use std::collections::VecDeque;
use std::fmt;

use proxyfleet_sdk::HttpDestination;
use proxyfleet_sdk::http::Method;
use proxyfleet_sdk::native::{ErrorCode, HttpRequest, HttpResponse};
use serde::Serialize;

/// The answer to one request: a response, or a transport failure.
#[derive(Debug, Clone)]
pub struct Reply(Result<HttpResponse, ErrorCode>);

impl Reply {
    /// A response with `status`, no headers and no body.
    pub fn status(status: u16) -> Self {
        Self(Ok(HttpResponse { status, headers: Vec::new(), body: Vec::new() }))
    }

    /// A response with `status` and `value` as its JSON body.
    ///
    /// # Panics
    ///
    /// When `value` does not serialise (a map with non-string keys).
    pub fn json(status: u16, value: &impl Serialize) -> Self {
        let body = serde_json::to_vec(value).expect("a reply body that serialises to JSON");
        Self::status(status).header("content-type", "application/json").body(body)
    }

    /// A transport failure instead of a response (`ConnectionRefused`,
    /// `ConnectionTimeout`, ...), as the operator reports it.
    pub fn transport(error: ErrorCode) -> Self {
        Self(Err(error))
    }

    /// Adds a header (to a response; a failure has none).
    #[must_use]
    pub fn header(mut self, name: &str, value: &str) -> Self {
        if let Ok(response) = &mut self.0 {
            response.headers.push((name.to_owned(), value.to_owned()));
        }
        self
    }

    /// Sets the body (of a response).
    #[must_use]
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        if let Ok(response) = &mut self.0 {
            response.body = body.into();
        }
        self
    }

    pub(crate) fn into_result(self) -> Result<HttpResponse, ErrorCode> {
        self.0
    }
}

/// How a declared exchange matches URLs.
#[derive(Debug, Clone, PartialEq, Eq)]
enum UrlPattern {
    Exact(String),
    Prefix(String),
}

/// How often an exchange answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Uses {
    Times(usize),
    Always,
}

/// A request the test expects and the reply it gets.
#[derive(Debug, Clone)]
pub struct Exchange {
    method: Method,
    url: UrlPattern,
    reply: Reply,
    uses: Uses,
    used: usize,
}

impl Exchange {
    /// Expects `method` on `url`; a `url` ending in `*` matches every URL
    /// that starts with what comes before it. Answers `200` with no body
    /// once, unless told otherwise.
    pub fn new(method: Method, url: &str) -> Self {
        let url = match url.strip_suffix('*') {
            Some(prefix) => UrlPattern::Prefix(prefix.to_owned()),
            None => UrlPattern::Exact(url.to_owned()),
        };
        Self { method, url, reply: Reply::status(200), uses: Uses::Times(1), used: 0 }
    }

    /// Expects a `GET`.
    pub fn get(url: &str) -> Self {
        Self::new(Method::Get, url)
    }

    /// Expects a `POST`.
    pub fn post(url: &str) -> Self {
        Self::new(Method::Post, url)
    }

    /// Expects a `PUT`.
    pub fn put(url: &str) -> Self {
        Self::new(Method::Put, url)
    }

    /// Expects a `DELETE`.
    pub fn delete(url: &str) -> Self {
        Self::new(Method::Delete, url)
    }

    /// Answers with `reply`.
    #[must_use]
    pub fn reply(mut self, reply: Reply) -> Self {
        self.reply = reply;
        self
    }

    /// Answers `count` matching requests instead of one.
    #[must_use]
    pub fn times(mut self, count: usize) -> Self {
        self.uses = Uses::Times(count);
        self
    }

    /// Answers every matching request, and may go unused.
    #[must_use]
    pub fn always(mut self) -> Self {
        self.uses = Uses::Always;
        self
    }

    fn matches(&self, request: &HttpRequest) -> bool {
        let exhausted = matches!(self.uses, Uses::Times(count) if self.used >= count);
        !exhausted
            && self.method == request.method
            && match &self.url {
                UrlPattern::Exact(url) => *url == request.url,
                UrlPattern::Prefix(prefix) => request.url.starts_with(prefix.as_str()),
            }
    }

    fn unused(&self) -> Option<String> {
        let Uses::Times(count) = self.uses else { return None };
        (self.used < count).then(|| {
            let url = match &self.url {
                UrlPattern::Exact(url) => url.clone(),
                UrlPattern::Prefix(prefix) => format!("{prefix}*"),
            };
            format!("{} {url} answered {} of {count} times", self.method, self.used)
        })
    }
}

/// Answers what no declared exchange does; `None` passes.
pub(crate) type Route = Box<dyn FnMut(&HttpRequest) -> Option<Reply>>;

/// The declared exchanges, the route, what was asked and what went wrong.
#[derive(Default)]
pub(crate) struct Exchanges {
    declared: Vec<Exchange>,
    route: Option<Route>,
    /// Every request the plugin made, in order.
    pub(crate) seen: Vec<HttpRequest>,
    /// Requests nothing answered: `METHOD URL`.
    pub(crate) unanswered: VecDeque<String>,
}

impl fmt::Debug for Exchanges {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Exchanges")
            .field("declared", &self.declared)
            .field("route", &self.route.as_ref().map(|_| "closure"))
            .field("seen", &self.seen.len())
            .finish_non_exhaustive()
    }
}

impl Exchanges {
    pub(crate) fn declare(&mut self, exchange: Exchange) {
        self.declared.push(exchange);
    }

    pub(crate) fn set_route(&mut self, route: Route) {
        self.route = Some(route);
    }

    /// The answer to `request`: refused as the operator refuses a
    /// destination the plugin never asked for, else the first declared
    /// exchange that matches and still answers, else the route.
    pub(crate) fn answer(
        &mut self,
        request: &HttpRequest,
        grants: &[HttpDestination],
    ) -> Result<HttpResponse, ErrorCode> {
        self.seen.push(request.clone());
        if !granted(&request.url, grants) {
            return Err(ErrorCode::HttpRequestDenied);
        }
        if let Some(exchange) = self.declared.iter_mut().find(|e| e.matches(request)) {
            exchange.used += 1;
            return exchange.reply.clone().into_result();
        }
        if let Some(reply) = self.route.as_mut().and_then(|route| route(request)) {
            return reply.into_result();
        }
        let label = format!("{} {}", request.method, request.url);
        self.unanswered.push_back(label.clone());
        Err(ErrorCode::InternalError(Some(format!(
            "proxyfleet-sdk-testkit: no exchange declared for {label}"
        ))))
    }

    /// Declared exchanges that answered fewer times than declared.
    pub(crate) fn unused(&self) -> Vec<String> {
        self.declared.iter().filter_map(Exchange::unused).collect()
    }
}

/// Whether `url`'s scheme, host and port are among `grants`, compared as
/// the operator compares them (host names without case).
fn granted(url: &str, grants: &[HttpDestination]) -> bool {
    let Some((scheme, rest)) = url.split_once("://") else { return false };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let authority = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    let (host, port) = match authority.strip_prefix('[') {
        Some(bracketed) => match bracketed.split_once(']') {
            Some((host, after)) => (host, after.strip_prefix(':')),
            None => return false,
        },
        None => match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        },
    };
    let default_port = match scheme {
        "http" => 80,
        "https" => 443,
        _ => return false,
    };
    let Ok(port) = port.map_or(Ok(default_port), str::parse::<u16>) else { return false };
    grants.iter().any(|grant| {
        grant.scheme.eq_ignore_ascii_case(scheme)
            // An IPv6 literal may be granted with or without brackets.
            && grant.host.trim_start_matches('[').trim_end_matches(']').eq_ignore_ascii_case(host)
            && grant.port.unwrap_or(default_port) == port
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn request(method: Method, url: &str) -> HttpRequest {
        HttpRequest {
            method,
            url: url.to_owned(),
            headers: Vec::new(),
            body: Vec::new(),
            connect_timeout: Duration::from_secs(1),
            first_byte_timeout: Duration::from_secs(1),
            between_bytes_timeout: Duration::from_secs(1),
        }
    }

    fn grants() -> Vec<HttpDestination> {
        vec![
            HttpDestination::https("api.example", None),
            HttpDestination::http("[::1]", Some(8080)),
        ]
    }

    #[test]
    fn grants_compare_scheme_host_and_port() {
        let grants = grants();
        assert!(granted("https://API.example/v1", &grants));
        assert!(granted("https://api.example:443/v1?x=1", &grants));
        assert!(granted("http://[::1]:8080/", &grants));
        assert!(!granted("http://api.example/v1", &grants), "another scheme");
        assert!(!granted("https://api.example:8443/v1", &grants), "another port");
        assert!(!granted("https://api.example.evil/v1", &grants), "another host");
        assert!(!granted("http://[::1]/", &grants), "the default port is not 8080");
    }

    #[test]
    fn an_exchange_answers_as_often_as_declared() {
        let mut exchanges = Exchanges::default();
        exchanges.declare(Exchange::get("https://api.example/a").reply(Reply::status(204)));
        exchanges
            .declare(Exchange::get("https://api.example/*").reply(Reply::status(404)).times(2));
        let grants = grants();
        let status = |exchanges: &mut Exchanges, url: &str| {
            exchanges.answer(&request(Method::Get, url), &grants).ok().map(|r| r.status)
        };
        assert_eq!(status(&mut exchanges, "https://api.example/a"), Some(204));
        // The exact one is used up; the prefix answers the same URL next.
        assert_eq!(status(&mut exchanges, "https://api.example/a"), Some(404));
        assert_eq!(exchanges.unused(), ["GET https://api.example/* answered 1 of 2 times"]);
        assert_eq!(status(&mut exchanges, "https://api.example/b"), Some(404));
        assert!(exchanges.unused().is_empty());
        assert!(matches!(
            exchanges.answer(&request(Method::Get, "https://api.example/c"), &grants),
            Err(ErrorCode::InternalError(_))
        ));
        assert_eq!(exchanges.unanswered, ["GET https://api.example/c"]);
    }

    #[test]
    fn the_route_answers_what_no_exchange_does() {
        let mut exchanges = Exchanges::default();
        exchanges.declare(Exchange::delete("https://api.example/a").always());
        exchanges.set_route(Box::new(|request| {
            request.url.ends_with("/b").then(|| Reply::json(200, &serde_json::json!({"id": "b"})))
        }));
        let grants = grants();
        let answer = exchanges.answer(&request(Method::Get, "https://api.example/b"), &grants);
        assert_eq!(answer.ok().map(|r| r.body), Some(br#"{"id":"b"}"#.to_vec()));
        assert!(exchanges.unused().is_empty(), "an `always` exchange may go unused");
    }

    #[test]
    fn a_destination_not_granted_is_denied_before_any_exchange() {
        let mut exchanges = Exchanges::default();
        exchanges.declare(Exchange::get("https://other.example/").always());
        let answer = exchanges.answer(&request(Method::Get, "https://other.example/"), &grants());
        assert!(matches!(answer, Err(ErrorCode::HttpRequestDenied)));
    }
}
