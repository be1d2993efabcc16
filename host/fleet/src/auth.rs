//! Bearer-token authentication of the discovery API.
//!
//! Tokens come from a file, one per line (`#` starts a comment), the shape
//! of a mounted Kubernetes Secret key. A line is a token, optionally
//! followed by its role: `TOKEN role=read` may read (the proxy list,
//! `next`, leases, the console) and use the gateway; `TOKEN role=operate`,
//! or a token alone, may also change state (reports, leases, quarantines,
//! rollbacks, the console's actions). The file is read again on every
//! [`ApiAuth::reload`], so a rotated Secret takes effect without a restart.
//! Comparison takes the same time whatever the mismatch, so response times
//! do not leak how much of a guess was right.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use crate::error::{Error, Result};

/// Who may call the API.
#[derive(Debug)]
pub struct ApiAuth {
    tokens: ArcSwap<Vec<Token>>,
    file: Option<PathBuf>,
    open_read: bool,
    /// Without a token file: whether requests that change state are open.
    open_writes: bool,
}

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// Reads, and the gateway.
    Read,
    /// Reads and every request that changes state.
    Operate,
}

impl Role {
    /// Its name in the token file.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Operate => "operate",
        }
    }
}

/// One token of the file.
struct Token {
    secret: Vec<u8>,
    role: Role,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Token").field("role", &self.role).finish_non_exhaustive()
    }
}

/// What a request needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Open to anyone (probes, health, metrics).
    Public,
    /// Reading the proxy list: open when configured so.
    ReadList,
    /// Other reads (handing out a proxy, listing leases).
    Token,
    /// Requests that change state: reports, leases, rollbacks. They need
    /// a token with the `operate` role; without a token file they are
    /// refused unless opened on purpose.
    Write,
}

impl ApiAuth {
    /// No authentication, and every request allowed, writes included
    /// (`--api-open-writes`).
    pub fn open() -> Self {
        Self { tokens: ArcSwap::default(), file: None, open_read: true, open_writes: true }
    }

    /// No authentication for reads; requests that change state are refused,
    /// since nothing could authorize them. The default without a token file.
    pub fn reads_only() -> Self {
        Self { tokens: ArcSwap::default(), file: None, open_read: true, open_writes: false }
    }

    /// Whether tokens guard the API (a token file was given).
    pub fn has_tokens(&self) -> bool {
        self.file.is_some()
    }

    /// Tokens from `file`; `open_read` leaves the proxy list readable
    /// without one. Fails when the file cannot be read or holds no token.
    pub fn from_file(file: PathBuf, open_read: bool) -> Result<Self> {
        let auth =
            Self { tokens: ArcSwap::default(), file: Some(file), open_read, open_writes: false };
        auth.reload()?;
        Ok(auth)
    }

    /// Reads the token file again; on failure the old tokens stay.
    pub fn reload(&self) -> Result<()> {
        let Some(file) = &self.file else { return Ok(()) };
        let text = std::fs::read_to_string(file)
            .map_err(|source| Error::TokenFile { path: file.display().to_string(), source })?;
        let mut tokens = Vec::new();
        for (number, line) in token_lines(&text) {
            tokens.push(parse_line(line).map_err(|message| {
                Error::setting(
                    "--api-token-file",
                    format!("{} line {number}: {message}", file.display()),
                )
            })?);
        }
        if tokens.is_empty() {
            return Err(Error::setting(
                "--api-token-file",
                format!("{} holds no token; write one token per line", file.display()),
            ));
        }
        self.tokens.store(Arc::new(tokens));
        Ok(())
    }

    /// Reloads every `every` until the task is aborted.
    pub fn spawn_reloader(self: &Arc<Self>, every: Duration) -> tokio::task::JoinHandle<()> {
        let auth = Arc::clone(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                if let Err(err) = auth.reload() {
                    tracing::warn!("API tokens not reloaded, the old ones stay: {err}");
                }
            }
        })
    }

    /// The role of `token`, when it is one of the file's. Every token is
    /// compared, always, so timing says nothing about which matched.
    pub fn role_of(&self, token: &[u8]) -> Option<Role> {
        self.role_where(|secret| constant_time_eq(secret, token))
    }

    /// The role of the first token `matches` holds for, comparing every
    /// one (a session cookie names its token by a keyed digest).
    pub fn role_where(&self, matches: impl Fn(&[u8]) -> bool) -> Option<Role> {
        let tokens = self.tokens.load();
        tokens.iter().fold(None, |found, token| {
            let hit = matches(&token.secret);
            found.or(hit.then_some(token.role))
        })
    }

    /// Whether a request with `authorization` may do what needs `access`.
    pub fn allows(&self, access: Access, authorization: Option<&[u8]>) -> bool {
        self.allows_token(access, authorization.and_then(|value| value.strip_prefix(b"Bearer ")))
    }

    /// Whether a request bearing `token` (however the request carried it:
    /// a bearer token to the API, a proxy password to the gateway) may do
    /// what needs `access`.
    pub fn allows_token(&self, access: Access, token: Option<&[u8]>) -> bool {
        if access == Access::Public {
            return true;
        }
        if self.file.is_none() {
            return access != Access::Write || self.open_writes;
        }
        if access == Access::ReadList && self.open_read {
            return true;
        }
        let Some(token) = token else {
            return false;
        };
        self.role_of(token).is_some_and(|role| Self::role_allows(role, access))
    }

    /// Whether `role` may do what needs `access`.
    pub fn role_allows(role: Role, access: Access) -> bool {
        access != Access::Write || role == Role::Operate
    }
}

/// The lines of a token file that hold a token, trimmed, with their
/// numbers from 1: blank lines and `#` comments are skipped.
fn token_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .map(|(index, line)| (index + 1, line.trim()))
        .filter(|(_, line)| !line.is_empty() && !line.starts_with('#'))
}

/// The first token of a token file's text, without its role: what a
/// client of the API sends (`proxyfleet probe`, `plugin rollback`).
pub fn first_token(text: &str) -> Option<&str> {
    token_lines(text).next().and_then(|(_, line)| line.split_whitespace().next())
}

/// `TOKEN` or `TOKEN role=ROLE`.
fn parse_line(line: &str) -> std::result::Result<Token, String> {
    let mut words = line.split_whitespace();
    let secret = words.next().unwrap_or_default().as_bytes().to_vec();
    let mut role = Role::Operate;
    for word in words {
        role = match word.split_once('=') {
            Some(("role", "read")) => Role::Read,
            Some(("role", "operate")) => Role::Operate,
            Some(("role", other)) => {
                return Err(format!(
                    "role {other:?} is not a role; write role=read or role=operate"
                ));
            }
            _ => {
                return Err(format!(
                    "after the token comes only role=read or role=operate, not {:?}",
                    word.split_once('=').map_or(word, |(key, _)| key)
                ));
            }
        };
    }
    Ok(Token { secret, role })
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_from_a_file_guard_all_but_public_and_optionally_the_list() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tokens");
        std::fs::write(&file, "# crawler tokens\ns3cret\n\nother\n").unwrap();
        let auth = ApiAuth::from_file(file.clone(), true).unwrap();
        assert!(auth.allows(Access::Public, None));
        assert!(auth.allows(Access::ReadList, None));
        assert!(!auth.allows(Access::Token, None));
        assert!(!auth.allows(Access::Write, None));
        assert!(auth.allows(Access::Write, Some(b"Bearer s3cret")));
        assert!(!auth.allows(Access::Token, Some(b"Bearer wrong")));
        assert!(!auth.allows(Access::Token, Some(b"s3cret")));
        assert!(auth.allows(Access::Token, Some(b"Bearer s3cret")));
        assert!(auth.allows(Access::Token, Some(b"Bearer other")));
        let closed = ApiAuth::from_file(file.clone(), false).unwrap();
        assert!(!closed.allows(Access::ReadList, None));
        // Rotation: the new token works after a reload, the old one not.
        std::fs::write(&file, "rotated\n").unwrap();
        auth.reload().unwrap();
        assert!(auth.allows(Access::Token, Some(b"Bearer rotated")));
        assert!(!auth.allows(Access::Token, Some(b"Bearer s3cret")));
        // An emptied file keeps the old tokens and says why.
        std::fs::write(&file, "# nothing\n").unwrap();
        let err = auth.reload().unwrap_err().to_string();
        assert!(err.contains("holds no token"), "{err}");
        assert!(auth.allows(Access::Token, Some(b"Bearer rotated")));
    }

    #[test]
    fn a_read_token_reads_and_an_operate_token_also_writes() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tokens");
        std::fs::write(
            &file,
            "viewer role=read
operator role=operate
plain
",
        )
        .unwrap();
        let auth = ApiAuth::from_file(file.clone(), false).unwrap();
        assert_eq!(auth.role_of(b"viewer"), Some(Role::Read));
        assert_eq!(auth.role_of(b"operator"), Some(Role::Operate));
        assert_eq!(auth.role_of(b"plain"), Some(Role::Operate), "a token alone keeps every right");
        assert_eq!(auth.role_of(b"viewer role=read"), None);
        assert!(auth.allows(Access::Token, Some(b"Bearer viewer")));
        assert!(!auth.allows(Access::Write, Some(b"Bearer viewer")));
        assert!(auth.allows(Access::Write, Some(b"Bearer operator")));
        // A line the file cannot mean is refused by line, key and fix, and
        // never quotes the token.
        std::fs::write(
            &file,
            "ok
secret-token rolle=read
",
        )
        .unwrap();
        let err = auth.reload().unwrap_err().to_string();
        assert!(err.contains("line 2") && err.contains("\"rolle\""), "{err}");
        assert!(!err.contains("secret-token"), "{err}");
        std::fs::write(
            &file,
            "secret-token role=admin
",
        )
        .unwrap();
        let err = auth.reload().unwrap_err().to_string();
        assert!(err.contains("role=read or role=operate"), "{err}");
        assert!(!err.contains("secret-token"), "{err}");
    }

    #[test]
    fn without_a_file_reads_are_open_and_writes_only_when_opened_on_purpose() {
        let default = ApiAuth::reads_only();
        for access in [Access::Public, Access::ReadList, Access::Token] {
            assert!(default.allows(access, None), "{access:?}");
        }
        assert!(!default.allows(Access::Write, None));
        assert!(!default.allows(Access::Write, Some(b"Bearer anything")));
        assert!(ApiAuth::open().allows(Access::Write, None));
    }
}
