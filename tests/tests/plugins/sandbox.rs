//! The sandbox's bounds against the `hostile` fixture, a plugin that
//! drives raw `wasi:http` the way an attacker would. Each test is named
//! for the attack it pins.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use proxyfleet_core::kv::MemoryKv;
use proxyfleet_core::{ErrorClass, Provider};
use proxyfleet_runtime::config::ProvidersConfig;
use proxyfleet_runtime::{EntryState, Registry, Runtime, RuntimeOptions};
use proxyfleet_tests::{Canned, TestServer, fetch_provider, fixture_provider, plugin};
use serde_json::Value;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;

/// The fixture imports libvirt (its libvirt attacks run in the libvirt
/// tier), so its entry must grant libvirt to load; this one names a host
/// that is never reached here.
const UNUSED_LIBVIRT: &str = "      libvirt:\n        - { host: kvm.invalid, user: pf, \
     keyFile: /nonexistent/key, knownHostsFile: /nonexistent/known_hosts, pools: [default] }\n";

fn grant(port: u16) -> String {
    format!(
        "      http:\n        - {{ url: 'http://127.0.0.1:{port}', allowAddresses: [127.0.0.1] }}\n{UNUSED_LIBVIRT}"
    )
}

async fn hostile(dir: &std::path::Path, port: u16, limits: &str) -> Arc<dyn Provider> {
    fixture_provider(dir, "hostile", &grant(port), limits).await
}

/// What the fixture reported of an attack.
async fn attack(provider: &dyn Provider, command: &str) -> Value {
    let instance = provider.get(command).await.unwrap_or_else(|err| panic!("{command}: {err}"));
    serde_json::from_str(&instance.name).expect("a JSON report")
}

/// A server that accepts connections, counts them and never answers.
async fn silent_server() -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&accepted);
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            held.push(stream);
        }
    });
    (port, accepted)
}

/// A server that answers every request with the request's own head, as a
/// backend answering TRACE, or one quoting a request in an error, does.
async fn reflecting_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0_u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    head.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
                let _ = stream.write_all(&head).await;
            });
        }
    });
    port
}

/// A server that answers every request with each of its headers reflected
/// as a response header `x-echo-<name>`, and with a body of the request's
/// head and the user and password of a Basic credential, decoded: a
/// backend quoting a request in an error does as much. The body goes out
/// in two writes, cut inside the credential, so the host reads it in two
/// chunks.
async fn echoing_server() -> u16 {
    use base64::Engine as _;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0_u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&head).into_owned();
                let mut echoed = String::new();
                let mut body = text.clone();
                for line in text.lines().skip(1).filter(|line| !line.is_empty()) {
                    let Some((name, value)) = line.split_once(": ") else { continue };
                    echoed.push_str(&format!("x-echo-{name}: {value}\r\n"));
                    if let Some(token) = value.strip_prefix("Basic ")
                        && let Ok(pair) = base64::engine::general_purpose::STANDARD.decode(token)
                    {
                        body.push_str(&format!(
                            "user and password: {}\n",
                            String::from_utf8_lossy(&pair)
                        ));
                    }
                }
                let answer = format!(
                    "HTTP/1.1 200 OK\r\n{echoed}content-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let cut = body.find("Basic ").map_or(0, |at| at + 12);
                let _ = stream.write_all(answer.as_bytes()).await;
                let _ = stream.write_all(&body.as_bytes()[..cut]).await;
                let _ = stream.flush().await;
                tokio::time::sleep(Duration::from_millis(50)).await;
                let _ = stream.write_all(&body.as_bytes()[cut..]).await;
            });
        }
    });
    port
}

/// Issue 15, item 1: a streamed request body was buffered whole before
/// its size was checked (512 MiB raised host RSS by about 1 GiB).
#[tokio::test]
async fn a_streamed_request_body_is_cut_off_at_its_own_limit() {
    let server = TestServer::http(Canned { status: 200, body: "ok".into() }).await;
    let dir = tempfile::tempdir().unwrap();
    let provider = hostile(dir.path(), server.addr.port(), "httpRequestMiB: 1").await;
    let url = format!("http://127.0.0.1:{}/upload", server.addr.port());

    let report = attack(&*provider, &format!("stream {url} 64")).await;
    assert_eq!(report["outcome"], "ErrorCode::HttpRequestBodySize(Some(1052672))", "{report}");
    let written = report["written"].as_u64().unwrap();
    assert!(written < 2 << 20, "the host stopped taking the body near 1 MiB: {report}");
    assert!(server.seen().is_empty(), "nothing was sent");

    // Within the limit, the body goes out.
    let report = attack(&*provider, &format!("stream {url} 1")).await;
    assert_eq!(report["outcome"], "status 200", "{report}");
    assert_eq!(server.seen().len(), 1);
}

/// Issue 15, item 7: TRACE reached the backend, and a backend answering it
/// reflects the injected credential to the plugin; CONNECT passed too.
#[tokio::test]
async fn trace_and_connect_are_refused_before_anything_is_sent() {
    let server = TestServer::http(Canned { status: 200, body: "ok".into() }).await;
    let dir = tempfile::tempdir().unwrap();
    let provider = hostile(dir.path(), server.addr.port(), "").await;
    let url = format!("http://127.0.0.1:{}/", server.addr.port());
    for method in ["TRACE", "CONNECT"] {
        let report = attack(&*provider, &format!("method {method} {url}")).await;
        assert_eq!(report["outcome"], "ErrorCode::HttpRequestMethodInvalid", "{method}: {report}");
    }
    assert!(server.seen().is_empty());
    let report = attack(&*provider, &format!("method GET {url}")).await;
    assert_eq!(report["outcome"], "status 200", "{report}");
}

/// Issue 15, item 7: whatever a plugin returned went on unchecked, so a
/// credential reflected by a backend reached statuses, spans and Events.
#[tokio::test]
async fn an_injected_credential_never_leaves_in_a_returned_instance() {
    let port = reflecting_server().await;
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("token");
    std::fs::write(&secret_file, "s3cret-token-9\n").unwrap();
    let grants = format!(
        "      http:\n        - url: http://127.0.0.1:{port}\n          allowAddresses: [127.0.0.1]\n          credential: {{ header: Authorization, valueTemplate: 'Bearer {{secret}}', secretFile: {} }}\n",
        secret_file.display()
    );
    let fetch = fetch_provider(dir.path(), &grants, "").await;
    // http-fetch returns the response body in the instance's name, and
    // the URL it fetched as the instance's id.
    let answer = fetch.get(&format!("http://127.0.0.1:{port}/")).await.unwrap();
    assert!(!answer.name.contains("s3cret"), "{}", answer.name);
    assert!(answer.name.contains("[redacted]"), "{}", answer.name);
    let err = fetch.get(&format!("http://127.0.0.1:{port}/s3cret-token-9")).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::PluginFault, "{err}");
    assert!(err.message.contains("id holds a credential"), "{err}");
    assert!(!err.message.contains("s3cret"), "{err}");
}

/// Issue 43, item 12: a plugin that made a granted backend echo request
/// headers read the injected credential back and returned it hex-encoded
/// (or reversed) in instance fields and logs, where the host's redaction
/// of exact copies cannot see it. The credential is now taken out of the
/// answer before the plugin reads it: in the reflected headers, in the
/// body (cut in two chunks inside the credential), and in its decoded
/// form, while the rest of what the backend reflected reaches the plugin.
#[tokio::test(flavor = "current_thread")]
async fn issue_43_item_12_a_reflected_credential_is_taken_out_before_the_plugin_reads_it() {
    use base64::Engine as _;
    let logs = proxyfleet_tests::CapturedLogs::default();
    let _guard = logs.install();
    let port = echoing_server().await;
    let dir = tempfile::tempdir().unwrap();
    let pair = "svc:Pa55-w0rd-77";
    let basic = base64::engine::general_purpose::STANDARD.encode(pair);
    let secret_file = dir.path().join("basic");
    std::fs::write(&secret_file, format!("{basic}\n")).unwrap();
    let grants = format!(
        "      http:\n        - url: http://127.0.0.1:{port}\n          allowAddresses: [127.0.0.1]\n          credential: {{ header: Authorization, valueTemplate: 'Basic {{secret}}', secretFile: {} }}\n",
        secret_file.display()
    ) + UNUSED_LIBVIRT;
    let provider = fixture_provider(dir.path(), "hostile", &grants, "").await;

    let report = attack(&*provider, &format!("reflect http://127.0.0.1:{port}/echo")).await;
    assert_eq!(report["status"], 200, "{report}");
    let logged = logs.text();
    let seen = |text: &str| logged.contains(&hex::encode(text));
    // What the plugin got, hex-encoded in its log record: the reflection
    // itself reached it, in headers and body, ...
    assert!(seen("x-echo-x-probe: reflect-probe-7\n"), "{logged}");
    assert!(seen("x-probe: reflect-probe-7\r\n"), "{logged}");
    assert!(seen("x-echo-accept-encoding: identity\n"), "identity is asked for: {logged}");
    assert!(seen("authorization: [redacted]"), "{logged}");
    // ... and no form of the credential did.
    for form in [basic.as_str(), &format!("Basic {basic}"), pair, "Pa55-w0rd-77", &basic[..12]] {
        assert!(!seen(form), "the plugin read {form:?}: {logged}");
    }
}

/// Issue 43, item 10: a provider id of 1 MiB was stored, and every later
/// call of that Proxy logged it (9.4 MB per call). The answer is refused as
/// `plugin-fault`, naming the field and its bound, and nothing of the id
/// reaches the error or the logs.
#[tokio::test(flavor = "current_thread")]
async fn a_provider_id_of_1_mib_is_refused_as_a_plugin_fault() {
    let logs = proxyfleet_tests::CapturedLogs::default();
    let _guard = logs.install();
    let dir = tempfile::tempdir().unwrap();
    let provider = hostile(dir.path(), 9, "").await;
    let mut spec = proxyfleet_harness::SpecBuilder::new("huge").build();
    spec.image = "oversize-id".into();

    let err = provider.create(&spec).await.expect_err("the answer is refused");
    assert_eq!(err.class, ErrorClass::PluginFault, "{err}");
    assert!(
        err.message.contains("instance.provider-id of 1048576 bytes, over the bound of 512 bytes"),
        "{err}"
    );
    assert!(err.message.len() < 200, "{err}");
    let logged = logs.text();
    assert!(!logged.contains(&"i".repeat(64)), "the id was logged");
    assert!(logged.len() < 64 << 10, "{} bytes of logs", logged.len());
}

/// Issue 15, item 3: one call opened 3,000 connections to a server that
/// never answered, until the host ran out of file descriptors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_call_cannot_open_more_requests_than_its_cap() {
    let (port, accepted) = silent_server().await;
    let dir = tempfile::tempdir().unwrap();
    let provider = hostile(dir.path(), port, "httpInFlightPerCall: 4").await;
    let report = attack(&*provider, &format!("flood http://127.0.0.1:{port}/ 200 300")).await;
    assert_eq!(report["pending"], 4, "{report}");
    assert_eq!(report["failed"], 196, "{report}");
    assert_eq!(
        report["errors"],
        serde_json::json!(["ErrorCode::ConnectionLimitReached"]),
        "{report}"
    );
    let accepted = accepted.load(Ordering::SeqCst);
    assert!(accepted <= 4, "{accepted} connections");
}

/// Issue 15, item 3: the entry's cap holds across calls: more calls do not
/// add connections, they wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_together_cannot_open_more_requests_than_the_entry_cap() {
    let (port, accepted) = silent_server().await;
    let dir = tempfile::tempdir().unwrap();
    let provider =
        hostile(dir.path(), port, "httpInFlight: 6, httpInFlightPerCall: 4, concurrency: 4").await;
    // Four calls of four requests each, held for 5 s: while they are held,
    // only the entry's cap of them may connect.
    let command = format!("flood http://127.0.0.1:{port}/ 4 5000");
    let calls = (0..4).map(|_| attack(&*provider, &command));
    let watch = async {
        let six = proxyfleet_tests::wait_for(Duration::from_secs(5), || async {
            (accepted.load(Ordering::SeqCst) >= 6).then_some(())
        })
        .await;
        assert!(six.is_some(), "the first six requests connect");
        tokio::time::sleep(Duration::from_millis(500)).await;
        accepted.load(Ordering::SeqCst)
    };
    let (reports, held) = tokio::join!(futures::future::join_all(calls), watch);
    assert_eq!(held, 6, "connections while the calls held their requests");
    let pending: u64 = reports.iter().map(|r| r["pending"].as_u64().unwrap()).sum();
    assert_eq!(pending, 16, "waiting for the entry's cap is not failing: {reports:?}");
}

/// Issue 15, item 2: `wasi:http` header maps live in host memory outside
/// `memoryMiB`; 8,192 maps of 120 KB were all kept (+944 MiB).
#[tokio::test]
async fn header_maps_are_bounded_by_the_resource_cap() {
    let dir = tempfile::tempdir().unwrap();
    let provider = hostile(dir.path(), 9, "memoryMiB: 16").await;
    let err = provider.get("headers 8192").await.unwrap_err();
    assert_eq!(err.class, ErrorClass::PluginFault, "{err}");
    // 16 MiB of plugin memory allows 512 resources of at most 32 KiB.
    let report = attack(&*provider, "headers 400").await;
    assert_eq!(report["made"], 400, "{report}");
    // One map past 32 KiB traps the call.
    let err = provider.get("header-size 40000").await.unwrap_err();
    assert_eq!(err.class, ErrorClass::PluginFault, "{err}");
    assert_eq!(attack(&*provider, "header-size 20000").await["appended"], true);
}

/// Issue 15, item 9: the plugin store had no quota; one call wrote 2,000
/// values of 64 KiB.
#[tokio::test]
async fn a_call_cannot_fill_the_store_past_the_entry_quota() {
    let dir = tempfile::tempdir().unwrap();
    let provider = hostile(dir.path(), 9, "kvTotalKiB: 256").await;
    let report = attack(&*provider, "kv-fill 2000 65000").await;
    assert_eq!(report["written"], 4, "{report}");
    let error = report["error"].as_str().unwrap();
    assert!(error.contains("limits.kvTotalKiB"), "{error}");

    let provider = hostile(dir.path(), 9, "kvWritesPerCall: 10").await;
    let report = attack(&*provider, "kv-fill 2000 10").await;
    assert_eq!(report["written"], 10, "{report}");
    assert!(report["error"].as_str().unwrap().contains("limits.kvWritesPerCall"), "{report}");
}

/// A plugin that hands the proxy credential of a spec back, in a log
/// record, an instance's name or an error, gets none of it past the host:
/// the password shows nowhere, in any form a backend echoes it in.
#[tokio::test(flavor = "current_thread")]
async fn a_plugin_cannot_hand_back_the_proxy_credential() {
    let logs = proxyfleet_tests::CapturedLogs::default();
    let _guard = logs.install();
    let dir = tempfile::tempdir().unwrap();
    let provider = hostile(dir.path(), 9, "").await;
    let credential = proxyfleet_core::credential::ProxyCredential::parse("crawler:Leak3d-pw").ok();
    let mut spec = proxyfleet_harness::SpecBuilder::new("leaky").build();
    spec.image = "leak-proxy-auth".into();
    spec.proxy_auth = credential;

    let instance = provider.create(&spec).await.expect("the fixture answers");
    assert!(instance.name.contains("[redacted]"), "{}", instance.name);
    spec.placement.push(("in-id".into(), "1".into()));
    let refused = provider.create(&spec).await.expect_err("an id holding it is refused");
    assert_eq!(refused.class, ErrorClass::PluginFault, "{refused}");
    spec.placement = vec![("fail".into(), "1".into())];
    let err = provider.create(&spec).await.expect_err("the fixture fails");
    assert_eq!(err.class, ErrorClass::Permanent);
    assert!(err.message.contains("[redacted]"), "{err}");
    let logged = logs.text();
    assert!(logged.contains("leaking the credential"), "{logged}");
    for text in [&instance.name, &refused.message, &err.message, &logged] {
        assert!(!text.contains("Leak3d-pw"), "the password shows: {text}");
    }
    assert!(instance.name.starts_with("user crawler"), "the username is no secret");
}

/// The `hostile` fixture on an entry whose config is `config` (a YAML flow
/// map): its lookup table follows the config.
async fn with_table(dir: &std::path::Path, config: &str) -> Registry {
    std::fs::copy(plugin("fixtures/hostile"), dir.join("hostile.wasm")).expect("copy fixture");
    let yaml = format!(
        "providers:\n  - name: table\n    plugin: hostile\n    config: {config}\n    grants:\n{UNUSED_LIBVIRT}"
    );
    let config = ProvidersConfig::parse(&yaml).expect("valid providers file");
    let runtime = Runtime::new(RuntimeOptions::default()).expect("runtime");
    Registry::load(&runtime, &config, dir, Arc::new(MemoryKv::new()))
        .await
        .expect("plugin directory readable")
}

fn refusal(registry: &Registry) -> String {
    match &registry.entries()["table"] {
        EntryState::Failed(reason) => reason.clone(),
        _ => panic!("the entry must not serve"),
    }
}

/// A call reads one value of the table its revision answered, and the
/// whole config only when it asks for it.
#[tokio::test]
async fn a_call_reads_single_values_of_the_lookup_table() {
    let dir = tempfile::tempdir().unwrap();
    let registry = with_table(dir.path(), "{ tableKeys: 3, tableValueBytes: 5 }").await;
    let provider = registry.provider("table").expect("the entry serves");
    let found = attack(provider.as_ref(), "lookup k/2").await;
    assert_eq!(found["value"], "vvvvv");
    let config_bytes = found["config_bytes"].as_u64().expect("a size");
    assert_eq!(config_bytes, r#"{"tableKeys":3,"tableValueBytes":5}"#.len() as u64);
    assert_eq!(attack(provider.as_ref(), "lookup k/3").await["value"], Value::Null);
}

/// The host holds a revision's table for as long as it serves the entry,
/// so its size is bounded by the config's, not by the plugin's wishes.
#[tokio::test]
async fn a_lookup_table_past_four_times_the_config_refuses_the_entry() {
    let dir = tempfile::tempdir().unwrap();
    let registry = with_table(dir.path(), "{ tableKeys: 2, tableValueBytes: 40000 }").await;
    let reason = refusal(&registry);
    assert!(reason.contains("lookup table of 80006 bytes"), "{reason}");
    assert!(reason.contains("four times its size plus 64 KiB"), "{reason}");
}

#[tokio::test]
async fn a_lookup_table_answering_a_key_twice_refuses_the_entry() {
    let dir = tempfile::tempdir().unwrap();
    let registry = with_table(dir.path(), "{ tableKeys: 2, tableRepeat: true }").await;
    let reason = refusal(&registry);
    assert!(reason.contains("the key \"k/0\" twice"), "{reason}");
}

/// Issue 47, item 11: a component that imports the libvirt interface
/// loaded for an entry with no libvirt grant (the docs said the host would
/// refuse it). It is refused as a widening, naming the grant and the
/// import, and serves once the entry grants libvirt.
#[tokio::test]
async fn issue_47_item_11_a_build_importing_libvirt_needs_a_libvirt_grant() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(plugin("fixtures/libvirt-probe"), dir.path().join("libvirt-probe.wasm"))
        .expect("copy fixture");
    let runtime = Runtime::new(RuntimeOptions::default()).expect("runtime");
    let load = |grants: &str| {
        let yaml = format!(
            "providers:\n  - name: probe\n    plugin: libvirt-probe\n    config: {{ host: kvm.invalid, pool: default }}\n{grants}"
        );
        let config = ProvidersConfig::parse(&yaml).expect("valid providers file");
        let (runtime, dir) = (runtime.clone(), dir.path().to_owned());
        async move {
            Registry::load(&runtime, &config, &dir, Arc::new(MemoryKv::new()))
                .await
                .expect("plugin directory readable")
        }
    };
    let refused = load("").await;
    match &refused.entries()["probe"] {
        EntryState::Failed(reason) => assert!(
            reason.contains(
                "asks for what the entry does not grant: grants.libvirt (the build \
                             imports proxyfleet:provider/libvirt@"
            ),
            "{reason}"
        ),
        other => panic!("the entry should be refused: {other:?}"),
    }
    let granted = load(&format!("    grants:\n{UNUSED_LIBVIRT}")).await;
    assert!(granted.provider("probe").is_ok(), "{:?}", granted.entries()["probe"]);
}
