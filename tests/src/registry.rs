//! A real OCI registry on loopback: Debian's `docker-registry` (the CNCF
//! distribution registry 2.8) with TLS from a test CA and htpasswd
//! (bcrypt) users, its storage and access log in a temporary directory.
//! Stopped when dropped; [`OciRegistry::stop`] and [`OciRegistry::start_again`]
//! take it down and bring it back on the same port with the same content.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::ports::free_port;

/// Debian's registry binary (package `docker-registry`).
const BINARY: &str = "/usr/bin/docker-registry";

/// How a registry authenticates its clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegistryAuth {
    /// Basic auth against an htpasswd file holding [`USER`].
    Htpasswd,
    /// Bearer tokens: JWTs that [`OciRegistry::token`] signs, as a token
    /// server would.
    Token,
    /// As [`RegistryAuth::Token`], with the challenge's realm
    /// `http://127.0.0.1:PORT/token`: a token server the test runs there.
    TokenRealm(u16),
}

/// The `service` (audience) and `issuer` of the registry's tokens.
const TOKEN_SERVICE: &str = "proxyfleet-test-registry";
const TOKEN_ISSUER: &str = "proxyfleet-test-issuer";

/// A running registry.
#[derive(Debug)]
pub struct OciRegistry {
    child: Option<Child>,
    dir: tempfile::TempDir,
    addr: SocketAddr,
    /// `localhost:PORT` on loopback, `IP:PORT` elsewhere: as references
    /// name it, and as its certificate does.
    pub host: String,
    /// The test CA, PEM, for `registries[].caFile`.
    pub ca_file: PathBuf,
}

/// The user every registry accepts, and its password.
pub const USER: &str = "puller";
/// The password of [`USER`]; tests check that it never shows.
pub const PASSWORD: &str = "s3cret-registry-password-7f2a";

impl OciRegistry {
    /// Starts a TLS registry that wants [`USER`] and [`PASSWORD`].
    ///
    /// # Panics
    /// When the registry binary is missing or does not come up.
    pub fn start() -> Self {
        Self::start_on(IpAddr::V4(Ipv4Addr::LOCALHOST))
    }

    /// [`OciRegistry::start_on`], authenticating as `auth` says.
    ///
    /// # Panics
    /// As [`OciRegistry::start`].
    pub fn start_with(ip: IpAddr, auth: RegistryAuth) -> Self {
        let mut registry = Self::configure(ip, auth);
        registry.start_again();
        registry
    }

    /// [`OciRegistry::start`] listening on `ip`, e.g. a bridge address the
    /// test cluster's pods reach; its certificate names the address.
    ///
    /// # Panics
    /// As [`OciRegistry::start`].
    pub fn start_on(ip: IpAddr) -> Self {
        Self::start_with(ip, RegistryAuth::Htpasswd)
    }

    fn configure(ip: IpAddr, auth: RegistryAuth) -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        let name = if ip.is_loopback() { "localhost".to_owned() } else { ip.to_string() };
        let (ca, cert, key) = crate::tls_for(&name);
        // A folder of its own: skopeo's --cert-dir reads every file in it.
        std::fs::create_dir(dir.path().join("ca")).expect("CA folder");
        let ca_file = dir.path().join("ca/ca.crt");
        std::fs::write(&ca_file, ca).expect("write the CA");
        std::fs::write(dir.path().join("server.crt"), cert).expect("write the certificate");
        std::fs::write(dir.path().join("server.key"), key).expect("write the key");
        let root = dir.path().display().to_string();
        let auth = match auth {
            RegistryAuth::Htpasswd => {
                let hash = bcrypt::hash(PASSWORD, 5).expect("bcrypt");
                std::fs::write(dir.path().join("htpasswd"), format!("{USER}:{hash}\n"))
                    .expect("htpasswd");
                format!("  htpasswd:\n    realm: proxyfleet-test\n    path: {root}/htpasswd\n")
            }
            RegistryAuth::Token | RegistryAuth::TokenRealm(_) => {
                let (signer_cert, signer_key) = token_signer();
                std::fs::write(dir.path().join("token-signer.crt"), signer_cert).expect("signer");
                std::fs::write(dir.path().join("token-signer.key"), signer_key).expect("signer");
                // The realm is where a client fetches tokens. Without a
                // token server of the test's, the test hands tokens out
                // itself, and the realm is never asked.
                let realm = match auth {
                    RegistryAuth::TokenRealm(port) => format!("http://127.0.0.1:{port}/token"),
                    _ => "https://127.0.0.1:9/token".to_owned(),
                };
                format!(
                    "  token:\n    realm: {realm}\n    service: {TOKEN_SERVICE}\n    \
                     issuer: {TOKEN_ISSUER}\n    rootcertbundle: {root}/token-signer.crt\n"
                )
            }
        };
        std::fs::create_dir_all(dir.path().join("storage")).expect("storage");
        let addr = SocketAddr::from((ip, free_port()));
        std::fs::write(
            dir.path().join("config.yml"),
            format!(
                "version: 0.1\nlog:\n  level: info\n  formatter: text\nstorage:\n  filesystem:\n    \
                 rootdirectory: {root}/storage\n  delete:\n    enabled: true\nhttp:\n  addr: {addr}\n  \
                 tls:\n    certificate: {root}/server.crt\n    key: {root}/server.key\n\
                 auth:\n{auth}"
            ),
        )
        .expect("write the config");
        Self { child: None, host: format!("{name}:{}", addr.port()), ca_file, addr, dir }
    }

    /// The `service` its token challenges name.
    pub const TOKEN_SERVICE: &'static str = TOKEN_SERVICE;

    /// A bearer token a [`RegistryAuth::Token`] registry accepts, granting
    /// `actions` (`pull`, `push`) on `repository` for an hour.
    ///
    /// # Panics
    /// When the registry was started with another kind of auth.
    pub fn token(&self, repository: &str, actions: &[&str]) -> String {
        let key = std::fs::read(self.dir.path().join("token-signer.key"))
            .expect("a registry with token auth");
        let cert = std::fs::read_to_string(self.dir.path().join("token-signer.crt")).unwrap();
        let der: String = cert.lines().filter(|line| !line.starts_with("-----")).collect();
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
        header.x5c = Some(vec![der]);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_secs();
        let claims = serde_json::json!({
            "iss": TOKEN_ISSUER,
            "sub": USER,
            "aud": TOKEN_SERVICE,
            "iat": now - 60,
            "nbf": now - 60,
            "exp": now + 3600,
            "jti": format!("{now}-{repository}-{}", actions.join(",")),
            "access": [{ "type": "repository", "name": repository, "actions": actions }],
        });
        let key = jsonwebtoken::EncodingKey::from_ec_pem(&key).expect("the signer's key");
        jsonwebtoken::encode(&header, &claims, &key).expect("a signed token")
    }

    /// Starts the registry again after [`OciRegistry::stop`].
    ///
    /// # Panics
    /// When it does not come up within 20 s.
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "the registry runs already");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("registry.log"))
            .expect("registry log");
        let child = Command::new(BINARY)
            .arg("serve")
            .arg(self.dir.path().join("config.yml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log handle"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|err| {
                panic!("cannot start {BINARY} (apt-get install docker-registry): {err}")
            });
        self.child = Some(child);
        let started = Instant::now();
        while TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "the registry did not listen on {} within 20 s:\n{}",
                self.addr,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the registry; its content stays.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// `oci://HOST/REPOSITORY:TAG`.
    pub fn reference(&self, repository: &str, tag: &str) -> String {
        format!("oci://{}/{repository}:{tag}", self.host)
    }

    /// The `registries[]` item that reaches this registry with
    /// `password_file` holding the password (YAML flow style).
    pub fn registries_item(&self, password_file: &Path) -> String {
        format!(
            "{{ host: '{}', username: {USER}, passwordFile: '{}', caFile: '{}' }}",
            self.host,
            password_file.display(),
            self.ca_file.display()
        )
    }

    /// The file the registry keeps blob `digest` (`sha256:…`) in.
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
        self.dir
            .path()
            .join("storage/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    /// Everything the registry logged, its access log included.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }
}

impl Drop for OciRegistry {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A self-signed certificate and its P-256 key (PEM) for signing tokens.
fn token_signer() -> (String, String) {
    let key = rcgen::KeyPair::generate().expect("signer key");
    let cert = rcgen::CertificateParams::new(vec!["token-signer".to_owned()])
        .expect("signer params")
        .self_signed(&key)
        .expect("signer certificate");
    (cert.pem(), key.serialize_pem())
}
