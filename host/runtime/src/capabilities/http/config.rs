//! The HTTP grants of a provider entry: destinations, the address ranges
//! each may resolve to, and the credential the host adds; parsed from the
//! providers file and validated here, beside the capability.

use std::path::PathBuf;

use http::HeaderName;
use ipnet::IpNet;
use proxyfleet_core::HttpDestination;
use proxyfleet_core::secret_store::SecretKeyRef;
use serde::Deserialize;

use crate::error::ConfigError;

/// One HTTP destination and what comes with it.
#[derive(Debug, Clone, PartialEq)]
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    /// A header built from a secret (`kind: header`, the default).
    Header(HeaderCredential),
    /// `Authorization: Bearer` with an access token the host gets for a
    /// Google service account (`kind: google-service-account`).
    GoogleServiceAccount(GoogleCredential),
    /// `Authorization: Bearer` with an access token the host gets from the
    /// metadata server: the service account of the VM, or the one a GKE
    /// pod's Kubernetes service account is bound to by Workload Identity
    /// (`kind: google-metadata`).
    GoogleMetadata(GoogleMetadataCredential),
}

/// A Google service account's key and the scopes its tokens are asked
/// for; the host exchanges them for access tokens
/// (`capabilities::google`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoogleCredential {
    /// The JSON key, read again on every exchange.
    pub key: SecretSource,
    /// OAuth scopes, each an `https://` URL.
    pub scopes: Vec<String>,
}

/// Where the host asks the metadata server for tokens, and for which
/// account and scopes (`capabilities::google`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoogleMetadataCredential {
    /// `host[:port]` of the metadata server, plain HTTP.
    pub metadata_host: String,
    /// `default`, or the e-mail of a service account of the VM.
    pub service_account: String,
    /// OAuth scopes, each an `https://` URL; empty: the account's own.
    pub scopes: Vec<String>,
}

/// The metadata server's name on Google Cloud (on GKE, the node's
/// gke-metadata-server answers it for the pod).
pub const METADATA_HOST: &str = "metadata.google.internal";

/// The credential kinds `credential.kind` takes.
const CREDENTIAL_KINDS: &str =
    "`header` (the default), `google-service-account` or `google-metadata`";

/// A header the host injects, built from a secret read on every request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderCredential {
    /// Header name, e.g. `authorization`.
    pub header: HeaderName,
    /// Header value with `{secret}` where the secret goes.
    pub value_template: String,
    /// Where the secret is read from; trailing newlines are dropped.
    pub secret: SecretSource,
}

/// Where a credential's secret is read from, each time it is needed, so
/// that a rotated secret is used without a restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretSource {
    /// A file of the host (`secretFile`, `keyFile`).
    File(PathBuf),
    /// A key of a Kubernetes Secret (`secretRef`), read through the mode's
    /// [`proxyfleet_core::secret_store::SecretStore`].
    Ref(SecretKeyRef),
}

impl std::fmt::Display for SecretSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::File(path) => write!(f, "the file {}", path.display()),
            Self::Ref(at) => at.fmt(f),
        }
    }
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
    secret_ref: Option<RawSecretRef>,
    scopes: Option<Vec<String>>,
    metadata_host: Option<String>,
    service_account: Option<String>,
}

/// A key of a Secret in the operator's namespace.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawSecretRef {
    /// The Secret's name.
    name: String,
    /// The key in it.
    key: String,
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

/// Each scope an OAuth scope URL.
fn validate_scopes(
    at: &str,
    field: &dyn Fn(&str) -> String,
    scopes: &[String],
) -> Result<(), ConfigError> {
    for (i, scope) in scopes.iter().enumerate() {
        if !scope.starts_with("https://")
            || scope.contains(char::is_whitespace)
            || scope.contains(',')
        {
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
    Ok(())
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
            refuse("metadataHost", raw.metadata_host.is_some(), "header")?;
            refuse("serviceAccount", raw.service_account.is_some(), "header")?;
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
            let secret = secret_source(
                at,
                &field,
                ("secretFile", raw.secret_file),
                raw.secret_ref,
                "the file holding the secret",
            )?;
            let value_template = raw.value_template.unwrap_or_else(|| "{secret}".to_owned());
            if !value_template.contains("{secret}") {
                return Err(ConfigError::invalid(
                    at,
                    field("valueTemplate"),
                    "must contain {secret} where the secret goes",
                ));
            }
            Ok(Credential::Header(HeaderCredential { header, value_template, secret }))
        }
        "google-service-account" => {
            let kind = "google-service-account";
            refuse("header", raw.header.is_some(), kind)?;
            refuse("valueTemplate", raw.value_template.is_some(), kind)?;
            refuse("secretFile", raw.secret_file.is_some(), kind)?;
            refuse("metadataHost", raw.metadata_host.is_some(), kind)?;
            refuse("serviceAccount", raw.service_account.is_some(), kind)?;
            let key = secret_source(
                at,
                &field,
                ("keyFile", raw.key_file),
                raw.secret_ref,
                "the service account's JSON key file",
            )?;
            let scopes = raw.scopes.unwrap_or_default();
            if scopes.is_empty() {
                return Err(ConfigError::invalid(
                    at,
                    field("scopes"),
                    "list at least one OAuth scope, e.g. https://www.googleapis.com/auth/compute",
                ));
            }
            validate_scopes(at, &field, &scopes)?;
            Ok(Credential::GoogleServiceAccount(GoogleCredential { key, scopes }))
        }
        "google-metadata" => {
            let kind = "google-metadata";
            refuse("header", raw.header.is_some(), kind)?;
            refuse("valueTemplate", raw.value_template.is_some(), kind)?;
            refuse("secretFile", raw.secret_file.is_some(), kind)?;
            refuse("keyFile", raw.key_file.is_some(), kind)?;
            refuse("secretRef", raw.secret_ref.is_some(), kind)?;
            let metadata_host = raw.metadata_host.unwrap_or_else(|| METADATA_HOST.to_owned());
            let authority = metadata_host.parse::<http::uri::Authority>().ok();
            if authority.is_none_or(|a| a.as_str() != metadata_host || a.host().is_empty())
                || metadata_host.contains('@')
            {
                return Err(ConfigError::invalid(
                    at,
                    field("metadataHost"),
                    format!(
                        "{metadata_host:?} is not host[:port]; leave it out for \
                         {METADATA_HOST}, or name a stand-in such as 127.0.0.1:8080"
                    ),
                ));
            }
            let service_account = raw.service_account.unwrap_or_else(|| "default".to_owned());
            let email = service_account.split_once('@').is_some_and(|(user, domain)| {
                !user.is_empty() && domain.contains('.') && !domain.starts_with('.')
            });
            let plain = |c: char| c.is_ascii_alphanumeric() || "@.-_".contains(c);
            if !(service_account == "default" || email) || !service_account.chars().all(plain) {
                return Err(ConfigError::invalid(
                    at,
                    field("serviceAccount"),
                    format!(
                        "{service_account:?} is neither `default` nor a service account's \
                         e-mail such as proxyfleet@my-project.iam.gserviceaccount.com"
                    ),
                ));
            }
            let scopes = raw.scopes.unwrap_or_default();
            validate_scopes(at, &field, &scopes)?;
            Ok(Credential::GoogleMetadata(GoogleMetadataCredential {
                metadata_host,
                service_account,
                scopes,
            }))
        }
        other => Err(ConfigError::invalid(
            at,
            field("kind"),
            format!("{other:?} is not a credential kind; use {CREDENTIAL_KINDS}"),
        )),
    }
}

/// The secret of a credential: the file under `file.0` (what it holds:
/// `holds`) or the Secret key of `secretRef`, exactly one of them.
fn secret_source(
    at: &str,
    field: &dyn Fn(&str) -> String,
    file: (&str, Option<PathBuf>),
    secret_ref: Option<RawSecretRef>,
    holds: &str,
) -> Result<SecretSource, ConfigError> {
    let (file_key, file) = file;
    match (file, secret_ref) {
        (Some(_), Some(_)) => Err(ConfigError::invalid(
            at,
            field("secretRef"),
            format!("give either `{file_key}` or `secretRef`, not both"),
        )),
        (Some(path), None) => Ok(SecretSource::File(path)),
        (None, Some(raw)) => {
            let name_at = field("secretRef.name");
            if !is_dns_subdomain(&raw.name) {
                return Err(ConfigError::invalid(
                    at,
                    name_at,
                    format!(
                        "{:?} is not a Secret name: use up to 253 lowercase letters, digits, \
                         '-' and '.'",
                        raw.name
                    ),
                ));
            }
            let key_chars = |c: char| c.is_ascii_alphanumeric() || "-._".contains(c);
            if raw.key.is_empty() || raw.key.len() > 253 || !raw.key.chars().all(key_chars) {
                return Err(ConfigError::invalid(
                    at,
                    field("secretRef.key"),
                    format!(
                        "{:?} is not a Secret key: use up to 253 letters, digits, '-', '_' and \
                         '.'",
                        raw.key
                    ),
                ));
            }
            Ok(SecretSource::Ref(SecretKeyRef { namespace: None, name: raw.name, key: raw.key }))
        }
        (None, None) => Err(ConfigError::invalid(
            at,
            field(file_key),
            format!(
                "is required: {holds}; or give `secretRef` (`name` and `key` of a Secret in the \
                 operator's namespace)"
            ),
        )),
    }
}

/// A DNS-1123 subdomain, as Kubernetes names most objects.
fn is_dns_subdomain(name: &str) -> bool {
    let label = |part: &str| {
        !part.is_empty()
            && part.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !part.starts_with('-')
            && !part.ends_with('-')
    };
    name.len() <= 253 && name.split('.').all(label)
}
