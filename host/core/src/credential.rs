//! The credential a proxy asks its clients for (HTTP Basic): what a Proxy
//! names, so that the health engine, the gateway and authorized crawlers
//! can use an authenticated proxy.
//!
//! The password never shows: `Debug` redacts it, and errors name what is
//! wrong with it, not what it is.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A username and password for a proxy's Basic authentication.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "Raw", into = "Raw")]
pub struct ProxyCredential {
    username: String,
    password: String,
}

/// Why a credential is refused; never holds the password.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CredentialError(String);

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    username: String,
    password: String,
}

impl TryFrom<Raw> for ProxyCredential {
    type Error = CredentialError;

    fn try_from(raw: Raw) -> Result<Self, Self::Error> {
        Self::new(raw.username, raw.password)
    }
}

impl From<ProxyCredential> for Raw {
    fn from(credential: ProxyCredential) -> Self {
        Raw { username: credential.username, password: credential.password }
    }
}

impl ProxyCredential {
    /// A credential; the username must not hold `:` (Basic authentication
    /// splits at the first one) and neither part may be empty or hold
    /// control characters (they would end a header line).
    pub fn new(username: String, password: String) -> Result<Self, CredentialError> {
        if username.is_empty() || username.contains(':') {
            return Err(CredentialError(
                "the username is empty or holds ':'; Basic authentication splits at the first ':'"
                    .to_owned(),
            ));
        }
        if password.is_empty() {
            return Err(CredentialError("the password is empty".to_owned()));
        }
        if username.chars().chain(password.chars()).any(char::is_control) {
            return Err(CredentialError(
                "the username or password holds a control character (a line break?)".to_owned(),
            ));
        }
        Ok(Self { username, password })
    }

    /// `username:password`, as a credential file holds it; one trailing
    /// line break is ignored.
    pub fn parse(text: &str) -> Result<Self, CredentialError> {
        let text = text.strip_suffix('\n').unwrap_or(text);
        let text = text.strip_suffix('\r').unwrap_or(text);
        let (username, password) = text.split_once(':').ok_or_else(|| {
            CredentialError("not username:password; write one line, username:password".to_owned())
        })?;
        Self::new(username.to_owned(), password.to_owned())
    }

    /// The username.
    pub fn username(&self) -> &str {
        &self.username
    }

    /// The password.
    pub fn password(&self) -> &str {
        &self.password
    }
}

impl fmt::Debug for ProxyCredential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProxyCredential")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_credential_parses_from_a_line_and_never_shows_its_password() {
        let credential = ProxyCredential::parse("crawler:s3cr:et\n").unwrap();
        assert_eq!((credential.username(), credential.password()), ("crawler", "s3cr:et"));
        assert!(!format!("{credential:?}").contains("s3cr"), "{credential:?}");
        for bad in ["", "nopassword", ":pw", "user:", "us\ter:pw", "user:p\nw"] {
            let err = ProxyCredential::parse(bad).unwrap_err().to_string();
            assert!(!err.contains("pw") || bad.is_empty(), "{err}");
        }
        let json = serde_json::to_string(&credential).unwrap();
        assert_eq!(serde_json::from_str::<ProxyCredential>(&json).unwrap(), credential);
        assert!(
            serde_json::from_str::<ProxyCredential>(r#"{"username":"a:b","password":"x"}"#)
                .is_err()
        );
    }
}
