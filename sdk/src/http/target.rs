//! A request's URL as the host will see it: scheme, authority and path,
//! and the URL as errors may show it.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Scheme {
    Http,
    Https,
}

impl Scheme {
    pub(super) fn default_port(self) -> u16 {
        match self {
            Self::Http => 80,
            Self::Https => 443,
        }
    }
}

/// The parts of an absolute `http`/`https` URL that `wasi:http` takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Target {
    pub(super) scheme: Scheme,
    /// `host[:port]` as written in the URL.
    pub(super) authority: String,
    /// The host, IPv6 literals in brackets.
    pub(super) host: String,
    /// The explicit port, or the scheme's default.
    pub(super) port: u16,
    /// Starts with `/`; the fragment is dropped.
    pub(super) path_with_query: String,
}

impl Target {
    pub(super) fn parse(url: &str) -> std::result::Result<Self, String> {
        let (scheme, rest) =
            url.split_once("://").ok_or_else(|| "expected scheme://host/path".to_owned())?;
        let scheme = match scheme.to_ascii_lowercase().as_str() {
            "http" => Scheme::Http,
            "https" => Scheme::Https,
            _ => return Err(format!("unsupported scheme `{scheme}` (use http or https)")),
        };
        let rest = rest.split_once('#').map_or(rest, |(before, _)| before);
        let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, path_with_query) = rest.split_at(authority_end);
        if authority.contains('@') {
            return Err(
                "credentials in the URL are not supported; send them in a header".to_owned()
            );
        }
        let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
            let (address, after) =
                bracketed.split_once(']').ok_or_else(|| "unclosed `[` in the host".to_owned())?;
            let port = match after {
                "" => None,
                _ => Some(
                    after
                        .strip_prefix(':')
                        .ok_or_else(|| "expected `:port` after `]`".to_owned())?,
                ),
            };
            (format!("[{address}]"), port)
        } else {
            match authority.rsplit_once(':') {
                Some((host, port)) => (host.to_owned(), Some(port)),
                None => (authority.to_owned(), None),
            }
        };
        if host.is_empty() || host == "[]" {
            return Err("missing host".to_owned());
        }
        let port = match port {
            None | Some("") => scheme.default_port(),
            Some(port) => port.parse().map_err(|_| format!("invalid port `{port}`"))?,
        };
        let path_with_query = if path_with_query.starts_with('/') {
            path_with_query.to_owned()
        } else {
            format!("/{path_with_query}")
        };
        Ok(Self {
            scheme,
            authority: authority.to_owned(),
            host: host.to_ascii_lowercase(),
            port,
            path_with_query,
        })
    }

    /// `scheme://host:port`, the unit the host grants.
    pub(super) fn origin(&self) -> String {
        let scheme = match self.scheme {
            Scheme::Http => "http",
            Scheme::Https => "https",
        };
        format!("{scheme}://{}:{}", self.host, self.port)
    }
}

/// `url` with any `user:password@` removed, for messages.
pub(super) fn redact_userinfo(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://{}", &rest[at + 1..]),
        None => url.to_owned(),
    }
}
