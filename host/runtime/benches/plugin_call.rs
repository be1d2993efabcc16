//! `plugin_call`: what a provider call costs.
//!
//! - `fresh_instance`: the production path, a new store and instance per
//!   call (InstancePre + pooling allocator + copy-on-write memory).
//! - `reused_instance`: the same call on a pinned instance.
//! - `native`: the same work through a native `Provider` impl.
//! - `fresh_instance_one_request`: a fresh-instance call that sends one
//!   HTTP request through the whole capability (allow-list, address
//!   policy, in-flight caps, request-body counting, response cap) to a
//!   server on loopback, and returns what it read.
//! - `deadline_overrun`: a plugin looping forever under a 50 ms deadline;
//!   the figure minus 50 ms is how late the host stops it.
//! - `static_get/<n>`: the `static` plugin's `get` of an assigned endpoint
//!   on an entry of `n` endpoints. A call reads its endpoint from the
//!   entry's lookup table, so the figure should not grow with `n`.
//!
//! Needs the built plugins and fixtures: `cargo xtask plugins`, then
//! `cargo bench -p proxyfleet-runtime --bench plugin_call`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use criterion::{Criterion, criterion_group, criterion_main};
use proxyfleet_core::kv::MemoryKv;
use proxyfleet_core::{
    Health, Instance, InstanceState, PluginInfo, Provider, ProviderError, ProxySpec,
};
use proxyfleet_runtime::config::{EntryConfig, Grants, Limits, ProvidersConfig};
use proxyfleet_runtime::{PluginProvider, Runtime, RuntimeOptions};

fn fixture(name: &str) -> PathBuf {
    built(&format!("fixtures/{name}"))
}

fn built(name: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/plugins")
        .join(format!("{name}.wasm"));
    assert!(path.is_file(), "{} is missing: run `cargo xtask plugins` first", path.display());
    path
}

fn entry(name: &str, limits: Limits) -> EntryConfig {
    entry_with(name, limits, Grants::default())
}

fn entry_with(name: &str, limits: Limits, grants: Grants) -> EntryConfig {
    EntryConfig {
        name: name.into(),
        plugin: name.into(),
        oci: None,
        config: serde_json::json!({}),
        grants,
        limits,
        pin: None,
        verify: None,
        // The fixtures report loopback addresses, which only an entry that
        // names the range keeps.
        proxy_addresses: vec!["127.0.0.0/8".parse().expect("a range")],
    }
}

async fn provider(runtime: &Runtime, name: &str, limits: Limits) -> PluginProvider {
    let revision = runtime.load_plugin(&fixture(name)).await.expect("fixture loads");
    PluginProvider::new(runtime, entry(name, limits), revision, Arc::new(MemoryKv::new()))
        .await
        .expect("entry binds")
}

/// An origin on loopback answering every request with `ok`, served on
/// `rt`'s threads.
fn origin(rt: &tokio::runtime::Runtime) -> std::net::SocketAddr {
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().unwrap();
    rt.spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|_request| async {
                    Ok::<_, std::convert::Infallible>(hyper::Response::new(
                        http_body_util::Full::new(bytes::Bytes::from_static(b"ok")),
                    ))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

/// The native twin of the `noop` fixture's `get`.
struct NativeNoop;

#[async_trait]
impl Provider for NativeNoop {
    fn entry(&self) -> &str {
        "native"
    }
    fn info(&self) -> PluginInfo {
        unreachable!("not benchmarked")
    }
    async fn create(&self, _spec: &ProxySpec) -> Result<Instance, ProviderError> {
        unreachable!("not benchmarked")
    }
    async fn get(&self, provider_id: &str) -> Result<Instance, ProviderError> {
        Ok(Instance {
            provider_id: provider_id.to_owned(),
            name: provider_id.to_owned(),
            state: InstanceState::Running,
            addresses: vec!["127.0.0.1".to_owned()],
            port: None,
            created_at: None,
            mark: None,
        })
    }
    async fn delete(&self, _provider_id: &str) -> Result<(), ProviderError> {
        Ok(())
    }
    async fn list(&self) -> Result<Vec<Instance>, ProviderError> {
        Ok(Vec::new())
    }
    async fn check(&self) -> Health {
        Health::ok()
    }
}

fn plugin_call(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let runtime = Runtime::new(RuntimeOptions::default()).unwrap();
    eprintln!("pooling allocator: {}", runtime.uses_pooling());
    let noop = rt.block_on(provider(&runtime, "noop", Limits::default()));

    let mut group = c.benchmark_group("plugin_call");
    group.bench_function("fresh_instance", |b| {
        b.to_async(&rt).iter(|| async { noop.get("vm-1").await.unwrap() });
    });
    let mut pinned = rt.block_on(noop.pin()).unwrap();
    group.bench_function("reused_instance", |b| {
        b.iter(|| rt.block_on(pinned.get("vm-1")).unwrap());
    });
    drop(pinned);
    let native: Arc<dyn Provider> = Arc::new(NativeNoop);
    group.bench_function("native", |b| {
        b.to_async(&rt).iter(|| async { native.get("vm-1").await.unwrap() });
    });

    let addr = origin(&rt);
    let grants = format!(
        "providers:\n  - name: fetch\n    plugin: http-fetch\n    grants:\n      http:\n        \
         - {{ url: 'http://{addr}', allowAddresses: [127.0.0.1] }}\n"
    );
    let grants = ProvidersConfig::parse(&grants).unwrap().entries.remove(0).grants;
    let fetch = rt.block_on(async {
        let revision = runtime.load_plugin(&fixture("http-fetch")).await.expect("fixture loads");
        PluginProvider::new(
            &runtime,
            entry_with("http-fetch", Limits::default(), grants),
            revision,
            Arc::new(MemoryKv::new()),
        )
        .await
        .expect("entry binds")
    });
    let url = format!("http://{addr}/ok");
    group.bench_function("fresh_instance_one_request", |b| {
        b.to_async(&rt).iter(|| async { fetch.get(&url).await.unwrap() });
    });
    group.finish();

    let limits = Limits { call_timeout: Duration::from_millis(50), ..Limits::default() };
    let spin = rt.block_on(provider(&runtime, "spin", limits));
    let spec = ProxySpec {
        name: "x".into(),
        namespace: "default".into(),
        uid: "uid-x".into(),
        cores: 1,
        memory_mib: 512,
        disk_gib: 4,
        image: String::new(),
        placement: Vec::new(),
        vlan_tag: None,
        port: 3128,
        user_data: Vec::new(),
        labels: Vec::new(),
        proxy_auth: None,
    };
    let mut group = c.benchmark_group("deadline_overrun");
    group.sample_size(10).measurement_time(Duration::from_secs(3));
    group.bench_function("spin_50ms_deadline", |b| {
        b.to_async(&rt).iter(|| async { spin.create(&spec).await.unwrap_err() });
    });
    group.finish();

    let mut group = c.benchmark_group("static_get");
    for endpoints in [100, 10_000] {
        let (entry, id) = rt.block_on(static_entry(&runtime, endpoints, &spec));
        group.bench_function(endpoints.to_string(), |b| {
            b.to_async(&rt).iter(|| async { entry.get(&id).await.unwrap() });
        });
    }
    group.finish();
}

/// A `static` entry of `endpoints` endpoints with one of them assigned to
/// `spec`, and that endpoint's ID.
async fn static_entry(
    runtime: &Runtime,
    endpoints: usize,
    spec: &ProxySpec,
) -> (PluginProvider, String) {
    let list: Vec<String> = (0..endpoints)
        .map(|i| format!("10.{}.{}.{}:3128", i / 65_536, i / 256 % 256, i % 256))
        .collect();
    let entry = EntryConfig {
        config: serde_json::json!({ "endpoints": list }),
        proxy_addresses: vec!["10.0.0.0/8".parse().expect("a range")],
        ..entry("static", Limits::default())
    };
    let revision = runtime.load_plugin(&built("static")).await.expect("the plugin loads");
    let provider = PluginProvider::new(runtime, entry, revision, Arc::new(MemoryKv::new()))
        .await
        .expect("entry binds");
    let id = provider.create(spec).await.expect("an endpoint").provider_id;
    (provider, id)
}

criterion_group!(benches, plugin_call);
criterion_main!(benches);
