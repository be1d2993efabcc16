//! The HTTP capability against real servers on loopback: the allow-list,
//! the address policy, the response cap and credential injection.

use proxyfleet_core::{ErrorClass, ProviderError};
use proxyfleet_tests::{Canned, TestServer, fetch_provider, localhost_tls, observed};

fn ok(body: &str) -> Canned {
    Canned { status: 200, body: body.to_owned().into() }
}

fn assert_refused(err: &ProviderError) {
    assert_eq!(err.class, ErrorClass::Unauthorized, "{err}");
}

#[tokio::test]
async fn only_granted_destinations_are_reached() {
    let server = TestServer::http(ok("hello")).await;
    let port = server.addr.port();
    let dir = tempfile::tempdir().unwrap();
    let grants = format!(
        "      http:\n        - {{ url: 'http://127.0.0.1:{port}', allowAddresses: [127.0.0.1] }}\n"
    );
    let fetch = fetch_provider(dir.path(), &grants, "").await;

    let answer = fetch.get(&format!("http://127.0.0.1:{port}/granted")).await.unwrap();
    let seen = observed(&answer.name);
    assert_eq!((seen["status"].as_u64(), seen["body"].as_str()), (Some(200), Some("hello")));

    for url in [
        format!("http://127.0.0.1:{}/other-port", port.wrapping_add(1)),
        format!("https://127.0.0.1:{port}/other-scheme"),
        format!("http://localhost:{port}/other-name"),
        "http://169.254.169.254/latest/meta-data".to_owned(),
    ] {
        let err = fetch.get(&url).await.unwrap_err();
        assert_refused(&err);
        assert!(err.message.contains("denied"), "{url}: {err}");
    }
    assert_eq!(server.seen().len(), 1, "only the granted request reached the server");
}

#[tokio::test]
async fn a_granted_name_resolving_to_loopback_needs_an_address_grant() {
    let server = TestServer::http(ok("hello")).await;
    let port = server.addr.port();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("http://localhost:{port}/");

    let name_only = format!("      http:\n        - {{ url: 'http://localhost:{port}' }}\n");
    let err = fetch_provider(dir.path(), &name_only, "").await.get(&url).await.unwrap_err();
    assert_refused(&err);
    let literal = format!("      http:\n        - {{ url: 'http://127.0.0.1:{port}' }}\n");
    let err = fetch_provider(dir.path(), &literal, "")
        .await
        .get(&format!("http://127.0.0.1:{port}/"))
        .await
        .unwrap_err();
    assert_refused(&err);
    assert!(server.seen().is_empty(), "nothing may reach a refused address");

    let with_range = format!(
        "      http:\n        - {{ url: 'http://localhost:{port}', allowAddresses: [127.0.0.0/8, '::1'] }}\n"
    );
    let answer = fetch_provider(dir.path(), &with_range, "").await.get(&url).await.unwrap();
    assert_eq!(observed(&answer.name)["status"], 200);
    assert_eq!(server.seen().len(), 1);
}

#[tokio::test]
async fn responses_over_the_cap_are_refused() {
    let server = TestServer::http(ok(&"x".repeat((1 << 20) + 1))).await;
    let port = server.addr.port();
    let dir = tempfile::tempdir().unwrap();
    let grants = format!(
        "      http:\n        - {{ url: 'http://127.0.0.1:{port}', allowAddresses: [127.0.0.1] }}\n"
    );
    let fetch = fetch_provider(dir.path(), &grants, "httpResponseMiB: 1").await;
    let url = format!("http://127.0.0.1:{port}/big");
    let err = fetch.get(&url).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::Permanent, "{err}");
    assert!(err.message.contains("too large"), "{err}");

    server.set_canned(ok(&"x".repeat(1 << 20)));
    let answer = fetch.get(&url).await.expect("a body at the cap is fine");
    assert_eq!(observed(&answer.name)["body_bytes"], 1 << 20);
}

#[tokio::test]
async fn https_without_the_entry_ca_fails_verification() {
    let (_ca, cert, key) = localhost_tls();
    let server = TestServer::https(ok("welcome"), &cert, &key).await;
    let port = server.addr.port();
    let dir = tempfile::tempdir().unwrap();
    let grants = format!(
        "      http:\n        - {{ url: 'https://localhost:{port}', allowAddresses: [127.0.0.1, '::1'] }}\n"
    );
    let err = fetch_provider(dir.path(), &grants, "")
        .await
        .get(&format!("https://localhost:{port}/"))
        .await
        .unwrap_err();
    assert_eq!(err.class, ErrorClass::Permanent, "{err}");
    assert!(err.message.contains("certificate"), "{err}");
}
