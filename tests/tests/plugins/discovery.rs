//! The discovery API over real HTTP on loopback: concurrent picks, leases,
//! expiry, reports, auth, and the OpenAPI file against the router.

use std::collections::{BTreeMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use proxyfleet_core::proxy::Phase;
use proxyfleet_fleet::api::{self, Api};
use proxyfleet_fleet::auth::ApiAuth;
use proxyfleet_fleet::probe::{ProbeFailure, ProbePass};
use proxyfleet_fleet::{Endpoint, Fleet, FleetSettings, Member};
use proxyfleet_metrics::Metrics;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// Members `p0..pN` at made-up loopback endpoints; verdicts are recorded
/// directly, as these tests are about handing out, not probing.
fn members(n: u8) -> Vec<Member> {
    (0..n)
        .map(|i| Member {
            id: format!("p{i}"),
            namespace: "default".into(),
            name: format!("p{i}"),
            pool: Some("default/crawl".into()),
            provider: "local".into(),
            labels: BTreeMap::new(),
            phase: Phase::Running,
            endpoint: Some(Endpoint::new(IpAddr::from([127, 0, 1, i]), 3128)),
            created_at: None,
            conditions: Vec::new(),
        })
        .collect()
}

fn verdicts(fleet: &Fleet, healthy: &[&str], unhealthy: &[&str]) {
    let targets = fleet.probe_targets();
    let result = |id: &str| -> Option<Result<ProbePass, ProbeFailure>> {
        if healthy.contains(&id) {
            Some(Ok(ProbePass { latency: Duration::from_millis(1), exit_ip: None }))
        } else if unhealthy.contains(&id) {
            Some(Err(ProbeFailure("refused".into())))
        } else {
            None
        }
    };
    let results = targets
        .into_iter()
        .filter_map(|(id, endpoint)| result(&id).map(|r| (id, endpoint, r)))
        .collect();
    fleet.record_probes(results, 1, 1);
}

async fn serve(fleet: &Arc<Fleet>, auth: ApiAuth) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let api = Arc::new(Api::new(Arc::clone(fleet), Arc::new(auth)));
    tokio::spawn(api::serve(
        listener,
        api,
        api::ConnectionLimits::default(),
        std::future::pending(),
    ));
    addr
}

/// One request on its own connection: (status, body).
async fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    token: Option<&str>,
) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: api\r\nConnection: close\r\n{auth}\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let status = response[9..12].parse().unwrap();
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (status, body)
}

fn field(body: &str, name: &str) -> String {
    let value: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|err| panic!("{err}: {body}"));
    value[name].as_str().unwrap_or_else(|| panic!("no {name} in {body}")).to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_next_calls_never_hand_out_an_unhealthy_or_quarantined_proxy() {
    let fleet = Arc::new(Fleet::new(FleetSettings::default(), Arc::new(Metrics::new())));
    fleet.publish(members(8));
    verdicts(&fleet, &["p0", "p1", "p2", "p3", "p4", "p5"], &["p6", "p7"]);
    let addr = serve(&fleet, ApiAuth::open()).await;
    let (status, _) = call(addr, "POST", "/v1/proxies/p5/report", r#"{"kind":"ban"}"#, None).await;
    assert_eq!(status, 200);

    // Half-way through, p4 is reported. A pick that started after the
    // report was answered must not return p4.
    let reported_at: Arc<std::sync::OnceLock<Instant>> = Arc::default();
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..1000 {
        let reported_at = Arc::clone(&reported_at);
        calls.spawn(async move {
            if i == 500 {
                let (status, _) =
                    call(addr, "POST", "/v1/proxies/p4/report", r#"{"kind":"failure"}"#, None)
                        .await;
                assert_eq!(status, 200);
                reported_at.set(Instant::now()).unwrap();
                return None;
            }
            let started = Instant::now();
            let (status, body) =
                call(addr, "GET", "/v1/proxies/next?pool=default%2Fcrawl", "", None).await;
            assert_eq!(status, 200, "{body}");
            Some((started, field(&body, "id")))
        });
    }
    let mut seen = HashSet::new();
    let mut picks = Vec::new();
    while let Some(result) = calls.join_next().await {
        if let Some(pick) = result.unwrap() {
            picks.push(pick);
        }
    }
    let reported_at = *reported_at.get().unwrap();
    for (started, id) in picks {
        assert!(!["p5", "p6", "p7"].contains(&id.as_str()), "handed out {id}");
        assert!(!(id == "p4" && started > reported_at), "handed out p4 after its report");
        seen.insert(id);
    }
    assert!(
        seen.is_superset(&HashSet::from(["p0".into(), "p1".into(), "p2".into(), "p3".into()])),
        "{seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn exclusive_leases_are_never_double_granted_under_1000_concurrent_requests() {
    let fleet = Arc::new(Fleet::new(FleetSettings::default(), Arc::new(Metrics::new())));
    fleet.publish(members(50));
    let all: Vec<String> = (0..50).map(|i| format!("p{i}")).collect();
    verdicts(&fleet, &all.iter().map(String::as_str).collect::<Vec<_>>(), &[]);
    let addr = serve(&fleet, ApiAuth::open()).await;
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..1000 {
        calls.spawn(async move {
            call(addr, "POST", "/v1/leases", r#"{"pool":"default/crawl","ttlSeconds":600}"#, None)
                .await
        });
    }
    let mut granted = Vec::new();
    while let Some(result) = calls.join_next().await {
        let (status, body) = result.unwrap();
        match status {
            201 => granted.push((field(&body, "proxyId"), field(&body, "id"))),
            503 => assert!(body.contains("no available proxy"), "{body}"),
            other => panic!("{other}: {body}"),
        }
    }
    let proxies: HashSet<&String> = granted.iter().map(|(p, _)| p).collect();
    assert_eq!(granted.len(), 50, "one lease per proxy");
    assert_eq!(proxies.len(), 50, "no proxy leased twice");
    // Nothing is left for `next`, and a released proxy comes back.
    assert_eq!(call(addr, "GET", "/v1/proxies/next", "", None).await.0, 503);
    let (proxy, lease) = &granted[0];
    assert_eq!(call(addr, "DELETE", &format!("/v1/leases/{lease}"), "", None).await.0, 204);
    let (status, body) = call(addr, "GET", "/v1/proxies/next", "", None).await;
    assert_eq!((status, field(&body, "id")), (200, proxy.clone()));
    assert_eq!(call(addr, "DELETE", &format!("/v1/leases/{lease}"), "", None).await.0, 404);
}

#[tokio::test(flavor = "multi_thread")]
async fn expired_leases_return_to_the_pool_and_renewals_keep_them() {
    let fleet = Arc::new(Fleet::new(FleetSettings::default(), Arc::new(Metrics::new())));
    fleet.publish(members(1));
    verdicts(&fleet, &["p0"], &[]);
    let addr = serve(&fleet, ApiAuth::open()).await;
    let (status, body) = call(addr, "POST", "/v1/leases", r#"{"ttlSeconds":1}"#, None).await;
    assert_eq!(status, 201, "{body}");
    let lease = field(&body, "id");
    assert_eq!(call(addr, "GET", "/v1/proxies/next", "", None).await.0, 503);
    let (status, body) =
        call(addr, "POST", &format!("/v1/leases/{lease}/renew"), r#"{"ttlSeconds":2}"#, None).await;
    assert_eq!(status, 200, "{body}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, _) = call(addr, "GET", "/v1/proxies/next", "", None).await;
        if status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "the expired lease never let the proxy go");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, body) = call(addr, "POST", &format!("/v1/leases/{lease}/renew"), "", None).await;
    assert_eq!(status, 404, "an expired lease cannot be renewed: {body}");
    assert_eq!(call(addr, "GET", "/v1/leases", "", None).await.1, r#"{"items":[]}"#);
}

#[tokio::test(flavor = "multi_thread")]
async fn tokens_guard_the_api_and_the_list_can_stay_open() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "crawler-token\n").unwrap();
    let fleet = Arc::new(Fleet::new(FleetSettings::default(), Arc::new(Metrics::new())));
    fleet.publish(members(1));
    verdicts(&fleet, &["p0"], &[]);
    let addr = serve(&fleet, ApiAuth::from_file(tokens, true).unwrap()).await;
    let (status, body) = call(addr, "GET", "/v1/proxies/next", "", None).await;
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("Authorization: Bearer"), "{body}");
    assert_eq!(call(addr, "GET", "/v1/proxies/next", "", Some("guess")).await.0, 401);
    assert_eq!(call(addr, "GET", "/v1/proxies/next", "", Some("crawler-token")).await.0, 200);
    assert_eq!(call(addr, "POST", "/v1/leases", "", None).await.0, 401);
    assert_eq!(call(addr, "GET", "/v1/proxies", "", None).await.0, 200, "open read");
    for public in ["/healthz", "/metrics", "/v1/echo"] {
        assert_eq!(call(addr, "GET", public, "", None).await.0, 200, "{public}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn without_tokens_reads_are_open_and_requests_that_change_state_are_refused() {
    let fleet = Arc::new(Fleet::new(FleetSettings::default(), Arc::new(Metrics::new())));
    fleet.publish(members(1));
    verdicts(&fleet, &["p0"], &[]);
    let addr = serve(&fleet, ApiAuth::reads_only()).await;
    for read in ["/v1/proxies", "/v1/proxies/next", "/v1/proxies/p0", "/v1/leases", "/v1/providers"]
    {
        assert_eq!(call(addr, "GET", read, "", None).await.0, 200, "{read}");
    }
    let writes = [
        ("POST", "/v1/proxies/p0/report", r#"{"kind":"ban"}"#),
        ("POST", "/v1/leases", r#"{"ttlSeconds":60}"#),
        ("POST", "/v1/leases/l1/renew", ""),
        ("DELETE", "/v1/leases/l1", ""),
        ("POST", "/v1/providers/lab/rollback", ""),
    ];
    for (method, path, body) in writes {
        let (status, answer) = call(addr, method, path, body, Some("anything")).await;
        assert_eq!(status, 403, "{method} {path}: {answer}");
        assert!(
            answer.contains("--api-token-file") && answer.contains("--api-open-writes"),
            "{answer}"
        );
    }
    assert_eq!(
        fleet.get("p0").unwrap().quarantined_until,
        None,
        "the refused report changed nothing"
    );
    // A route that does not exist is not a write: it is not found.
    for method in ["PUT", "POST", "OPTIONS"] {
        assert_eq!(call(addr, method, "/v1/nowhere", "", None).await.0, 404, "{method}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_requests_name_the_field() {
    let fleet = Arc::new(Fleet::new(FleetSettings::default(), Arc::new(Metrics::new())));
    let addr = serve(&fleet, ApiAuth::open()).await;
    let (status, body) = call(addr, "POST", "/v1/leases", r#"{"ttl":5}"#, None).await;
    assert_eq!(status, 400);
    assert!(body.contains("unknown field `ttl`"), "{body}");
    let (status, body) = call(addr, "GET", "/v1/proxies?colour=red", "", None).await;
    assert_eq!(status, 400);
    assert!(body.contains("colour"), "{body}");
    let (status, body) =
        call(addr, "POST", "/v1/proxies/p0/report", r#"{"kind":"slow"}"#, None).await;
    assert_eq!(status, 400);
    assert!(body.contains("kind") || body.contains("slow"), "{body}");
    assert_eq!(call(addr, "GET", "/readyz", "", None).await.0, 503, "not ready before a round");
}

/// Every method and path of docs/discovery-api.yaml reaches a handler, and
/// a path the file leaves out gets the no-route answer.
#[tokio::test(flavor = "multi_thread")]
async fn the_openapi_file_and_the_router_agree() {
    let file = proxyfleet_tests::workspace_root().join("docs/discovery-api.yaml");
    let doc: yaml_serde::Value =
        yaml_serde::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    let fleet = Arc::new(Fleet::new(FleetSettings::default(), Arc::new(Metrics::new())));
    let addr = serve(&fleet, ApiAuth::open()).await;
    let mut documented = 0;
    for (path, item) in doc["paths"].as_mapping().unwrap() {
        let path = path.as_str().unwrap().replace("{id}", "some-id").replace("{entry}", "lab");
        for (method, _) in item.as_mapping().unwrap() {
            let method = method.as_str().unwrap().to_uppercase();
            if method == "PARAMETERS" {
                continue;
            }
            let (status, body) = call(addr, &method, &path, "", None).await;
            assert!(
                !body.contains("no route"),
                "{method} {path} is documented but not routed: {status} {body}"
            );
            documented += 1;
        }
    }
    assert_eq!(documented, 14);
    let (status, body) = call(addr, "GET", "/v1/undocumented", "", None).await;
    assert_eq!(status, 404);
    assert!(body.contains("no route"), "{body}");
}
