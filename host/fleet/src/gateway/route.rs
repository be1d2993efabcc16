//! Routing parameters in the proxy username.
//!
//! Crawler tools put routing in the proxy credentials, since that is the
//! one place every HTTP client lets them set per proxy. The gateway takes
//! the username as comma-separated `key=value` pairs and the password as an
//! API token:
//!
//! ```text
//! curl -x 'http://pool=default.web,session=s1:TOKEN@127.0.0.1:8481' http://example.com/
//! ```
//!
//! | key | value |
//! | --- | --- |
//! | `pool` | a ProxyPool, `namespace/name` or `namespace.name` (no `/` to escape in a URL) |
//! | `provider` | a provider entry |
//! | `label.KEY` | a label the proxy must carry, `label.tier=gold` |
//! | `session` | a sticky session ID: 1 to 64 of `A-Z a-z 0-9 _ -` |
//! | `strategy` | `round-robin`, `least-recently-used` or `random` |
//!
//! An empty username (`http://:TOKEN@host:port`) routes over the whole
//! fleet. An unknown key or a bad value is refused by name.

use crate::catalog::{Selector, Strategy};

/// The longest session ID.
const MAX_SESSION: usize = 64;

/// Where a crawler wants its request to go.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Route {
    /// Which proxies may serve it.
    pub selector: Selector,
    /// The sticky session, if any.
    pub session: Option<String>,
    /// How to pick, when not the operator's default.
    pub strategy: Option<Strategy>,
}

/// Why a username is not a route.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("proxy username, {key}: {message}")]
pub struct RouteError {
    /// The key at fault (`username` for the whole).
    pub key: String,
    /// What is wrong and what to write instead.
    pub message: String,
}

impl RouteError {
    fn new(key: &str, message: impl Into<String>) -> Self {
        Self { key: key.to_owned(), message: message.into() }
    }
}

impl Route {
    /// Parses a proxy username.
    pub fn parse(username: &str) -> Result<Self, RouteError> {
        let mut route = Route::default();
        for pair in username.split(',').map(str::trim).filter(|pair| !pair.is_empty()) {
            let Some((key, value)) = pair.split_once('=') else {
                return Err(RouteError::new(
                    "username",
                    format!("{pair:?} is not key=value; write e.g. pool=default.web,session=s1"),
                ));
            };
            if value.is_empty() {
                return Err(RouteError::new(key, "is empty; give a value or leave the key out"));
            }
            match key {
                "pool" => route.selector.pool = Some(pool_of(value)?),
                "provider" => route.selector.provider = Some(value.to_owned()),
                "session" => route.session = Some(session_of(value)?),
                "strategy" => {
                    route.strategy = Some(
                        Strategy::parse("strategy", value)
                            .map_err(|err| RouteError::new("strategy", err.to_string()))?,
                    );
                }
                _ => match key.strip_prefix("label.") {
                    Some(label) if !label.is_empty() => {
                        route.selector.labels.push((label.to_owned(), value.to_owned()));
                    }
                    _ => {
                        return Err(RouteError::new(
                            key,
                            "is not a routing key; use pool, provider, label.KEY, session or strategy",
                        ));
                    }
                },
            }
        }
        Ok(route)
    }
}

/// `namespace/name` or `namespace.name`: a namespace is a DNS label, so
/// its first dot ends it.
fn pool_of(value: &str) -> Result<String, RouteError> {
    let (namespace, name) =
        value.split_once('/').or_else(|| value.split_once('.')).ok_or_else(|| {
            RouteError::new(
                "pool",
                format!("{value:?} names no namespace; write namespace/name or namespace.name"),
            )
        })?;
    if namespace.is_empty() || name.is_empty() {
        return Err(RouteError::new(
            "pool",
            format!("{value:?} is not namespace/name or namespace.name"),
        ));
    }
    Ok(format!("{namespace}/{name}"))
}

fn session_of(value: &str) -> Result<String, RouteError> {
    let valid = value.len() <= MAX_SESSION
        && value.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !valid {
        return Err(RouteError::new(
            "session",
            format!("{value:?} is not a session ID; use 1 to {MAX_SESSION} of A-Z a-z 0-9 _ -"),
        ));
    }
    Ok(value.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_username_names_pool_provider_labels_session_and_strategy() {
        let route = Route::parse(
            "pool=default.web, provider=gcp,label.tier=gold,session=s-1,strategy=random",
        )
        .unwrap();
        assert_eq!(route.selector.pool.as_deref(), Some("default/web"));
        assert_eq!(route.selector.provider.as_deref(), Some("gcp"));
        assert_eq!(route.selector.labels, [("tier".to_owned(), "gold".to_owned())]);
        assert_eq!(route.session.as_deref(), Some("s-1"));
        assert_eq!(route.strategy, Some(Strategy::Random));
        assert_eq!(
            Route::parse("pool=crawl/eu.west").unwrap().selector.pool.as_deref(),
            Some("crawl/eu.west")
        );
        assert_eq!(
            Route::parse("pool=crawl.eu.west").unwrap().selector.pool.as_deref(),
            Some("crawl/eu.west"),
            "a namespace has no dot, so the first one ends it"
        );
        assert_eq!(Route::parse("").unwrap(), Route::default());
    }

    #[test]
    fn bad_usernames_are_refused_by_key() {
        for (username, key) in [
            ("country=us", "country"),
            ("pool", "username"),
            ("pool=web", "pool"),
            ("pool=", "pool"),
            ("session=has space", "session"),
            ("session=a/b", "session"),
            ("strategy=fastest", "strategy"),
            ("label.=x", "label."),
        ] {
            let err = Route::parse(username).unwrap_err();
            assert_eq!(err.key, key, "{username}: {err}");
            assert!(err.to_string().starts_with("proxy username, "), "{err}");
        }
        let long = format!("session={}", "a".repeat(MAX_SESSION + 1));
        assert_eq!(Route::parse(&long).unwrap_err().key, "session");
    }
}
