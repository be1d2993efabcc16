//! ClusterProxyProviders against a real API server with the real static
//! plugin: applied live as entries, their conditions, a refused edit that
//! keeps the entry serving, an invalid spec, a name the providers file
//! holds, a deletion held while Proxies name the provider, and providers
//! given to one installation by label.

use std::time::Duration;

use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use proxyfleet_core::reconcile::Policy;
use proxyfleet_kube::cluster_providers::{self, PROVIDER_FINALIZER};
use proxyfleet_kube::crd::{ClusterProxyProvider, Condition, INSTALLATION_LABEL, Proxy};
use proxyfleet_tests::{
    Controllers, kube_admin_client, kube_install_crds, kube_test_namespace, wait_for,
};

use crate::kube_controller::{PROVIDERS, proxy};
use crate::provider_passes::{Passes, delete_all};

const PATIENCE: Duration = Duration::from_secs(30);

/// A ClusterProxyProvider given to `installation`: the leaders of the
/// tests running beside (installations of their own) leave it alone.
fn provider(name: &str, installation: &str, spec: serde_json::Value) -> ClusterProxyProvider {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "proxyfleet.io/v1alpha1",
        "kind": "ClusterProxyProvider",
        "metadata": { "name": name, "labels": { INSTALLATION_LABEL: installation } },
        "spec": spec,
    }))
    .unwrap()
}

fn static_spec(endpoints: &[&str]) -> serde_json::Value {
    serde_json::json!({
        "plugin": "static",
        "config": { "endpoints": endpoints },
        "proxyAddresses": ["192.0.2.0/24"],
    })
}

/// `status/reason` of condition `type_`, once the status describes the
/// object's current generation.
fn current(object: &ClusterProxyProvider, type_: &str) -> Option<(String, String, String)> {
    let status = object.status.as_ref()?;
    (Some(status.observed_generation) == object.metadata.generation).then_some(())?;
    let condition: &Condition = status.conditions.iter().find(|c| c.type_ == type_)?;
    Some((
        format!("{:?}", condition.status),
        condition.reason.clone(),
        condition.message.clone().unwrap_or_default(),
    ))
}

async fn until_condition(
    api: &Api<ClusterProxyProvider>,
    name: &str,
    type_: &str,
    status: &str,
    reason: &str,
) -> String {
    let found = wait_for(PATIENCE, || async {
        let object = api.get(name).await.ok()?;
        let (s, r, message) = current(&object, type_)?;
        (s == status && r == reason).then_some(message)
    })
    .await;
    match found {
        Some(message) => message,
        None => panic!(
            "{name}: {type_} did not become {status}/{reason} within {PATIENCE:?}: {:#?}",
            api.get(name).await.ok().and_then(|o| o.status)
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_providers_serve_live_and_are_held_while_proxies_name_them() {
    let client = kube_admin_client().await;
    kube_install_crds(&client).await;
    let namespace = kube_test_namespace(&client, "pf-cpp").await;
    // The file's entry under a name of this run's: another installation's
    // view of its file may hold `lab` (an operator that ran against this
    // server).
    let file_entry = format!("file-{namespace}");
    let providers = PROVIDERS.replace("name: lab", &format!("name: {file_entry}"));
    let controllers =
        Controllers::start(&client, &namespace, &providers, Policy::default(), false).await;
    let registry = std::sync::Arc::clone(&controllers.registry);
    let passes = Passes::start(&client, registry.clone() as _, &namespace);
    let api: Api<ClusterProxyProvider> = Api::all(client.clone());
    // Cluster-scoped: a name of this run's own.
    let name = format!("team-{namespace}");

    let own = registry.installation().as_str().to_owned();
    api.create(&PostParams::default(), &provider(&name, &own, static_spec(&["192.0.2.5:3128"])))
        .await
        .unwrap();
    until_condition(&api, &name, "Ready", "True", "Serving").await;
    let object = api.get(&name).await.unwrap();
    assert!(object.finalizers().iter().any(|f| f == PROVIDER_FINALIZER));
    let status = object.status.unwrap();
    assert_eq!(status.plugin.as_deref(), Some("static"));
    assert!(status.digest.is_some() && status.activated_at.is_some(), "{status:?}");
    assert!(registry.provider(&name).is_ok(), "the entry serves");

    // The leader's checks go on it as `Checked`, beside the passes' own
    // conditions (each applied by its own field manager).
    let metrics = proxyfleet_metrics::Metrics::new();
    let failures = proxyfleet_kube::operate::check_providers(
        &client,
        registry.as_ref(),
        Duration::from_secs(5),
        &metrics,
    )
    .await;
    assert!(failures.is_empty(), "{failures:?}");
    let checked = |object: &ClusterProxyProvider| {
        let status = object.status.as_ref()?;
        let checked = status.conditions.iter().find(|c| c.type_ == "Checked")?;
        Some(format!("{:?}/{}", checked.status, checked.reason))
    };
    assert_eq!(checked(&api.get(&name).await.unwrap()).as_deref(), Some("True/Passed"));

    // A Proxy names it as it names a file entry.
    let proxies: Api<Proxy> = Api::namespaced(client.clone(), &namespace);
    proxies.create(&PostParams::default(), &proxy("a", &name)).await.unwrap();
    let ready = wait_for(PATIENCE, || async {
        let status = proxies.get("a").await.ok()?.status?;
        (Condition::is_true(&status.conditions, "Ready")
            && status.ip.as_deref() == Some("192.0.2.5"))
        .then_some(())
    })
    .await;
    assert!(ready.is_some(), "the Proxy on the cluster provider is Ready");

    // An edit its plugin refuses (an endpoint named twice): the entry keeps
    // serving its spec, and the conditions say so.
    let edit = |spec: serde_json::Value| {
        let api = api.clone();
        let name = name.clone();
        async move {
            let patch = serde_json::json!({ "spec": spec });
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
        }
    };
    edit(static_spec(&["192.0.2.5:3128", "192.0.2.5:3128"])).await;
    let refused = until_condition(&api, &name, "ConfigValid", "False", "Refused").await;
    assert!(refused.contains("endpoints[1]"), "the reason names the key: {refused}");
    let ready = until_condition(&api, &name, "Ready", "False", "Refused").await;
    assert!(ready.contains("serves its previous spec"), "{ready}");
    let object = api.get(&name).await.unwrap();
    assert_eq!(current(&object, "PluginLoaded").unwrap().0, "True");
    assert!(registry.provider(&name).is_ok(), "the entry still serves");
    assert_eq!(
        checked(&api.get(&name).await.unwrap()).as_deref(),
        Some("True/Passed"),
        "the passes leave the checks' condition alone"
    );

    // A key the providers file does not have: refused by name.
    edit(serde_json::json!({ "limits": { "colour": "blue" } })).await;
    let invalid = until_condition(&api, &name, "ConfigValid", "False", "InvalidSpec").await;
    assert!(invalid.contains("colour"), "{invalid}");

    // A merge patch's null drops the key.
    edit(serde_json::json!({ "limits": null, "config": { "endpoints": ["192.0.2.6:3128"] } }))
        .await;
    until_condition(&api, &name, "Ready", "True", "Serving").await;

    // Deletion waits for the Proxy that names it.
    api.delete(&name, &DeleteParams::default()).await.unwrap();
    let held = until_condition(&api, &name, "InUse", "True", "ProxiesRemain").await;
    assert!(held.contains(&format!("{namespace}/a")), "{held}");
    assert!(registry.provider(&name).is_ok(), "a provider held by its Proxies serves");
    proxies.delete("a", &DeleteParams::default()).await.unwrap();
    let gone =
        wait_for(PATIENCE, || async { api.get_opt(&name).await.ok()?.is_none().then_some(()) })
            .await;
    assert!(gone.is_some(), "the provider went once no Proxy named it");
    let removed = wait_for(PATIENCE, || async { registry.provider(&name).is_err().then_some(()) });
    assert!(removed.await.is_some(), "its entry is removed");

    // The providers file's entry keeps its name.
    let taken = provider(&file_entry, &own, static_spec(&["192.0.2.7:3128"]));
    api.create(&PostParams::default(), &taken).await.unwrap();
    let why = until_condition(&api, &file_entry, "Ready", "False", "NameTaken").await;
    assert!(why.contains("providers file"), "{why}");
    api.delete(&file_entry, &DeleteParams::default()).await.unwrap();
    let gone = wait_for(PATIENCE, || async {
        api.get_opt(&file_entry).await.ok()?.is_none().then_some(())
    })
    .await;
    assert!(gone.is_some());
    assert!(controllers.registry.provider(&file_entry).is_ok(), "the file's entry still serves");

    passes.stop().await;
    controllers.stop().await;
}

/// `spec.allowedNamespaces`: a Proxy in a namespace the selector leaves
/// out is not provisioned and says why; labelling the namespace lets it
/// through at the next pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_provider_serves_only_the_namespaces_it_selects() {
    use k8s_openapi::api::core::v1::Namespace;
    let client = kube_admin_client().await;
    kube_install_crds(&client).await;
    let namespace = kube_test_namespace(&client, "pf-cpp-ns").await;
    let controllers =
        Controllers::start(&client, &namespace, PROVIDERS, Policy::default(), false).await;
    let registry = std::sync::Arc::clone(&controllers.registry);
    let follow = tokio::spawn(cluster_providers::follow(client.clone(), registry.clone() as _));
    let api: Api<ClusterProxyProvider> = Api::all(client.clone());
    let name = format!("allowed-{namespace}");
    let mut spec = static_spec(&["192.0.2.8:3128"]);
    spec["allowedNamespaces"] =
        serde_json::json!({ "matchLabels": { "proxyfleet.io/test-team": "a" } });
    let own = registry.installation().as_str();
    api.create(&PostParams::default(), &provider(&name, own, spec)).await.unwrap();
    let served = wait_for(PATIENCE, || async { registry.provider(&name).ok().map(drop) }).await;
    assert!(served.is_some(), "the selector is not part of the entry");

    let proxies: Api<Proxy> = Api::namespaced(client.clone(), &namespace);
    proxies.create(&PostParams::default(), &proxy("a", &name)).await.unwrap();
    let refused = wait_for(PATIENCE, || async {
        let status = proxies.get("a").await.ok()?.status?;
        let provisioned = status.conditions.iter().find(|c| c.type_ == "Provisioned")?;
        let message = provisioned.message.clone()?;
        message.contains("allowedNamespaces").then(|| (provisioned.reason.clone(), message))
    })
    .await;
    let (reason, message) = refused.expect("the Proxy says the provider does not serve it");
    assert_eq!(reason, "ProviderUnavailable");
    assert!(message.contains(&namespace), "{message}");

    let namespaces: Api<Namespace> = Api::all(client.clone());
    let label = serde_json::json!({ "metadata": { "labels": { "proxyfleet.io/test-team": "a" } } });
    namespaces.patch(&namespace, &PatchParams::default(), &Patch::Merge(&label)).await.unwrap();
    let ready = wait_for(Duration::from_secs(90), || async {
        let status = proxies.get("a").await.ok()?.status?;
        Condition::is_true(&status.conditions, "Ready").then_some(())
    })
    .await;
    assert!(ready.is_some(), "once selected, the Proxy is provisioned");

    proxies.delete("a", &DeleteParams::default()).await.unwrap();
    let gone =
        wait_for(PATIENCE, || async { proxies.get_opt("a").await.ok()?.is_none().then_some(()) })
            .await;
    assert!(gone.is_some());
    api.delete(&name, &DeleteParams::default()).await.unwrap();
    follow.abort();
    controllers.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_provider_given_to_another_installation_is_left_alone() {
    use std::sync::Arc;

    use proxyfleet_runtime::Registry;
    use proxyfleet_runtime::config::ProvidersConfig;

    let client = kube_admin_client().await;
    kube_install_crds(&client).await;
    // The namespace only makes this run's names unique.
    let namespace = kube_test_namespace(&client, "pf-given").await;
    let plugins = tempfile::tempdir().unwrap();
    std::fs::copy(proxyfleet_tests::plugin("static"), plugins.path().join("static.wasm")).unwrap();
    let registry = Arc::new(
        Registry::load(
            &crate::views::runtime(),
            &ProvidersConfig::parse("providers: []\n").unwrap(),
            plugins.path(),
            Arc::new(proxyfleet_core::kv::MemoryKv::new()),
        )
        .await
        .unwrap(),
    );
    let own = registry.installation().as_str().to_owned();
    let passes = Passes::start(&client, registry.clone() as _, &namespace);
    let api: Api<ClusterProxyProvider> = Api::all(client.clone());
    let given = |name: &str, installation: &str| {
        provider(name, installation, static_spec(&["192.0.2.30:3128"]))
    };
    let theirs = format!("theirs-{namespace}");
    let ours = format!("ours-{namespace}");
    api.create(&PostParams::default(), &given(&theirs, "someone-else")).await.unwrap();
    api.create(&PostParams::default(), &given(&ours, &own)).await.unwrap();
    until_condition(&api, &ours, "Ready", "True", "Serving").await;
    // Both were seen by now (the watch brings them in order), and no
    // installation of this run is `someone-else`.
    let untouched = api.get(&theirs).await.unwrap();
    assert!(
        untouched.finalizers().is_empty() && untouched.status.is_none(),
        "another installation's provider is neither finalized nor given a status: {untouched:?}"
    );
    assert!(registry.provider(&theirs).is_err(), "nor served");

    // Given to this installation, it serves; given away again, it does not.
    let relabel = |installation: String| {
        let (api, theirs) = (api.clone(), theirs.clone());
        async move {
            let patch = serde_json::json!({
                "metadata": { "labels": { INSTALLATION_LABEL: installation } }
            });
            api.patch(&theirs, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
        }
    };
    relabel(own.clone()).await;
    until_condition(&api, &theirs, "Ready", "True", "Serving").await;
    assert!(registry.provider(&theirs).is_ok(), "served once given to this installation");
    relabel("someone-else".to_owned()).await;
    let dropped =
        wait_for(PATIENCE, || async { registry.provider(&theirs).is_err().then_some(()) });
    assert!(dropped.await.is_some(), "no longer served once given away");

    // Its finalizer is now the other installation's to remove; take it
    // back to delete it here.
    relabel(own.clone()).await;
    assert!(delete_all(&api, &[&theirs, &ours], PATIENCE).await, "both deleted");
    passes.stop().await;
}
