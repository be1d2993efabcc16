//! Plugin revisions in Kubernetes mode against a real API server: a swap
//! and a refused candidate each publish an Event on the entry's
//! ClusterProxyProvider (the view of its providers-file entry), and its
//! status names the serving, previous and refused revisions.

use std::sync::Arc;

use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt as _;
use kube::api::{Api, ListParams};
use proxyfleet_core::kv::MemoryKv;
use proxyfleet_kube::crd::ClusterProxyProvider;
use proxyfleet_kube::operate::{RevisionAnnouncer, check_providers};
use proxyfleet_metrics::Metrics;
use proxyfleet_runtime::Registry;
use proxyfleet_runtime::config::ProvidersConfig;
use proxyfleet_tests::{kube_admin_client, kube_install_crds, plugin, replace_file};

use crate::views::{Views, condition};

async fn events_of(client: &kube::Client, entry: &str, reason: &str) -> Vec<String> {
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(entry)
                && e.reason.as_deref() == Some(reason)
        })
        .filter_map(|e| e.note)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swaps_and_refusals_show_as_events_and_on_the_provider_status() {
    let client = kube_admin_client().await;
    kube_install_crds(&client).await;
    // ClusterProxyProviders are cluster-scoped: a name of this run's own.
    let run = uuid_like();
    let entry = format!("swap-{run}");
    let plugins = tempfile::tempdir().unwrap();
    let file = plugins.path().join("answer.wasm");
    std::fs::copy(plugin("fixtures/answer-v1"), &file).unwrap();
    let providers = format!("providers:\n  - {{ name: {entry}, plugin: answer }}\n");
    let runtime = crate::views::runtime();
    let registry = Arc::new(
        Registry::load(
            &runtime,
            &ProvidersConfig::parse(&providers).unwrap(),
            plugins.path(),
            Arc::new(MemoryKv::new()),
        )
        .await
        .unwrap(),
    );
    let metrics = Metrics::new();
    let interval = std::time::Duration::from_secs(60);
    let mut announcer = RevisionAnnouncer::new(client.clone(), "tests".into());
    assert!(
        !announcer.announce(registry.as_ref(), &metrics).await,
        "the first call only takes note"
    );
    let mut views = Views::new(&client, registry.clone());
    assert_eq!(views.show(registry.as_ref()).await.applied, std::slice::from_ref(&entry));
    assert!(check_providers(&client, registry.as_ref(), interval, &metrics).await.is_empty());
    let status = views.status(&entry).await;
    assert_eq!(condition(&status, "Ready").0, "Ready=True/Serving");
    assert_eq!(condition(&status, "Checked").0, "Checked=True/Passed");
    assert_eq!(status.version.as_deref(), Some("1.0.0"));
    assert_eq!(status.previous, None);

    replace_file(&plugin("fixtures/answer-v2"), &file);
    registry.rescan().await;
    assert!(announcer.announce(registry.as_ref(), &metrics).await);
    let status = views.status(&entry).await;
    assert_eq!(status.version.as_deref(), Some("2.0.0"));
    assert_eq!(status.previous.as_ref().map(|p| p.version.as_str()), Some("1.0.0"));
    assert!(status.activated_at.is_some());
    let activated = events_of(&client, &entry, "PluginActivated").await;
    assert!(
        activated
            .iter()
            .any(|note| note.contains("answer 2.0.0") && note.contains("previous 1.0.0")),
        "{activated:?}"
    );

    replace_file(&plugin("fixtures/answer-wide"), &file);
    registry.rescan().await;
    assert!(announcer.announce(registry.as_ref(), &metrics).await);
    let status = views.status(&entry).await;
    assert_eq!(status.version.as_deref(), Some("2.0.0"), "the refused build does not serve");
    let refused = status.rejected.last().expect("the refusal is listed");
    assert_eq!(refused.kind, "capabilities");
    let rejected = events_of(&client, &entry, "PluginRejected").await;
    assert!(rejected.iter().any(|note| note.contains("capabilities")), "{rejected:?}");
    assert!(
        metrics
            .encode()
            .contains(&format!("proxyfleet_plugin_rejections_total{{entry=\"{entry}\"}} 1"))
    );
}

fn uuid_like() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{:x}{:x}", std::process::id(), nanos)
}

/// Entries changed while running (the providers file followed): a refused
/// config edit is an Event and the conditions of the entry's
/// ClusterProxyProvider (its previous config still serving), a new entry is
/// shown at the next pass, and a removed entry's view is deleted rather
/// than left saying it serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_changed_while_running_show_on_their_provider_objects() {
    let client = kube_admin_client().await;
    kube_install_crds(&client).await;
    let run = uuid_like();
    let (kept, added, removed) =
        (format!("kept-{run}"), format!("added-{run}"), format!("gone-{run}"));
    let plugins = tempfile::tempdir().unwrap();
    std::fs::copy(plugin("static"), plugins.path().join("static.wasm")).unwrap();
    let entry = |name: &str, endpoints: &str| {
        format!("  - {{ name: {name}, plugin: static, config: {{ endpoints: [{endpoints}] }} }}\n")
    };
    let providers = |entries: &[String]| format!("providers:\n{}", entries.concat());
    let first = providers(&[entry(&kept, "'10.0.0.1:3128'"), entry(&removed, "'10.0.0.2:3128'")]);
    let runtime = crate::views::runtime();
    let registry = Arc::new(
        Registry::load(
            &runtime,
            &ProvidersConfig::parse(&first).unwrap(),
            plugins.path(),
            Arc::new(MemoryKv::new()),
        )
        .await
        .unwrap(),
    );
    let metrics = Metrics::new();
    let interval = std::time::Duration::from_secs(60);
    let mut announcer = RevisionAnnouncer::new(client.clone(), "tests".into());
    assert!(!announcer.announce(registry.as_ref(), &metrics).await);
    let mut views = Views::new(&client, registry.clone());
    let mut shown = views.show(registry.as_ref()).await.applied;
    shown.sort();
    assert_eq!(shown, [removed.clone(), kept.clone()], "in name order");
    assert!(check_providers(&client, registry.as_ref(), interval, &metrics).await.is_empty());

    // The static plugin refuses an endpoint named twice.
    let refused = providers(&[
        entry(&kept, "'10.0.0.1:3128', '10.0.0.1:3128'"),
        entry(&removed, "'10.0.0.2:3128'"),
    ]);
    registry.reconfigure(&ProvidersConfig::parse(&refused).unwrap()).await;
    assert!(announcer.announce(registry.as_ref(), &metrics).await, "a refused edit is news");
    assert_eq!(
        views.show(registry.as_ref()).await.applied,
        std::slice::from_ref(&kept),
        "the view follows"
    );
    let status = views.status(&kept).await;
    let (ready, why) = condition(&status, "Ready");
    assert_eq!(ready, "Ready=False/Refused");
    assert!(why.contains("serves its previous spec") && why.contains("endpoints[1]"), "{why}");
    assert_eq!(condition(&status, "PluginLoaded").0, "PluginLoaded=True/Loaded");
    let events = events_of(&client, &kept, "ConfigRefused").await;
    assert!(events.iter().any(|note| note.contains("keeps serving")), "{events:?}");

    let next = providers(&[entry(&kept, "'10.0.0.1:3128'"), entry(&added, "'10.0.0.3:3128'")]);
    registry.reconfigure(&ProvidersConfig::parse(&next).unwrap()).await;
    assert!(announcer.announce(registry.as_ref(), &metrics).await, "added and removed are news");
    let shown = views.show(registry.as_ref()).await;
    assert_eq!(
        (shown.applied, shown.deleted),
        (vec![added.clone(), kept.clone()], vec![removed.clone()])
    );
    assert!(check_providers(&client, registry.as_ref(), interval, &metrics).await.is_empty());
    let providers_api: Api<ClusterProxyProvider> = Api::all(client.clone());
    assert!(providers_api.get_opt(&removed).await.unwrap().is_none(), "the removed one is gone");
    assert_eq!(condition(&views.status(&added).await, "Ready").0, "Ready=True/Serving");
    assert_eq!(condition(&views.status(&kept).await, "Ready").0, "Ready=True/Serving");
    // A platform team's resource of a file entry's name is not written
    // over, and the file's entry is not shown while it stands.
    let taken = serde_json::json!({
        "apiVersion": "proxyfleet.io/v1alpha1",
        "kind": "ClusterProxyProvider",
        "metadata": {
            "name": format!("taken-{run}"),
            "labels": { proxyfleet_kube::crd::INSTALLATION_LABEL: registry.installation().as_str() },
        },
        "spec": { "plugin": "static", "config": { "endpoints": ["10.0.0.9:3128"] } },
    });
    let taken: ClusterProxyProvider = serde_json::from_value(taken).unwrap();
    providers_api.create(&Default::default(), &taken).await.unwrap();
    let with_taken = providers(&[
        entry(&kept, "'10.0.0.1:3128'"),
        entry(&added, "'10.0.0.3:3128'"),
        entry(&format!("taken-{run}"), "'10.0.0.4:3128'"),
    ]);
    registry.reconfigure(&ProvidersConfig::parse(&with_taken).unwrap()).await;
    let shown = views.show(registry.as_ref()).await;
    assert_eq!(shown.taken, [format!("taken-{run}")]);
    let untouched = providers_api.get(&format!("taken-{run}")).await.unwrap();
    assert_eq!(untouched.spec.config, taken.spec.config, "the team's spec stands");
    assert!(untouched.labels().get(proxyfleet_kube::file_providers::FILE_LABEL).is_none());
    providers_api.delete(&format!("taken-{run}"), &Default::default()).await.unwrap();
}
