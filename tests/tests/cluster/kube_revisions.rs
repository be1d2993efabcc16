//! Plugin revisions in Kubernetes mode against a real API server: a swap
//! and a refused candidate each publish an Event on the entry's
//! ProxyProvider, and its status names the serving, previous and refused
//! revisions.

use std::sync::Arc;

use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};
use proxyfleet_core::kv::MemoryKv;
use proxyfleet_kube::crd::ProxyProvider;
use proxyfleet_kube::operate::{RevisionAnnouncer, check_providers};
use proxyfleet_metrics::Metrics;
use proxyfleet_runtime::config::ProvidersConfig;
use proxyfleet_runtime::{Registry, Runtime, RuntimeOptions};
use proxyfleet_tests::{kube_admin_client, kube_install_crds, plugin, replace_file};

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
    // ProxyProviders are cluster-scoped: a name of this run's own.
    let entry = format!("swap-{}", &uuid_like());
    let plugins = tempfile::tempdir().unwrap();
    let file = plugins.path().join("answer.wasm");
    std::fs::copy(plugin("fixtures/answer-v1"), &file).unwrap();
    let providers = format!("providers:\n  - {{ name: {entry}, plugin: answer }}\n");
    let runtime = Runtime::new(RuntimeOptions::default()).unwrap();
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
    assert!(check_providers(&client, registry.as_ref(), interval, &metrics).await.is_empty());
    let providers_api: Api<ProxyProvider> = Api::all(client.clone());
    let status = providers_api.get(&entry).await.unwrap().status.unwrap();
    assert_eq!(status.version.as_deref(), Some("1.0.0"));
    assert_eq!(status.previous, None);

    replace_file(&plugin("fixtures/answer-v2"), &file);
    registry.rescan().await;
    assert!(announcer.announce(registry.as_ref(), &metrics).await);
    check_providers(&client, registry.as_ref(), interval, &metrics).await;
    let status = providers_api.get(&entry).await.unwrap().status.unwrap();
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
    check_providers(&client, registry.as_ref(), interval, &metrics).await;
    let status = providers_api.get(&entry).await.unwrap().status.unwrap();
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
/// config edit is an Event and an issue on the entry's ProxyProvider, a
/// new entry is published at once, and a removed entry's ProxyProvider is
/// deleted rather than left saying it serves.
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
    let runtime = Runtime::new(RuntimeOptions::default()).unwrap();
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
    assert!(check_providers(&client, registry.as_ref(), interval, &metrics).await.is_empty());
    let providers_api: Api<ProxyProvider> = Api::all(client.clone());
    assert!(providers_api.get_opt(&removed).await.unwrap().is_some());

    // The static plugin refuses an endpoint named twice.
    let refused = providers(&[
        entry(&kept, "'10.0.0.1:3128', '10.0.0.1:3128'"),
        entry(&removed, "'10.0.0.2:3128'"),
    ]);
    registry.reconfigure(&ProvidersConfig::parse(&refused).unwrap()).await;
    assert!(announcer.announce(registry.as_ref(), &metrics).await, "a refused edit is news");
    check_providers(&client, registry.as_ref(), interval, &metrics).await;
    let status = providers_api.get(&kept).await.unwrap().status.unwrap();
    assert!(status.available, "the entry keeps serving its config");
    let issue = status.issues.iter().find(|issue| issue.reason == "configRefused");
    assert!(
        issue.and_then(|i| i.message.as_deref()).is_some_and(|m| m.contains("endpoints[1]")),
        "{status:?}"
    );
    let events = events_of(&client, &kept, "ConfigRefused").await;
    assert!(events.iter().any(|note| note.contains("keeps serving")), "{events:?}");

    let next = providers(&[entry(&kept, "'10.0.0.1:3128'"), entry(&added, "'10.0.0.3:3128'")]);
    registry.reconfigure(&ProvidersConfig::parse(&next).unwrap()).await;
    assert!(announcer.announce(registry.as_ref(), &metrics).await, "added and removed are news");
    assert!(check_providers(&client, registry.as_ref(), interval, &metrics).await.is_empty());
    assert!(providers_api.get_opt(&removed).await.unwrap().is_none(), "the removed one is gone");
    assert!(providers_api.get(&added).await.unwrap().status.unwrap().available);
    let status = providers_api.get(&kept).await.unwrap().status.unwrap();
    assert!(status.issues.iter().all(|issue| issue.reason != "configRefused"), "{status:?}");
}
