//! The ProxyPool controller with the Proxy controller against a real API
//! server and the static plugin: members are made, become Ready, follow
//! the scale subresource and the template.

use std::time::Duration;

use kube::ResourceExt as _;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use proxyfleet_core::reconcile::Policy;
use proxyfleet_kube::crd::POOL_LABEL;
use proxyfleet_kube::crd::{Proxy, ProxyPool};
use proxyfleet_tests::{
    Controllers, kube_admin_client, kube_install_crds, kube_test_namespace, wait_for,
};

pub(crate) const PROVIDERS: &str = "providers:\n  - name: lab\n    plugin: static\n    config: { endpoints: ['192.0.2.1:3128', '192.0.2.2:3128', '192.0.2.3:3128'] }\n    proxyAddresses: ['192.0.2.0/24']\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_keeps_its_members_at_the_wanted_number_and_spec() {
    let client = kube_admin_client().await;
    kube_install_crds(&client).await;
    let namespace = kube_test_namespace(&client, "pf-pool").await;
    let controllers =
        Controllers::start(&client, &namespace, PROVIDERS, Policy::default(), true).await;
    a_pool_keeps_its_members_on(&client, &namespace).await;
    controllers.stop().await;
}

/// With both controllers running over `namespace` and [`PROVIDERS`].
pub(crate) async fn a_pool_keeps_its_members_on(client: &kube::Client, namespace: &str) {
    let pools: Api<ProxyPool> = Api::namespaced(client.clone(), namespace);
    let proxies: Api<Proxy> = Api::namespaced(client.clone(), namespace);
    let manifest: ProxyPool = serde_json::from_value(serde_json::json!({
        "apiVersion": "proxyfleet.io/v1alpha1",
        "kind": "ProxyPool",
        "metadata": { "name": "crawl" },
        "spec": { "replicas": 2, "template": { "metadata": { "labels": { "tier": "a" } }, "spec": { "provider": "lab" } } },
    }))
    .unwrap();
    pools.create(&PostParams::default(), &manifest).await.unwrap();
    let wait = Duration::from_secs(30);
    let ready = |count: u32| {
        let pools = pools.clone();
        async move {
            wait_for(wait, || async {
                let status = pools.get("crawl").await.ok()?.status?;
                (status.ready_replicas == count && status.replicas == count).then_some(status)
            })
            .await
        }
    };
    let status = ready(2).await.expect("two members become Ready");
    assert_eq!(status.selector.as_deref(), Some("proxyfleet.io/pool=crawl"));
    let members =
        proxies.list(&ListParams::default().labels(&format!("{POOL_LABEL}=crawl"))).await.unwrap();
    assert_eq!(members.items.len(), 2);
    for member in &members.items {
        assert!(member.name_any().starts_with("crawl-"));
        assert_eq!(member.labels().get("tier").map(String::as_str), Some("a"));
        assert_eq!(member.owner_references()[0].kind, "ProxyPool");
    }

    // kubectl scale goes through the scale subresource.
    let patch = serde_json::json!({ "spec": { "replicas": 1 } });
    pools.patch_scale("crawl", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    ready(1).await.expect("scaled down to one member");
    let gone = wait_for(wait, || async {
        let list = proxies
            .list(&ListParams::default().labels(&format!("{POOL_LABEL}=crawl")))
            .await
            .ok()?;
        (list.items.len() == 1).then_some(())
    })
    .await;
    assert!(gone.is_some(), "the removed member is deleted behind its finalizer");

    // A template change reaches the members.
    let patch = serde_json::json!({ "spec": { "template": { "spec": { "provider": "lab", "cores": 2 } } } });
    pools.patch("crawl", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    let updated = wait_for(wait, || async {
        let list = proxies
            .list(&ListParams::default().labels(&format!("{POOL_LABEL}=crawl")))
            .await
            .ok()?;
        list.items.iter().all(|p| p.spec.cores == 2).then_some(())
    })
    .await;
    assert!(updated.is_some(), "members follow the template");
}
