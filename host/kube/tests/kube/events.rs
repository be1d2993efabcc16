//! The Event recorder's requests: a repeat within the window is one more
//! of the first Event's series, not another Event.

use http::Method;
use k8s_openapi::api::core::v1::ObjectReference;
use proxyfleet_kube::events::{Event, EventType, Recorder, Reporter};

use crate::mock::{Handle, next, no_more_requests, pair, reply};

fn recorder(client: kube::Client) -> Recorder {
    Recorder::new(
        client,
        Reporter { controller: "proxyfleet".into(), instance: Some("mock".into()) },
    )
}

fn proxy_a() -> ObjectReference {
    ObjectReference {
        api_version: Some("proxyfleet.io/v1alpha1".into()),
        kind: Some("Proxy".into()),
        name: Some("a".into()),
        namespace: Some("ns".into()),
        uid: Some("uid-a".into()),
        ..ObjectReference::default()
    }
}

fn event(reason: &str) -> Event {
    Event {
        type_: EventType::Warning,
        reason: reason.into(),
        note: Some(format!("{reason} happened")),
        action: "Reconcile".into(),
        secondary: None,
    }
}

/// Takes a create and answers it with `name`; returns the body sent.
async fn created(handle: &mut Handle, name: &str) -> serde_json::Value {
    let (method, uri, mut body, respond) = next(handle).await;
    assert_eq!(method, Method::POST);
    assert!(uri.starts_with("/apis/events.k8s.io/v1/namespaces/ns/events?"), "{uri}");
    let sent = body.clone();
    body["metadata"]["name"] = name.into();
    reply(respond, 201, &body);
    sent
}

/// Takes a merge patch of `name`'s series and answers with `status`;
/// returns the series count sent.
async fn patched(handle: &mut Handle, name: &str, status: u16) -> serde_json::Value {
    let (method, uri, body, respond) = next(handle).await;
    assert_eq!(method, Method::PATCH);
    assert!(
        uri.starts_with(&format!("/apis/events.k8s.io/v1/namespaces/ns/events/{name}?")),
        "{uri}"
    );
    assert_eq!(body.as_object().map(|o| o.len()), Some(1), "the series alone: {body}");
    assert!(body["series"]["lastObservedTime"].is_string(), "{body}");
    if status == 404 {
        let gone = serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("events.events.k8s.io \"{name}\" not found"),
            "reason": "NotFound", "code": 404,
        });
        reply(respond, 404, &gone);
    } else {
        reply(respond, status, &serde_json::json!({ "metadata": { "name": name } }));
    }
    body["series"]["count"].clone()
}

#[tokio::test]
async fn a_repeat_within_the_window_counts_in_the_first_events_series() {
    let (client, mut handle) = pair();
    let recorder = recorder(client);
    let server = tokio::spawn(async move {
        let sent = created(&mut handle, "a.1").await;
        assert_eq!(sent["reason"], "CreateFailed");
        assert_eq!(sent["type"], "Warning");
        assert_eq!(sent["note"], "CreateFailed happened");
        assert_eq!(sent["regarding"]["uid"], "uid-a");
        assert_eq!(sent["reportingController"], "proxyfleet");
        assert_eq!(sent["reportingInstance"], "mock");
        assert!(sent.get("series").is_none(), "{sent}");
        assert_eq!(patched(&mut handle, "a.1", 200).await, 2);
        assert_eq!(patched(&mut handle, "a.1", 200).await, 3);
        // Another reason is another Event.
        let sent = created(&mut handle, "a.2").await;
        assert_eq!(sent["reason"], "Created");
        handle
    });
    for reason in ["CreateFailed", "CreateFailed", "CreateFailed", "Created"] {
        recorder.publish(&event(reason), &proxy_a()).await.unwrap();
    }
    let mut handle = server.await.unwrap();
    assert!(no_more_requests(&mut handle).await);
}

#[tokio::test]
async fn a_repeat_of_an_event_the_server_no_longer_has_starts_a_new_one() {
    let (client, mut handle) = pair();
    let recorder = recorder(client);
    let server = tokio::spawn(async move {
        created(&mut handle, "a.1").await;
        patched(&mut handle, "a.1", 404).await;
        created(&mut handle, "a.2").await;
        // The new one carries the series on.
        assert_eq!(patched(&mut handle, "a.2", 200).await, 2);
        handle
    });
    for _ in 0..3 {
        recorder.publish(&event("CreateFailed"), &proxy_a()).await.unwrap();
    }
    let mut handle = server.await.unwrap();
    assert!(no_more_requests(&mut handle).await);
}
