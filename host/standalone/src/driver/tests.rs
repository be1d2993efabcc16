//! The driver over core's fakes: manifests in a temporary folder, a real
//! state database, and a `StaticSource` of `FakeProvider`s, so each test
//! runs the whole pass (sync, reconcile, record, publish, collect, check)
//! with no plugin runtime.

use std::sync::Arc;
use std::time::Duration;

use proxyfleet_core::fake::{self, FakeProvider};
use proxyfleet_core::installation::InstallationId;
use proxyfleet_core::proxy::{ConditionType, Phase};
use proxyfleet_core::source::{EntryState, StaticSource};
use proxyfleet_core::{Instance, InstanceState, OwnershipMark};
use proxyfleet_fleet::action::{Action, ProxyRef};
use proxyfleet_fleet::api::{ModeStatus, Refusal};
use proxyfleet_metrics::Metrics;

use super::{Settings, Standalone};
use crate::error::Error;
use crate::state::StateDb;

fn manifest(name: &str, provider: &str) -> String {
    format!(
        "apiVersion: proxyfleet.io/v1alpha1\nkind: Proxy\nmetadata: {{ name: {name} }}\n\
         spec: {{ provider: {provider}, port: 3128 }}\n---\n"
    )
}

fn installation(id: &str) -> InstallationId {
    InstallationId::parse("installation", id).unwrap()
}

/// A temporary site: a manifest folder and a state database.
struct Site {
    dir: tempfile::TempDir,
}

impl Site {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("proxies")).unwrap();
        Self { dir }
    }

    fn write(&self, manifests: &str) {
        std::fs::write(self.dir.path().join("proxies/proxies.yaml"), manifests).unwrap();
    }

    /// The driver on `source`, with orphans collected at any age.
    async fn open(&self, source: StaticSource) -> Standalone {
        let mut settings = Settings::new(self.dir.path().join("proxies"));
        settings.gc_min_age = Duration::ZERO;
        let state = StateDb::open(
            &self.dir.path().join("state.redb"),
            Some(&installation(fake::INSTALLATION)),
        )
        .await
        .unwrap();
        Standalone::new(settings, state, Arc::new(source), Arc::new(Metrics::new())).unwrap()
    }
}

/// One entry, `fake`, served by `provider`.
fn serving(provider: &Arc<FakeProvider>) -> StaticSource {
    StaticSource::new(installation(fake::INSTALLATION))
        .with("fake", EntryState::Ready(Arc::clone(provider) as _))
}

/// A new Proxy's record is written with the finalizer on, so its first
/// pass creates: a pass of its own just to put the finalizer on cost every
/// new Proxy a commit and a dispatch (a third of a 1,000-Proxy start's
/// record writes).
#[tokio::test]
async fn regression_a_new_proxys_first_pass_creates_its_instance() {
    let site = Site::new();
    let provider = Arc::new(FakeProvider::new("fake"));
    site.write(&manifest("a", "fake"));
    let standalone = site.open(serving(&provider)).await;
    standalone.sync_desired().unwrap();
    let record = standalone.records().unwrap().remove(0);
    assert!(record.finalizer && record.status.provider_id.is_none(), "{record:?}");
    standalone.reconcile_due().await;
    assert_eq!(provider.instances().len(), 1, "the first pass made the instance");
    let record = standalone.records().unwrap().remove(0);
    assert!(record.status.provider_id.is_some(), "{record:?}");
}

/// Without pools, the records a converging fleet's passes write change
/// nothing a sync decides: it used to read every record again after any
/// write, every 2 s while 10,000 Proxies came up. A removed record still
/// counts: a Proxy put back while its old instance was being deleted gets
/// its record, and a new instance, once that deletion ends.
#[tokio::test]
async fn regression_passes_writing_records_make_no_sync_read_them_and_a_removal_does() {
    let site = Site::new();
    let provider = Arc::new(FakeProvider::new("fake"));
    site.write(&manifest("a", "fake"));
    let standalone = site.open(serving(&provider)).await;
    // File times tell only once they are older than the clock's tick.
    tokio::time::sleep(crate::desired::Stamp::RECENT + Duration::from_millis(100)).await;
    standalone.sync_desired().unwrap();
    let writes = standalone.record_writes();
    standalone.reconcile_due().await;
    assert!(standalone.record_writes() > writes, "the pass wrote the record");
    let scans = standalone.record_scans();
    standalone.sync_desired().unwrap();
    assert_eq!(standalone.record_scans(), scans, "the sync read the records again");

    site.write("");
    standalone.sync_desired().unwrap();
    site.write(&manifest("a", "fake"));
    standalone.sync_desired().unwrap();
    let old = standalone.records().unwrap().remove(0);
    assert!(old.deleting, "{old:?}");
    for _ in 0..100 {
        if standalone.records().unwrap().is_empty() {
            break;
        }
        standalone.reconcile_due().await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(provider.instances().is_empty(), "the old instance was deleted");
    let records = standalone.run_until_settled(Duration::from_secs(10)).await.unwrap();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_ne!(records[0].meta.uid, old.meta.uid, "a new incarnation");
    assert_eq!(records[0].status.phase, Phase::Running, "{records:?}");
    assert_eq!(provider.instances().len(), 1);
}

#[tokio::test]
async fn proxies_converge_on_the_source_and_go_when_removed() {
    let site = Site::new();
    let provider = Arc::new(FakeProvider::new("fake"));
    site.write(&(manifest("a", "fake") + &manifest("b", "fake")));
    let standalone = site.open(serving(&provider)).await;

    let records = standalone.run_until_settled(Duration::from_secs(10)).await.unwrap();
    assert_eq!(records.len(), 2);
    for record in &records {
        assert_eq!(record.status.phase, Phase::Running, "{record:?}");
        assert!(record.finalizer);
        assert!(record.status.ip.as_deref().is_some_and(|ip| ip.starts_with("198.51.100.")));
    }
    assert_eq!(provider.instances().len(), 2);

    site.write(&manifest("a", "fake"));
    let records = standalone.run_until_settled(Duration::from_secs(10)).await.unwrap();
    assert_eq!(records.iter().map(|r| r.meta.name.as_str()).collect::<Vec<_>>(), ["a"]);
    let left: Vec<_> = provider.instances().into_values().map(|i| i.name).collect();
    assert_eq!(left, ["a"], "b's instance was deleted with its record");
}

/// Also pins a cost: a publish after writes used to read every record
/// (10,000 decoded four times a second while a large fleet converged); it
/// reads the ones written.
#[tokio::test]
async fn running_proxies_are_published_to_the_catalog_and_withdrawn_when_deleted() {
    let site = Site::new();
    let provider = Arc::new(FakeProvider::new("fake"));
    site.write(&manifest("a", "fake"));
    let standalone = site.open(serving(&provider)).await;
    standalone.run_until_settled(Duration::from_secs(10)).await.unwrap();

    standalone.publish_fleet().unwrap();
    let targets = standalone.fleet().probe_targets();
    assert_eq!(targets.len(), 1, "{targets:?}");
    assert_eq!(targets[0].1.port, 3128);
    assert!(targets[0].1.ip.to_string().starts_with("198.51.100."));

    site.write("");
    standalone.run_until_settled(Duration::from_secs(10)).await.unwrap();
    let scans = standalone.record_scans();
    standalone.publish_fleet().unwrap();
    assert!(standalone.fleet().probe_targets().is_empty());
    assert!(standalone.fleet().list(&Default::default(), None).is_empty());
    assert_eq!(standalone.record_scans(), scans, "the publish read every record");
}

#[tokio::test]
async fn a_proxy_on_a_missing_entry_waits_and_names_the_entries_there_are() {
    let site = Site::new();
    let provider = Arc::new(FakeProvider::new("fake"));
    site.write(&manifest("lost", "nowhere"));
    let standalone = site.open(serving(&provider)).await;
    standalone.sync_desired().unwrap();
    standalone.reconcile_due().await;
    standalone.reconcile_due().await;

    let record = standalone.records().unwrap().remove(0);
    assert_ne!(record.status.phase, Phase::Running);
    let condition = record.status.condition(ConditionType::Provisioned).unwrap();
    assert!(condition.message.contains("\"nowhere\""), "{condition:?}");
    assert!(condition.message.contains("[fake]"), "{condition:?}");
    assert!(provider.calls().is_empty(), "no call reached another entry");
}

#[tokio::test]
async fn orphans_of_this_installation_are_collected_and_nothing_else() {
    let site = Site::new();
    let provider = Arc::new(FakeProvider::new("fake"));
    site.write(&manifest("a", "fake"));
    let standalone = site.open(serving(&provider)).await;
    standalone.run_until_settled(Duration::from_secs(10)).await.unwrap();
    let marked = |id: &str, installation: &str| Instance {
        provider_id: id.to_owned(),
        name: id.to_owned(),
        state: InstanceState::Running,
        addresses: Vec::new(),
        port: None,
        created_at: Some(1),
        mark: Some(OwnershipMark {
            installation: installation.to_owned(),
            uid: format!("uid-of-{id}"),
            namespace: "default".to_owned(),
            name: id.to_owned(),
            created_at: 1,
        }),
    };
    provider.insert(marked("orphan", fake::INSTALLATION));
    provider.insert(marked("theirs", "another-installation"));

    let reports = standalone.collect_garbage().await;
    assert_eq!(reports.len(), 1);
    let (entry, report) = &reports[0];
    assert_eq!(entry, "fake");
    report.as_ref().unwrap();
    let mut left: Vec<_> = provider.instances().into_values().map(|i| i.name).collect();
    left.sort();
    assert_eq!(left, ["a", "theirs"], "the orphan went; the Proxy's and the other's stayed");
}

#[tokio::test]
async fn provider_checks_publish_every_entry_and_keep_the_last_success() {
    let site = Site::new();
    let provider = Arc::new(FakeProvider::new("fake"));
    let source = serving(&provider)
        .with("broken", EntryState::Failed("plugin \"x\" failed to load".to_owned()));
    let standalone = site.open(source).await;

    let checks = standalone.check_providers().await;
    assert_eq!(checks.iter().map(|c| c.entry.as_str()).collect::<Vec<_>>(), ["broken", "fake"]);
    let broken = &checks[0];
    assert!(!broken.health.healthy);
    assert_eq!((broken.plugin.as_deref(), broken.last_success), (None, None));
    let fake = &checks[1];
    assert!(fake.health.healthy);
    assert_eq!(fake.plugin.as_deref(), Some("fake 1.0.0"));
    assert_eq!(fake.last_success, Some(fake.checked_at));
    assert_eq!(standalone.provider_checks(), checks);
}

#[tokio::test]
async fn the_state_api_reports_revisions_and_refuses_a_rollback_with_nothing_before() {
    let site = Site::new();
    let provider = Arc::new(FakeProvider::new("fake"));
    let standalone = site.open(serving(&provider)).await;

    let providers = standalone.providers();
    assert_eq!(providers["revisions"][0]["entry"], "fake");
    assert_eq!(providers["revisions"][0]["plugin"], "fake");
    assert!(matches!(standalone.rollback("fake"), Err(Refusal::Conflict(_))));
    assert!(matches!(standalone.rollback("nowhere"), Err(Refusal::NotFound(_))));
}

/// The console's "Replace instance": the record keeps the request across
/// manifest syncs (the files never carry it), the instance is replaced once,
/// and the action is in the state log after a restart.
#[tokio::test]
async fn an_operators_replacement_makes_one_new_instance_and_is_logged() {
    let site = Site::new();
    let provider = Arc::new(FakeProvider::new("fake"));
    site.write(&manifest("a", "fake"));
    let standalone = site.open(serving(&provider)).await;
    let records = standalone.run_until_settled(Duration::from_secs(10)).await.unwrap();
    let before = records[0].status.provider_id.clone().unwrap();
    let proxy =
        ProxyRef { id: records[0].meta.uid.clone(), namespace: "default".into(), name: "a".into() };

    standalone.replace(&proxy).await.unwrap();
    standalone.record(&Action::Replace { proxy: proxy.clone() }).await;
    // A manifest edit (a label) while the request is pending keeps it.
    site.write(&manifest("a", "fake").replace("port: 3128", "port: 3128, labels: { team: crawl }"));
    let records = standalone.run_until_settled(Duration::from_secs(10)).await.unwrap();
    let after = records[0].status.provider_id.clone().unwrap();
    assert_ne!(before, after, "a new instance");
    assert_eq!(records[0].status.phase, Phase::Running);
    assert!(records[0].desired.replace_token.is_some(), "kept across the sync");
    let names: Vec<_> = provider.instances().into_values().map(|i| i.provider_id).collect();
    assert_eq!(names, std::slice::from_ref(&after), "the old instance is gone");
    // Settled: another sync replaces nothing more.
    let records = standalone.run_until_settled(Duration::from_secs(10)).await.unwrap();
    assert_eq!(records[0].status.provider_id.as_deref(), Some(after.as_str()));

    let gone = ProxyRef { id: "another-uid".into(), ..proxy.clone() };
    assert!(matches!(standalone.replace(&gone).await, Err(Refusal::NotFound(_))));
    drop(standalone);
    let reopened = site.open(serving(&provider)).await;
    let activity = reopened.fleet().activity(Some(&proxy.id), 10);
    assert_eq!(activity.len(), 1, "{activity:?}");
    assert!(activity[0].what.contains("new instance"), "{activity:?}");
}

#[tokio::test]
async fn providers_built_for_another_installation_are_refused() {
    let site = Site::new();
    let state = StateDb::open(&site.dir.path().join("state.redb"), Some(&installation("ours")))
        .await
        .unwrap();
    let source = StaticSource::new(installation("theirs"));
    let err = Standalone::new(
        Settings::new(site.dir.path().join("proxies")),
        state,
        Arc::new(source),
        Arc::new(Metrics::new()),
    )
    .unwrap_err();
    assert!(
        matches!(&err, Error::InstallationMismatch { database, providers }
            if database.as_str() == "ours" && providers.as_str() == "theirs"),
        "{err}"
    );
}

#[tokio::test]
async fn the_run_loop_brings_proxies_up_and_lets_passes_end_at_shutdown() {
    let site = Site::new();
    let provider = Arc::new(FakeProvider::new("fake"));
    site.write(&(manifest("a", "fake") + &manifest("b", "fake")));
    let standalone = Arc::new(site.open(serving(&provider)).await);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(Arc::clone(&standalone).run(async {
        let _ = stopped.await;
    }));

    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let records = standalone.records().unwrap();
        if records.len() == 2 && records.iter().all(|r| r.status.phase == Phase::Running) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "not running: {records:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The loop publishes each turn: the catalog follows the records.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while standalone.fleet().probe_targets().len() < 2 {
        assert!(std::time::Instant::now() < deadline, "never published");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.send(()).unwrap();
    running.await.unwrap().unwrap();
    assert_eq!(provider.instances().len(), 2, "a shutdown deletes nothing");
}

/// Issue 47, item 3: a Proxy a provider's quota holds back showed
/// `phase: Provisioning` with no reason in `/v1/proxies`; the reason was
/// only in a log line.
#[tokio::test]
async fn issue_47_item_3_a_proxy_held_back_by_quota_says_so_in_the_discovery_view() {
    let site = Site::new();
    let provider = Arc::new(FakeProvider::new("fake"));
    provider.fail_next(
        fake::Op::Create,
        proxyfleet_core::ProviderError::quota_exceeded("CPUS quota 24 reached"),
    );
    site.write(&manifest("a", "fake"));
    let standalone = site.open(serving(&provider)).await;
    let records = standalone.run_until_settled(Duration::from_millis(500)).await.unwrap();
    assert_eq!(records[0].status.phase, Phase::Provisioning);
    standalone.publish_fleet().unwrap();
    let view = standalone.fleet().get(&records[0].meta.uid).unwrap();
    let shown = serde_json::to_value(&view).unwrap();
    assert_eq!(shown["phase"], "Provisioning", "{shown}");
    let reason = shown["phaseReason"].as_str().unwrap_or_default();
    assert!(reason.starts_with("QuotaExceeded: "), "{shown}");
    assert!(reason.ends_with("CPUS quota 24 reached"), "{shown}");
}
