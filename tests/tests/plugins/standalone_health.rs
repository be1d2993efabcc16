//! Standalone mode with the health engine: verdicts from probes through
//! real tinyproxy processes land in the Proxies' conditions, and a pool
//! member crawlers report too often is replaced.

use std::sync::Arc;

use bytes::Bytes;
use std::time::Duration;

use proxyfleet_core::proxy::{ConditionStatus, ConditionType, ProxyStatus};
use proxyfleet_fleet::catalog::ReportKind;
use proxyfleet_fleet::{
    CheckTarget, FleetSettings, HealthEngine, HealthSettings, ProbeMode, Selector,
};
use proxyfleet_runtime::config::ProvidersConfig;
use proxyfleet_standalone::{Settings, Standalone};
use proxyfleet_tests::proxies::Tinyproxy;
use proxyfleet_tests::{Canned, TestServer, plugin};

struct Site {
    dir: tempfile::TempDir,
    proxies: Vec<Tinyproxy>,
    echo: TestServer,
}

impl Site {
    async fn new(manifests: &str, proxies: usize) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("plugins")).unwrap();
        std::fs::copy(plugin("static"), dir.path().join("plugins/static.wasm")).unwrap();
        std::fs::create_dir(dir.path().join("proxies")).unwrap();
        std::fs::write(dir.path().join("proxies/proxies.yaml"), manifests).unwrap();
        // A plain echo server stands in for the API's /v1/echo here.
        let echo = TestServer::http(Canned {
            status: 200,
            body: Bytes::from_static(br#"{"ip":"127.0.0.1"}"#),
        })
        .await;
        Self { dir, proxies: (0..proxies).map(|_| Tinyproxy::start()).collect(), echo }
    }

    async fn open(&self, fleet: FleetSettings) -> Standalone {
        let endpoints: Vec<String> =
            self.proxies.iter().map(|p| format!("'{}'", p.addr())).collect();
        let providers = format!(
            "providers:\n  - name: local\n    plugin: static\n    config: {{ endpoints: [{}] }}\n    proxyAddresses: ['127.0.0.0/8']\n",
            endpoints.join(", ")
        );
        let mut settings = Settings::new(self.dir.path().join("proxies"));
        settings.fleet = fleet;
        proxyfleet_tests::standalone::open(
            settings,
            &self.dir.path().join("state.redb"),
            &ProvidersConfig::parse(&providers).unwrap(),
            &self.dir.path().join("plugins"),
        )
        .await
        .0
    }

    fn engine(&self, standalone: &Standalone) -> HealthEngine {
        let target = format!("http://{}/", self.echo.addr);
        let mut settings = HealthSettings::new(CheckTarget::parse("target", &target).unwrap());
        settings.healthy_after = 1;
        settings.unhealthy_after = 2;
        settings.timeout = Duration::from_secs(2);
        settings.mode = ProbeMode::Get;
        HealthEngine::new(settings, Arc::clone(standalone.fleet()))
    }
}

fn condition(status: &ProxyStatus, kind: ConditionType) -> Option<ConditionStatus> {
    status.condition(kind).map(|c| c.status)
}

/// One step of the driver's loop plus one round of probes.
async fn tick(standalone: &Standalone, engine: &HealthEngine) {
    standalone.run_until_settled(Duration::from_secs(20)).await.unwrap();
    standalone.publish_fleet().unwrap();
    engine.round().await;
    standalone.apply_health().unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn probe_verdicts_become_the_healthy_and_ready_conditions() {
    let manifest = "apiVersion: proxyfleet.io/v1alpha1\nkind: Proxy\nmetadata: { name: a }\nspec: { provider: local }\n";
    let mut site = Site::new(manifest, 1).await;
    let standalone = site.open(FleetSettings::default()).await;
    let engine = site.engine(&standalone);
    tick(&standalone, &engine).await;
    let record = standalone.records().unwrap().remove(0);
    assert_eq!(condition(&record.status, ConditionType::Healthy), Some(ConditionStatus::True));
    assert_eq!(condition(&record.status, ConditionType::Ready), Some(ConditionStatus::True));
    let message = &record.status.condition(ConditionType::Healthy).unwrap().message;
    assert!(message.contains("exit address 127.0.0.1"), "{message}");
    assert_eq!(standalone.fleet().next(&Selector::default(), None).unwrap().0, record.meta.uid);

    site.proxies[0].kill();
    tick(&standalone, &engine).await;
    tick(&standalone, &engine).await;
    let record = standalone.records().unwrap().remove(0);
    assert_eq!(condition(&record.status, ConditionType::Healthy), Some(ConditionStatus::False));
    assert_eq!(condition(&record.status, ConditionType::Ready), Some(ConditionStatus::False));
    let message = &record.status.condition(ConditionType::Healthy).unwrap().message;
    assert!(message.contains("cannot connect to the proxy port"), "{message}");
    // The reconciler's next pass keeps the verdict: Ready stays False.
    standalone.run_until_settled(Duration::from_secs(20)).await.unwrap();
    let record = standalone.records().unwrap().remove(0);
    assert_eq!(condition(&record.status, ConditionType::Ready), Some(ConditionStatus::False));

    site.proxies[0].restart();
    tick(&standalone, &engine).await;
    let record = standalone.records().unwrap().remove(0);
    assert_eq!(condition(&record.status, ConditionType::Ready), Some(ConditionStatus::True));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pool_member_reported_past_the_threshold_is_replaced() {
    let manifest = "apiVersion: proxyfleet.io/v1alpha1\nkind: ProxyPool\nmetadata: { name: crawl }\n\
                    spec: { replicas: 1, template: { spec: { provider: local } } }\n";
    let site = Site::new(manifest, 2).await;
    let settings = FleetSettings { replace_after: 2, ..FleetSettings::default() };
    let standalone = site.open(settings).await;
    let engine = site.engine(&standalone);
    tick(&standalone, &engine).await;
    let first = standalone.records().unwrap().remove(0);
    let fleet = standalone.fleet();
    assert!(!fleet.report(&first.meta.uid, ReportKind::Ban, "403").unwrap().replacing);
    assert!(fleet.report(&first.meta.uid, ReportKind::Ban, "403").unwrap().replacing);
    standalone.apply_health().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        tick(&standalone, &engine).await;
        let records = standalone.records().unwrap();
        if records.len() == 1 && records[0].meta.uid != first.meta.uid {
            let (id, _) = fleet.next(&Selector::default(), None).unwrap();
            assert_eq!(id, records[0].meta.uid, "the replacement is handed out");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no replacement: {records:?}");
    }
}
