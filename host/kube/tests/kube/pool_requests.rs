//! The requests one ProxyPool pass makes, against a mocked API server
//! (tower-test): what it reads from the members' cache and when it lists.

use std::sync::Arc;

use http::Method;
use kube::runtime::controller::Action;
use kube::runtime::{reflector, watcher};
use proxyfleet_kube::crd::{Proxy, ProxyPool};
use proxyfleet_kube::pool::{PoolContext, reconcile_pool};
use proxyfleet_kube::pool_status::{Findings, conditions};

use crate::mock::{next, no_more_requests, pair, reply};

/// A pool wanting `replicas`; with `status`, the status a pass that
/// counted (total, ready) members wrote.
fn pool(replicas: u32, status: Option<(u32, u32)>) -> ProxyPool {
    let mut pool: ProxyPool = serde_json::from_value(serde_json::json!({
        "apiVersion": "proxyfleet.io/v1alpha1",
        "kind": "ProxyPool",
        "metadata": { "name": "crawl", "namespace": "ns", "uid": "uid-pool", "generation": 1 },
        "spec": { "replicas": replicas, "template": { "spec": { "provider": "lab" } } },
    }))
    .unwrap();
    if let Some((total, ready)) = status {
        let findings = Findings { total, ready, problem: None };
        pool.status = Some(
            serde_json::from_value(serde_json::json!({
                "replicas": total, "readyReplicas": ready,
                "selector": "proxyfleet.io/pool=crawl", "observedGeneration": 1,
                "conditions": conditions(&pool.spec, 1, &findings, &[], 1_700_000_000),
            }))
            .unwrap(),
        );
    }
    pool
}

fn member(name: &str, ready: bool) -> Proxy {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "proxyfleet.io/v1alpha1",
        "kind": "Proxy",
        "metadata": {
            "name": name, "namespace": "ns", "uid": format!("uid-{name}"),
            "creationTimestamp": "2026-12-01T00:00:00Z",
            "labels": { "proxyfleet.io/pool": "crawl" },
            "ownerReferences": [{
                "apiVersion": "proxyfleet.io/v1alpha1", "kind": "ProxyPool", "name": "crawl",
                "uid": "uid-pool", "controller": true, "blockOwnerDeletion": true,
            }],
        },
        "spec": { "provider": "lab" },
        "status": { "conditions": [{
            "type": "Ready", "status": if ready { "True" } else { "False" },
            "reason": "Probed", "message": "", "lastTransitionTime": "2026-12-01T00:00:00Z",
        }] },
    }))
    .unwrap()
}

/// A context whose members' cache holds `cached`.
fn context(client: kube::Client, cached: Vec<Proxy>) -> Arc<PoolContext> {
    let (store, mut writer) = reflector::store::<Proxy>();
    for proxy in cached {
        writer.apply_watcher_event(&watcher::Event::Apply(proxy));
    }
    Arc::new(PoolContext::new(client, store))
}

fn list_of(items: &[Proxy]) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "proxyfleet.io/v1alpha1", "kind": "ProxyList",
        "metadata": { "resourceVersion": "9" }, "items": items,
    })
}

/// Every member's status write wakes its pool. Each such pass used to
/// list every member from the API server: with 1,000 members coming up,
/// the pool listed 1,000 Proxies back to back for the whole scale-up. A
/// pass whose cache says nothing is to change sends nothing.
#[tokio::test]
async fn regression_a_pass_with_nothing_to_change_lists_nothing() {
    let (client, mut handle) = pair();
    let context = context(client, vec![member("crawl-a", true), member("crawl-b", false)]);
    let action = reconcile_pool(Arc::new(pool(2, Some((2, 1)))), context).await.unwrap();
    assert_eq!(action, Action::await_change());
    assert!(no_more_requests(&mut handle).await);
}

#[tokio::test]
async fn a_member_turning_ready_is_reported_from_the_cache_with_one_status_apply() {
    let (client, mut handle) = pair();
    let context = context(client, vec![member("crawl-a", true), member("crawl-b", true)]);
    let server = tokio::spawn(async move {
        let (method, uri, body, respond) = next(&mut handle).await;
        assert_eq!(method, Method::PATCH);
        assert!(
            uri.starts_with("/apis/proxyfleet.io/v1alpha1/namespaces/ns/proxypools/crawl/status?"),
            "{uri}"
        );
        assert_eq!(body["status"]["readyReplicas"], 2);
        let ready = &body["status"]["conditions"][0];
        assert_eq!((&ready["type"], &ready["status"]), (&"Ready".into(), &"True".into()));
        assert_eq!(ready["observedGeneration"], 1);
        reply(respond, 200, &serde_json::to_value(pool(2, Some((2, 2)))).unwrap());
        handle
    });
    reconcile_pool(Arc::new(pool(2, Some((2, 1)))), context).await.unwrap();
    let mut handle = server.await.unwrap();
    assert!(no_more_requests(&mut handle).await);
}

/// The cache lags the pass's own creates: it shows one member where the
/// API server already holds three. The pass lists before it acts and
/// makes none again.
#[tokio::test]
async fn a_cache_behind_the_last_creates_is_checked_on_a_list_and_nothing_is_made_twice() {
    let (client, mut handle) = pair();
    let context = context(client, vec![member("crawl-a", true)]);
    let server = tokio::spawn(async move {
        let (method, uri, _, respond) = next(&mut handle).await;
        assert_eq!(method, Method::GET);
        assert!(uri.starts_with("/apis/proxyfleet.io/v1alpha1/namespaces/ns/proxies?"), "{uri}");
        assert!(uri.contains("labelSelector=proxyfleet.io%2Fpool%3Dcrawl"), "{uri}");
        let listed = [member("crawl-a", true), member("crawl-b", false), member("crawl-c", false)];
        reply(respond, 200, &list_of(&listed));

        let (method, uri, body, respond) = next(&mut handle).await;
        assert_eq!(method, Method::PATCH, "{uri}: the status, no create");
        assert_eq!(body["status"]["replicas"], 3);
        assert_eq!(body["status"]["readyReplicas"], 1);
        reply(respond, 200, &serde_json::to_value(pool(3, Some((3, 1)))).unwrap());
        handle
    });
    reconcile_pool(Arc::new(pool(3, Some((1, 1)))), context).await.unwrap();
    let mut handle = server.await.unwrap();
    assert!(no_more_requests(&mut handle).await);
}

/// Creates go out in batches of 1, 2, 4, …; when a batch is refused the
/// pass ends there with the API's error, and the rest wait for a retry.
#[tokio::test]
async fn creates_start_slow_and_a_refused_batch_stops_the_rest() {
    let (client, mut handle) = pair();
    let context = context(client, Vec::new());
    let server = tokio::spawn(async move {
        let (method, _, _, respond) = next(&mut handle).await;
        assert_eq!(method, Method::GET);
        reply(respond, 200, &list_of(&[]));
        // The first batch: one create, accepted.
        let (method, uri, body, respond) = next(&mut handle).await;
        assert_eq!(method, Method::POST);
        assert!(uri.starts_with("/apis/proxyfleet.io/v1alpha1/namespaces/ns/proxies?"), "{uri}");
        assert_eq!(body["metadata"]["generateName"], "crawl-");
        assert_eq!(body["metadata"]["ownerReferences"][0]["uid"], "uid-pool");
        reply(respond, 201, &serde_json::to_value(member("crawl-a", false)).unwrap());
        // The second: two at once, both refused by a quota.
        let mut refused = Vec::new();
        for _ in 0..2 {
            let (method, _, _, respond) = next(&mut handle).await;
            assert_eq!(method, Method::POST);
            refused.push(respond);
        }
        for respond in refused {
            let status = serde_json::json!({
                "apiVersion": "v1", "kind": "Status", "status": "Failure",
                "message": "exceeded quota: proxies", "reason": "Forbidden", "code": 403,
            });
            reply(respond, 403, &status);
        }
        // The refusal is the pool's state: its Ready condition says so.
        let (method, uri, body, respond) = next(&mut handle).await;
        assert_eq!(method, Method::PATCH, "{uri}: the status, no third batch");
        let ready = &body["status"]["conditions"][0];
        assert_eq!((&ready["type"], &ready["status"]), (&"Ready".into(), &"False".into()));
        assert_eq!(ready["reason"], "MemberChangeRefused");
        assert!(ready["message"].as_str().unwrap().ends_with("exceeded quota: proxies"));
        reply(respond, 200, &serde_json::to_value(pool(10, Some((0, 0)))).unwrap());
        handle
    });
    let err = reconcile_pool(Arc::new(pool(10, None)), context).await.unwrap_err();
    assert!(
        matches!(&err, proxyfleet_kube::pool::Error::Kube(kube::Error::Api(status)) if status.code == 403),
        "{err}"
    );
    let mut handle = server.await.unwrap();
    assert!(no_more_requests(&mut handle).await, "no third batch");
}

/// A spec the planner cannot read (a `maxAge` of zero passes the schema's
/// pattern) changes no member: the pool says which field is wrong in its
/// Ready condition and waits for the spec to change.
#[tokio::test]
async fn a_spec_that_cannot_be_planned_is_reported_in_the_conditions_and_nothing_is_changed() {
    let (client, mut handle) = pair();
    let context = context(client, vec![member("crawl-a", true)]);
    let mut invalid = pool(3, Some((1, 1)));
    invalid.spec.max_age = Some("0h".into());
    let server = tokio::spawn(async move {
        let (method, uri, body, respond) = next(&mut handle).await;
        assert_eq!(method, Method::PATCH, "{uri}: the status only");
        let ready = &body["status"]["conditions"][0];
        assert_eq!((&ready["status"], &ready["reason"]), (&"False".into(), &"InvalidSpec".into()));
        assert!(ready["message"].as_str().unwrap().starts_with("spec.maxAge: \"0h\""), "{ready}");
        assert_eq!(body["status"]["readyReplicas"], 1, "the members are still counted");
        reply(respond, 200, &serde_json::to_value(pool(3, Some((1, 1)))).unwrap());
        handle
    });
    let action = reconcile_pool(Arc::new(invalid), context).await.unwrap();
    assert_eq!(action, Action::await_change());
    let mut handle = server.await.unwrap();
    assert!(no_more_requests(&mut handle).await);
}
