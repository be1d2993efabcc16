//! Credentials read from Kubernetes Secrets (`secretRef`) against the real
//! API server: a ClusterProxyProvider's header credential comes from a
//! Secret in the operator's namespace, reaches the backend and never the
//! plugin or the status; a provider naming a Secret that is not there is
//! `Ready=False` naming the grant and the Secret, and serves once the
//! Secret is created.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use proxyfleet_core::kv::MemoryKv;
use proxyfleet_core::secret_store::{SecretKeyRef, SecretReadError, SecretStore as _};
use proxyfleet_kube::crd::{ClusterProxyProvider, Condition, INSTALLATION_LABEL};
use proxyfleet_kube::credential_secrets::CredentialSecrets;
use proxyfleet_runtime::config::ProvidersConfig;
use proxyfleet_runtime::{Registry, RuntimeOptions};
use proxyfleet_tests::{
    Canned, TestServer, kube_admin_client, kube_install_crds, kube_test_namespace, localhost_tls,
    plugin, wait_for,
};

use crate::provider_passes::{Passes, delete_all};

/// Long enough for the leader's resync (30 s) to try a refused entry again.
const PATIENCE: Duration = Duration::from_secs(75);

fn secret(name: &str, key: &str, value: &str) -> Secret {
    serde_json::from_value(serde_json::json!({
        "metadata": { "name": name },
        "stringData": { key: value },
    }))
    .unwrap()
}

/// `status/reason` and message of the provider's `Ready` condition.
async fn ready(api: &Api<ClusterProxyProvider>, name: &str) -> Option<(String, String)> {
    let object = api.get(name).await.ok()?;
    let status = object.status?;
    let ready: &Condition = status.conditions.iter().find(|c| c.type_ == "Ready")?;
    Some((
        format!("{:?}/{}", ready.status, ready.reason),
        ready.message.clone().unwrap_or_default(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_provider_takes_its_credential_from_a_secret_and_names_a_missing_one() {
    let client = kube_admin_client().await;
    kube_install_crds(&client).await;
    let namespace = kube_test_namespace(&client, "pf-secref").await;
    let (ca, cert, key) = localhost_tls();
    let server =
        TestServer::https(Canned { status: 200, body: "welcome".into() }, &cert, &key).await;
    let port = server.addr.port();
    let plugins = tempfile::tempdir().unwrap();
    std::fs::copy(plugin("fixtures/http-fetch"), plugins.path().join("http-fetch.wasm")).unwrap();
    let ca_file = plugins.path().join("ca.pem");
    std::fs::write(&ca_file, ca).unwrap();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    secrets
        .create(&PostParams::default(), &secret("api-token", "token", "t0ken-of-a-secret\n"))
        .await
        .unwrap();

    // The store itself: a key by name, and what is missing named.
    let store = CredentialSecrets::new(client.clone(), &namespace);
    let at = |name: &str, key: &str| SecretKeyRef {
        namespace: None,
        name: name.into(),
        key: key.into(),
    };
    assert_eq!(store.read(&at("api-token", "token")).await.unwrap(), b"t0ken-of-a-secret\n");
    let no_key = store.read(&at("api-token", "password")).await.unwrap_err();
    assert!(matches!(&no_key, SecretReadError::NoKey { present, .. } if present == "token"));
    assert!(!no_key.to_string().contains("t0ken"), "{no_key}");
    assert!(matches!(
        store.read(&at("nowhere", "token")).await,
        Err(SecretReadError::NotFound { namespace: ns, .. }) if ns == namespace
    ));

    // A registry of its own installation, whose operator namespace is the
    // test's, kept by the follower and the leader's passes.
    let runtime = crate::views::runtime_with(RuntimeOptions {
        secrets: Some(Arc::new(CredentialSecrets::new(client.clone(), &namespace))),
        ..RuntimeOptions::default()
    });
    let registry = Arc::new(
        Registry::load(
            &runtime,
            &ProvidersConfig::parse("providers: []\n").unwrap(),
            plugins.path(),
            Arc::new(MemoryKv::new()),
        )
        .await
        .unwrap(),
    );
    let passes = Passes::start(&client, registry.clone() as _, &namespace);
    let api: Api<ClusterProxyProvider> = Api::all(client.clone());
    // Given to this installation: the other tests' operators leave them be.
    let own = registry.installation().as_str().to_owned();
    let provider = |name: &str, secret_name: &str| -> ClusterProxyProvider {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "proxyfleet.io/v1alpha1",
            "kind": "ClusterProxyProvider",
            "metadata": { "name": name, "labels": { INSTALLATION_LABEL: own } },
            "spec": {
                "plugin": "http-fetch",
                "grants": {
                    "caFile": ca_file,
                    "http": [{
                        "url": format!("https://localhost:{port}"),
                        "allowAddresses": ["127.0.0.1", "::1"],
                        "credential": {
                            "header": "Authorization",
                            "valueTemplate": "Bearer {secret}",
                            "secretRef": { "name": secret_name, "key": "token" },
                        },
                    }],
                },
            },
        }))
        .unwrap()
    };

    let name = format!("fetch-{namespace}");
    api.create(&PostParams::default(), &provider(&name, "api-token")).await.unwrap();
    let serving = wait_for(PATIENCE, || async {
        (ready(&api, &name).await?.0 == "True/Serving").then_some(())
    })
    .await;
    assert!(serving.is_some(), "{:?}", ready(&api, &name).await);
    let fetch = registry.provider(&name).unwrap();
    let answer = fetch.get(&format!("https://localhost:{port}/api")).await.unwrap();
    assert_eq!(server.seen()[0].header("authorization"), Some("Bearer t0ken-of-a-secret"));
    assert!(!answer.name.contains("t0ken"), "the plugin saw the credential: {}", answer.name);

    // A Secret that is not there: nothing serves, and the condition names
    // the grant and the Secret; created, the entry serves at the next pass.
    let waiting = format!("waiting-{namespace}");
    api.create(&PostParams::default(), &provider(&waiting, "later")).await.unwrap();
    let refused = wait_for(PATIENCE, || async {
        let (state, message) = ready(&api, &waiting).await?;
        (state == "False/Refused").then_some(message)
    })
    .await;
    let Some(refused) = refused else { panic!("not refused: {:?}", ready(&api, &waiting).await) };
    assert!(
        refused.contains("grants.http[0].credential.secretRef")
            && refused.contains("\"later\" not found"),
        "{refused}"
    );
    assert!(registry.provider(&waiting).is_err(), "an entry without its credential serves nothing");
    secrets.create(&PostParams::default(), &secret("later", "token", "l4ter")).await.unwrap();
    let healed = wait_for(PATIENCE, || async {
        (ready(&api, &waiting).await?.0 == "True/Serving").then_some(())
    })
    .await;
    assert!(healed.is_some(), "{:?}", ready(&api, &waiting).await);

    assert!(delete_all(&api, &[&name, &waiting], PATIENCE).await, "the providers went");
    passes.stop().await;
}
