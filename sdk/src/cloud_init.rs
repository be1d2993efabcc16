//! cloud-init user-data for a proxy VM: the Proxy's own user-data, plus the
//! credential the proxy must ask for when the spec carries one.
//!
//! The credential travels as a second part of a MIME multipart document,
//! which cloud-init reads as two parts: the Proxy's user-data unchanged,
//! and a cloud-config that writes `username:password` to
//! [`PROXY_AUTH_PATH`] (mode 0600, owned by root) before any `runcmd` or
//! script runs. The proxy's own setup (the user-data) reads it from there;
//! `docs/examples/tinyproxy-cloud-init.yaml` is such a setup. The
//! cloud-config part merges into a cloud-config of the user's by appending
//! to its lists (`write_files`) and adding only keys it lacks, so it
//! changes nothing the user wrote.
//!
//! ```
//! use proxyfleet_sdk::ProxyAuth;
//!
//! let auth = ProxyAuth { username: "crawler".into(), password: "s3cret".into() };
//! let data = proxyfleet_sdk::cloud_init::user_data(b"#cloud-config\n", Some(&auth))
//!     .expect("plain cloud-config combines");
//! assert!(data.starts_with(b"Content-Type: multipart/mixed"));
//! // Without a credential the user-data is passed on unchanged.
//! assert_eq!(proxyfleet_sdk::cloud_init::user_data(b"#!/bin/sh\n", None).unwrap(), b"#!/bin/sh\n");
//! ```

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use crate::types::ProxyAuth;

/// Where the instance finds the proxy credential: one line,
/// `username:password`.
///
/// ```
/// use proxyfleet_sdk::ProxyAuth;
/// use proxyfleet_sdk::cloud_init::{PROXY_AUTH_PATH, user_data};
///
/// // The proxy's own setup reads the credential that the second part writes.
/// let script = format!("#!/bin/sh\nIFS=: read -r user pass < {PROXY_AUTH_PATH}\n");
/// assert!(script.contains("< /etc/proxyfleet/proxy-auth"));
///
/// let auth = ProxyAuth { username: "crawler".into(), password: "s3cret".into() };
/// let data = user_data(script.as_bytes(), Some(&auth)).expect("a script combines");
/// assert!(data.starts_with(b"Content-Type: multipart/mixed"));
/// ```
pub const PROXY_AUTH_PATH: &str = "/etc/proxyfleet/proxy-auth";

/// Cannot appear in a part: every part is base64, whose lines never start
/// with `-`.
const BOUNDARY: &str = "==proxyfleet-user-data==";

/// Why user-data cannot carry the credential.
///
/// It converts into [`crate::ProviderError::InvalidSpec`] with `?`:
///
/// ```
/// use proxyfleet_sdk::ProviderError;
/// use proxyfleet_sdk::cloud_init::CloudInitError;
///
/// let error = ProviderError::from(CloudInitError::Compressed);
/// assert!(matches!(error, ProviderError::InvalidSpec(_)));
/// assert!(error.message().starts_with("userData:"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CloudInitError {
    /// The user-data is a MIME document already; cloud-init would read it
    /// as one opaque part.
    #[error(
        "userData: a MIME multipart document cannot be combined with the proxy credential \
         (spec.proxyAuth); give the user-data as one cloud-config or script"
    )]
    Multipart,
    /// The user-data is gzip-compressed; cloud-init decompresses only the
    /// whole document.
    #[error(
        "userData: gzip-compressed user-data cannot be combined with the proxy credential \
         (spec.proxyAuth); give it uncompressed"
    )]
    Compressed,
}

impl From<CloudInitError> for crate::ProviderError {
    fn from(error: CloudInitError) -> Self {
        crate::ProviderError::InvalidSpec(error.to_string())
    }
}

/// The user-data to give the instance: `user_data` unchanged without a
/// credential, else `user_data` and the credential's cloud-config as a
/// MIME multipart document (either part may be missing: empty user-data
/// gives the credential's part alone).
///
/// ```
/// use proxyfleet_sdk::ProxyAuth;
/// use proxyfleet_sdk::cloud_init::{CloudInitError, user_data};
///
/// let auth = ProxyAuth { username: "crawler".into(), password: "s3cret".into() };
/// let data = user_data(b"#!/bin/sh\napt-get install -y tinyproxy\n", Some(&auth))
///     .expect("a script combines");
/// assert!(data.starts_with(b"Content-Type: multipart/mixed"));
/// // gzip-compressed user-data cannot take a second part.
/// assert_eq!(user_data(&[0x1f, 0x8b, 8, 0], Some(&auth)), Err(CloudInitError::Compressed));
/// ```
pub fn user_data(user_data: &[u8], auth: Option<&ProxyAuth>) -> Result<Vec<u8>, CloudInitError> {
    let Some(auth) = auth else {
        return Ok(user_data.to_vec());
    };
    if user_data.starts_with(&[0x1f, 0x8b]) {
        return Err(CloudInitError::Compressed);
    }
    if is_mime(user_data) {
        return Err(CloudInitError::Multipart);
    }
    let mut out =
        format!("Content-Type: multipart/mixed; boundary=\"{BOUNDARY}\"\nMIME-Version: 1.0\n\n");
    if !user_data.is_empty() {
        // `text/plain`: cloud-init tells the part's type from its first
        // line (`#cloud-config`, `#!`, `#include`, ...), as it does for
        // user-data that is not MIME.
        part(&mut out, "text/plain", "user-data", user_data);
    }
    part(&mut out, "text/cloud-config", "proxyfleet-proxy-auth.cfg", auth_config(auth).as_bytes());
    out.push_str(&format!("--{BOUNDARY}--\n"));
    Ok(out.into_bytes())
}

/// The cloud-config that writes the credential file.
fn auth_config(auth: &ProxyAuth) -> String {
    let content = STANDARD.encode(format!("{}:{}\n", auth.username, auth.password));
    format!(
        "#cloud-config\n\
         merge_how:\n\
         - name: list\n  settings: [append]\n\
         - name: dict\n  settings: [no_replace, recurse_list]\n\
         write_files:\n\
         - path: {PROXY_AUTH_PATH}\n  \
           owner: root:root\n  \
           permissions: '0600'\n  \
           encoding: b64\n  \
           content: {content}\n"
    )
}

fn part(out: &mut String, content_type: &str, filename: &str, body: &[u8]) {
    out.push_str(&format!(
        "--{BOUNDARY}\nContent-Type: {content_type}; charset=\"utf-8\"\nMIME-Version: 1.0\n\
         Content-Transfer-Encoding: base64\n\
         Content-Disposition: attachment; filename=\"{filename}\"\n\n"
    ));
    let encoded = STANDARD.encode(body);
    for line in encoded.as_bytes().chunks(76) {
        // Base64 is ASCII.
        out.push_str(std::str::from_utf8(line).unwrap_or_default());
        out.push('\n');
    }
}

/// Starts with a MIME header, as cloud-init's multipart user-data does.
fn is_mime(data: &[u8]) -> bool {
    let head = &data[..data.len().min(32)];
    let head = String::from_utf8_lossy(head).to_ascii_lowercase();
    head.starts_with("content-type:") || head.starts_with("mime-version:")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth() -> ProxyAuth {
        ProxyAuth { username: "crawler".into(), password: "s3cret-pass".into() }
    }

    /// The parts of a document this module wrote: (headers, decoded body).
    fn parts(document: &[u8]) -> Vec<(String, Vec<u8>)> {
        let text = std::str::from_utf8(document).expect("MIME text");
        let marker = format!("--{BOUNDARY}\n");
        let end = format!("--{BOUNDARY}--\n");
        assert!(text.ends_with(&end), "{text}");
        let body = &text[..text.len() - end.len()];
        body.split(&marker)
            .skip(1)
            .map(|part| {
                let (headers, encoded) = part.split_once("\n\n").expect("headers end");
                let decoded = STANDARD.decode(encoded.replace('\n', "")).expect("base64");
                (headers.to_owned(), decoded)
            })
            .collect()
    }

    #[test]
    fn without_a_credential_the_user_data_is_unchanged() {
        for data in [&b""[..], b"#cloud-config\n", &[0x1f, 0x8b, 0, 1], b"Content-Type: x\n"] {
            assert_eq!(user_data(data, None).expect("a test value"), data);
        }
    }

    #[test]
    fn the_credential_joins_the_user_data_as_a_cloud_config_part() {
        let mine = b"#cloud-config\npackages: [tinyproxy]\n";
        let document = user_data(mine, Some(&auth())).expect("a test value");
        let text = String::from_utf8(document.clone()).expect("a test value");
        assert!(text.starts_with(&format!(
            "Content-Type: multipart/mixed; boundary=\"{BOUNDARY}\"\nMIME-Version: 1.0\n\n"
        )));
        assert!(!text.contains("s3cret-pass"), "the password is base64 in its part");
        let parts = parts(&document);
        assert_eq!(parts.len(), 2);
        assert!(parts[0].0.contains("Content-Type: text/plain"), "{}", parts[0].0);
        assert_eq!(parts[0].1, mine, "the user's part is byte for byte theirs");
        assert!(parts[1].0.contains("Content-Type: text/cloud-config"), "{}", parts[1].0);
        let config = String::from_utf8(parts[1].1.clone()).expect("a test value");
        assert!(config.starts_with("#cloud-config\n"), "{config}");
        assert!(config.contains("settings: [append]"), "lists append: {config}");
        let content = config
            .lines()
            .find_map(|line| line.trim().strip_prefix("content: "))
            .expect("a content line");
        assert_eq!(STANDARD.decode(content).expect("a test value"), b"crawler:s3cret-pass\n");
        assert!(config.contains(&format!("- path: {PROXY_AUTH_PATH}\n")), "{config}");
        assert!(config.contains("permissions: '0600'"), "{config}");
    }

    #[test]
    fn empty_user_data_gives_the_credential_part_alone() {
        let parts = parts(&user_data(b"", Some(&auth())).expect("a test value"));
        assert_eq!(parts.len(), 1);
        assert!(parts[0].0.contains("text/cloud-config"));
    }

    #[test]
    fn binary_user_data_survives_its_part() {
        let script: Vec<u8> = b"#!/bin/sh\n".iter().copied().chain(0..=255u8).collect();
        let parts = parts(&user_data(&script, Some(&auth())).expect("a test value"));
        assert_eq!(parts[0].1, script);
    }

    #[test]
    fn mime_and_gzip_user_data_are_refused_naming_the_field() {
        let mime = b"Content-Type: multipart/mixed; boundary=x\n\n--x--\n";
        assert_eq!(user_data(mime, Some(&auth())), Err(CloudInitError::Multipart));
        assert_eq!(
            user_data(b"MIME-Version: 1.0\n", Some(&auth())),
            Err(CloudInitError::Multipart)
        );
        assert_eq!(user_data(&[0x1f, 0x8b, 8, 0], Some(&auth())), Err(CloudInitError::Compressed));
        let message = crate::ProviderError::from(CloudInitError::Multipart).to_string();
        assert!(message.contains("userData") && message.contains("proxyAuth"), "{message}");
    }
}
