//! How the host reaches each registry: credentials from files, an extra CA,
//! plain HTTP only where it is safe or explicitly allowed.
//!
//! Credentials and CA files are read on every use, never kept: a mounted
//! Secret that rotates takes effect on the next pull, and nothing secret
//! lives in the host's memory between pulls. A registry with no entry is
//! reached anonymously over HTTPS with the system's roots.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::secrets::RegistryAuth;
use serde::Deserialize;
use thiserror::Error;

use crate::destination::Destinations;
use crate::error::OciError;
use crate::reference::is_loopback_host;
use crate::signature::{KeyPolicy, RawVerify};

/// How long a registry has to accept a connection.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// How long a registry may go quiet while answering.
const READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);
/// What the pull's requests call themselves.
const USER_AGENT: &str = concat!("proxyfleet/", env!("CARGO_PKG_VERSION"));

/// One `registries[]` item as written.
#[derive(Debug, Clone, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawRegistry {
    /// `HOST` or `HOST:PORT`, as references spell it.
    pub host: String,
    /// User name for basic auth.
    pub username: Option<String>,
    /// A file holding the user name (a `kubernetes.io/basic-auth` Secret's
    /// `username` key), instead of `username`.
    pub username_file: Option<PathBuf>,
    /// A file holding the password for basic auth.
    pub password_file: Option<PathBuf>,
    /// A file holding a bearer token, instead of basic auth.
    pub token_file: Option<PathBuf>,
    /// PEM certificates trusted for this registry besides the system's.
    pub ca_file: Option<PathBuf>,
    /// Speak plain HTTP; only for loopback unless `insecure` is set too.
    #[serde(default)]
    pub plain_http: bool,
    /// Allows `plainHttp` for a registry that is not on loopback.
    #[serde(default)]
    pub insecure: bool,
    /// Public keys every build pulled from this registry must be signed
    /// with (one of them).
    pub verify: Option<RawVerify>,
}

/// A registry item that makes no sense, with the field and the fix.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("registries[{index}].{field}: {reason}")]
pub struct InvalidRegistry {
    /// Position in the list.
    pub index: usize,
    /// The key at fault.
    pub field: &'static str,
    /// What is wrong and how to fix it.
    pub reason: String,
}

/// Where basic or bearer credentials come from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Credentials {
    Anonymous,
    Basic { username: Username, password_file: PathBuf },
    Bearer { token_file: PathBuf },
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Username {
    Literal(String),
    File(PathBuf),
}

/// How one registry is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryAccess {
    host: String,
    credentials: Credentials,
    ca_file: Option<PathBuf>,
    plain_http: bool,
    verify: Option<KeyPolicy>,
}

/// Every registry the installation names, by host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Registries {
    by_host: BTreeMap<String, RegistryAccess>,
}

impl Registries {
    /// Validates the `registries` list: hosts unique, one kind of
    /// credential each, plain HTTP only where allowed.
    pub fn validate(raw: Vec<RawRegistry>) -> Result<Self, InvalidRegistry> {
        let mut by_host = BTreeMap::new();
        for (index, item) in raw.into_iter().enumerate() {
            let access = RegistryAccess::validate(index, item)?;
            if by_host.contains_key(&access.host) {
                return Err(InvalidRegistry {
                    index,
                    field: "host",
                    reason: format!(
                        "{:?} is listed by an earlier item; list each registry once",
                        access.host
                    ),
                });
            }
            by_host.insert(access.host.clone(), access);
        }
        Ok(Self { by_host })
    }

    /// How `host` is reached: its item, or anonymous HTTPS.
    pub fn for_host(&self, host: &str) -> RegistryAccess {
        self.by_host.get(&host.to_ascii_lowercase()).cloned().unwrap_or_else(|| RegistryAccess {
            host: host.to_ascii_lowercase(),
            credentials: Credentials::Anonymous,
            ca_file: None,
            plain_http: false,
            verify: None,
        })
    }
}

impl RegistryAccess {
    /// One registry's access, validated; `index` places errors.
    pub fn validate(index: usize, raw: RawRegistry) -> Result<Self, InvalidRegistry> {
        let invalid = |field, reason: String| InvalidRegistry { index, field, reason };
        let host = raw.host.trim().to_ascii_lowercase();
        if host.is_empty() || host.contains('/') || host.contains("://") {
            return Err(invalid(
                "host",
                format!(
                    "{:?} is not a registry host: write HOST or HOST:PORT as references \
                     spell it, e.g. ghcr.io or 10.0.0.5:5000",
                    raw.host
                ),
            ));
        }
        let username = match (raw.username, raw.username_file) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    "usernameFile",
                    "set `username` or `usernameFile`, not both".to_owned(),
                ));
            }
            (Some(name), None) => Some(Username::Literal(name)),
            (None, Some(path)) => Some(Username::File(path)),
            (None, None) => None,
        };
        let credentials = match (username, raw.password_file, raw.token_file) {
            (None, None, None) => Credentials::Anonymous,
            (Some(username), Some(password_file), None) => {
                Credentials::Basic { username, password_file }
            }
            (None, None, Some(token_file)) => Credentials::Bearer { token_file },
            (Some(_), None, None) => {
                return Err(invalid(
                    "passwordFile",
                    "basic auth needs a password: name the file that holds it".to_owned(),
                ));
            }
            (None, Some(_), None) => {
                return Err(invalid(
                    "username",
                    "basic auth needs a user name: set `username` or `usernameFile`".to_owned(),
                ));
            }
            (_, _, Some(_)) => {
                return Err(invalid(
                    "tokenFile",
                    "a bearer token replaces basic auth: set `tokenFile` or \
                     `username` and `passwordFile`, not both"
                        .to_owned(),
                ));
            }
        };
        if raw.plain_http && !raw.insecure && !is_loopback_host(&host) {
            return Err(invalid(
                "plainHttp",
                format!(
                    "{host} is not on loopback, and plain HTTP would carry its credentials \
                     and plugins in the clear: serve the registry over TLS (with `caFile` \
                     for a private CA), or set `insecure: true` as well to accept that"
                ),
            ));
        }
        if raw.insecure && !raw.plain_http {
            return Err(invalid(
                "insecure",
                "only allows `plainHttp` off loopback; it never turns off certificate \
                 checks: set `plainHttp: true` too, or remove it"
                    .to_owned(),
            ));
        }
        if raw.plain_http && raw.ca_file.is_some() {
            return Err(invalid(
                "caFile",
                "a CA is for TLS, and `plainHttp` turns TLS off: remove one of them".to_owned(),
            ));
        }
        let verify = raw
            .verify
            .map(|verify| KeyPolicy::validate(format!("registries[{index}].verify"), verify))
            .transpose()
            .map_err(|reason| invalid("verify", reason))?;
        Ok(Self { host, credentials, ca_file: raw.ca_file, plain_http: raw.plain_http, verify })
    }

    /// The keys every build from this registry must be signed with.
    pub fn verify(&self) -> Option<&KeyPolicy> {
        self.verify.as_ref()
    }

    /// The registry host.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// True when this registry is reached over plain HTTP.
    pub fn plain_http(&self) -> bool {
        self.plain_http
    }

    /// The HTTP client of a pull from this registry, its CA file read now:
    /// redirects and resolved names are judged by `destinations`.
    pub(crate) fn http_client(
        &self,
        destinations: &Arc<Destinations>,
    ) -> Result<reqwest_oci::Client, OciError> {
        crate::tls::install_default_provider();
        let mut roots = Vec::new();
        if let Some(path) = &self.ca_file {
            let pem = self.read(path, "caFile")?;
            let certificate =
                reqwest_oci::Certificate::from_pem(&pem).map_err(|err| OciError::AccessFile {
                    registry: self.host.clone(),
                    field: "caFile",
                    path: path.clone(),
                    source: std::io::Error::new(std::io::ErrorKind::InvalidData, err),
                })?;
            roots.push(certificate);
        }
        reqwest_oci::Client::builder()
            .tls_certs_merge(roots)
            // As the push's client: a registry that hangs must not hold a
            // pull (and a cold start) forever; a slow one may still send a
            // large layer.
            .connect_timeout(CONNECT_TIMEOUT)
            .read_timeout(READ_TIMEOUT)
            .user_agent(USER_AGENT)
            .redirect(destinations.redirect_policy())
            .dns_resolver(destinations.resolver())
            .build()
            .map_err(|source| OciError::Client { registry: self.host.clone(), source })
    }

    /// A registry client for this registry (pushes), its CA file read now.
    pub(crate) fn client(&self) -> Result<oci_client::Client, OciError> {
        crate::tls::install_default_provider();
        let extra_root_certificates = match &self.ca_file {
            Some(path) => {
                vec![Certificate {
                    encoding: CertificateEncoding::Pem,
                    data: self.read(path, "caFile")?,
                }]
            }
            None => Vec::new(),
        };
        Ok(oci_client::Client::new(ClientConfig {
            protocol: if self.plain_http { ClientProtocol::Http } else { ClientProtocol::Https },
            extra_root_certificates,
            // A registry that hangs must not hold a pull (and a cold start)
            // forever; a slow one may still send a large layer.
            connect_timeout: Some(CONNECT_TIMEOUT),
            read_timeout: Some(READ_TIMEOUT),
            ..ClientConfig::default()
        }))
    }

    /// The credentials, read from their files now.
    pub(crate) fn auth(&self) -> Result<RegistryAuth, OciError> {
        Ok(match &self.credentials {
            Credentials::Anonymous => RegistryAuth::Anonymous,
            Credentials::Basic { username, password_file } => {
                let username = match username {
                    Username::Literal(name) => name.clone(),
                    Username::File(path) => self.read_text(path, "usernameFile")?,
                };
                RegistryAuth::Basic(username, self.read_text(password_file, "passwordFile")?)
            }
            Credentials::Bearer { token_file } => {
                RegistryAuth::Bearer(self.read_text(token_file, "tokenFile")?)
            }
        })
    }

    fn read(&self, path: &Path, field: &'static str) -> Result<Vec<u8>, OciError> {
        std::fs::read(path).map_err(|source| OciError::AccessFile {
            registry: self.host.clone(),
            field,
            path: path.to_owned(),
            source,
        })
    }

    /// A one-line secret: the trailing newline an editor or `echo` leaves
    /// is not part of it.
    fn read_text(&self, path: &Path, field: &'static str) -> Result<String, OciError> {
        let bytes = self.read(path, field)?;
        let text = String::from_utf8(bytes).map_err(|_| OciError::AccessFile {
            registry: self.host.clone(),
            field,
            path: path.to_owned(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8 text"),
        })?;
        Ok(text.trim_end_matches(['\r', '\n']).to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(host: &str) -> RawRegistry {
        RawRegistry { host: host.to_owned(), ..RawRegistry::default() }
    }

    fn refused(item: RawRegistry) -> InvalidRegistry {
        Registries::validate(vec![item]).unwrap_err()
    }

    #[test]
    fn a_registry_without_an_item_is_anonymous_https() {
        let registries = Registries::validate(Vec::new()).unwrap();
        let access = registries.for_host("GHCR.io");
        assert_eq!(access.host(), "ghcr.io");
        assert!(!access.plain_http());
        assert!(matches!(access.auth().unwrap(), RegistryAuth::Anonymous));
    }

    #[test]
    fn plain_http_off_loopback_needs_insecure() {
        let err = refused(RawRegistry { plain_http: true, ..raw("10.0.0.5:5000") });
        assert_eq!(err.field, "plainHttp");
        assert!(err.reason.contains("set `insecure: true`"), "{err}");
        let loopback =
            Registries::validate(vec![RawRegistry { plain_http: true, ..raw("127.0.0.1:5000") }]);
        assert!(loopback.unwrap().for_host("127.0.0.1:5000").plain_http());
        let allowed = RawRegistry { plain_http: true, insecure: true, ..raw("10.0.0.5:5000") };
        assert!(Registries::validate(vec![allowed]).is_ok());
        let err = refused(RawRegistry { insecure: true, ..raw("10.0.0.5:5000") });
        assert_eq!(err.field, "insecure");
    }

    #[test]
    fn credentials_are_one_kind_and_complete() {
        let basic_without_password = RawRegistry { username: Some("u".into()), ..raw("r.io") };
        assert_eq!(refused(basic_without_password).field, "passwordFile");
        let password_without_user = RawRegistry { password_file: Some("/p".into()), ..raw("r.io") };
        assert_eq!(refused(password_without_user).field, "username");
        let both = RawRegistry {
            username: Some("u".into()),
            password_file: Some("/p".into()),
            token_file: Some("/t".into()),
            ..raw("r.io")
        };
        assert_eq!(refused(both).field, "tokenFile");
        let two_names = RawRegistry {
            username: Some("u".into()),
            username_file: Some("/u".into()),
            password_file: Some("/p".into()),
            ..raw("r.io")
        };
        assert_eq!(refused(two_names).field, "usernameFile");
        let err = Registries::validate(vec![raw("r.io"), raw("R.io")]).unwrap_err();
        assert_eq!((err.index, err.field), (1, "host"));
        assert_eq!(refused(raw("https://r.io")).field, "host");
    }

    #[test]
    fn credentials_are_read_on_every_use_and_lose_their_newline() {
        let dir = tempfile::tempdir().unwrap();
        let password = dir.path().join("password");
        std::fs::write(&password, "first\n").unwrap();
        let registries = Registries::validate(vec![RawRegistry {
            username: Some("puller".into()),
            password_file: Some(password.clone()),
            ..raw("r.io")
        }])
        .unwrap();
        let access = registries.for_host("r.io");
        assert!(
            matches!(access.auth().unwrap(), RegistryAuth::Basic(u, p) if u == "puller" && p == "first")
        );
        std::fs::write(&password, "rotated").unwrap();
        assert!(matches!(access.auth().unwrap(), RegistryAuth::Basic(_, p) if p == "rotated"));
        std::fs::remove_file(&password).unwrap();
        let err = access.auth().unwrap_err().to_string();
        assert!(err.contains("r.io") && err.contains("passwordFile"), "{err}");
    }
}
