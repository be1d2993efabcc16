//! The exact requests one reconcile pass makes, against a mocked API server
//! (tower-test): the fast tier beside the tests on a real one.

use std::sync::Arc;
use std::time::Duration;

use http::Method;
use kube::runtime::controller::Action;
use proxyfleet_core::Provider;
use proxyfleet_core::fake::{FakeProvider, Op};
use proxyfleet_core::installation::InstallationId;
use proxyfleet_core::reconcile::{FINALIZER, Policy};
use proxyfleet_core::source::{EntryState, StaticSource};
use proxyfleet_core::spec_key::SpecKey;
use proxyfleet_kube::controller::{Context, reconcile_proxy};
use proxyfleet_kube::crd::Proxy;

use crate::mock::{next, no_more_requests, pair, reply};

/// A context with no provider entries: every provider is unavailable, so
/// a pass makes API requests only. No plugin runtime is involved.
async fn context(client: kube::Client) -> Arc<Context> {
    let providers = Arc::new(StaticSource::new(InstallationId::default()));
    let key = SpecKey::generate();
    Arc::new(Context::new(client, providers, Policy::default(), Some("mock".into()), key))
}

/// A context whose entry `lab` is `fake`, hashing specs with `key`.
fn context_with(client: kube::Client, fake: &Arc<FakeProvider>, key: SpecKey) -> Arc<Context> {
    let providers = Arc::new(
        StaticSource::new(InstallationId::default())
            .with("lab", EntryState::Ready(Arc::clone(fake) as Arc<dyn Provider>)),
    );
    Arc::new(Context::new(client, providers, Policy::default(), Some("mock".into()), key))
}

fn proxy(finalizers: &[&str]) -> Proxy {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "proxyfleet.io/v1alpha1",
        "kind": "Proxy",
        "metadata": {
            "name": "a", "namespace": "ns", "uid": "uid-a", "generation": 1,
            "resourceVersion": "7", "finalizers": finalizers,
        },
        "spec": { "provider": "lab" },
    }))
    .unwrap()
}

/// The first pass only puts the finalizer on, guarded by the
/// resourceVersion, and leaves the next pass to the watch event the patch
/// causes. It used to requeue at once: on a busy API server that pass often
/// ran before the watch had brought the patched object back and repeated
/// the patch with the old resourceVersion (211 answers 409 while 1,000
/// Proxies came up in the scale bench).
#[tokio::test]
async fn regression_the_first_pass_only_puts_the_finalizer_on_and_waits_for_the_watch() {
    let (client, mut handle) = pair();
    let context = context(client).await;
    let object = proxy(&[]);
    let server = tokio::spawn(async move {
        let (method, uri, body, respond) = next(&mut handle).await;
        assert_eq!(method, Method::PATCH);
        assert!(uri.starts_with("/apis/proxyfleet.io/v1alpha1/namespaces/ns/proxies/a?"), "{uri}");
        assert_eq!(body["metadata"]["finalizers"], serde_json::json!([FINALIZER]));
        assert_eq!(body["metadata"]["resourceVersion"], "7");
        reply(respond, 200, &serde_json::to_value(proxy(&[FINALIZER])).unwrap());
        handle
    });
    let action = reconcile_proxy(Arc::new(object), context).await.unwrap();
    assert_eq!(action, Action::requeue(Duration::from_secs(10)), "only a fallback");
    let mut handle = server.await.unwrap();
    // Nothing else: no status write, no event, no provider call.
    assert!(no_more_requests(&mut handle).await);
}

#[tokio::test]
async fn an_unknown_entry_makes_one_warning_event_and_one_status_apply() {
    let (client, mut handle) = pair();
    let context = context(client).await;
    let server = tokio::spawn(async move {
        let (method, uri, body, respond) = next(&mut handle).await;
        assert_eq!(method, Method::POST);
        assert!(uri.starts_with("/apis/events.k8s.io/v1/namespaces/ns/events"), "{uri}");
        assert_eq!(body["type"], "Warning");
        assert_eq!(body["reason"], "ProviderUnavailable");
        reply(respond, 200, &body);

        let (method, uri, body, respond) = next(&mut handle).await;
        assert_eq!(method, Method::PATCH);
        assert!(
            uri.starts_with("/apis/proxyfleet.io/v1alpha1/namespaces/ns/proxies/a/status?"),
            "{uri}"
        );
        assert!(uri.contains("fieldManager=proxyfleet") && uri.contains("force=true"), "{uri}");
        let conditions = body["status"]["conditions"].as_array().unwrap();
        let provisioned = conditions.iter().find(|c| c["type"] == "Provisioned").unwrap();
        assert_eq!(provisioned["reason"], "ProviderUnavailable");
        reply(respond, 200, &serde_json::to_value(proxy(&[FINALIZER])).unwrap());
        handle
    });
    reconcile_proxy(Arc::new(proxy(&[FINALIZER])), context).await.unwrap();
    let mut handle = server.await.unwrap();
    assert!(no_more_requests(&mut handle).await);
}

/// A pass that polls a new instance often ran before the watch brought
/// back the status the previous pass wrote; on the cached object, which
/// records no instance, it created the instance again (438 of 1,000
/// Proxies in the scale bench, each a second `Created` Event). Every pass
/// now works on the later of the cached object and the answer to this
/// process's last status write, without a request of its own.
#[tokio::test]
async fn regression_a_pass_on_a_cache_without_the_last_status_write_makes_no_second_instance() {
    let (client, mut handle) = pair();
    let fake = Arc::new(FakeProvider::new("lab").start_provisioning());
    let context = context_with(client, &fake, SpecKey::generate());
    // The cache holds the Proxy with its finalizer, at version 7, through
    // both passes.
    let cached = Arc::new(proxy(&[FINALIZER]));
    let server = tokio::spawn(async move {
        let mut requests = Vec::new();
        while let Ok(Some((request, respond))) =
            tokio::time::timeout(Duration::from_millis(200), handle.next_request()).await
        {
            let (method, path) = (request.method().clone(), request.uri().path().to_owned());
            let bytes = request.into_body().collect_bytes().await.unwrap();
            let mut answer = serde_json::to_value(proxy(&[FINALIZER])).unwrap();
            if path.ends_with("/status") {
                // The API server's answer: the object with the status
                // written, at a later version.
                let sent: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
                answer["status"] = sent["status"].clone();
                answer["metadata"]["resourceVersion"] = "8".into();
            }
            reply(respond, 200, &answer);
            requests.push((method, path));
        }
        requests
    });
    reconcile_proxy(Arc::clone(&cached), Arc::clone(&context)).await.unwrap();
    reconcile_proxy(cached, context).await.unwrap();
    let requests = server.await.unwrap();
    assert_eq!(fake.calls(), [(Op::Create, "uid-a".to_owned()), (Op::Get, "fake-1".to_owned())]);
    assert!(
        requests.iter().all(|(method, path)| *method != Method::GET || !path.contains("/proxies/")),
        "no Proxy was read: {requests:?}"
    );
}

/// The same rule on the replacement path: a pass that replaced the
/// instance made for an older spec recorded the new one, and the next pass,
/// on a cache that still shows the old instance and spec hash, polls the
/// new instance instead of replacing it in turn.
#[tokio::test]
async fn a_pass_on_a_cache_without_the_replacement_replaces_nothing_again() {
    let (client, mut handle) = pair();
    let fake = Arc::new(FakeProvider::new("lab").start_provisioning());
    let context = context_with(client, &fake, SpecKey::generate());
    let mut cached = serde_json::to_value(proxy(&[FINALIZER])).unwrap();
    cached["status"] = serde_json::json!({
        "phase": "Running", "providerID": "old-1", "specHash": "an-older-spec",
        "observedGeneration": 1,
    });
    let cached: Arc<Proxy> = Arc::new(serde_json::from_value(cached).unwrap());
    let server = tokio::spawn(async move {
        let mut status_writes = 0;
        while let Ok(Some((request, respond))) =
            tokio::time::timeout(Duration::from_millis(200), handle.next_request()).await
        {
            let path = request.uri().path().to_owned();
            let bytes = request.into_body().collect_bytes().await.unwrap();
            let mut answer = serde_json::to_value(proxy(&[FINALIZER])).unwrap();
            if path.ends_with("/status") {
                status_writes += 1;
                let sent: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
                answer["status"] = sent["status"].clone();
                answer["metadata"]["resourceVersion"] = (7 + status_writes).to_string().into();
            }
            reply(respond, 200, &answer);
        }
    });
    reconcile_proxy(Arc::clone(&cached), Arc::clone(&context)).await.unwrap();
    reconcile_proxy(cached, context).await.unwrap();
    server.await.unwrap();
    assert_eq!(
        fake.calls(),
        [
            (Op::Delete, "old-1".to_owned()),
            (Op::Get, "old-1".to_owned()),
            (Op::Create, "uid-a".to_owned()),
            (Op::Get, "fake-1".to_owned()),
        ]
    );
}
