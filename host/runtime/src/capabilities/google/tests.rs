//! The service-account exchange against the simulator's token endpoint,
//! over HTTPS through the entry's own transport.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt as _;
use serde_json::Value;

use proxyfleet_gce_sim::{Faults, SimOptions, Simulator};

use super::*;
use crate::capabilities::http::ReqwestTransport;
use crate::capabilities::http::config::{GoogleCredential, SecretSource};
use crate::config::{Credential, EntryConfig, ProvidersConfig};

const EMAIL: &str = "proxyfleet@proxyfleet-test.iam.gserviceaccount.com";
const SCOPE: &str = "https://www.googleapis.com/auth/compute";

struct Fixture {
    sim: Simulator,
    entry: EntryConfig,
    transport: ReqwestTransport,
    key_file: PathBuf,
    account: Arc<GoogleAccessToken>,
    redactor: Redactor,
    _dir: tempfile::TempDir,
}

/// A simulator on `https://localhost` whose tokens live `lifetime`, and
/// the PEM of the CA that signed its certificate.
pub(super) async fn simulator(lifetime: Duration) -> (Simulator, String) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let server_key = rcgen::KeyPair::generate().unwrap();
    let server = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .signed_by(&server_key, &issuer)
        .unwrap();
    let options = SimOptions { token_lifetime: lifetime, ..SimOptions::default() };
    let sim = Simulator::start(options, &server.pem(), &server_key.serialize_pem()).await.unwrap();
    (sim, ca.pem())
}

impl Fixture {
    async fn new(lifetime: Duration, allow_loopback: bool) -> Self {
        let (sim, ca) = simulator(lifetime).await;
        let dir = tempfile::tempdir().unwrap();
        let ca_file = dir.path().join("ca.pem");
        std::fs::write(&ca_file, ca).unwrap();
        let key_file = dir.path().join("key.json");
        std::fs::write(&key_file, sim.create_key(EMAIL).unwrap().json).unwrap();
        let allow =
            if allow_loopback { "\n          allowAddresses: [127.0.0.1, '::1']" } else { "" };
        let yaml = format!(
            "providers:\n  - name: gcp\n    plugin: gcp\n    grants:\n      caFile: {}\n      http:\n        \
             - url: {}{allow}\n          credential:\n            kind: google-service-account\n            \
             keyFile: {}\n            scopes: [{SCOPE}]\n",
            ca_file.display(),
            sim.endpoint(),
            key_file.display(),
        );
        let entry = ProvidersConfig::parse(&yaml).unwrap().entries.remove(0);
        let transport = ReqwestTransport::for_entry(
            &entry.grants.http,
            entry.grants.ca_file.as_deref(),
            &entry.limits,
        )
        .unwrap();
        let account = match &entry.grants.http[0].credential {
            Some(Credential::GoogleServiceAccount(google)) => {
                Arc::new(GoogleAccessToken::service_account(google, None))
            }
            other => panic!("a service-account credential: {other:?}"),
        };
        Self { sim, entry, transport, key_file, account, redactor: Redactor::default(), _dir: dir }
    }

    fn account(&self) -> Arc<GoogleAccessToken> {
        Arc::clone(&self.account)
    }

    async fn header(&self) -> Result<HeaderValue, TokenError> {
        self.account()
            .header(&self.transport, &self.entry.grants.http[0], &self.entry.limits, &self.redactor)
            .await
    }

    /// Like [`Fixture::header`], on a new credential of the same key file,
    /// which remembers no earlier failure.
    async fn fresh_header(&self) -> Result<HeaderValue, TokenError> {
        let credential = GoogleCredential {
            key: SecretSource::File(self.key_file.clone()),
            scopes: vec![SCOPE.to_owned()],
        };
        self.header_of(&credential, None).await
    }

    /// A header of a new credential `credential`, whose `secretRef` is read
    /// through `secrets`.
    async fn header_of(
        &self,
        credential: &GoogleCredential,
        secrets: Option<Arc<dyn proxyfleet_core::secret_store::SecretStore>>,
    ) -> Result<HeaderValue, TokenError> {
        GoogleAccessToken::service_account(credential, secrets)
            .header(&self.transport, &self.entry.grants.http[0], &self.entry.limits, &self.redactor)
            .await
    }
}

#[tokio::test]
async fn a_key_in_a_secret_is_exchanged_as_a_key_file_is() {
    use proxyfleet_core::secret_store::{MemorySecrets, SecretKeyRef};
    let f = Fixture::new(Duration::from_secs(3600), true).await;
    let secrets = Arc::new(MemorySecrets::new("proxyfleet"));
    let key = std::fs::read(&f.key_file).unwrap();
    secrets.put("proxyfleet", "gcp-key", &[("key.json", &key)]);
    let credential = GoogleCredential {
        key: SecretSource::Ref(SecretKeyRef {
            namespace: None,
            name: "gcp-key".into(),
            key: "key.json".into(),
        }),
        scopes: vec![SCOPE.to_owned()],
    };
    let header = f.header_of(&credential, Some(Arc::clone(&secrets) as _)).await.unwrap();
    let issued = f.sim.tokens_issued();
    assert_eq!(issued.last().map(|grant| grant.access_token.clone()), Some(bearer(&header)));
    assert_eq!(issued.last().map(|grant| grant.client_email.as_str()), Some(EMAIL));

    secrets.remove("proxyfleet", "gcp-key");
    let err = f.header_of(&credential, Some(secrets as _)).await.unwrap_err();
    let TokenError::Refused(message) = &err else { panic!("refused: {err:?}") };
    assert!(message.contains("\"gcp-key\"") && message.contains("not found"), "{message}");
    let without_store = f.header_of(&credential, None).await.unwrap_err().to_string();
    assert!(without_store.contains("secretRef"), "{without_store}");
}

fn bearer(header: &HeaderValue) -> String {
    header.to_str().unwrap().strip_prefix("Bearer ").unwrap().to_owned()
}

#[tokio::test]
async fn a_token_is_exchanged_once_cached_and_renewed_before_it_expires() {
    let f = Fixture::new(Duration::from_secs(2), true).await;
    let first = f.header().await.expect("a token");
    assert!(first.is_sensitive(), "the header is marked sensitive");
    assert_eq!(f.header().await.unwrap(), first, "cached");
    let grants = f.sim.tokens_issued();
    assert_eq!(grants.len(), 1);
    assert_eq!(grants[0].access_token, bearer(&first));
    assert_eq!(grants[0].client_email, EMAIL);
    assert_eq!(grants[0].scopes, [SCOPE]);
    assert!(f.redactor.redact(&bearer(&first)).contains("[redacted]"));

    // A 2 s token is renewed after half its life.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let second = f.header().await.expect("a new token");
    assert_ne!(second, first);
    assert_eq!(f.sim.tokens_issued().len(), 2);
    assert!(f.redactor.redact(&bearer(&second)).contains("[redacted]"));
    assert!(
        f.redactor.redact(&bearer(&first)).contains("[redacted]"),
        "a replaced token is still hidden while it is valid"
    );
    // Past the first token's expiry, the next exchange forgets it.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let third = f.header().await.expect("a third token");
    assert_ne!(third, second);
    assert_eq!(
        f.redactor.redact(&bearer(&first)),
        bearer(&first),
        "the expired token is forgotten"
    );
}

#[tokio::test]
async fn a_rotated_key_file_is_read_at_the_next_exchange() {
    let f = Fixture::new(Duration::from_secs(3600), true).await;
    f.header().await.unwrap();
    let new_key = f.sim.create_key(EMAIL).unwrap();
    std::fs::write(&f.key_file, &new_key.json).unwrap();
    f.account().token_refused();
    f.header().await.unwrap();
    let grants = f.sim.tokens_issued();
    assert_eq!(grants.len(), 2);
    assert_eq!(grants[1].private_key_id, new_key.private_key_id);
}

/// Issue 15, item 12: every 401 dropped the token, so a plugin sending
/// requests that draw 401s forced a token exchange on each of them.
#[tokio::test]
async fn a_plugin_drawing_401s_cannot_force_an_exchange_per_request() {
    let f = Fixture::new(Duration::from_secs(3600), true).await;
    let first = f.header().await.unwrap();
    f.account().token_refused();
    let second = f.header().await.unwrap();
    assert_ne!(second, first, "the first refusal is believed at once");
    for _ in 0..5 {
        f.account().token_refused();
        assert_eq!(f.header().await.unwrap(), second, "later ones wait for the interval");
    }
    assert_eq!(f.sim.tokens_issued().len(), 2);
}

/// The same attack on a failing endpoint: every request retried it.
#[tokio::test]
async fn a_failed_exchange_answers_from_memory_until_the_interval_passes() {
    let f = Fixture::new(Duration::from_secs(3600), true).await;
    f.sim.set_faults(Faults { token_endpoint_down: true, ..Faults::default() });
    let err = f.header().await.unwrap_err();
    f.sim.set_faults(Faults::default());
    assert_eq!(f.header().await.unwrap_err(), err, "not asked again yet");
    assert!(f.sim.tokens_issued().is_empty());
}

#[tokio::test]
async fn a_revoked_key_is_refused_with_the_endpoints_reason() {
    let f = Fixture::new(Duration::from_secs(3600), true).await;
    let key: Value = serde_json::from_str(&std::fs::read_to_string(&f.key_file).unwrap()).unwrap();
    f.sim.revoke_key(key["private_key_id"].as_str().unwrap());
    let err = f.header().await.unwrap_err();
    let TokenError::Refused(text) = &err else { panic!("refused: {err:?}") };
    assert!(text.contains("invalid_grant") && text.contains("Invalid JWT Signature"), "{text}");
    assert!(text.contains(EMAIL), "{text}");
    assert!(!text.contains("PRIVATE KEY"), "{text}");
}

#[tokio::test]
async fn a_failing_token_endpoint_is_transient() {
    let f = Fixture::new(Duration::from_secs(3600), true).await;
    f.sim.set_faults(Faults { token_endpoint_down: true, ..Faults::default() });
    let err = f.header().await.unwrap_err();
    assert!(matches!(&err, TokenError::Unavailable(text) if text.contains("HTTP 503")), "{err:?}");
    let response = refusal_response(&err);
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn the_token_endpoint_is_held_to_the_address_policy() {
    let f = Fixture::new(Duration::from_secs(3600), false).await;
    let err = f.header().await.unwrap_err();
    assert!(
        matches!(&err, TokenError::Refused(text) if text.contains("DestinationIpProhibited")),
        "{err:?}"
    );
    assert!(f.sim.tokens_issued().is_empty());
}

#[tokio::test]
async fn unusable_key_files_are_refused_naming_the_problem() {
    let f = Fixture::new(Duration::from_secs(3600), true).await;
    let key: Value = serde_json::from_str(&std::fs::read_to_string(&f.key_file).unwrap()).unwrap();
    let pem = key["private_key"].as_str().unwrap().to_owned();
    let with = |field: &str, value: Value| {
        let mut key = key.clone();
        key[field] = value;
        key.to_string()
    };
    let cases = [
        ("{\"type\": ", "is not JSON".to_owned()),
        (&with("type", json!("authorized_user")), "`authorized_user`".to_owned()),
        (&with("client_email", Value::Null), "no `client_email`".to_owned()),
        (&with("token_uri", json!("http://localhost/token")), "not an https://".to_owned()),
        (
            &with(
                "private_key",
                json!("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"),
            ),
            "not an RSA key".to_owned(),
        ),
        (
            &with("private_key", json!(pem.replace("PRIVATE KEY", "CERTIFICATE"))),
            "PKCS#8".to_owned(),
        ),
    ];
    for (text, expected) in cases {
        std::fs::write(&f.key_file, text).unwrap();
        let err = f.fresh_header().await.unwrap_err();
        let TokenError::Refused(message) = &err else { panic!("refused: {err:?}") };
        assert!(message.contains(&expected), "{message} lacks {expected}");
        assert!(message.contains(&f.key_file.display().to_string()), "{message}");
        assert!(!message.contains(&pem[40..80]), "the key leaked: {message}");
    }
    std::fs::remove_file(&f.key_file).unwrap();
    let err = f.fresh_header().await.unwrap_err();
    assert!(matches!(&err, TokenError::Refused(text) if text.contains("cannot read the key file")));
}

#[tokio::test]
async fn the_refusal_is_a_google_style_401_with_the_reason() {
    let response =
        refusal_response(&TokenError::Refused("the key file /k.json has no `token_uri`".into()));
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["error"]["code"], 401);
    assert_eq!(body["error"]["status"], "UNAUTHENTICATED");
    assert_eq!(body["error"]["errors"][0]["domain"], HOST_DOMAIN);
    assert_eq!(body["error"]["errors"][0]["reason"], "credentialUnavailable");
    assert!(body["error"]["message"].as_str().unwrap().contains("no `token_uri`"));
}
