//! Tokens from the simulator's metadata server (plain HTTP on loopback,
//! the real paths and headers), and what the host makes of its refusals.

use http::HeaderValue;
use http_body_util::BodyExt as _;
use proxyfleet_gce_sim::{Faults, Simulator};

use super::super::{GoogleAccessToken, refusal_response};
use super::*;
use crate::capabilities::Redactor;
use crate::capabilities::http::ReqwestTransport;
use crate::capabilities::http::config::Credential;
use crate::config::{EntryConfig, ProvidersConfig};

const EMAIL: &str = "fleet@proxyfleet-test.iam.gserviceaccount.com";
const SCOPE: &str = "https://www.googleapis.com/auth/compute";

struct Fixture {
    sim: Simulator,
    entry: EntryConfig,
    transport: ReqwestTransport,
    token: GoogleAccessToken,
    redactor: Redactor,
    ca: String,
}

impl Fixture {
    /// A simulator whose tokens live `lifetime`, and an entry whose grant
    /// takes tokens from the metadata server at `metadata_host` (the
    /// simulator's when `None`).
    async fn new(lifetime: Duration, metadata_host: Option<String>) -> Self {
        let (sim, ca) = super::super::tests::simulator(lifetime).await;
        let metadata_host = match metadata_host {
            Some(host) => host,
            None => sim.serve_metadata(EMAIL).await.unwrap().to_string(),
        };
        let yaml = format!(
            "providers:\n  - name: gcp\n    plugin: gcp\n    grants:\n      http:\n        \
             - url: {}\n          credential:\n            kind: google-metadata\n            \
             metadataHost: '{metadata_host}'\n            scopes: [{SCOPE}]\n",
            sim.endpoint(),
        );
        let entry = ProvidersConfig::parse(&yaml).unwrap().entries.remove(0);
        let transport =
            ReqwestTransport::for_entry(&entry.grants.http, None, &entry.limits).unwrap();
        let token = match &entry.grants.http[0].credential {
            Some(Credential::GoogleMetadata(google)) => GoogleAccessToken::metadata(google),
            other => panic!("a metadata credential: {other:?}"),
        };
        Self { sim, entry, transport, token, redactor: Redactor::default(), ca }
    }

    async fn header(&self) -> Result<HeaderValue, TokenError> {
        self.token
            .header(&self.transport, &self.entry.grants.http[0], &self.entry.limits, &self.redactor)
            .await
    }

    fn asked(&self) -> usize {
        self.sim.requests().iter().filter(|line| line.starts_with("metadata GET")).count()
    }
}

fn bearer(header: &HeaderValue) -> String {
    header.to_str().unwrap().strip_prefix("Bearer ").unwrap().to_owned()
}

#[tokio::test]
async fn a_token_comes_from_the_metadata_server_is_cached_and_renewed_before_expiry() {
    let f = Fixture::new(Duration::from_secs(2), None).await;
    let first = f.header().await.expect("a token");
    assert!(first.is_sensitive());
    assert_eq!(f.header().await.unwrap(), first, "cached");
    assert_eq!(f.asked(), 1);
    let issued = f.sim.tokens_issued();
    assert_eq!(issued.len(), 1);
    assert_eq!(
        (issued[0].client_email.as_str(), issued[0].scopes.as_slice()),
        (EMAIL, &[SCOPE.to_owned()][..])
    );
    assert_eq!(issued[0].access_token, bearer(&first));
    assert!(f.redactor.redact(&bearer(&first)).contains("[redacted]"));

    // The API takes it.
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(f.ca.as_bytes()).unwrap())
        .no_proxy()
        .build()
        .unwrap();
    let project = format!("{}/compute/v1/projects/proxyfleet-test", f.sim.endpoint());
    let answer = client.get(&project).header("authorization", first.clone()).send().await.unwrap();
    assert_eq!(answer.status(), StatusCode::OK, "{}", answer.text().await.unwrap());

    // A 2 s token is asked for again after half its life; the metadata
    // server, past its own refresh point, gives a new one.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let second = f.header().await.expect("a new token");
    assert_ne!(second, first);
    assert_eq!(f.asked(), 2);
}

#[tokio::test]
async fn an_unbound_service_account_is_refused_with_gkes_reason() {
    let f = Fixture::new(Duration::from_secs(3600), None).await;
    f.sim.set_faults(Faults { metadata_iam_denied: true, ..Faults::default() });
    let err = f.header().await.unwrap_err();
    let TokenError::Refused(text) = &err else { panic!("refused: {err:?}") };
    assert!(text.contains("HTTP 403"), "{text}");
    assert!(text.contains("iam.serviceAccounts.getAccessToken"), "{text}");
    assert_eq!(refusal_response(&err).status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_metadata_server_that_is_not_ready_is_transient() {
    let f = Fixture::new(Duration::from_secs(3600), None).await;
    f.sim.set_faults(Faults { metadata_down: true, ..Faults::default() });
    let err = f.header().await.unwrap_err();
    assert!(matches!(&err, TokenError::Unavailable(text) if text.contains("HTTP 503")), "{err:?}");
    let response = refusal_response(&err);
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("UNAVAILABLE"));
}

#[tokio::test]
async fn nothing_listening_is_transient_and_names_the_server() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let f = Fixture::new(Duration::from_secs(3600), Some(format!("127.0.0.1:{port}"))).await;
    let err = f.header().await.unwrap_err();
    assert!(
        matches!(&err, TokenError::Unavailable(text) if text.contains("cannot reach the metadata server 127.0.0.1:")),
        "{err:?}"
    );
}

/// A server that answers without `Metadata-Flavor: Google` (a proxy or
/// a captive portal on that address) is not believed, whatever it says.
#[tokio::test]
async fn an_answer_without_the_flavor_header_is_not_believed() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut buf = [0u8; 2048];
            let _ = stream.read(&mut buf).await;
            let body = r#"{"access_token":"ya29.not-from-google","expires_in":3600}"#;
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
                 connection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(answer.as_bytes()).await;
        }
    });
    let f = Fixture::new(Duration::from_secs(3600), Some(addr.to_string())).await;
    let err = f.header().await.unwrap_err();
    let TokenError::Refused(text) = &err else { panic!("refused: {err:?}") };
    assert!(text.contains("is not a metadata server"), "{text}");
    assert!(!text.contains("ya29"), "{text}");
}

#[test]
fn the_token_url_is_the_metadata_servers() {
    let server = |account: &str, scopes: &[&str]| {
        MetadataServer {
            config: GoogleMetadataCredential {
                metadata_host: "metadata.google.internal".to_owned(),
                service_account: account.to_owned(),
                scopes: scopes.iter().map(|s| (*s).to_owned()).collect(),
            },
        }
        .url()
    };
    assert_eq!(
        server("default", &[]),
        "http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/token"
    );
    assert_eq!(
        server(EMAIL, &[SCOPE, "https://www.googleapis.com/auth/cloud-platform"]),
        format!(
            "http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/{EMAIL}\
             /token?scopes=https%3A%2F%2Fwww%2Egoogleapis%2Ecom%2Fauth%2Fcompute%2Chttps%3A%2F%2F\
             www%2Egoogleapis%2Ecom%2Fauth%2Fcloud%2Dplatform"
        )
    );
}
