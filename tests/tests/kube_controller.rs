//! The Proxy controller against a real API server with the real static
//! plugin: reconcile to Ready, events, replacement on a spec change, an
//! unknown provider entry, and a finalizer-guarded delete.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use proxyfleet_core::kv::KvStore as _;
use proxyfleet_core::reconcile::{FINALIZER, Policy};
use proxyfleet_kube::controller::{self, Context};
use proxyfleet_kube::crd::{Proxy, ProxyPhase};
use proxyfleet_kube::kv::ConfigMapKv;
use proxyfleet_runtime::config::ProvidersConfig;
use proxyfleet_runtime::{Registry, Runtime, RuntimeOptions};
use proxyfleet_tests::{
    kube_admin_client, kube_install_crds, kube_test_namespace, plugin, wait_for,
};

const PROVIDERS: &str = "providers:\n  - name: lab\n    plugin: static\n    config: { endpoints: ['192.0.2.1:3128', '192.0.2.2:3128'] }\n";

fn proxy(name: &str, provider: &str) -> Proxy {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "proxyfleet.io/v1alpha1",
        "kind": "Proxy",
        "metadata": { "name": name },
        "spec": { "provider": provider },
    }))
    .unwrap()
}

fn condition_reason(proxy: &Proxy, kind: &str) -> Option<String> {
    proxy
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == kind)
        .map(|c| format!("{}/{}", c.status, c.reason))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxies_reconcile_to_ready_and_are_deleted_behind_the_finalizer() {
    let client = kube_admin_client().await;
    kube_install_crds(&client).await;
    let namespace = kube_test_namespace(&client, "pf-ctl").await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(plugin("static"), dir.path().join("static.wasm")).unwrap();
    let kv = Arc::new(ConfigMapKv::new(client.clone(), &namespace));
    let runtime = Runtime::new(RuntimeOptions::default()).unwrap();
    let registry = Registry::load(
        &runtime,
        &ProvidersConfig::parse(PROVIDERS).unwrap(),
        dir.path(),
        kv.clone(),
    )
    .await
    .unwrap();
    let policy = Policy { provisioning_poll: Duration::from_millis(200), ..Policy::default() };
    let context =
        Arc::new(Context::new(client.clone(), Arc::new(registry), policy, Some("test".into())));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let controller = {
        let namespace = namespace.clone();
        tokio::spawn(async move {
            controller::run(context, Some(&namespace), async {
                let _ = stopped.await;
            })
            .await;
        })
    };
    let proxies: Api<Proxy> = Api::namespaced(client.clone(), &namespace);
    let wait = Duration::from_secs(30);

    proxies.create(&PostParams::default(), &proxy("a", "lab")).await.unwrap();
    let ready = wait_for(wait, || async {
        let current = proxies.get("a").await.ok()?;
        (condition_reason(&current, "Ready").as_deref() == Some("True/Ready")).then_some(current)
    })
    .await
    .expect("the Proxy becomes Ready");
    let status = ready.status.clone().unwrap();
    assert_eq!(status.phase, ProxyPhase::Running);
    assert_eq!(status.ip.as_deref(), Some("192.0.2.1"));
    assert_eq!(status.plugin.as_deref(), Some("static"));
    assert!(ready.finalizers().iter().any(|f| f == FINALIZER));

    let events: Api<Event> = Api::namespaced(client.clone(), &namespace);
    let created = wait_for(wait, || async {
        let list = events.list(&Default::default()).await.ok()?;
        list.items.into_iter().find(|e| e.reason.as_deref() == Some("Created"))
    })
    .await;
    assert!(created.is_some(), "a Created event is recorded");

    // A change that needs a new instance replaces it.
    let first_id = status.provider_id.clone();
    let patch = serde_json::json!({ "spec": { "cores": 2 } });
    proxies.patch("a", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    let replaced = wait_for(wait, || async {
        let current = proxies.get("a").await.ok()?;
        let status = current.status.clone()?;
        (status.observed_generation == 2 && status.phase == ProxyPhase::Running).then_some(status)
    })
    .await
    .expect("the change is reconciled");
    assert_ne!(replaced.spec_hash, status.spec_hash);
    assert!(replaced.provider_id.is_some() && first_id.is_some());

    // An unknown entry gets a condition and no calls.
    proxies.create(&PostParams::default(), &proxy("b", "nowhere")).await.unwrap();
    let reason = wait_for(wait, || async {
        let current = proxies.get("b").await.ok()?;
        condition_reason(&current, "Provisioned").filter(|r| r.ends_with("ProviderUnavailable"))
    })
    .await;
    assert_eq!(reason.as_deref(), Some("False/ProviderUnavailable"));

    // Delete: the instance goes first, then the finalizer, then the object.
    proxies.delete("a", &DeleteParams::default()).await.unwrap();
    let gone =
        wait_for(wait, || async { proxies.get_opt("a").await.ok()?.is_none().then_some(()) }).await;
    assert!(gone.is_some(), "the Proxy is deleted once its instance is");
    let left = kv.list("lab", "").await.unwrap();
    assert!(left.is_empty(), "the static endpoint was released: {left:?}");

    proxies.delete("b", &DeleteParams::default()).await.unwrap();
    let _ = stop.send(());
    controller.await.unwrap();
}
