//! The plugins' store with its watch: reads answered without a request once
//! the store's ConfigMaps are listed, its own writes seen at once, and the
//! watch catching up with an older state never undoing them.

use http::Method;
use k8s_openapi::ByteString;
use proxyfleet_core::kv::{CasOutcome, KvStore, encode_versioned};
use proxyfleet_kube::kv::ConfigMapKv;
use serde_json::{Value, json};

use crate::mock::{Handle, Respond, next, no_more_requests, pair, reply};

const MAP: &str = "proxyfleet-kv-lab";

fn hex(key: &str) -> String {
    key.bytes().map(|b| format!("{b:02x}")).collect()
}

/// The store ConfigMap of entry `lab` at `resource_version`, holding
/// `entries` (key, version, value) and the last version handed out.
fn config_map(resource_version: &str, last: u64, entries: &[(&str, u64, &str)]) -> Value {
    let data: serde_json::Map<String, Value> = entries
        .iter()
        .map(|(key, version, value)| {
            let stored = ByteString(encode_versioned(*version, value.as_bytes()));
            (hex(key), serde_json::to_value(stored).unwrap())
        })
        .collect();
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {
            "name": MAP, "namespace": "ns", "resourceVersion": resource_version,
            "labels": { "proxyfleet.io/kv": "lab" },
            "annotations": { "proxyfleet.io/kv-version": last.to_string() },
        },
        "binaryData": data,
    })
}

/// Takes the watch's list and answers it with `items`; then takes the
/// watch request and hands back where its answer goes.
async fn listed(handle: &mut Handle, items: Vec<Value>) -> Respond {
    let (method, uri, _, respond) = next(handle).await;
    assert_eq!(method, Method::GET);
    assert!(uri.starts_with("/api/v1/namespaces/ns/configmaps?"), "{uri}");
    assert!(uri.contains("labelSelector=proxyfleet.io%2Fkv"), "{uri}");
    assert!(!uri.contains("watch=true"), "the list comes first: {uri}");
    let list = json!({
        "apiVersion": "v1", "kind": "ConfigMapList",
        "metadata": { "resourceVersion": "5" }, "items": items,
    });
    reply(respond, 200, &list);
    watched(handle).await
}

/// Takes the next watch request; hands back where its answer goes.
async fn watched(handle: &mut Handle) -> Respond {
    let (method, uri, _, respond) = next(handle).await;
    assert_eq!(method, Method::GET);
    assert!(uri.contains("watch=true"), "{uri}");
    respond
}

/// Ends a watch after one `MODIFIED` event with `object`, then takes the
/// watch that follows: by then the store has applied the event.
async fn modified(handle: &mut Handle, respond: Respond, object: Value) -> Respond {
    let line = json!({ "type": "MODIFIED", "object": object });
    respond.send_response(
        http::Response::builder()
            .status(200)
            .body(kube::client::Body::from(format!("{line}\n").into_bytes()))
            .unwrap(),
    );
    watched(handle).await
}

async fn value(store: &ConfigMapKv, key: &str) -> Option<String> {
    let entry = store.get("lab", key).await.unwrap()?;
    Some(String::from_utf8(entry.value).unwrap())
}

#[tokio::test]
async fn reads_follow_the_watch_and_the_stores_own_writes_without_a_request() {
    let (client, mut handle) = pair();
    let (store, follow) = ConfigMapKv::watched(client, "ns");
    tokio::spawn(follow);
    let _watch = listed(&mut handle, vec![config_map("5", 3, &[("endpoint/a", 3, "uid-1")])]).await;

    assert_eq!(value(&store, "endpoint/a").await.as_deref(), Some("uid-1"));
    assert_eq!(store.list("lab", "endpoint/").await.unwrap().len(), 1);
    assert_eq!(store.get("elsewhere", "endpoint/a").await.unwrap(), None, "known absent");
    assert!(no_more_requests(&mut handle).await, "reads were answered from the watch");

    // A compare-and-swap reads afresh and writes; its answer is what the
    // store reads next.
    let server = tokio::spawn(async move {
        let (method, uri, _, respond) = next(&mut handle).await;
        assert_eq!(
            (method, uri.split('?').next()),
            (Method::GET, Some(&*format!("/api/v1/namespaces/ns/configmaps/{MAP}")))
        );
        reply(respond, 200, &config_map("5", 3, &[("endpoint/a", 3, "uid-1")]));
        let (method, _, mut body, respond) = next(&mut handle).await;
        assert_eq!(method, Method::PUT);
        assert_eq!(body["metadata"]["resourceVersion"], "5", "a conditional update");
        body["metadata"]["resourceVersion"] = "9".into();
        reply(respond, 200, &body);
        handle
    });
    let outcome = store.compare_and_swap("lab", "endpoint/b", None, Some(b"uid-2".to_vec()));
    assert_eq!(outcome.await.unwrap(), CasOutcome::Applied(4));
    let mut handle = server.await.unwrap();
    assert_eq!(value(&store, "endpoint/b").await.as_deref(), Some("uid-2"));
    assert!(no_more_requests(&mut handle).await);
}

#[tokio::test]
async fn regression_the_watch_catching_up_does_not_undo_a_write_already_answered() {
    let (client, mut handle) = pair();
    let (store, follow) = ConfigMapKv::watched(client, "ns");
    tokio::spawn(follow);
    let watch = listed(&mut handle, vec![config_map("5", 1, &[("endpoint/a", 1, "uid-1")])]).await;
    let server = tokio::spawn(async move {
        let (_, _, _, respond) = next(&mut handle).await;
        reply(respond, 200, &config_map("5", 1, &[("endpoint/a", 1, "uid-1")]));
        let (_, _, mut body, respond) = next(&mut handle).await;
        body["metadata"]["resourceVersion"] = "9".into();
        reply(respond, 200, &body);
        handle
    });
    store.compare_and_swap("lab", "endpoint/b", None, Some(b"uid-2".to_vec())).await.unwrap();
    let mut handle = server.await.unwrap();

    // Another writer's change from before ours arrives only now.
    let older = config_map("7", 2, &[("endpoint/a", 2, "uid-9")]);
    let watch = modified(&mut handle, watch, older).await;
    assert_eq!(value(&store, "endpoint/b").await.as_deref(), Some("uid-2"));
    assert_eq!(value(&store, "endpoint/a").await.as_deref(), Some("uid-1"));

    // A change after ours is taken.
    let later = config_map("12", 5, &[("endpoint/a", 1, "uid-1"), ("endpoint/b", 5, "uid-3")]);
    let _watch = modified(&mut handle, watch, later).await;
    assert_eq!(value(&store, "endpoint/b").await.as_deref(), Some("uid-3"));
    assert!(no_more_requests(&mut handle).await);
}
