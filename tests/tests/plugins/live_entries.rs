//! Provider entries that change while the host runs
//! (`Registry::reconfigure` and the providers-file follower): added,
//! edited, refused and removed without a restart, on the real static
//! plugin. An edit the plugin refuses leaves the entry serving what it had.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use proxyfleet_core::kv::MemoryKv;
use proxyfleet_core::proxy::Phase;
use proxyfleet_core::source::ProviderSource;
use proxyfleet_harness::SpecBuilder;
use proxyfleet_runtime::config::ProvidersConfig;
use proxyfleet_runtime::providers_watch::{ProvidersWatchOptions, follow_providers_file};
use proxyfleet_runtime::{EntryChange, EntryState, PluginLoad, Registry, Runtime, RuntimeOptions};
use proxyfleet_standalone::Settings;
use proxyfleet_tests::{plugin, wait_for};

/// How long a change may take to show on a loaded machine before the test
/// fails.
const PATIENCE: Duration = Duration::from_secs(30);

/// A providers file of static entries, each `(name, endpoints)`.
fn providers(entries: &[(&str, &str)]) -> String {
    let mut text = String::from("providers:\n");
    for (name, endpoints) in entries {
        text.push_str(&format!(
            "  - name: {name}\n    plugin: static\n    config: {{ endpoints: [{endpoints}] }}\n    proxyAddresses: ['127.0.0.0/8']\n"
        ));
    }
    text
}

fn parse(text: &str) -> ProvidersConfig {
    ProvidersConfig::parse(text).expect("valid providers file")
}

/// A plugin directory holding the static plugin.
fn plugin_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(plugin("static"), dir.path().join("static.wasm")).unwrap();
    dir
}

async fn load(dir: &Path, text: &str) -> Arc<Registry> {
    let runtime = Runtime::new(RuntimeOptions::default()).unwrap();
    Arc::new(Registry::load(&runtime, &parse(text), dir, Arc::new(MemoryKv::new())).await.unwrap())
}

/// The port of the endpoint `entry` hands a new Proxy named `name`.
async fn port_for(registry: &Registry, entry: &str, name: &str) -> u16 {
    let provider = registry.provider(entry).expect("the entry serves");
    let instance = provider.create(&SpecBuilder::new(name).build()).await.expect("create");
    instance.port.expect("a static endpoint has a port")
}

/// The endpoints of the config `entry` serves now.
fn served(registry: &Registry, entry: &str) -> serde_json::Value {
    match &registry.entries()[entry] {
        EntryState::Ready(provider) => provider.config().config["endpoints"].clone(),
        other => panic!("{entry} does not serve: {other:?}"),
    }
}

#[tokio::test]
async fn entries_are_added_edited_and_removed_without_a_restart() {
    let dir = plugin_dir();
    let registry = load(dir.path(), &providers(&[("a", "'127.0.0.1:18001'")])).await;
    assert_eq!(port_for(&registry, "a", "p1").await, 18001);

    let changes = registry
        .reconfigure(&parse(&providers(&[
            ("a", "'127.0.0.1:18001', '127.0.0.1:18002'"),
            ("b", "'127.0.0.1:18003'"),
        ])))
        .await;
    assert_eq!(
        changes.into_iter().collect::<Vec<_>>(),
        [("a".to_owned(), EntryChange::Updated), ("b".to_owned(), EntryChange::Added)]
    );
    assert_eq!(port_for(&registry, "a", "p2").await, 18002, "the edit serves");
    assert_eq!(port_for(&registry, "b", "p3").await, 18003, "the new entry serves");

    let changes = registry.reconfigure(&parse(&providers(&[("b", "'127.0.0.1:18003'")]))).await;
    assert_eq!(changes.into_iter().collect::<Vec<_>>(), [("a".to_owned(), EntryChange::Removed)]);
    let gone = registry.provider("a").err().expect("a removed entry serves nothing");
    assert!(gone.to_string().contains("no provider entry named \"a\""), "{gone}");
    assert!(registry.revisions_of("a").is_none());
    assert_eq!(registry.revisions().len(), 1);
    assert!(
        registry.reconfigure(&parse(&providers(&[("b", "'127.0.0.1:18003'")]))).await.is_empty(),
        "an unchanged configuration changes nothing"
    );

    // The standalone dispatcher asks for the bound on every pass.
    let limited =
        format!("{}    limits: {{ concurrency: 3 }}\n", providers(&[("b", "'127.0.0.1:18003'")]));
    assert_eq!(registry.reconfigure(&parse(&limited)).await.get("b"), Some(&EntryChange::Updated));
    assert_eq!(ProviderSource::concurrency(registry.as_ref(), "b"), Some(3));
}

#[tokio::test]
async fn an_edit_the_plugin_refuses_leaves_the_entry_serving_its_config() {
    let dir = plugin_dir();
    let registry = load(dir.path(), &providers(&[("a", "'127.0.0.1:18001'")])).await;
    let refused = providers(&[("a", "'127.0.0.1:18001', '127.0.0.1:18001'")]);

    let changes = registry.reconfigure(&parse(&refused)).await;
    let Some(EntryChange::Refused { reason, kept_serving: true }) = changes.get("a") else {
        panic!("the repeated endpoint is refused and the entry keeps serving: {changes:?}");
    };
    assert!(reason.contains("endpoints[1]"), "the reason names the field: {reason}");
    assert_eq!(port_for(&registry, "a", "p1").await, 18001, "the config before still serves");
    let revisions = registry.revisions_of("a").unwrap();
    assert_eq!(revisions.config_refused.as_deref(), Some(reason.as_str()));
    assert!(revisions.unavailable.is_none());
    assert!(
        registry.reconfigure(&parse(&refused)).await.is_empty(),
        "the same refused edit is not tried again"
    );

    let changes = registry.reconfigure(&parse(&providers(&[("a", "'127.0.0.1:18002'")]))).await;
    assert_eq!(changes.get("a"), Some(&EntryChange::Updated));
    assert_eq!(port_for(&registry, "a", "p2").await, 18002);
    assert_eq!(registry.revisions_of("a").unwrap().config_refused, None, "cleared once taken");

    // Going back to the serving config withdraws a refused edit too.
    registry.reconfigure(&parse(&refused)).await;
    assert!(registry.revisions_of("a").unwrap().config_refused.is_some());
    registry.reconfigure(&parse(&providers(&[("a", "'127.0.0.1:18002'")]))).await;
    assert_eq!(registry.revisions_of("a").unwrap().config_refused, None);
}

#[tokio::test]
async fn a_new_entry_that_cannot_serve_says_why_and_a_later_fix_serves() {
    let dir = plugin_dir();
    let registry = load(dir.path(), &providers(&[("a", "'127.0.0.1:18001'")])).await;
    let unknown =
        format!("{}  - name: b\n    plugin: nosuch\n", providers(&[("a", "'127.0.0.1:18001'")]));
    let changes = registry.reconfigure(&parse(&unknown)).await;
    let Some(EntryChange::Refused { reason, kept_serving: false }) = changes.get("b") else {
        panic!("an unknown plugin is refused: {changes:?}");
    };
    assert!(reason.contains("no nosuch.wasm in"), "{reason}");
    assert!(matches!(&registry.entries()["b"], EntryState::Failed(why) if why == reason));
    assert_eq!(port_for(&registry, "a", "p1").await, 18001, "the other entry is untouched");

    // The plugin file lands; the next edit of the entry takes it.
    std::fs::copy(plugin("static"), dir.path().join("nosuch.wasm")).unwrap();
    let fixed = format!(
        "{}  - name: b\n    plugin: nosuch\n    config: {{ endpoints: ['127.0.0.1:18009'] }}\n    proxyAddresses: ['127.0.0.0/8']\n",
        providers(&[("a", "'127.0.0.1:18001'")])
    );
    let changes = registry.reconfigure(&parse(&fixed)).await;
    assert_eq!(changes.get("b"), Some(&EntryChange::Updated));
    assert_eq!(port_for(&registry, "b", "p2").await, 18009);
}

#[tokio::test]
async fn a_plugin_no_entry_named_at_load_is_compiled_when_an_entry_names_it() {
    let dir = plugin_dir();
    std::fs::copy(plugin("static"), dir.path().join("second.wasm")).unwrap();
    let registry = load(dir.path(), &providers(&[("a", "'127.0.0.1:18001'")])).await;
    assert!(matches!(registry.plugins()["second"], PluginLoad::Unused));
    let text = format!(
        "{}  - name: b\n    plugin: second\n    config: {{ endpoints: ['127.0.0.1:18005'] }}\n    proxyAddresses: ['127.0.0.0/8']\n",
        providers(&[("a", "'127.0.0.1:18001'")])
    );
    assert_eq!(registry.reconfigure(&parse(&text)).await.get("b"), Some(&EntryChange::Added));
    assert!(matches!(registry.plugins()["second"], PluginLoad::Loaded(_)));
    assert_eq!(port_for(&registry, "b", "p1").await, 18005);

    // Once no entry names it, the compiled plugin is let go.
    registry.reconfigure(&parse(&providers(&[("a", "'127.0.0.1:18001'")]))).await;
    assert!(matches!(registry.plugins()["second"], PluginLoad::Unused));
}

#[tokio::test]
async fn the_providers_file_is_followed_and_a_broken_one_changes_nothing() {
    let dir = plugin_dir();
    let file = dir.path().join("providers.yaml");
    let first = providers(&[("a", "'127.0.0.1:18001'")]);
    std::fs::write(&file, &first).unwrap();
    let registry = load(dir.path(), &first).await;
    let _follow = follow_providers_file(
        Arc::clone(&registry),
        file.clone(),
        &parse(&first),
        ProvidersWatchOptions {
            interval: Duration::from_millis(50),
            retry_failed: Duration::from_secs(30),
            watchdog: None,
        },
    );

    // Written the way a mounted ConfigMap changes: a new file moved in.
    let replace = |text: &str| {
        let next = dir.path().join("providers.yaml.next");
        std::fs::write(&next, text).unwrap();
        std::fs::rename(&next, &file).unwrap();
    };
    replace(&providers(&[("a", "'127.0.0.1:18001'"), ("b", "'127.0.0.1:18002'")]));
    let added = wait_for(PATIENCE, || async { registry.provider("b").ok().map(drop) }).await;
    assert!(added.is_some(), "the added entry did not serve within {PATIENCE:?}");

    // Not YAML, then an unknown key: each refused whole, nothing changes.
    replace("providers: [");
    replace(&format!("{}    colour: blue\n", providers(&[("a", "'127.0.0.1:18003'")])));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(registry.provider("b").is_ok(), "a broken file removes nothing");
    assert_eq!(port_for(&registry, "a", "p1").await, 18001, "and edits nothing");

    replace(&providers(&[("a", "'127.0.0.1:18004'")]));
    let removed =
        wait_for(PATIENCE, || async { registry.provider("b").is_err().then_some(()) }).await;
    assert!(removed.is_some(), "the removed entry still served after {PATIENCE:?}");
    assert_eq!(port_for(&registry, "a", "p2").await, 18004);
}

/// End to end in standalone mode: a Proxy naming an entry that does not
/// exist yet runs once the entry is added, on the bound the new entry's
/// limits give.
#[tokio::test]
async fn a_proxy_waiting_for_its_entry_runs_once_the_entry_is_added() {
    let site = tempfile::tempdir().unwrap();
    let plugins = site.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    std::fs::copy(plugin("static"), plugins.join("static.wasm")).unwrap();
    std::fs::create_dir(site.path().join("proxies")).unwrap();
    std::fs::write(
        site.path().join("proxies/p.yaml"),
        "apiVersion: proxyfleet.io/v1alpha1\nkind: Proxy\nmetadata: { name: late }\nspec: { provider: later, port: 3128 }\n",
    )
    .unwrap();
    let first = providers(&[("local", "'127.0.0.1:18001'")]);
    let mut settings = Settings::new(site.path().join("proxies"));
    settings.policy.backoff_base = Duration::from_millis(100);
    let (standalone, registry) = proxyfleet_tests::standalone::open(
        settings,
        &site.path().join("state.redb"),
        &parse(&first),
        &plugins,
    )
    .await;
    let records = standalone.run_until_settled(Duration::from_secs(2)).await.unwrap();
    assert_ne!(records[0].status.phase, Phase::Running, "no entry named `later` yet");

    let changes = registry
        .reconfigure(&parse(&providers(&[
            ("local", "'127.0.0.1:18001'"),
            ("later", "'127.0.0.1:18007'"),
        ])))
        .await;
    assert_eq!(changes.get("later"), Some(&EntryChange::Added));
    let records = standalone.run_until_settled(PATIENCE).await.unwrap();
    assert_eq!(records[0].status.phase, Phase::Running, "{:?}", records[0]);
    assert_eq!(records[0].status.port, Some(18007));
}

/// Entries declared by resources (a ClusterProxyProvider's spec) beside
/// the file's: parsed as file entries are, and neither side takes or
/// removes the other's names.
#[tokio::test]
async fn resource_entries_and_the_file_never_take_each_others_names() {
    use proxyfleet_core::entry_resources::{Applied, ResourceEntries as _};
    let dir = plugin_dir();
    let file = providers(&[("a", "'127.0.0.1:18001'")]);
    let registry = load(dir.path(), &file).await;
    let spec = |port: u16| {
        serde_json::json!({
            "plugin": "static",
            "config": { "endpoints": [format!("127.0.0.1:{port}")] },
            "proxyAddresses": ["127.0.0.0/8"],
        })
    };

    assert_eq!(registry.apply("r", &spec(18002)).await, Applied::Serving);
    assert_eq!(port_for(&registry, "r", "p1").await, 18002);
    assert_eq!(registry.apply("r", &spec(18002)).await, Applied::Serving, "unchanged");
    assert_eq!(registry.apply("a", &spec(18003)).await, Applied::NameTaken);
    assert_eq!(port_for(&registry, "a", "p2").await, 18001, "the file's entry is untouched");

    let Applied::Invalid { message } =
        registry.apply("r", &serde_json::json!({ "plugin": "static", "colour": 1 })).await
    else {
        panic!("an unknown key is refused");
    };
    assert!(message.contains("colour"), "{message}");
    let Applied::Invalid { message } =
        registry.apply("r", &serde_json::json!({ "name": "x", "plugin": "static" })).await
    else {
        panic!("a name in the spec is refused");
    };
    assert!(message.contains("spec.name"), "{message}");
    let repeated = serde_json::json!({
        "plugin": "static",
        "config": { "endpoints": ["127.0.0.1:18002", "127.0.0.1:18002"] },
    });
    assert!(matches!(
        registry.apply("r", &repeated).await,
        Applied::Refused { kept_serving: true, .. }
    ));
    assert_eq!(
        served(&registry, "r"),
        serde_json::json!(["127.0.0.1:18002"]),
        "the spec before still serves"
    );

    // The file neither removes nor takes over a resource's entry.
    let changes = registry.reconfigure(&parse(&file)).await;
    assert!(changes.is_empty(), "{changes:?}");
    assert!(registry.provider("r").is_ok());
    let claiming = providers(&[("a", "'127.0.0.1:18001'"), ("r", "'127.0.0.1:18004'")]);
    let changes = registry.reconfigure(&parse(&claiming)).await;
    assert!(matches!(changes.get("r"), Some(EntryChange::Refused { kept_serving: false, .. })));
    assert_eq!(served(&registry, "r"), serde_json::json!(["127.0.0.1:18002"]));
    assert_eq!(registry.resource_names(), ["r"]);

    registry.remove("a").await;
    assert!(registry.provider("a").is_ok(), "removing a resource never removes a file entry");
    registry.remove("r").await;
    assert!(registry.provider("r").is_err());
    assert!(registry.resource_names().is_empty());
}

/// A resource stating a file entry exactly as the file writes it (what a
/// cluster shows of each file entry) comes to what that entry comes to,
/// including a refused edit of the file, and takes nothing over.
#[tokio::test]
async fn a_resource_showing_a_file_entry_comes_to_what_the_entry_comes_to() {
    use proxyfleet_core::entry_resources::{Applied, ResourceEntries as _};
    let dir = plugin_dir();
    let file = providers(&[("a", "'127.0.0.1:18011'"), ("b", "'127.0.0.1:18012'")]);
    let registry = load(dir.path(), &file).await;
    let written = registry.file_entries();
    assert_eq!(written.iter().map(|(name, _)| name.as_str()).collect::<Vec<_>>(), ["a", "b"]);
    let view_of_a = written[0].1.clone();
    assert_eq!(registry.apply("a", &view_of_a).await, Applied::Serving);
    assert!(registry.resource_names().is_empty(), "a view declares no entry");
    let mut other = view_of_a.clone();
    other["config"]["endpoints"] = serde_json::json!(["127.0.0.1:18013"]);
    assert_eq!(registry.apply("a", &other).await, Applied::NameTaken, "a different spec");

    // The file's edit of `a` is refused (an endpoint named twice): its new
    // view says so, and the config before still serves.
    let refused =
        providers(&[("a", "'127.0.0.1:18014', '127.0.0.1:18014'"), ("b", "'127.0.0.1:18012'")]);
    registry.reconfigure(&parse(&refused)).await;
    let view_of_a = registry.file_entries()[0].1.clone();
    let Applied::Refused { reason, kept_serving: true } = registry.apply("a", &view_of_a).await
    else {
        panic!("the refused edit shows on its view");
    };
    assert!(reason.contains("endpoints[1]"), "{reason}");
    assert_eq!(served(&registry, "a"), serde_json::json!(["127.0.0.1:18011"]));

    // Removing the view removes nothing; an entry that left the file is
    // no longer written.
    registry.remove("a").await;
    assert!(registry.provider("a").is_ok());
    registry.reconfigure(&parse(&providers(&[("a", "'127.0.0.1:18011'")]))).await;
    assert_eq!(registry.file_entries().len(), 1);
}
