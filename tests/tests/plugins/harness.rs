//! The plugin test harness, used the way a plugin author would.

use std::sync::Arc;

use proxyfleet_core::kv::MemoryKv;
use proxyfleet_core::{ErrorClass, Provider as _};
use proxyfleet_harness::{Harness, ScriptedResponse, SpecBuilder};
use proxyfleet_tests::{observed, plugin};

const API: &str = "https://api.example.test";

#[tokio::test]
async fn scripted_answers_reach_the_plugin_and_requests_are_recorded() {
    let harness = Harness::builder(plugin("fixtures/http-fetch"))
        .grant_http(API)
        .respond("GET", &format!("{API}/vms/1"), ScriptedResponse::json(200, r#"{"id":1}"#))
        .respond("GET", &format!("{API}/vms/2"), ScriptedResponse::new(404, "no such vm"))
        .respond("GET", &format!("{API}/flaky"), ScriptedResponse::new(503, "busy"))
        .respond("GET", &format!("{API}/flaky"), ScriptedResponse::new(200, "recovered"))
        .build()
        .await
        .unwrap();
    let fetch = harness.provider();

    let answer = fetch.get(&format!("{API}/vms/1")).await.unwrap();
    assert_eq!(observed(&answer.name)["body"], r#"{"id":1}"#);
    let err = fetch.get(&format!("{API}/vms/2")).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::NotFound, "{err}");

    // Answers for the same request come in order, the last one repeating.
    let err = fetch.get(&format!("{API}/flaky")).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::Transient, "{err}");
    for _ in 0..2 {
        let answer = fetch.get(&format!("{API}/flaky")).await.unwrap();
        assert_eq!(observed(&answer.name)["body"], "recovered");
    }

    let unscripted = fetch.get(&format!("{API}/nothing-here")).await.unwrap_err();
    assert!(unscripted.message.contains("no scripted response for GET"), "{unscripted}");

    let requests = harness.requests();
    assert_eq!(requests.len(), 6);
    assert_eq!(requests[0].method, "GET");
    assert_eq!(requests[0].url, format!("{API}/vms/1"));
    assert!(requests[0].headers.iter().any(|(k, v)| k == "accept" && v == "*/*"));
}

#[tokio::test]
async fn the_allow_list_holds_in_the_harness() {
    let harness =
        Harness::builder(plugin("fixtures/http-fetch")).grant_http(API).build().await.unwrap();
    let err = harness.provider().get("https://elsewhere.example.test/").await.unwrap_err();
    assert_eq!(err.class, ErrorClass::Unauthorized, "{err}");
    assert!(harness.requests().is_empty(), "a refused request never reaches the transport");
}

#[tokio::test]
async fn two_hosts_sharing_a_store_never_hand_out_an_endpoint_twice() {
    let kv = Arc::new(MemoryKv::new());
    let config = serde_json::json!({ "endpoints": ["192.0.2.1:3128", "192.0.2.2:3128"] });
    let build =
        || Harness::builder(plugin("static")).config(config.clone()).kv(Arc::clone(&kv)).build();
    let (one, two) = (build().await.unwrap(), build().await.unwrap());
    let a = one.provider().create(&SpecBuilder::new("a").build()).await.unwrap();
    let a_again = two.provider().create(&SpecBuilder::new("a").build()).await.unwrap();
    assert_eq!(a.provider_id, a_again.provider_id, "the other host adopts the assignment");
    let b = two.provider().create(&SpecBuilder::new("b").build()).await.unwrap();
    assert_ne!(a.provider_id, b.provider_id);
    let keys: Vec<_> = proxyfleet_core::kv::KvStore::list(kv.as_ref(), "test", "endpoint/")
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.key)
        .collect();
    assert_eq!(keys.len(), 2, "one endpoint key per assignment: {keys:?}");
}

#[tokio::test]
async fn a_config_the_plugin_refuses_fails_the_build_with_the_key() {
    let err = Harness::builder(plugin("static"))
        .config(serde_json::json!({ "endpoints": ["192.0.2.1:3128"], "extra": 1 }))
        .build()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("extra"), "{err}");
}
