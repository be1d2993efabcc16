//! Keeps secrets out of errors and logs.

use std::borrow::Cow;
use std::sync::Mutex;

/// Secrets the host has handled for one entry. Every message that leaves a
/// plugin (errors, logs) passes through [`Redactor::redact`], since a backend
/// may echo a credential back in an error body the plugin quotes.
#[derive(Debug, Default)]
pub struct Redactor {
    secrets: Mutex<Vec<String>>,
}

/// What a secret is replaced with.
pub const REDACTED: &str = "[redacted]";

impl Redactor {
    /// Remembers a secret value (a credential file's content or a header
    /// built from it). Values shorter than 4 bytes are not worth hiding and
    /// would mangle ordinary text.
    pub fn remember(&self, secret: &str) {
        if secret.len() < 4 {
            return;
        }
        let mut secrets = self.secrets.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if !secrets.iter().any(|s| s == secret) {
            secrets.push(secret.to_owned());
            // Longest first, so a header value is replaced whole rather than
            // leaving its prefix around a redacted token.
            secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        }
    }

    /// Remembers a proxy credential handed to the plugin: the password and
    /// the forms a backend may echo it in (`username:password` as a file
    /// holds it, and base64 as a Kubernetes Secret's data or a Basic header
    /// carries it).
    pub fn remember_proxy_credential(&self, username: &str, password: &str) {
        use base64::Engine as _;
        let pair = format!("{username}:{password}");
        let base64 = &base64::engine::general_purpose::STANDARD;
        for secret in [
            base64.encode(password),
            base64.encode(&pair),
            base64.encode(format!("{pair}\n")),
            pair,
            password.to_owned(),
        ] {
            self.remember(&secret);
        }
    }

    /// Stops hiding a secret that is no longer valid (an access token that
    /// was replaced), so the list does not grow with every renewal.
    pub fn forget(&self, secret: &str) {
        let mut secrets = self.secrets.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        secrets.retain(|s| s != secret);
    }

    /// Whether `text` holds a remembered secret.
    pub fn holds_secret(&self, text: &str) -> bool {
        let secrets = self.secrets.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        secrets.iter().any(|secret| text.contains(secret.as_str()))
    }

    /// `text` with every remembered secret replaced.
    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let secrets = self.secrets.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut out = Cow::Borrowed(text);
        for secret in secrets.iter() {
            if out.contains(secret.as_str()) {
                out = Cow::Owned(out.replace(secret.as_str(), REDACTED));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_every_occurrence_and_prefers_the_longest_secret() {
        let redactor = Redactor::default();
        redactor.remember("s3cret-token");
        redactor.remember("Bearer s3cret-token");
        let text = "401: bad header 'Bearer s3cret-token' (token s3cret-token)";
        assert_eq!(redactor.redact(text), "401: bad header '[redacted]' (token [redacted])");
    }

    #[test]
    fn a_proxy_credential_is_hidden_in_the_forms_a_backend_echoes() {
        let redactor = Redactor::default();
        redactor.remember_proxy_credential("crawler", "s3cret-pw");
        for (text, hidden) in [
            ("password s3cret-pw", "s3cret-pw"),
            ("Basic Y3Jhd2xlcjpzM2NyZXQtcHc=", "Y3Jhd2xlcjpzM2NyZXQtcHc="),
            ("data: {password: czNjcmV0LXB3}", "czNjcmV0LXB3"),
        ] {
            let redacted = redactor.redact(text);
            assert!(!redacted.contains(hidden) && redacted.contains(REDACTED), "{redacted}");
        }
        assert_eq!(redactor.redact("user crawler"), "user crawler", "the username is not secret");
    }

    #[test]
    fn forgotten_secrets_are_left_alone() {
        let redactor = Redactor::default();
        redactor.remember("ya29.old-token");
        redactor.forget("ya29.old-token");
        assert_eq!(redactor.redact("ya29.old-token"), "ya29.old-token");
    }

    #[test]
    fn short_values_are_left_alone() {
        let redactor = Redactor::default();
        redactor.remember("a");
        assert_eq!(redactor.redact("a cat"), "a cat");
    }
}
