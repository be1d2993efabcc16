use std::time::Duration;

use super::*;
use crate::fake::{FakeProvider, Op};
use crate::proxy::{ConditionStatus, ConditionType, Phase, ProxyDesired, ProxyMeta, ProxyStatus};
use crate::{ErrorClass, Instance, InstanceState, OwnershipMark, ProviderError};

/// A Proxy and its stored state across passes, like a store would keep it.
struct Proxy {
    meta: ProxyMeta,
    desired: ProxyDesired,
    status: ProxyStatus,
    deleting: bool,
    has_finalizer: bool,
    policy: Policy,
    spec_key: SpecKey,
    /// Unix seconds the next pass runs at.
    now: u64,
}

impl Proxy {
    fn new(name: &str) -> Self {
        Self {
            meta: ProxyMeta {
                uid: format!("uid-{name}"),
                namespace: "default".into(),
                name: name.into(),
                generation: 1,
            },
            desired: crate::proxy::tests::desired(),
            status: ProxyStatus::default(),
            deleting: false,
            has_finalizer: true,
            policy: Policy::default(),
            spec_key: SpecKey::generate(),
            now: 100,
        }
    }

    fn without_finalizer(mut self) -> Self {
        self.has_finalizer = false;
        self
    }

    /// One pass against `provider`, applied to the stored state.
    async fn pass(&mut self, provider: &FakeProvider) -> Outcome {
        self.pass_with(Ok(provider)).await
    }

    async fn pass_with(&mut self, provider: Result<&FakeProvider, ProviderError>) -> Outcome {
        let state = ProxyState {
            meta: &self.meta,
            desired: &self.desired,
            status: &self.status,
            deleting: self.deleting,
            has_finalizer: self.has_finalizer,
            spec_key: &self.spec_key,
        };
        let provider = provider.map(|p| p as &dyn Provider);
        // Jitter 0.5 makes backoff exact: factor 0.8 + 0.4 * 0.5 = 1.0.
        let outcome = reconcile(state, provider, &self.policy, self.now, 0.5).await;
        self.status = outcome.status.clone();
        match outcome.finalizer {
            FinalizerChange::Add => self.has_finalizer = true,
            FinalizerChange::Remove => self.has_finalizer = false,
            FinalizerChange::Keep => {}
        }
        outcome
    }

    fn condition(&self, kind: ConditionType) -> (ConditionStatus, String) {
        let c = self.status.condition(kind).unwrap_or_else(|| panic!("{kind:?} is not set"));
        (c.status, c.reason.clone())
    }
}

fn reasons(outcome: &Outcome) -> Vec<&'static str> {
    outcome.events.iter().map(|e| e.reason).collect()
}

#[tokio::test]
async fn the_finalizer_goes_on_before_any_provider_call() {
    let fake = FakeProvider::new("lab");
    let mut proxy = Proxy::new("a").without_finalizer();
    let outcome = proxy.pass(&fake).await;
    assert_eq!(outcome.finalizer, FinalizerChange::Add);
    assert_eq!(outcome.requeue_after, Some(Duration::ZERO));
    assert!(fake.calls().is_empty());
}

#[tokio::test]
async fn create_records_the_instance_and_reports_ready() {
    let fake = FakeProvider::new("lab");
    let mut proxy = Proxy::new("a");
    let outcome = proxy.pass(&fake).await;
    assert_eq!(reasons(&outcome), ["Created"]);
    assert_eq!(proxy.status.provider_id.as_deref(), Some("fake-1"));
    assert_eq!(proxy.status.ip.as_deref(), Some("198.51.100.1"));
    assert_eq!(proxy.status.phase, Phase::Running);
    assert_eq!(proxy.status.plugin.as_deref(), Some("fake"));
    assert_eq!(proxy.status.spec_hash, Some(proxy.desired.spec_hash(&proxy.spec_key)));
    assert_eq!(proxy.condition(ConditionType::Provisioned).0, ConditionStatus::True);
    assert_eq!(proxy.condition(ConditionType::Ready).0, ConditionStatus::True);
    assert_eq!(outcome.requeue_after, Some(proxy.policy.resync));

    let again = proxy.pass(&fake).await;
    assert!(again.events.is_empty(), "a steady proxy makes no events");
    assert_eq!(fake.calls().iter().filter(|(op, _)| *op == Op::Create).count(), 1);
}

#[tokio::test]
async fn a_provisioning_instance_is_polled_until_it_has_an_address() {
    let fake = FakeProvider::new("lab").start_provisioning();
    let mut proxy = Proxy::new("a");
    let outcome = proxy.pass(&fake).await;
    assert_eq!(proxy.status.phase, Phase::Provisioning);
    assert_eq!(
        proxy.status.provider_id.as_deref(),
        Some("fake-1"),
        "the id is kept as soon as known"
    );
    assert_eq!(
        outcome.requeue_after,
        Some(proxy.policy.provisioning_poll_first),
        "a new instance is looked at again soon"
    );
    assert_eq!(
        proxy.condition(ConditionType::Ready),
        (ConditionStatus::False, "NotProvisioned".into())
    );
    // Still starting: polled after half the time it has kept the Proxy
    // waiting, up to the longest interval.
    for (waited, poll) in [(0, 500), (3, 1500), (6, 3000), (60, 5000)] {
        proxy.now = 100 + waited;
        let outcome = proxy.pass(&fake).await;
        assert_eq!(
            outcome.requeue_after,
            Some(Duration::from_millis(poll)),
            "after {waited} s of starting"
        );
    }

    fake.set_state("fake-1", InstanceState::Running, &["203.0.113.9"]);
    proxy.pass(&fake).await;
    assert_eq!(
        (proxy.status.phase, proxy.status.ip.as_deref()),
        (Phase::Running, Some("203.0.113.9"))
    );
}

#[tokio::test]
async fn a_retried_create_adopts_what_a_crashed_attempt_left() {
    let fake = FakeProvider::new("lab");
    let mut proxy = Proxy::new("a");
    // A create that ran but whose answer was never recorded.
    let spec = proxy.desired.to_spec(&proxy.meta);
    fake.create(&spec).await.unwrap();
    proxy.pass(&fake).await;
    assert_eq!(fake.instances().len(), 1, "never a second instance for one UID");
    assert_eq!(proxy.status.provider_id.as_deref(), Some("fake-1"));
}

#[tokio::test]
async fn a_spec_change_replaces_the_instance_and_a_label_change_does_not() {
    let fake = FakeProvider::new("lab");
    let mut proxy = Proxy::new("a");
    proxy.pass(&fake).await;

    proxy.desired.labels.insert("team".into(), "crawl".into());
    proxy.pass(&fake).await;
    assert!(!fake.calls().iter().any(|(op, _)| *op == Op::Delete), "labels need no new instance");

    proxy.desired.cores = 2;
    proxy.meta.generation = 2;
    let outcome = proxy.pass(&fake).await;
    assert_eq!(reasons(&outcome), ["Replaced", "Created"]);
    assert_eq!(fake.instances().keys().collect::<Vec<_>>(), ["fake-2"]);
    assert_eq!(proxy.status.provider_id.as_deref(), Some("fake-2"));
    assert_eq!(proxy.status.observed_generation, 2);
    assert_eq!(proxy.status.spec_hash, Some(proxy.desired.spec_hash(&proxy.spec_key)));
}

/// The provider configures the proxy with the credential, so a new one
/// needs a new instance; the same one again does not.
#[tokio::test]
async fn a_credential_change_replaces_the_instance() {
    let fake = FakeProvider::new("lab");
    let mut proxy = Proxy::new("a");
    let credential = |text| Some(crate::credential::ProxyCredential::parse(text).unwrap());
    proxy.desired.proxy_auth = credential("crawler:one");
    proxy.pass(&fake).await;
    proxy.pass(&fake).await;
    assert!(!fake.calls().iter().any(|(op, _)| *op == Op::Delete), "nothing changed");

    proxy.desired.proxy_auth = credential("crawler:two");
    let outcome = proxy.pass(&fake).await;
    assert_eq!(reasons(&outcome), ["Replaced", "Created"]);
    assert_eq!(proxy.status.provider_id.as_deref(), Some("fake-2"));
    let hash = proxy.status.spec_hash.clone().unwrap();
    assert_eq!(Some(hash), Some(proxy.desired.spec_hash(&proxy.spec_key)));
}

#[tokio::test]
async fn a_replacement_waits_until_the_old_instance_is_gone() {
    let fake = FakeProvider::new("lab").slow_deletes();
    let mut proxy = Proxy::new("a");
    proxy.pass(&fake).await;
    proxy.desired.image = "debian-13".into();
    let outcome = proxy.pass(&fake).await;
    assert_eq!(proxy.condition(ConditionType::Provisioned).1, "Replacing");
    assert_eq!(outcome.requeue_after, Some(proxy.policy.provisioning_poll_first));
    let creates = fake.calls().iter().filter(|(op, _)| *op == Op::Create).count();
    assert_eq!(creates, 1, "no new instance while the old one is still there");
    proxy.pass(&fake).await;
    assert_eq!(fake.instances().keys().collect::<Vec<_>>(), ["fake-2"]);
}

#[tokio::test]
async fn transient_errors_back_off_exponentially() {
    let fake = FakeProvider::new("lab");
    let mut proxy = Proxy::new("a");
    for (attempt, expected) in [(1, 5), (2, 10), (3, 20)] {
        fake.fail_next(Op::Create, ProviderError::transient("502 from the API"));
        let outcome = proxy.pass(&fake).await;
        assert_eq!(outcome.error, Some(ErrorClass::Transient));
        assert_eq!(proxy.status.attempts, attempt);
        assert_eq!(outcome.requeue_after, Some(Duration::from_secs(expected)));
        assert_eq!(proxy.condition(ConditionType::Provisioned).1, "CreateFailed");
    }
    proxy.pass(&fake).await;
    assert_eq!(proxy.status.attempts, 0, "success resets the backoff");
    assert_eq!(proxy.status.phase, Phase::Running);
}

#[tokio::test]
async fn an_instance_created_after_failed_attempts_is_polled_soon() {
    let fake = FakeProvider::new("lab").start_provisioning();
    fake.fail_next(Op::Create, ProviderError::transient("503 from the API"));
    let mut proxy = Proxy::new("a");
    proxy.pass(&fake).await;
    assert_eq!(proxy.condition(ConditionType::Provisioned).1, "CreateFailed");
    // The Provisioned condition has been False for five minutes when the
    // create finally succeeds; the new instance is still polled soon.
    proxy.now += 300;
    let outcome = proxy.pass(&fake).await;
    assert_eq!(proxy.status.provider_id.as_deref(), Some("fake-1"));
    assert_eq!(outcome.requeue_after, Some(proxy.policy.provisioning_poll_first));
}

#[test]
fn resyncs_spread_within_twenty_percent_so_a_fleet_started_together_is_not_looked_at_in_lockstep() {
    let policy = Policy::default();
    assert_eq!(policy.resync_after(0.5), policy.resync);
    assert_eq!(policy.resync_after(0.0), Duration::from_secs(48));
    let high = policy.resync_after(0.999);
    assert!(high > Duration::from_millis(71_900) && high < Duration::from_secs(72), "{high:?}");
}

#[test]
fn backoff_is_capped_and_jittered_within_twenty_percent() {
    let policy = Policy::default();
    assert_eq!(policy.backoff(ErrorClass::Transient, 30, 0.5), policy.backoff_max);
    let low = policy.backoff(ErrorClass::Transient, 1, 0.0);
    let high = policy.backoff(ErrorClass::Transient, 1, 0.999);
    assert_eq!(low, Duration::from_secs(4));
    assert!(high > Duration::from_millis(5990) && high <= Duration::from_secs(6), "{high:?}");
}

#[tokio::test]
async fn quota_errors_have_their_own_reason_and_a_longer_backoff() {
    let fake = FakeProvider::new("lab");
    fake.fail_next(Op::Create, ProviderError::quota_exceeded("CPUS quota 24 reached"));
    let mut proxy = Proxy::new("a");
    let outcome = proxy.pass(&fake).await;
    assert_eq!(proxy.condition(ConditionType::Provisioned).1, "QuotaExceeded");
    assert_eq!(outcome.requeue_after, Some(proxy.policy.quota_backoff_base));
}

#[tokio::test]
async fn final_errors_latch_failed_until_the_spec_changes() {
    for (err, reason) in [
        (ProviderError::permanent("template 9000 is not a template"), "PermanentError"),
        (ProviderError::invalid_spec("cores: 64 is more than the node has"), "InvalidSpec"),
        (ProviderError::unauthorized("401 from the API"), "Unauthorized"),
    ] {
        let fake = FakeProvider::new("lab");
        fake.fail_next(Op::Create, err);
        let mut proxy = Proxy::new("a");
        let outcome = proxy.pass(&fake).await;
        assert_eq!(proxy.status.phase, Phase::Failed);
        assert_eq!(proxy.condition(ConditionType::Provisioned).1, reason);
        assert_eq!(outcome.requeue_after, None, "no hot loop");
        let calls = fake.calls().len();
        let latched = proxy.pass(&fake).await;
        assert_eq!(fake.calls().len(), calls, "a latched failure makes no calls");
        assert!(latched.events.is_empty());

        proxy.desired.cores = 2;
        proxy.pass(&fake).await;
        assert_eq!(proxy.status.phase, Phase::Running, "a spec change unlatches");
        assert_eq!(proxy.status.failed_spec_hash, None);
    }
}

#[tokio::test]
async fn an_unknown_provider_entry_gets_a_condition_and_no_calls() {
    let fake = FakeProvider::new("lab");
    let mut proxy = Proxy::new("a");
    let outcome =
        proxy.pass_with(Err(ProviderError::unavailable("no provider entry named \"lab\""))).await;
    let (status, reason) = proxy.condition(ConditionType::Provisioned);
    assert_eq!((status, reason.as_str()), (ConditionStatus::False, "ProviderUnavailable"));
    assert!(outcome.requeue_after.is_some(), "retried in case the entry appears");
    assert!(fake.calls().is_empty());
}

#[tokio::test]
async fn a_failing_get_keeps_the_address() {
    let fake = FakeProvider::new("lab");
    let mut proxy = Proxy::new("a");
    proxy.pass(&fake).await;
    // The bug this pins: "connection is closed" read as "no address yet"
    // pulled a healthy proxy out of rotation.
    fake.fail_next(Op::Get, ProviderError::transient("connection is closed"));
    let outcome = proxy.pass(&fake).await;
    assert_eq!(outcome.error, Some(ErrorClass::Transient));
    assert_eq!(proxy.status.ip.as_deref(), Some("198.51.100.1"));
    assert_eq!(proxy.status.phase, Phase::Running);
    assert_eq!(proxy.condition(ConditionType::Ready).0, ConditionStatus::True);
}

#[tokio::test]
async fn a_running_instance_flapping_to_provisioning_keeps_its_address_for_a_few_polls() {
    let fake = FakeProvider::new("lab");
    let mut proxy = Proxy::new("a");
    proxy.pass(&fake).await;
    fake.set_state("fake-1", InstanceState::Provisioning, &[]);
    for _ in 0..proxy.policy.flap_tolerance {
        proxy.pass(&fake).await;
        assert_eq!(proxy.status.ip.as_deref(), Some("198.51.100.1"));
        assert_eq!(proxy.condition(ConditionType::Provisioned).0, ConditionStatus::True);
    }
    proxy.pass(&fake).await;
    assert_eq!(proxy.status.ip, None, "past the tolerance the address goes");
    assert_eq!(proxy.status.phase, Phase::Provisioning);

    fake.set_state("fake-1", InstanceState::Running, &["198.51.100.1"]);
    proxy.pass(&fake).await;
    assert_eq!(proxy.status.flaps, 0);
}

#[tokio::test]
async fn a_lost_instance_is_recreated() {
    let fake = FakeProvider::new("lab");
    let mut proxy = Proxy::new("a");
    proxy.pass(&fake).await;
    fake.vanish("fake-1");
    let outcome = proxy.pass(&fake).await;
    assert_eq!(reasons(&outcome), ["InstanceLost"]);
    assert_eq!(proxy.status.provider_id, None);
    proxy.pass(&fake).await;
    assert_eq!(proxy.status.provider_id.as_deref(), Some("fake-2"));
}

#[tokio::test]
async fn a_failed_instance_is_replaced() {
    let fake = FakeProvider::new("lab");
    let mut proxy = Proxy::new("a");
    proxy.pass(&fake).await;
    fake.set_state("fake-1", InstanceState::Failed, &[]);
    let outcome = proxy.pass(&fake).await;
    assert_eq!(reasons(&outcome), ["InstanceFailed"]);
    assert!(fake.instances().is_empty());
    proxy.pass(&fake).await;
    assert_eq!(proxy.status.provider_id.as_deref(), Some("fake-2"));
}

#[tokio::test]
async fn deletion_confirms_the_instance_is_gone_before_the_finalizer_goes() {
    let fake = FakeProvider::new("lab");
    let mut proxy = Proxy::new("a");
    proxy.pass(&fake).await;
    proxy.deleting = true;
    let outcome = proxy.pass(&fake).await;
    assert_eq!(outcome.finalizer, FinalizerChange::Remove);
    assert!(fake.instances().is_empty());
    let ops: Vec<Op> = fake.calls().into_iter().map(|(op, _)| op).skip(1).collect();
    assert_eq!(ops, [Op::Delete, Op::Get], "delete, then confirm with get");
}

#[tokio::test]
async fn a_failed_delete_keeps_the_finalizer_and_says_why() {
    let fake = FakeProvider::new("lab");
    let mut proxy = Proxy::new("a");
    proxy.pass(&fake).await;
    proxy.deleting = true;
    fake.fail_next(Op::Delete, ProviderError::unauthorized("403: token lacks VM.Allocate"));
    let outcome = proxy.pass(&fake).await;
    assert_eq!(outcome.finalizer, FinalizerChange::Keep);
    assert_eq!(proxy.condition(ConditionType::Provisioned).1, "DeleteFailed");
    assert_eq!(reasons(&outcome), ["DeleteFailed"]);
    assert!(outcome.events[0].warning && outcome.events[0].message.contains("VM.Allocate"));
    assert!(outcome.requeue_after.is_some(), "deletion keeps retrying even after final errors");
    let outcome = proxy.pass(&fake).await;
    assert_eq!(outcome.finalizer, FinalizerChange::Remove);
}

#[tokio::test]
async fn a_slow_delete_is_waited_for() {
    let fake = FakeProvider::new("lab").slow_deletes();
    let mut proxy = Proxy::new("a");
    proxy.pass(&fake).await;
    proxy.deleting = true;
    assert_eq!(proxy.pass(&fake).await.finalizer, FinalizerChange::Keep);
    assert_eq!(proxy.pass(&fake).await.finalizer, FinalizerChange::Remove);
}

#[tokio::test]
async fn deleting_before_a_create_was_recorded_finds_the_instance_by_its_mark() {
    let fake = FakeProvider::new("lab");
    let mut proxy = Proxy::new("a");
    let orphan_of_crash = proxy.desired.to_spec(&proxy.meta);
    fake.create(&orphan_of_crash).await.unwrap();
    let foreign = Instance {
        provider_id: "someone-else".into(),
        name: "x".into(),
        state: InstanceState::Running,
        addresses: vec![],
        port: None,
        created_at: None,
        mark: Some(OwnershipMark {
            installation: crate::fake::INSTALLATION.into(),
            uid: "uid-other".into(),
            namespace: "default".into(),
            name: "x".into(),
            created_at: 1,
        }),
    };
    fake.insert(foreign);
    proxy.deleting = true;
    let outcome = proxy.pass(&fake).await;
    assert_eq!(outcome.finalizer, FinalizerChange::Remove);
    assert_eq!(
        fake.instances().keys().collect::<Vec<_>>(),
        ["someone-else"],
        "only ours is deleted"
    );
}

#[tokio::test]
async fn deleting_a_proxy_without_our_finalizer_touches_nothing() {
    let fake = FakeProvider::new("lab");
    let mut proxy = Proxy::new("a").without_finalizer();
    proxy.deleting = true;
    let outcome = proxy.pass(&fake).await;
    assert_eq!(outcome.finalizer, FinalizerChange::Keep);
    assert!(fake.calls().is_empty());
}
