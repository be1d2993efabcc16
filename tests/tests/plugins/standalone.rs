//! Standalone mode end to end: manifests in, the real static plugin, the
//! embedded store, restarts.

use std::path::Path;
use std::time::Duration;

use proxyfleet_core::kv::KvStore as _;
use proxyfleet_core::proxy::{ConditionType, Phase};
use proxyfleet_runtime::config::ProvidersConfig;
use proxyfleet_standalone::store::Store;
use proxyfleet_standalone::{Settings, Standalone};
use proxyfleet_tests::plugin;

const PROVIDERS: &str = "providers:\n  - name: local\n    plugin: static\n    config: { endpoints: ['127.0.0.1:18001', '127.0.0.1:18002'] }\n    proxyAddresses: ['127.0.0.0/8']\n";

fn manifest(name: &str, provider: &str, port: u16) -> String {
    format!(
        "apiVersion: proxyfleet.io/v1alpha1\nkind: Proxy\nmetadata: {{ name: {name} }}\nspec: {{ provider: {provider}, port: {port} }}\n---\n"
    )
}

struct Site {
    dir: tempfile::TempDir,
}

impl Site {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("plugins")).unwrap();
        std::fs::copy(plugin("static"), dir.path().join("plugins/static.wasm")).unwrap();
        std::fs::create_dir(dir.path().join("proxies")).unwrap();
        Self { dir }
    }

    fn write(&self, manifests: &str) {
        std::fs::write(self.dir.path().join("proxies/proxies.yaml"), manifests).unwrap();
    }

    fn path(&self, rest: &str) -> std::path::PathBuf {
        self.dir.path().join(rest)
    }

    async fn open(&self) -> Standalone {
        self.open_with(|_| {}).await
    }

    async fn open_with(&self, adjust: impl FnOnce(&mut Settings)) -> Standalone {
        self.open_on(PROVIDERS, adjust).await
    }

    async fn open_on(&self, providers: &str, adjust: impl FnOnce(&mut Settings)) -> Standalone {
        let mut settings = Settings::new(self.path("proxies"));
        settings.gc_min_age = Duration::ZERO;
        adjust(&mut settings);
        let providers = ProvidersConfig::parse(providers).unwrap();
        proxyfleet_tests::standalone::open(
            settings,
            &self.path("state/state.redb"),
            &providers,
            &self.path("plugins"),
        )
        .await
        .0
    }
}

async fn assignments(state: &Path) -> Vec<String> {
    let store = Store::open(state).unwrap();
    store.list("local", "endpoint/").await.unwrap().into_iter().map(|e| e.key).collect()
}

#[tokio::test]
async fn proxies_converge_on_the_static_plugin_and_go_when_removed() {
    let site = Site::new();
    site.write(&(manifest("a", "local", 3128) + &manifest("b", "local", 3128)));
    let standalone = site.open().await;
    let records = standalone.run_until_settled(Duration::from_secs(20)).await.unwrap();
    assert_eq!(records.len(), 2);
    let mut endpoints = Vec::new();
    for record in &records {
        assert_eq!(record.status.phase, Phase::Running, "{record:?}");
        assert!(record.finalizer);
        assert_eq!(record.status.plugin.as_deref(), Some("static"));
        endpoints.push((record.status.ip.clone().unwrap(), record.status.port.unwrap()));
    }
    endpoints.sort();
    assert_eq!(endpoints, [("127.0.0.1".to_owned(), 18001), ("127.0.0.1".to_owned(), 18002)]);

    site.write(&manifest("a", "local", 3128));
    let records = standalone.run_until_settled(Duration::from_secs(20)).await.unwrap();
    assert_eq!(records.iter().map(|r| r.meta.name.as_str()).collect::<Vec<_>>(), ["a"]);
    drop(standalone);
    assert_eq!(
        assignments(&site.path("state/state.redb")).await.len(),
        1,
        "b's endpoint was released"
    );
}

#[tokio::test]
async fn a_restart_after_an_unrecorded_create_adopts_instead_of_duplicating() {
    let site = Site::new();
    site.write(&manifest("a", "local", 3128));
    let (uid, endpoint) = {
        let standalone = site.open().await;
        standalone.sync_desired().unwrap();
        let record = standalone.records().unwrap().remove(0);
        assert!(record.finalizer, "a new record has the finalizer from its first write");
        assert!(record.status.provider_id.is_none());
        // The create reaches the backend, then the process dies before the
        // status is written.
        let provider = standalone.source().provider("local").unwrap();
        let instance = provider.create(&record.desired.to_spec(&record.meta)).await.unwrap();
        (record.meta.uid, instance.provider_id)
    };
    let standalone = site.open().await;
    let records = standalone.run_until_settled(Duration::from_secs(20)).await.unwrap();
    assert_eq!(records[0].meta.uid, uid, "the UID survives the restart");
    assert_eq!(records[0].status.provider_id.as_deref(), Some(endpoint.as_str()));
    drop(standalone);
    assert_eq!(assignments(&site.path("state/state.redb")).await.len(), 1, "no second instance");
}

#[tokio::test]
async fn a_spec_change_replaces_and_an_unknown_provider_is_reported() {
    let site = Site::new();
    site.write(&(manifest("a", "local", 3128) + &manifest("lost", "nowhere", 3128)));
    let standalone = site.open().await;
    let records = standalone.run_until_settled(Duration::from_secs(2)).await.unwrap();
    let lost = records.iter().find(|r| r.meta.name == "lost").unwrap();
    let provisioned = lost.status.condition(ConditionType::Provisioned).unwrap();
    assert_eq!(provisioned.reason, "ProviderUnavailable");
    assert!(provisioned.message.contains("nowhere"), "{}", provisioned.message);

    let before = records.iter().find(|r| r.meta.name == "a").unwrap().clone();
    site.write(&(manifest("a", "local", 8080) + &manifest("lost", "nowhere", 3128)));
    let records = standalone.run_until_settled(Duration::from_secs(2)).await.unwrap();
    let after = records.iter().find(|r| r.meta.name == "a").unwrap();
    assert_eq!(after.meta.generation, before.meta.generation + 1);
    assert_eq!(after.status.observed_generation, after.meta.generation);
    assert_ne!(after.status.spec_hash, before.status.spec_hash);
    assert_eq!(after.status.phase, Phase::Running);
}

#[tokio::test]
async fn orphans_are_collected_and_checks_are_published() {
    let site = Site::new();
    site.write(&manifest("a", "local", 3128));
    let standalone = site.open().await;
    standalone.run_until_settled(Duration::from_secs(20)).await.unwrap();
    // An assignment no Proxy of this installation owns.
    let provider = standalone.source().provider("local").unwrap();
    let mut orphan = standalone.records().unwrap()[0].clone();
    orphan.meta.uid = "uid-of-a-proxy-long-gone".into();
    provider.create(&orphan.desired.to_spec(&orphan.meta)).await.unwrap();
    assert_eq!(provider.list().await.unwrap().len(), 2);

    let reports = standalone.collect_garbage().await;
    let (entry, report) = &reports[0];
    assert_eq!(entry, "local");
    assert_eq!(report.as_ref().unwrap().deleted.len(), 1);
    let left = provider.list().await.unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].mark.as_ref().unwrap().uid, standalone.records().unwrap()[0].meta.uid);

    let text = standalone.metrics().encode();
    for line in [
        "proxyfleet_gc_found_total{entry=\"local\"} 2",
        "proxyfleet_gc_deleted_total{entry=\"local\"} 1",
    ] {
        assert!(text.contains(line), "{line} missing from:\n{text}");
    }
    assert!(!text.contains("proxyfleet_reconciles_total{outcome=\"ok\"} 0\n"), "{text}");

    let checks = standalone.check_providers().await;
    assert_eq!(checks.len(), 1);
    assert!(checks[0].health.healthy);
    assert!(checks[0].last_success.is_some());
    assert_eq!(checks[0].plugin.as_deref(), Some("static 0.1.0"));
    assert!(
        standalone.metrics().encode().contains("proxyfleet_provider_healthy{entry=\"local\"} 1")
    );
}

fn pool_manifest(replicas: u32) -> String {
    format!(
        "apiVersion: proxyfleet.io/v1alpha1\nkind: ProxyPool\nmetadata: {{ name: crawl }}\n\
         spec: {{ replicas: {replicas}, template: {{ spec: {{ provider: local }} }} }}\n"
    )
}

#[tokio::test]
async fn a_pool_scales_its_members_up_and_down() {
    let site = Site::new();
    site.write(&pool_manifest(2));
    let standalone = site.open().await;
    let records = standalone.run_until_settled(Duration::from_secs(20)).await.unwrap();
    assert_eq!(records.len(), 2);
    for record in &records {
        assert_eq!(record.pool.as_deref(), Some("default/crawl"));
        assert!(record.meta.name.starts_with("crawl-"), "{}", record.meta.name);
        assert_eq!(record.status.phase, Phase::Running);
    }

    site.write(&pool_manifest(1));
    let records = standalone.run_until_settled(Duration::from_secs(20)).await.unwrap();
    assert_eq!(records.len(), 1, "scaled down to one member");
    let survivor = records[0].meta.uid.clone();

    site.write(&pool_manifest(2));
    let records = standalone.run_until_settled(Duration::from_secs(20)).await.unwrap();
    assert_eq!(records.len(), 2);
    assert!(records.iter().any(|r| r.meta.uid == survivor), "scaling up keeps the existing member");
    drop(standalone);
    assert_eq!(assignments(&site.path("state/state.redb")).await.len(), 2);
}

#[tokio::test]
async fn regression_a_settled_proxys_resync_writes_nothing() {
    let site = Site::new();
    site.write(&manifest("a", "local", 3128));
    // Every pass is due again at once, as resyncs make them.
    let standalone = site.open_with(|settings| settings.policy.resync = Duration::ZERO).await;
    let records = standalone.run_until_settled(Duration::from_secs(20)).await.unwrap();
    assert_eq!(records[0].status.phase, Phase::Running, "{records:?}");
    let writes = standalone.record_writes();
    for _ in 0..3 {
        standalone.sync_desired().unwrap();
        assert_eq!(standalone.reconcile_due().await, 1, "the resync pass runs");
    }
    assert_eq!(standalone.record_writes(), writes, "passes that changed nothing wrote nothing");
    assert_eq!(standalone.records().unwrap(), records);
}

/// Regression: every new Proxy was its own commit, so a first start with
/// 10,000 Proxies spent about 14 s writing records before the first pass.
#[tokio::test]
async fn regression_new_proxies_are_written_in_one_commit_and_all_get_a_pass() {
    let site = Site::new();
    site.write(&(0..50).map(|i| manifest(&format!("p{i}"), "local", 3128)).collect::<String>());
    let standalone = site.open().await;
    let before = standalone.record_writes();
    standalone.sync_desired().unwrap();
    assert_eq!(standalone.record_writes() - before, 1, "one commit for 50 new Proxies");
    assert_eq!(standalone.records().unwrap().len(), 50);
    assert_eq!(standalone.reconcile_due().await, 50, "each is due at once");
}

#[tokio::test]
async fn regression_an_idle_sync_reads_no_record_yet_sees_every_manifest_edit() {
    let site = Site::new();
    site.write(&manifest("a", "local", 3128));
    let standalone = site.open().await;
    standalone.run_until_settled(Duration::from_secs(20)).await.unwrap();
    // File times tell only once they are older than the clock's tick.
    tokio::time::sleep(proxyfleet_standalone::desired::Stamp::RECENT + Duration::from_millis(100))
        .await;
    standalone.sync_desired().unwrap();
    standalone.publish_fleet().unwrap();
    let scans = standalone.record_scans();
    for _ in 0..3 {
        standalone.sync_desired().unwrap();
        standalone.publish_fleet().unwrap();
    }
    assert_eq!(standalone.record_scans(), scans, "an idle sync read every record again");

    // An edit in place of the same length, at once: still seen.
    site.write(&manifest("a", "local", 3129));
    standalone.sync_desired().unwrap();
    let records = standalone.records().unwrap();
    assert_eq!(records[0].desired.port, 3129, "{records:?}");
    assert_eq!(records[0].meta.generation, 2);
}

/// Regression: the idle sync stamped only the manifests, so a changed
/// credential (or user-data) file went unseen until a manifest changed.
/// Seen now, it replaces the instance (the provider configured the old one
/// with the old credential), and the hash in the status is a keyed one
/// that stays the same across a restart.
#[tokio::test]
async fn regression_a_changed_credential_file_is_seen_and_replaces_the_instance() {
    let logs = proxyfleet_tests::CapturedLogs::default();
    let _guard = logs.install();
    let site = Site::new();
    let credential = site.path("proxies/a.credential");
    std::fs::write(&credential, "crawler:first-pw\n").unwrap();
    site.write(
        "apiVersion: proxyfleet.io/v1alpha1\nkind: Proxy\nmetadata: { name: a }\n\
         spec: { provider: local, proxyAuthFile: a.credential }\n",
    );
    let standalone = site.open().await;
    let records = standalone.run_until_settled(Duration::from_secs(20)).await.unwrap();
    let first = records[0].status.clone();
    assert_eq!(first.phase, Phase::Running, "{records:?}");
    tokio::time::sleep(proxyfleet_standalone::desired::Stamp::RECENT + Duration::from_millis(100))
        .await;
    standalone.sync_desired().unwrap();
    let scans = standalone.record_scans();
    standalone.sync_desired().unwrap();
    assert_eq!(standalone.record_scans(), scans, "idle: nothing read");

    // Same length, at once.
    std::fs::write(&credential, "crawler:other-pw\n").unwrap();
    standalone.sync_desired().unwrap();
    let records = standalone.records().unwrap();
    let seen = records[0].desired.proxy_auth.as_ref().map(|c| c.password().to_owned());
    assert_eq!(seen.as_deref(), Some("other-pw"));
    let records = standalone.run_until_settled(Duration::from_secs(20)).await.unwrap();
    let second = records[0].status.clone();
    assert_eq!(second.phase, Phase::Running, "{records:?}");
    assert_ne!(second.spec_hash, first.spec_hash, "a new credential, a new hash");
    assert_ne!(second.provider_id, None);
    let logged = logs.text();
    assert!(logged.contains("reason=\"Replaced\""), "{logged}");
    assert!(!logged.contains("first-pw") && !logged.contains("other-pw"), "{logged}");
    drop(standalone);

    let reopened = site.open().await;
    let records = reopened.run_until_settled(Duration::from_secs(20)).await.unwrap();
    assert_eq!(records[0].status.spec_hash, second.spec_hash, "the key is kept");
    assert!(!records[0].status.spec_hash.clone().unwrap_or_default().is_empty());
}

#[tokio::test]
async fn a_pool_member_past_its_max_age_is_recycled_while_nothing_else_changes() {
    let site = Site::new();
    site.write(
        "apiVersion: proxyfleet.io/v1alpha1\nkind: ProxyPool\nmetadata: { name: crawl }\n\
         spec: { replicas: 1, maxAge: 3s, template: { spec: { provider: local } } }\n",
    );
    let standalone = site.open().await;
    let records = standalone.run_until_settled(Duration::from_secs(20)).await.unwrap();
    assert_eq!(records.len(), 1);
    let first = records[0].meta.uid.clone();
    // Only the clock moves: the skipped syncs must still wake for maxAge.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        standalone.sync_desired().unwrap();
        standalone.reconcile_due().await;
        let records = standalone.records().unwrap();
        let replaced = records.iter().all(|r| r.meta.uid != first)
            && records.iter().any(|r| r.status.phase == Phase::Running);
        if replaced {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never recycled: {records:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Regression: a pass wrote back the whole record it had read, so a
/// manifest edit synced while a create was in flight was undone (and
/// applied again on the next sync as another generation).
#[tokio::test]
async fn regression_a_manifest_edit_during_a_pass_is_kept() {
    use proxyfleet_gce_sim::{SimOptions, Simulator};

    let (ca, cert, key) = proxyfleet_tests::localhost_tls();
    let sim = Simulator::start(
        SimOptions {
            projects: vec!["lab".into()],
            zones: vec!["europe-west1-b".into()],
            // The create's operation outlasts the edit by far.
            operation_duration: Duration::from_secs(2),
            boot_duration: Duration::from_millis(100),
            ..SimOptions::default()
        },
        &cert,
        &key,
    )
    .await
    .unwrap();
    let site = Site::new();
    std::fs::copy(plugin("gcp"), site.path("plugins/gcp.wasm")).unwrap();
    std::fs::write(site.path("ca.pem"), ca).unwrap();
    let sa_key = sim.create_key("fleet@lab.iam.gserviceaccount.com").unwrap();
    std::fs::write(site.path("key.json"), &sa_key.json).unwrap();
    let providers = format!(
        "providers:\n{}",
        proxyfleet_tests::gcp::sim_entry(
            "cloud",
            &sim.endpoint(),
            "lab",
            &site.path("ca.pem"),
            &site.path("key.json")
        )
    );
    let labelled = |team: &str| {
        format!(
            "apiVersion: proxyfleet.io/v1alpha1\nkind: Proxy\nmetadata: {{ name: a }}\n\
             spec: {{ provider: cloud, image: debian-12, labels: {{ team: {team} }} }}\n"
        )
    };
    site.write(&labelled("blue"));
    let standalone = std::sync::Arc::new(site.open_on(&providers, |_| {}).await);
    standalone.sync_desired().unwrap();
    let pass = tokio::spawn({
        let standalone = std::sync::Arc::clone(&standalone);
        async move { standalone.reconcile_due().await }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !sim
        .requests()
        .iter()
        .any(|line| line.starts_with("POST ") && line.contains("/instances"))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "no insert: {:?} {:?} {:?}",
            sim.requests(),
            standalone.records(),
            standalone.check_providers().await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    site.write(&labelled("green"));
    standalone.sync_desired().unwrap();
    assert_eq!(pass.await.unwrap(), 1);
    let records = standalone.records().unwrap();
    assert_eq!(records[0].desired.labels["team"], "green", "the edit was undone: {records:?}");
    assert_eq!(records[0].meta.generation, 2);
    assert!(records[0].finalizer);
    assert_eq!(records[0].status.observed_generation, 1, "the pass saw the first generation");
    let records = standalone.run_until_settled(Duration::from_secs(30)).await.unwrap();
    assert_eq!(records[0].status.phase, Phase::Running, "{records:?}");
    assert_eq!(records[0].status.observed_generation, 2);
    assert_eq!(records[0].meta.generation, 2);
}
