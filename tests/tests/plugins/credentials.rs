//! Credential injection against a real HTTPS server.

use std::sync::Arc;
use std::time::Duration;

use proxyfleet_core::ErrorClass;
use proxyfleet_core::secret_store::MemorySecrets;
use proxyfleet_runtime::RuntimeOptions;
use proxyfleet_runtime::config::ProvidersConfig;
use proxyfleet_runtime::providers_watch::{ProvidersWatchOptions, follow_providers_file};
use proxyfleet_tests::{
    Canned, CapturedLogs, TestServer, fetch_provider, fixture_providers, fixture_registry_with,
    localhost_tls, observed, wait_for,
};

/// An HTTPS origin on localhost answering `welcome`, and a directory
/// holding the CA that signed its certificate (`ca.pem`, the path given).
async fn welcoming_origin() -> (TestServer, tempfile::TempDir, std::path::PathBuf) {
    let (ca, cert, key) = localhost_tls();
    let server =
        TestServer::https(Canned { status: 200, body: "welcome".into() }, &cert, &key).await;
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca).unwrap();
    (server, dir, ca_file)
}

#[tokio::test(flavor = "current_thread")]
async fn credentials_are_injected_by_the_host_and_never_seen_or_logged() {
    let logs = CapturedLogs::default();
    let _guard = logs.install();
    let (server, dir, ca_file) = welcoming_origin().await;
    let port = server.addr.port();
    let secret_file = dir.path().join("token");
    std::fs::write(&secret_file, "s3cret-token-1\n").unwrap();
    let grants = format!(
        "      caFile: {}\n      http:\n        - url: https://localhost:{port}\n          allowAddresses: [127.0.0.1, '::1']\n          credential: {{ header: Authorization, valueTemplate: 'Bearer {{secret}}', secretFile: {} }}\n",
        ca_file.display(),
        secret_file.display()
    );
    let fetch = fetch_provider(dir.path(), &grants, "").await;
    let url = format!("https://localhost:{port}/api");

    let answer = fetch.get(&url).await.unwrap();
    assert_eq!(server.seen()[0].header("authorization"), Some("Bearer s3cret-token-1"));
    assert_eq!(observed(&answer.name)["body"], "welcome");
    assert!(!answer.name.contains("s3cret"), "the plugin saw the credential: {}", answer.name);

    // Rotation: the file is read on every request.
    std::fs::write(&secret_file, "s3cret-token-2").unwrap();
    fetch.get(&url).await.unwrap();
    assert_eq!(server.seen()[1].header("authorization"), Some("Bearer s3cret-token-2"));

    // Each request is one debug line with its path; a credential-like
    // query value is not logged.
    fetch.get(&format!("{url}?access_token=abc123xyz&page=2")).await.unwrap();

    // A backend that echoes the credential: the plugin quotes the body in
    // its error, and the host redacts it.
    server
        .set_canned(Canned { status: 401, body: "bad credentials: Bearer s3cret-token-2".into() });
    let err = fetch.get(&url).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::Unauthorized, "{err}");
    assert!(!err.message.contains("s3cret"), "the error leaks the secret: {err}");
    assert!(err.message.contains("[redacted]"), "{err}");

    let logged = logs.text();
    assert!(logged.contains("plugin.http{"), "requests are logged in spans: {logged}");
    assert!(!logged.contains("s3cret"), "the logs leak the secret:\n{logged}");
    let answered: Vec<&str> = logged.lines().filter(|line| line.contains(" answered ")).collect();
    assert_eq!(answered.len(), 4, "one line per request:\n{logged}");
    assert!(
        answered[0].contains("path=\"/api\"") && answered[0].contains("status=200"),
        "{logged}"
    );
    assert!(answered[2].contains("path=\"/api?access_token=[redacted]&page=2\""), "{logged}");
    assert!(answered[3].contains("status=401"), "{logged}");
    // The fixture's provider ID is the URL itself, so the call's span shows
    // it; the request's own fields do not.
    let fields = answered[2].split(" answered ").nth(1).unwrap_or_default();
    assert!(!fields.contains("abc123xyz"), "the request's line leaks a query token: {fields}");
}

#[tokio::test(flavor = "current_thread")]
async fn a_credential_in_a_secret_is_injected_rotated_and_a_missing_one_refuses_the_entry() {
    let logs = CapturedLogs::default();
    let _guard = logs.install();
    let (server, dir, ca_file) = welcoming_origin().await;
    let port = server.addr.port();
    let secrets = Arc::new(MemorySecrets::new("proxyfleet"));
    secrets.put("proxyfleet", "api", &[("token", b"s3cret-of-a-secret-1\n")]);
    let grants = |secret_ref: &str| {
        format!(
            "      caFile: {}\n      http:\n        - url: https://localhost:{port}\n          allowAddresses: [127.0.0.1, '::1']\n          credential: {{ header: Authorization, valueTemplate: 'Bearer {{secret}}', secretRef: {secret_ref} }}\n",
            ca_file.display()
        )
    };
    let options =
        || RuntimeOptions { secrets: Some(Arc::clone(&secrets) as _), ..Default::default() };
    let registry = fixture_registry_with(
        options(),
        dir.path(),
        "http-fetch",
        &grants("{ name: api, key: token }"),
        "",
    )
    .await;
    let fetch = registry.provider("fetch").expect("serves with its Secret");
    let url = format!("https://localhost:{port}/api");
    fetch.get(&url).await.unwrap();
    assert_eq!(server.seen()[0].header("authorization"), Some("Bearer s3cret-of-a-secret-1"));

    // Rotation: the Secret is read again for the next request.
    secrets.put("proxyfleet", "api", &[("token", b"s3cret-of-a-secret-2")]);
    fetch.get(&url).await.unwrap();
    assert_eq!(server.seen()[1].header("authorization"), Some("Bearer s3cret-of-a-secret-2"));

    // An echoing backend: redacted as a file's secret is.
    server.set_canned(Canned { status: 401, body: "bad: Bearer s3cret-of-a-secret-2".into() });
    let err = fetch.get(&url).await.unwrap_err();
    assert!(!err.message.contains("s3cret"), "the error leaks the secret: {err}");

    // The Secret gone: the request is answered by the host, not sent.
    secrets.remove("proxyfleet", "api");
    let err = fetch.get(&url).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::Transient, "the host's 503: {err}");
    assert_eq!(server.seen().len(), 3, "no request left without its credential");

    // A Secret or key that is not there refuses the entry, naming the grant
    // and what is missing; so does a secretRef where no Secrets are read.
    secrets.put("proxyfleet", "api", &[("token", b"s3cret-of-a-secret-3")]);
    for (secret_ref, options, why) in [
        ("{ name: nowhere, key: token }", options(), "Secret \"nowhere\" not found"),
        ("{ name: api, key: password }", options(), "no key \"password\" (it has: token)"),
        ("{ name: api, key: token }", RuntimeOptions::default(), "secretFile"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let registry =
            fixture_registry_with(options, dir.path(), "http-fetch", &grants(secret_ref), "").await;
        let refused = registry.provider("fetch").err().expect("refused").to_string();
        assert!(
            refused.contains("grants.http[0].credential.secretRef") && refused.contains(why),
            "{secret_ref}: {refused}"
        );
        assert!(!refused.contains("s3cret"), "{refused}");
    }

    // A Secret created after the entry was refused, with no change of the
    // providers file: the file's follower binds the entry again.
    let dir = tempfile::tempdir().unwrap();
    let late = grants("{ name: late, key: token }");
    let registry =
        Arc::new(fixture_registry_with(options(), dir.path(), "http-fetch", &late, "").await);
    assert!(registry.provider("fetch").is_err(), "refused while the Secret is missing");
    let file = dir.path().join("providers.yaml");
    std::fs::write(&file, fixture_providers("http-fetch", &late, "")).unwrap();
    let _follow = follow_providers_file(
        Arc::clone(&registry),
        file.clone(),
        &ProvidersConfig::load(&file).unwrap(),
        ProvidersWatchOptions {
            interval: Duration::from_millis(50),
            retry_failed: Duration::from_millis(100),
            watchdog: None,
        },
    );
    secrets.put("proxyfleet", "late", &[("token", b"s3cret-of-a-late-secret")]);
    let serving =
        wait_for(Duration::from_secs(10), || async { registry.provider("fetch").ok().map(drop) });
    assert!(serving.await.is_some(), "bound again once its Secret exists");
    server.set_canned(Canned { status: 200, body: "welcome".into() });
    registry.provider("fetch").unwrap().get(&url).await.unwrap();
    assert_eq!(
        server.seen().last().and_then(|seen| seen.header("authorization").map(str::to_owned)),
        Some("Bearer s3cret-of-a-late-secret".to_owned())
    );

    let logged = logs.text();
    assert!(!logged.contains("s3cret"), "the logs leak the secret:\n{logged}");
}
