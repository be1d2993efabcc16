//! The HTTP grants of a provider entry: destinations, the address ranges
//! each may resolve to, and the credential the host adds; parsed from the
//! providers file and validated here, beside the capability.

use std::path::PathBuf;

use http::HeaderName;
use ipnet::IpNet;
use proxyfleet_core::HttpDestination;
use serde::Deserialize;

use crate::error::ConfigError;

/// One HTTP destination and what comes with it.
#[derive(Debug, Clone)]
pub struct HttpGrant {
    /// Scheme, host and port the plugin may send to.
    pub destination: HttpDestination,
    /// Address ranges that would otherwise be refused (loopback, private,
    /// link-local, metadata) that this destination may resolve to.
    pub allow_addresses: Vec<IpNet>,
    /// A credential the host adds to every request to this destination.
    pub credential: Option<Credential>,
}

/// What the host adds to every request to a grant's destination.
#[derive(Debug, Clone)]
pub enum Credential {
    /// A header built from a secret file (`kind: header`, the default).
    Header(HeaderCredential),
    /// `Authorization: Bearer` with an access token the host gets for a
    /// Google service account (`kind: google-service-account`).
    GoogleServiceAccount(GoogleCredential),
}

/// A Google service account's key and the scopes its tokens are asked
/// for; the host exchanges them for access tokens
/// (`capabilities::google`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoogleCredential {
    /// The JSON key file, read again on every exchange.
    pub key_file: PathBuf,
    /// OAuth scopes, each an `https://` URL.
    pub scopes: Vec<String>,
}

/// The credential kinds `credential.kind` takes.
const CREDENTIAL_KINDS: &str = "`header` (the default) or `google-service-account`";

/// A header the host injects, built from a secret file read on every request.
#[derive(Debug, Clone)]
pub struct HeaderCredential {
    /// Header name, e.g. `authorization`.
    pub header: HeaderName,
    /// Header value with `{secret}` where the file's content goes.
    pub value_template: String,
    /// File holding the secret; trailing newlines are dropped.
    pub secret_file: PathBuf,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct RawHttpGrant {
    url: String,
    #[serde(default)]
    allow_addresses: Vec<String>,
    credential: Option<RawCredential>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawCredential {
    kind: Option<String>,
    header: Option<String>,
    value_template: Option<String>,
    secret_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    scopes: Option<Vec<String>>,
}

pub(crate) fn validate_http_grant(
    at: &str,
    i: usize,
    raw: RawHttpGrant,
) -> Result<HttpGrant, ConfigError> {
    let key = |field: &str| format!("grants.http[{i}].{field}");
    let uri: http::Uri = raw.url.parse().map_err(|err| {
        ConfigError::invalid(at, key("url"), format!("{:?} is not a URL: {err}", raw.url))
    })?;
    let scheme = match uri.scheme_str() {
        Some(s @ ("http" | "https")) => s.to_owned(),
        _ => {
            return Err(ConfigError::invalid(
                at,
                key("url"),
                format!("{:?} must start with https:// or http://", raw.url),
            ));
        }
    };
    let host = uri.host().unwrap_or_default().trim_matches(['[', ']']).to_ascii_lowercase();
    if host.is_empty() || host.contains('*') {
        return Err(ConfigError::invalid(
            at,
            key("url"),
            format!("{:?} must name one host; wildcards are not accepted", raw.url),
        ));
    }
    if let Some(ip) = crate::capabilities::address::non_canonical(&host) {
        return Err(ConfigError::invalid(
            at,
            key("url"),
            format!(
                "{:?}: the host {host:?} is the IP address {ip} written another way; write {ip} \
                 (URL parsers read such spellings differently)",
                raw.url
            ),
        ));
    }
    if uri.path_and_query().is_some_and(|p| p.as_str() != "/" && !p.as_str().is_empty()) {
        return Err(ConfigError::invalid(
            at,
            key("url"),
            format!("{:?}: a grant is scheme, host and port only; drop the path", raw.url),
        ));
    }
    let destination = HttpDestination { scheme, host, port: uri.port_u16() };
    let allow_addresses = crate::capabilities::address::parse_ranges(
        at,
        &key("allowAddresses"),
        &raw.allow_addresses,
    )?;
    let credential =
        raw.credential.map(|c| validate_credential(at, &key("credential"), c)).transpose()?;
    Ok(HttpGrant { destination, allow_addresses, credential })
}

fn validate_credential(at: &str, key: &str, raw: RawCredential) -> Result<Credential, ConfigError> {
    let field = |name: &str| format!("{key}.{name}");
    // Keys of the other kind are refused by name rather than ignored: a
    // half-converted credential would otherwise send no secret at all.
    let refuse = |name: &str, present: bool, kind: &str| {
        if present {
            Err(ConfigError::invalid(
                at,
                field(name),
                format!("does not apply to kind `{kind}`; remove it"),
            ))
        } else {
            Ok(())
        }
    };
    match raw.kind.as_deref().unwrap_or("header") {
        "header" => {
            refuse("keyFile", raw.key_file.is_some(), "header")?;
            refuse("scopes", raw.scopes.is_some(), "header")?;
            let Some(header) = raw.header else {
                return Err(ConfigError::invalid(
                    at,
                    field("header"),
                    "is required: name the header to send, e.g. Authorization",
                ));
            };
            let header = HeaderName::try_from(header.as_str()).map_err(|_| {
                ConfigError::invalid(
                    at,
                    field("header"),
                    format!("{header:?} is not a valid header name"),
                )
            })?;
            let Some(secret_file) = raw.secret_file else {
                return Err(ConfigError::invalid(
                    at,
                    field("secretFile"),
                    "is required: the file holding the secret",
                ));
            };
            let value_template = raw.value_template.unwrap_or_else(|| "{secret}".to_owned());
            if !value_template.contains("{secret}") {
                return Err(ConfigError::invalid(
                    at,
                    field("valueTemplate"),
                    "must contain {secret} where the secret file's content goes",
                ));
            }
            Ok(Credential::Header(HeaderCredential { header, value_template, secret_file }))
        }
        "google-service-account" => {
            let kind = "google-service-account";
            refuse("header", raw.header.is_some(), kind)?;
            refuse("valueTemplate", raw.value_template.is_some(), kind)?;
            refuse("secretFile", raw.secret_file.is_some(), kind)?;
            let Some(key_file) = raw.key_file else {
                return Err(ConfigError::invalid(
                    at,
                    field("keyFile"),
                    "is required: the service account's JSON key file",
                ));
            };
            let scopes = raw.scopes.unwrap_or_default();
            if scopes.is_empty() {
                return Err(ConfigError::invalid(
                    at,
                    field("scopes"),
                    "list at least one OAuth scope, e.g. https://www.googleapis.com/auth/compute",
                ));
            }
            for (i, scope) in scopes.iter().enumerate() {
                if !scope.starts_with("https://") || scope.contains(char::is_whitespace) {
                    return Err(ConfigError::invalid(
                        at,
                        field(&format!("scopes[{i}]")),
                        format!(
                            "{scope:?} is not an OAuth scope URL such as \
                             https://www.googleapis.com/auth/compute"
                        ),
                    ));
                }
            }
            Ok(Credential::GoogleServiceAccount(GoogleCredential { key_file, scopes }))
        }
        other => Err(ConfigError::invalid(
            at,
            field("kind"),
            format!("{other:?} is not a credential kind; use {CREDENTIAL_KINDS}"),
        )),
    }
}
