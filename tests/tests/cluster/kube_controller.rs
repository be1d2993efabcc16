//! The Proxy controller against a real API server with the real static
//! plugin: reconcile to Ready, events, replacement on a spec change, an
//! unknown provider entry, and a finalizer-guarded delete.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use proxyfleet_core::kv::KvStore;
use proxyfleet_core::reconcile::{FINALIZER, Policy};
use proxyfleet_kube::crd::{ClusterProxyProvider, Proxy, ProxyPhase, ProxyPool};
use proxyfleet_kube::kv::ConfigMapKv;
use proxyfleet_runtime::Registry;
use proxyfleet_runtime::config::ProvidersConfig;
use proxyfleet_tests::{
    Controllers, kube_admin_client, kube_install_crds, kube_test_namespace, plugin, wait_for,
};

pub(crate) const PROVIDERS: &str = "providers:\n  - name: lab\n    plugin: static\n    config: { endpoints: ['192.0.2.1:3128', '192.0.2.2:3128'] }\n    proxyAddresses: ['192.0.2.0/24']\n";

pub(crate) fn proxy(name: &str, provider: &str) -> Proxy {
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
        .map(|c| format!("{:?}/{}", c.status, c.reason))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxies_reconcile_to_ready_and_are_deleted_behind_the_finalizer() {
    let client = kube_admin_client().await;
    kube_install_crds(&client).await;
    let namespace = kube_test_namespace(&client, "pf-ctl").await;
    let controllers = Controllers::start(
        &client,
        &namespace,
        PROVIDERS,
        Policy { provisioning_poll: Duration::from_millis(200), ..Policy::default() },
        false,
    )
    .await;
    reconcile_to_ready_and_delete_on(&client, &namespace, &controllers, Events::Served).await;
    controllers.stop().await;
}

/// Whether the API server serves Events (the current CRD-only one does
/// not: the controller's Events fail there, and nothing else may).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Events {
    Served,
    NotServed,
}

/// With the Proxy controller running over `namespace` and [`PROVIDERS`]
/// (polling every 200 ms).
pub(crate) async fn reconcile_to_ready_and_delete_on<K: KvStore>(
    client: &kube::Client,
    namespace: &str,
    controllers: &Controllers<K>,
    events: Events,
) {
    let proxies: Api<Proxy> = Api::namespaced(client.clone(), namespace);
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
    let ip = status.ip.as_deref();
    assert!(matches!(ip, Some("192.0.2.1" | "192.0.2.2")), "a configured endpoint: {ip:?}");
    assert_eq!(status.plugin.as_deref(), Some("static"));
    assert!(ready.finalizers().iter().any(|f| f == FINALIZER));

    let conditions = &status.conditions;
    assert!(conditions.iter().all(|c| c.observed_generation == Some(1)), "{conditions:?}");
    if events == Events::Served {
        let events: Api<Event> = Api::namespaced(client.clone(), namespace);
        let created = wait_for(wait, || async {
            let list = events.list(&Default::default()).await.ok()?;
            list.items.into_iter().find(|e| e.reason.as_deref() == Some("Created"))
        })
        .await;
        assert!(created.is_some(), "a Created event is recorded");
    }

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
    let left = controllers.kv.list("lab", "").await.unwrap();
    assert!(left.is_empty(), "the static endpoint was released: {left:?}");

    proxies.delete("b", &DeleteParams::default()).await.unwrap();
}

/// The console's "Replace instance" in a cluster: the annotation wakes the
/// controller (annotations otherwise wake nothing), the instance is
/// replaced once, and the action is an Event on the Proxy. A Proxy made
/// again under the same name is refused, not replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_replacement_makes_a_new_instance_and_an_event() {
    use proxyfleet_fleet::action::{Action, ProxyRef};
    use proxyfleet_fleet::mode::Refusal;
    use proxyfleet_kube::actions::OperatorActions;

    let client = kube_admin_client().await;
    kube_install_crds(&client).await;
    let namespace = kube_test_namespace(&client, "pf-replace").await;
    let controllers = Controllers::start(
        &client,
        &namespace,
        PROVIDERS,
        Policy { provisioning_poll: Duration::from_millis(200), ..Policy::default() },
        false,
    )
    .await;
    let proxies: Api<Proxy> = Api::namespaced(client.clone(), &namespace);
    let wait = Duration::from_secs(30);
    proxies.create(&PostParams::default(), &proxy("a", "lab")).await.unwrap();
    let ready = wait_for(wait, || async {
        let current = proxies.get("a").await.ok()?;
        (condition_reason(&current, "Ready").as_deref() == Some("True/Ready")).then_some(current)
    })
    .await
    .expect("the Proxy becomes Ready");
    let before = ready.status.clone().unwrap().spec_hash;

    let actions = OperatorActions::new(client.clone(), "test-replica".into());
    let target =
        ProxyRef { id: ready.uid().unwrap(), namespace: namespace.clone(), name: "a".into() };
    actions.replace(&target).await.unwrap();
    actions.record(&Action::Replace { proxy: target.clone() }).await;
    let replaced = wait_for(wait, || async {
        let status = proxies.get("a").await.ok()?.status?;
        (status.spec_hash != before && status.phase == ProxyPhase::Running).then_some(status)
    })
    .await
    .expect("the instance is replaced");
    assert_eq!(replaced.observed_generation, 1, "the spec did not change");

    let events: Api<Event> = Api::namespaced(client.clone(), &namespace);
    let recorded = wait_for(wait, || async {
        let list = events.list(&Default::default()).await.ok()?;
        list.items.into_iter().find(|e| e.reason.as_deref() == Some("OperatorReplaced"))
    })
    .await
    .expect("an Event of the operator's action");
    assert_eq!(recorded.regarding.as_ref().and_then(|r| r.name.as_deref()), Some("a"));
    assert!(recorded.note.as_deref().unwrap_or("").contains("new instance"), "{recorded:?}");
    let replaced_event = wait_for(wait, || async {
        let list = events.list(&Default::default()).await.ok()?;
        list.items.into_iter().find(|e| e.reason.as_deref() == Some("Replaced"))
    })
    .await;
    assert!(replaced_event.is_some(), "the controller's own Replaced event");

    let stale = ProxyRef { id: "00000000-0000-0000-0000-000000000000".into(), ..target };
    assert!(matches!(actions.replace(&stale).await, Err(Refusal::NotFound(_))));
    let after = proxies.get("a").await.unwrap().status.unwrap().spec_hash;
    assert_eq!(after, replaced.spec_hash, "a stale request replaces nothing");

    proxies.delete("a", &DeleteParams::default()).await.unwrap();
    controllers.stop().await;
}

/// The manifests in deploy/kubernetes/rbac.yaml, bound to the test user
/// instead of the ServiceAccount, in `namespace` instead of the operator's.
///
/// Regression: the cluster-wide bindings of earlier runs on the same API
/// server stayed, and gave the test user every verb an earlier ClusterRole
/// had, so a verb the chart dropped but the code still used went
/// unnoticed. They are deleted first.
async fn bind_deploy_rbac(client: &kube::Client, namespace: &str) {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
    use kube::api::ListParams;
    let bindings = Api::<ClusterRoleBinding>::all(client.clone());
    let roles = Api::<ClusterRole>::all(client.clone());
    for binding in bindings.list(&ListParams::default()).await.unwrap() {
        let bound_user = binding.subjects.iter().flatten().any(|subject| {
            subject.kind == "User" && subject.name == proxyfleet_tests::KUBE_TEST_USER
        });
        if bound_user {
            let name = binding.name_any();
            bindings.delete(&name, &DeleteParams::default()).await.unwrap();
            let _ = roles.delete(&binding.role_ref.name, &DeleteParams::default()).await;
        }
    }
    let text = std::fs::read_to_string(
        proxyfleet_tests::workspace_root().join("deploy/kubernetes/rbac.yaml"),
    )
    .unwrap();
    let user = serde_json::json!([{ "kind": "User", "name": proxyfleet_tests::KUBE_TEST_USER, "apiGroup": "rbac.authorization.k8s.io" }]);
    let suffix = namespace.to_owned();
    for document in yaml_serde::Deserializer::from_str(&text) {
        let mut value: serde_json::Value = serde::Deserialize::deserialize(document).unwrap();
        let kind = value["kind"].as_str().unwrap().to_owned();
        match kind.as_str() {
            "ClusterRole" => {
                value["metadata"]["name"] = format!("proxyfleet-{suffix}").into();
                let role: ClusterRole = serde_json::from_value(value).unwrap();
                Api::<ClusterRole>::all(client.clone())
                    .create(&PostParams::default(), &role)
                    .await
                    .unwrap();
            }
            "ClusterRoleBinding" => {
                value["metadata"]["name"] = format!("proxyfleet-{suffix}").into();
                value["roleRef"]["name"] = format!("proxyfleet-{suffix}").into();
                value["subjects"] = user.clone();
                let binding: ClusterRoleBinding = serde_json::from_value(value).unwrap();
                Api::<ClusterRoleBinding>::all(client.clone())
                    .create(&PostParams::default(), &binding)
                    .await
                    .unwrap();
            }
            "Role" => {
                value["metadata"]["namespace"] = namespace.into();
                let role: Role = serde_json::from_value(value).unwrap();
                Api::<Role>::namespaced(client.clone(), namespace)
                    .create(&PostParams::default(), &role)
                    .await
                    .unwrap();
            }
            "RoleBinding" => {
                value["metadata"]["namespace"] = namespace.into();
                value["subjects"] = user.clone();
                let binding: RoleBinding = serde_json::from_value(value).unwrap();
                Api::<RoleBinding>::namespaced(client.clone(), namespace)
                    .create(&PostParams::default(), &binding)
                    .await
                    .unwrap();
            }
            _ => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_rbac_is_enough_for_the_controller() {
    let admin = kube_admin_client().await;
    kube_install_crds(&admin).await;
    let namespace = kube_test_namespace(&admin, "pf-rbac").await;
    bind_deploy_rbac(&admin, &namespace).await;
    let user = proxyfleet_tests::kube_user_client().await;
    // RBAC changes reach the authorizer's cache within a moment.
    let lease = proxyfleet_kube::lease::LeaderElector::new(
        user.clone(),
        &namespace,
        proxyfleet_kube::lease::ElectionConfig {
            lease: "proxyfleet-leader".into(),
            identity: "rbac-test".into(),
            lease_duration: Duration::from_secs(5),
            renew_every: Duration::from_secs(1),
        },
    );
    let leading = wait_for(Duration::from_secs(10), || async {
        lease.try_acquire_or_renew().await.ok()?.then_some(())
    })
    .await;
    assert!(leading.is_some(), "the Role allows the leader Lease");
    // Before campaigning the operator reads its CRDs by name; the ones the
    // API server stores serve this build.
    proxyfleet_kube::crd_check::check(&user).await.unwrap();
    // A credential Secret in the operator's namespace, read by name.
    {
        use proxyfleet_core::secret_store::{SecretKeyRef, SecretStore as _};
        let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(
            serde_json::json!({ "metadata": { "name": "pve-token" }, "stringData": { "token": "t" } }),
        )
        .unwrap();
        Api::namespaced(admin.clone(), &namespace)
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
        let store =
            proxyfleet_kube::credential_secrets::CredentialSecrets::new(user.clone(), &namespace);
        let at = SecretKeyRef { namespace: None, name: "pve-token".into(), key: "token".into() };
        assert_eq!(store.read(&at).await.unwrap(), b"t", "reading a credential Secret is allowed");
    }

    let controllers =
        Controllers::start(&user, &namespace, PROVIDERS, Policy::default(), true).await;
    let proxies: Api<Proxy> = Api::namespaced(admin.clone(), &namespace);
    proxies.create(&PostParams::default(), &proxy("a", "lab")).await.unwrap();
    let ready = wait_for(Duration::from_secs(30), || async {
        let current = proxies.get("a").await.ok()?;
        (condition_reason(&current, "Ready").as_deref() == Some("True/Ready")).then_some(())
    })
    .await;
    assert!(ready.is_some(), "status and finalizer writes are allowed");
    // A pool's writes, with only the verbs the ClusterRole keeps: members
    // made (with the owner reference) and deleted, the pool's status.
    let pools: Api<ProxyPool> = Api::namespaced(admin.clone(), &namespace);
    pools.create(&PostParams::default(), &proxyfleet_tests::kube_pool(1)).await.unwrap();
    let pool_at = |count: u32| {
        let pools = pools.clone();
        async move {
            wait_for(Duration::from_secs(30), || async {
                let status = pools.get("crawl").await.ok()?.status?;
                (status.ready_replicas == count && status.replicas == count).then_some(())
            })
            .await
        }
    };
    assert!(pool_at(1).await.is_some(), "members and the pool's status are allowed");
    let scale = serde_json::json!({ "spec": { "replicas": 0 } });
    pools.patch_scale("crawl", &PatchParams::default(), &Patch::Merge(&scale)).await.unwrap();
    assert!(pool_at(0).await.is_some(), "deleting a member is allowed");
    let events: Api<Event> = Api::namespaced(admin.clone(), &namespace);
    let recorded = wait_for(Duration::from_secs(10), || async {
        let list = events.list(&Default::default()).await.ok()?;
        (!list.items.is_empty()).then_some(())
    })
    .await;
    assert!(recorded.is_some(), "Events are allowed");
    assert_eq!(
        controllers.kv.list("lab", "endpoint/").await.unwrap().len(),
        1,
        "the ConfigMap store is allowed"
    );
    let following = wait_for(Duration::from_secs(10), || async {
        controllers.kv.follows_watch().then_some(())
    })
    .await;
    assert!(following.is_some(), "the Role allows listing and watching the store's ConfigMaps");
    let metrics = proxyfleet_metrics::Metrics::new();
    let failures = proxyfleet_kube::operate::check_providers(
        &user,
        controllers.registry.as_ref(),
        Duration::from_secs(5),
        &metrics,
    )
    .await;
    assert!(failures.is_empty(), "{failures:?}");
    // The file's entries shown as ClusterProxyProviders, as this user: an
    // entry's view applied (created), checked, and deleted once the entry
    // leaves the file. (An installation of its own, with a name of this
    // run's: views are cluster-scoped.)
    let extra = format!("extra-{namespace}");
    let plugins = tempfile::tempdir().unwrap();
    std::fs::copy(plugin("static"), plugins.path().join("static.wasm")).unwrap();
    let with_extra = format!(
        "providers:\n  - {{ name: {extra}, plugin: static, config: {{ endpoints: ['192.0.2.9:3128'] }} }}\n"
    );
    let own = Arc::new(
        Registry::load(
            &crate::views::runtime(),
            &ProvidersConfig::parse(&with_extra).unwrap(),
            plugins.path(),
            Arc::new(proxyfleet_core::kv::MemoryKv::new()),
        )
        .await
        .unwrap(),
    );
    let mut views = proxyfleet_kube::file_providers::FileViews::new(user.clone());
    let shown = views.pass(own.as_ref()).await.expect("showing entries is allowed");
    assert_eq!(shown.applied, std::slice::from_ref(&extra));
    let failures = proxyfleet_kube::operate::check_providers(
        &user,
        own.as_ref(),
        Duration::from_secs(5),
        &metrics,
    )
    .await;
    assert!(
        failures.is_empty(),
        "publishing checks on ClusterProxyProviders is allowed: {failures:?}"
    );
    let providers_api = Api::<ClusterProxyProvider>::all(admin.clone());
    let checked = providers_api.get(&extra).await.unwrap().status.unwrap_or_default();
    assert!(checked.conditions.iter().any(|c| c.type_ == "Checked"), "{checked:?}");
    own.reconfigure(&ProvidersConfig::parse("providers: []\n").unwrap()).await;
    let shown = views.pass(own.as_ref()).await.unwrap();
    assert_eq!(shown.deleted, std::slice::from_ref(&extra));
    assert!(
        providers_api.get_opt(&extra).await.unwrap().is_none(),
        "deleting a removed entry's view is allowed"
    );
    // ClusterProxyProviders, followed and kept as this user: watched,
    // finalized, their status written, and their deletion let go.
    {
        use proxyfleet_kube::cluster_providers::{self, ProviderContext};
        let follow = tokio::spawn(cluster_providers::follow(
            user.clone(),
            controllers.registry.clone() as _,
        ));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let context = ProviderContext::new(
            user.clone(),
            controllers.registry.clone() as _,
            Some(namespace.clone()),
            None,
        );
        let leader = tokio::spawn(cluster_providers::run(context, async move {
            let _ = stopped.await;
        }));
        let declared = format!("declared-{namespace}");
        let object: ClusterProxyProvider = serde_json::from_value(serde_json::json!({
            "apiVersion": "proxyfleet.io/v1alpha1",
            "kind": "ClusterProxyProvider",
            "metadata": {
                "name": declared,
                "labels": {
                    proxyfleet_kube::crd::INSTALLATION_LABEL:
                        controllers.registry.installation().as_str(),
                },
            },
            "spec": { "plugin": "static", "config": { "endpoints": ["192.0.2.20:3128"] } },
        }))
        .unwrap();
        let cluster_api = Api::<ClusterProxyProvider>::all(admin.clone());
        cluster_api.create(&PostParams::default(), &object).await.unwrap();
        let ready = wait_for(Duration::from_secs(30), || async {
            let status = cluster_api.get(&declared).await.ok()?.status?;
            proxyfleet_kube::crd::Condition::is_true(&status.conditions, "Ready").then_some(())
        })
        .await;
        assert!(ready.is_some(), "following and keeping ClusterProxyProviders is allowed");
        cluster_api.delete(&declared, &DeleteParams::default()).await.unwrap();
        let released = wait_for(Duration::from_secs(30), || async {
            cluster_api.get_opt(&declared).await.ok()?.is_none().then_some(())
        })
        .await;
        assert!(released.is_some(), "removing the finalizer is allowed");
        let _ = stop.send(());
        let _ = leader.await;
        follow.abort();
    }
    proxies.delete("a", &DeleteParams::default()).await.unwrap();
    let gone = wait_for(Duration::from_secs(30), || async {
        proxies.get_opt("a").await.ok()?.is_none().then_some(())
    })
    .await;
    assert!(gone.is_some());
    controllers.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unusable_user_data_secret_is_a_condition_naming_the_field() {
    use k8s_openapi::api::core::v1::Secret;
    let client = kube_admin_client().await;
    kube_install_crds(&client).await;
    let namespace = kube_test_namespace(&client, "pf-userdata").await;
    let controllers =
        Controllers::start(&client, &namespace, PROVIDERS, Policy::default(), false).await;
    // A Secret without the opt-in label must not be read.
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "cloud-init" },
        "stringData": { "user-data": "#cloud-config\n" },
    }))
    .unwrap();
    Api::<Secret>::namespaced(client.clone(), &namespace)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let proxies: Api<Proxy> = Api::namespaced(client.clone(), &namespace);
    let manifest: Proxy = serde_json::from_value(serde_json::json!({
        "apiVersion": "proxyfleet.io/v1alpha1",
        "kind": "Proxy",
        "metadata": { "name": "a" },
        "spec": { "provider": "lab", "userDataSecretRef": { "name": "cloud-init" } },
    }))
    .unwrap();
    proxies.create(&PostParams::default(), &manifest).await.unwrap();
    let message = wait_for(Duration::from_secs(30), || async {
        let current = proxies.get("a").await.ok()?;
        let status = current.status?;
        let condition = status.conditions.into_iter().find(|c| c.type_ == "Provisioned")?;
        (condition.reason == "InvalidSpec").then_some(condition.message.unwrap_or_default())
    })
    .await
    .expect("the Proxy reports the unusable Secret");
    assert!(
        message.contains("spec.userDataSecretRef") && message.contains("proxyfleet.io/user-data"),
        "{message}"
    );
    assert!(controllers.kv.list("lab", "").await.unwrap().is_empty(), "no provider call was made");

    // Labelling the Secret fixes it.
    let patch =
        serde_json::json!({ "metadata": { "labels": { "proxyfleet.io/user-data": "true" } } });
    Api::<Secret>::namespaced(client.clone(), &namespace)
        .patch("cloud-init", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    // A spec touch wakes the Proxy at once instead of at the next retry.
    let touch = serde_json::json!({ "spec": { "labels": { "touched": "yes" } } });
    proxies.patch("a", &PatchParams::default(), &Patch::Merge(&touch)).await.unwrap();
    let ready = wait_for(Duration::from_secs(30), || async {
        let current = proxies.get("a").await.ok()?;
        (condition_reason(&current, "Ready").as_deref() == Some("True/Ready")).then_some(())
    })
    .await;
    assert!(ready.is_some());
    controllers.stop().await;
}

#[tokio::test]
async fn provider_checks_are_published_per_entry() {
    let client = kube_admin_client().await;
    kube_install_crds(&client).await;
    let namespace = kube_test_namespace(&client, "pf-checks").await;
    let kv = Arc::new(ConfigMapKv::new(client.clone(), &namespace));
    provider_checks_are_published_per_entry_on(&client, &namespace, kv).await;
}

/// The entries' checks as the conditions of their ClusterProxyProviders
/// (the views of the file's entries, named after `namespace` to be this
/// run's) and as metrics.
pub(crate) async fn provider_checks_are_published_per_entry_on(
    client: &kube::Client,
    namespace: &str,
    kv: Arc<dyn KvStore>,
) {
    use crate::views::{Views, condition};
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(plugin("static"), dir.path().join("static.wasm")).unwrap();
    // Entry names are cluster-wide objects: make them unique to this run.
    let (good, empty, missing) =
        (format!("{namespace}-good"), format!("{namespace}-empty"), format!("{namespace}-missing"));
    let providers = format!(
        "providers:\n  - {{ name: {good}, plugin: static, config: {{ endpoints: ['192.0.2.1:3128'] }}, proxyAddresses: ['192.0.2.0/24'] }}\n  - {{ name: {empty}, plugin: static, config: {{ endpoints: [] }} }}\n  - {{ name: {missing}, plugin: nowhere }}\n"
    );
    let runtime = crate::views::runtime();
    let registry = Arc::new(
        Registry::load(&runtime, &ProvidersConfig::parse(&providers).unwrap(), dir.path(), kv)
            .await
            .unwrap(),
    );
    let mut views = Views::new(client, registry.clone());
    assert_eq!(views.show(registry.as_ref()).await.applied.len(), 3);
    let metrics = proxyfleet_metrics::Metrics::new();
    let failures = proxyfleet_kube::operate::check_providers(
        client,
        registry.as_ref(),
        Duration::from_secs(5),
        &metrics,
    )
    .await;
    assert!(failures.is_empty(), "{failures:?}");
    let text = metrics.encode();
    assert!(text.contains(&format!("proxyfleet_provider_healthy{{entry=\"{good}\"}} 1")), "{text}");
    assert!(
        text.contains(&format!("proxyfleet_provider_healthy{{entry=\"{empty}\"}} 0")),
        "{text}"
    );

    let ok = views.status(&good).await;
    assert_eq!(condition(&ok, "Ready").0, "Ready=True/Serving");
    assert_eq!(condition(&ok, "Checked").0, "Checked=True/Passed");
    assert_eq!(ok.plugin.as_deref(), Some("static"));
    let unhealthy = views.status(&empty).await;
    assert_eq!(condition(&unhealthy, "Ready").0, "Ready=True/Serving");
    let (checked, findings) = condition(&unhealthy, "Checked");
    assert!(checked.starts_with("Checked=False/"), "{checked}: {findings}");
    let unavailable = views.status(&missing).await;
    let (ready, why) = condition(&unavailable, "Ready");
    assert_eq!(ready, "Ready=False/Refused");
    assert!(why.contains("nowhere.wasm"), "{why}");
    assert!(condition(&unavailable, "Checked").0.starts_with("Checked=False/"));
}
