//! The CRDs and the controllers against a current API server:
//! `apiextensions-apiserver` 1.36 or later, built from Debian sid's Go
//! packages and started on loopback by `deploy/dev/current-apiserver/start.sh`.
//! It treats CRDs and custom resources as a current kube-apiserver does
//! (structural schemas, defaults, CEL rules, server-side apply, the status
//! and scale subresources, watches) and serves no core API: namespaces need
//! not exist, and what needs Events, Secrets, ConfigMaps or Leases stays
//! with the 1.20 tier. The checks shared with that tier are its functions,
//! run here on this server.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use proxyfleet_core::reconcile::Policy;
use proxyfleet_kube::crd::ProxyPool;
use proxyfleet_kube::kube_version::KubeVersion;
use proxyfleet_tests::{
    Controllers, kube_current_client, kube_install_crds, kube_pool, kube_unique_namespace,
};

use crate::kube_controller::{Events, reconcile_to_ready_and_delete_on};
use crate::kube_crd::pool_with_providers;

/// The current server's admin client, its CRDs installed, and a namespace
/// name of its own.
async fn on_current(prefix: &str) -> (kube::Client, String) {
    let client = kube_current_client().await;
    kube_install_crds(&client).await;
    (client, kube_unique_namespace(prefix))
}

#[tokio::test]
async fn the_crds_install_with_their_rules_and_serve_this_build() {
    let client = kube_current_client().await;
    let info = client.apiserver_version().await.unwrap();
    let version = KubeVersion::of_server(&info).expect("the server says its version");
    assert!(version >= KubeVersion { major: 1, minor: 36 }, "a current server: {info:?}");
    assert!(version.enforces_cel());
    kube_install_crds(&client).await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let installed = crds.get("proxypools.proxyfleet.io").await.unwrap();
    let text = serde_json::to_string(&installed.spec).unwrap();
    assert!(text.contains("x-kubernetes-validations"), "the rules are installed whole");
    proxyfleet_kube::crd_check::check(&client).await.expect("the operator would lead on them");
}

#[tokio::test]
async fn proxies_are_defaulted_validated_and_have_a_status() {
    let (client, namespace) = on_current("pf-crd").await;
    crate::kube_crd::proxies_are_defaulted_validated_and_have_a_status_on(&client, &namespace)
        .await;
}

#[tokio::test]
async fn pools_serve_the_scale_subresource() {
    let (client, namespace) = on_current("pf-scale").await;
    crate::kube_crd::pools_serve_the_scale_subresource_on(&client, &namespace).await;
}

#[tokio::test]
async fn pool_conditions_are_kept_merged_by_type_and_validated() {
    let (client, namespace) = on_current("pf-conditions").await;
    crate::kube_crd::pool_conditions_are_kept_merged_by_type_and_validated_on(&client, &namespace)
        .await;
}

/// The CEL rules hold on create, on server-side apply and through the
/// scale subresource (`kubectl scale`), and each refusal names the field
/// and the fix.
#[tokio::test]
async fn a_pools_cel_rules_refuse_what_openapi_cannot_say() {
    let (client, namespace) = on_current("pf-rules").await;
    let pools: Api<ProxyPool> = Api::namespaced(client.clone(), &namespace);
    let refusal = |result: Result<ProxyPool, kube::Error>| match result {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "{status:?}");
            status.message
        }
        other => panic!("refused as invalid, not {other:?}"),
    };

    let mut pool = kube_pool(2);
    pool.spec.min_available = 3;
    let message = refusal(pools.create(&PostParams::default(), &pool).await);
    assert!(message.contains("spec.minAvailable"), "{message}");
    assert!(message.contains("lower spec.minAvailable first"), "{message}");

    pool.spec.min_available = 2;
    pools.create(&PostParams::default(), &pool).await.expect("minAvailable = replicas is valid");
    let scale = serde_json::json!({ "spec": { "replicas": 1 } });
    let scaled = pools.patch_scale("crawl", &PatchParams::default(), &Patch::Merge(&scale)).await;
    let message = match scaled {
        Err(kube::Error::Api(status)) => status.message,
        other => panic!("kubectl scale below minAvailable is refused, not {other:?}"),
    };
    assert!(message.contains("spec.minAvailable"), "{message}");
    let apply = serde_json::json!({
        "apiVersion": "proxyfleet.io/v1alpha1", "kind": "ProxyPool",
        "spec": { "replicas": 2, "minAvailable": 5, "template": { "spec": { "provider": "lab" } } },
    });
    let applied = pools
        .patch("crawl", &PatchParams::apply("proxyfleet-tests").force(), &Patch::Apply(&apply))
        .await;
    assert!(refusal(applied).contains("spec.minAvailable"));
    assert_eq!(pools.get("crawl").await.unwrap().spec.min_available, 2, "nothing was changed");

    let mut labelled = kube_pool(1);
    labelled.metadata.name = Some("labelled".into());
    labelled.spec.template.metadata = Some(proxyfleet_kube::crd::TemplateMetadata {
        labels: [("proxyfleet.io/pool".to_owned(), "other".to_owned())].into(),
    });
    let message = refusal(pools.create(&PostParams::default(), &labelled).await);
    assert!(message.contains("spec.template.metadata.labels"), "{message}");
    assert!(message.contains("set by the pool"), "{message}");

    let mut twice = pool_with_providers(&["lab", "lab"]);
    twice.metadata.name = Some("twice".into());
    let message = refusal(pools.create(&PostParams::default(), &twice).await);
    assert!(message.contains("spec.providers[1]") && message.contains("Duplicate"), "{message}");
}

/// The leader's views of file entries as ClusterProxyProviders, their
/// statuses and checks.
#[tokio::test]
async fn provider_checks_are_published_per_entry() {
    let (client, namespace) = on_current("pf-checks").await;
    let kv = std::sync::Arc::new(proxyfleet_core::kv::MemoryKv::default());
    crate::kube_controller::provider_checks_are_published_per_entry_on(&client, &namespace, kv)
        .await;
}

/// The Proxy controller's writes (finalizer, status by server-side apply,
/// conditions with their generation) and the pool controller's (members
/// owned by the pool, the pool's status, members deleted behind their
/// finalizers) on a current server. Events are not served here: the
/// controller goes on without them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controllers_reconcile_on_a_current_server() {
    let (client, namespace) = on_current("pf-ctl").await;
    let policy = Policy { provisioning_poll: Duration::from_millis(200), ..Policy::default() };
    let controllers = Controllers::start_in_memory(
        &client,
        &namespace,
        crate::kube_controller::PROVIDERS,
        policy,
        false,
    )
    .await;
    reconcile_to_ready_and_delete_on(&client, &namespace, &controllers, Events::NotServed).await;
    controllers.stop().await;

    let namespace = kube_unique_namespace("pf-pool");
    let controllers = Controllers::start_in_memory(
        &client,
        &namespace,
        crate::kube_pool::PROVIDERS,
        Policy::default(),
        true,
    )
    .await;
    crate::kube_pool::a_pool_keeps_its_members_on(&client, &namespace).await;
    controllers.stop().await;
}
