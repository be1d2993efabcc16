//! The generated CRDs against a real API server (Kubernetes 1.20 from
//! `deploy/dev/kube-apiserver`): they install, default, validate, and
//! serve the status and scale subresources. Each check is a function of
//! the client and namespace, which `current_server` runs against a current
//! API server too.

use kube::api::{Api, Patch, PatchParams, PostParams};
use proxyfleet_kube::crd::{Proxy, ProxyPool};
use proxyfleet_tests::{kube_admin_client, kube_install_crds, kube_pool, kube_test_namespace};

/// The 1.20 server's admin client, its CRDs installed, and a new namespace.
async fn on_1_20(prefix: &str) -> (kube::Client, String) {
    let client = kube_admin_client().await;
    kube_install_crds(&client).await;
    let namespace = kube_test_namespace(&client, prefix).await;
    (client, namespace)
}

fn proxy(name: &str, spec: &serde_json::Value) -> Proxy {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "proxyfleet.io/v1alpha1",
        "kind": "Proxy",
        "metadata": { "name": name },
        "spec": spec,
    }))
    .unwrap()
}

#[tokio::test]
async fn proxies_are_defaulted_validated_and_have_a_status() {
    let (client, namespace) = on_1_20("pf-crd").await;
    proxies_are_defaulted_validated_and_have_a_status_on(&client, &namespace).await;
}

pub(crate) async fn proxies_are_defaulted_validated_and_have_a_status_on(
    client: &kube::Client,
    namespace: &str,
) {
    let proxies: Api<Proxy> = Api::namespaced(client.clone(), namespace);

    let created = proxies
        .create(
            &PostParams::default(),
            &proxy("minimal", &serde_json::json!({ "provider": "lab" })),
        )
        .await
        .unwrap();
    assert_eq!((created.spec.cores, created.spec.port, created.spec.memory_mib), (1, 3128, 512));

    let err = proxies
        .create(
            &PostParams::default(),
            &proxy("bad", &serde_json::json!({ "provider": "lab", "cores": 0 })),
        )
        .await
        .unwrap_err();
    let message = err.to_string();
    assert!(message.contains("spec.cores"), "the API server names the field: {message}");
    let err = proxies
        .create(
            &PostParams::default(),
            &proxy("bad", &serde_json::json!({ "provider": "Not A Label" })),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("spec.provider"), "{err}");

    let status = serde_json::json!({
        "apiVersion": "proxyfleet.io/v1alpha1",
        "kind": "Proxy",
        "status": { "phase": "Running", "ip": "203.0.113.7", "providerID": "vm-1" }
    });
    let patched = proxies
        .patch_status(
            "minimal",
            &PatchParams::apply("proxyfleet-tests").force(),
            &Patch::Apply(&status),
        )
        .await
        .unwrap();
    assert_eq!(patched.status.unwrap().ip.as_deref(), Some("203.0.113.7"));
}

#[tokio::test]
async fn pools_serve_the_scale_subresource() {
    let (client, namespace) = on_1_20("pf-scale").await;
    pools_serve_the_scale_subresource_on(&client, &namespace).await;
}

pub(crate) async fn pools_serve_the_scale_subresource_on(client: &kube::Client, namespace: &str) {
    let pools: Api<ProxyPool> = Api::namespaced(client.clone(), namespace);
    pools.create(&PostParams::default(), &kube_pool(2)).await.unwrap();
    let scale = pools.get_scale("crawl").await.unwrap();
    assert_eq!(scale.spec.and_then(|s| s.replicas), Some(2));
    let patch = serde_json::json!({ "spec": { "replicas": 5 } });
    pools.patch_scale("crawl", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    assert_eq!(pools.get("crawl").await.unwrap().spec.replicas, 5);
}

/// A pool's conditions as the pool controller writes them are kept whole
/// (an older CRD pruned them), two writers' conditions merge by type under
/// server-side apply, and a status outside `True`/`False`/`Unknown` is
/// refused naming the field.
#[tokio::test]
async fn pool_conditions_are_kept_merged_by_type_and_validated() {
    let (client, namespace) = on_1_20("pf-conditions").await;
    pool_conditions_are_kept_merged_by_type_and_validated_on(&client, &namespace).await;
}

pub(crate) async fn pool_conditions_are_kept_merged_by_type_and_validated_on(
    client: &kube::Client,
    namespace: &str,
) {
    let pools: Api<ProxyPool> = Api::namespaced(client.clone(), namespace);
    pools.create(&PostParams::default(), &kube_pool(1)).await.unwrap();
    let condition = |type_: &str, status: &str| {
        serde_json::json!({
            "type": type_, "status": status, "reason": "Tested", "message": "by a test",
            "observedGeneration": 1, "lastTransitionTime": "2026-12-01T00:00:00Z",
        })
    };
    let status = |conditions: serde_json::Value| {
        serde_json::json!({
            "apiVersion": "proxyfleet.io/v1alpha1", "kind": "ProxyPool",
            "status": { "conditions": conditions },
        })
    };
    let apply = |manager: &'static str| PatchParams::apply(manager).force();
    let ours = status(serde_json::json!([condition("Ready", "True")]));
    pools.patch_status("crawl", &apply("proxyfleet"), &Patch::Apply(&ours)).await.unwrap();
    let theirs = status(serde_json::json!([condition("example.com/Audited", "False")]));
    pools.patch_status("crawl", &apply("auditor"), &Patch::Apply(&theirs)).await.unwrap();
    let conditions = pools.get("crawl").await.unwrap().status.unwrap().conditions;
    let types: Vec<_> = conditions.iter().map(|c| c.type_.as_str()).collect();
    assert_eq!(types, ["Ready", "example.com/Audited"], "merged by type");
    assert_eq!(conditions[0].observed_generation, Some(1), "not pruned");
    assert_eq!(conditions[0].message.as_deref(), Some("by a test"));

    let bad = status(serde_json::json!([condition("Ready", "Yes")]));
    let err = pools.patch_status("crawl", &apply("proxyfleet"), &Patch::Apply(&bad)).await;
    let message = err.unwrap_err().to_string();
    assert!(message.contains("status.conditions"), "the field is named: {message}");
}

/// On 1.20, which takes no CEL rules, a provider entry named twice is still
/// refused (the list is a map keyed by name); what the rules guard is
/// accepted there (`current_server` checks the rules).
#[tokio::test]
async fn a_provider_entry_named_twice_is_refused_without_cel() {
    let (client, namespace) = on_1_20("pf-rules").await;
    let pools: Api<ProxyPool> = Api::namespaced(client.clone(), &namespace);
    let err = pools.create(&PostParams::default(), &pool_with_providers(&["lab", "lab"])).await;
    let message = err.unwrap_err().to_string();
    assert!(message.contains("spec.providers[1]") && message.contains("Duplicate"), "{message}");
    let mut pool = kube_pool(1);
    pool.spec.min_available = 2;
    pools.create(&PostParams::default(), &pool).await.expect("1.20 enforces no CEL rule");
}

/// The pool `crawl` of one Proxy spread over `entries` (names as given).
pub(crate) fn pool_with_providers(entries: &[&str]) -> ProxyPool {
    let mut pool = kube_pool(1);
    pool.spec.providers = entries
        .iter()
        .map(|name| proxyfleet_kube::crd::WeightedProvider { name: (*name).to_owned(), weight: 1 })
        .collect();
    pool
}
