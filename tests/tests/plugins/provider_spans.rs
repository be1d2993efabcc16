//! Every provider call is one `provider.call` span, the plugin's log lines
//! and HTTP requests sit inside it, and faults are recorded on it.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use proxyfleet_core::kv::MemoryKv;
use proxyfleet_harness::SpecBuilder;
use proxyfleet_runtime::config::ProvidersConfig;
use proxyfleet_runtime::{Registry, Runtime, RuntimeOptions};
use proxyfleet_tests::{Canned, TestServer, plugin};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt as _};
use tracing_subscriber::registry::LookupSpan;

/// A span as it stood when it closed.
#[derive(Debug, Clone)]
struct SeenSpan {
    name: String,
    /// Names of the enclosing spans, innermost first.
    ancestors: Vec<String>,
    fields: BTreeMap<String, String>,
}

impl SeenSpan {
    fn field(&self, name: &str) -> &str {
        self.fields.get(name).map_or("", String::as_str)
    }
}

/// An event and the span it was emitted in.
#[derive(Debug, Clone)]
struct SeenEvent {
    span: Option<String>,
    span_fields: BTreeMap<String, String>,
    fields: BTreeMap<String, String>,
}

#[derive(Debug, Default)]
struct Seen {
    spans: Vec<SeenSpan>,
    events: Vec<SeenEvent>,
}

/// A layer that keeps every span (with the fields recorded on it later)
/// and every event, with the names of their parents.
#[derive(Debug, Clone, Default)]
struct Capture(Arc<Mutex<Seen>>);

#[derive(Default)]
struct Fields(BTreeMap<String, String>);

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        let span = ctx.span(id).expect("a new span is registered");
        let ancestors = span.scope().skip(1).map(|p| p.name().to_owned()).collect();
        span.extensions_mut().insert(SeenSpan {
            name: attrs.metadata().name().to_owned(),
            ancestors,
            fields: fields.0,
        });
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let span = ctx.span(id).expect("a recorded span is registered");
        let mut extensions = span.extensions_mut();
        if let Some(seen) = extensions.get_mut::<SeenSpan>() {
            let mut fields = Fields(std::mem::take(&mut seen.fields));
            values.record(&mut fields);
            seen.fields = fields.0;
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let parent = ctx.event_span(event);
        let (span, span_fields) = parent
            .and_then(|p| p.extensions().get::<SeenSpan>().cloned())
            .map_or((None, BTreeMap::new()), |s| (Some(s.name), s.fields));
        self.0.lock().unwrap().events.push(SeenEvent { span, span_fields, fields: fields.0 });
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let span = ctx.span(&id).expect("a closing span is registered");
        if let Some(seen) = span.extensions().get::<SeenSpan>() {
            self.0.lock().unwrap().spans.push(seen.clone());
        }
    }
}

impl Capture {
    fn install(&self) -> tracing::subscriber::DefaultGuard {
        proxyfleet_tests::keep_callsites_dynamic();
        let subscriber = tracing_subscriber::registry()
            .with(self.clone())
            .with(tracing_subscriber::filter::LevelFilter::TRACE);
        tracing::subscriber::set_default(subscriber)
    }

    fn spans(&self, name: &str) -> Vec<SeenSpan> {
        self.0.lock().unwrap().spans.iter().filter(|s| s.name == name).cloned().collect()
    }

    fn calls(&self, operation: &str) -> Vec<SeenSpan> {
        let mut calls = self.spans("provider.call");
        calls.retain(|s| s.field("operation") == operation);
        calls
    }

    fn events(&self) -> Vec<SeenEvent> {
        self.0.lock().unwrap().events.clone()
    }
}

/// Loads `yaml` with the listed components copied into `dir`.
async fn load(dir: &Path, components: &[&str], yaml: &str) -> Registry {
    for name in components {
        let file = Path::new(name).file_name().unwrap().to_str().unwrap();
        std::fs::copy(plugin(name), dir.join(format!("{file}.wasm"))).unwrap();
    }
    let config = ProvidersConfig::parse(yaml).unwrap();
    let runtime = Runtime::new(RuntimeOptions::default()).unwrap();
    Registry::load(&runtime, &config, dir, Arc::new(MemoryKv::new())).await.unwrap()
}

#[tokio::test(flavor = "current_thread")]
async fn a_call_is_one_span_holding_the_plugins_logs() {
    let capture = Capture::default();
    let _guard = capture.install();
    let dir = tempfile::tempdir().unwrap();
    let registry = load(
        dir.path(),
        &["static"],
        "providers:\n  - name: office\n    plugin: static\n    config: { endpoints: ['192.0.2.1:3128'] }\n    proxyAddresses: ['192.0.2.0/24']\n",
    )
    .await;
    let provider = registry.provider("office").unwrap();
    let spec = SpecBuilder::new("web-1").namespace("crawl").build();
    provider.create(&spec).await.unwrap();

    let creates = capture.calls("create");
    assert_eq!(creates.len(), 1, "one span per call: {creates:?}");
    let create = &creates[0];
    for (field, value) in
        [("entry", "office"), ("plugin", "static"), ("proxy", "crawl/web-1"), ("result", "ok")]
    {
        assert_eq!(create.field(field), value, "{field} of {create:?}");
    }
    assert!(!create.field("plugin_version").is_empty(), "{create:?}");
    assert!(create.field("elapsed_ms").parse::<u64>().is_ok(), "{create:?}");
    assert_eq!(create.field("fault"), "", "a call that succeeded has no fault");
    assert!(create.ancestors.is_empty(), "nothing else was running: {create:?}");

    let validations = capture.calls("validate-config");
    assert_eq!(validations.len(), 1, "binding the entry validated its config once");
    assert_eq!(validations[0].field("result"), "ok");
    let describe = capture.calls("describe");
    assert_eq!(describe.len(), 1, "loading the plugin described it once");
    assert_eq!(describe[0].field("plugin"), "static");

    let logged = capture
        .events()
        .into_iter()
        .find(|e| e.fields.get("message").is_some_and(|m| m.contains("endpoint assigned")))
        .expect("the plugin logged its assignment");
    assert_eq!(logged.span.as_deref(), Some("provider.call"), "{logged:?}");
    assert_eq!(logged.span_fields.get("operation").map(String::as_str), Some("create"));
}

#[tokio::test(flavor = "current_thread")]
async fn plugin_requests_are_child_spans_without_paths_queries_or_credentials() {
    let capture = Capture::default();
    let _guard = capture.install();
    let server = TestServer::http(Canned { status: 200, body: "hello".into() }).await;
    let port = server.addr.port();
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("token");
    std::fs::write(&secret_file, "s3cret-token").unwrap();
    let yaml = format!(
        "providers:\n  - name: fetch\n    plugin: http-fetch\n    grants:\n      http:\n        - url: http://127.0.0.1:{port}\n          allowAddresses: [127.0.0.1/32]\n          credential: {{ header: Authorization, valueTemplate: 'Bearer {{secret}}', secretFile: {} }}\n",
        secret_file.display()
    );
    let registry = load(dir.path(), &["fixtures/http-fetch"], &yaml).await;
    let fetch = registry.provider("fetch").unwrap();

    fetch.get(&format!("http://127.0.0.1:{port}/api/v1/vms?ticket=q-secret")).await.unwrap();
    assert_eq!(server.seen()[0].header("authorization"), Some("Bearer s3cret-token"));

    let requests = capture.spans("plugin.http");
    assert_eq!(requests.len(), 1, "{requests:?}");
    let request = &requests[0];
    // wasmtime's own trace-level span of the import may sit in between.
    assert!(request.ancestors.iter().any(|a| a == "provider.call"), "{request:?}");
    for (field, value) in [
        ("entry", "fetch"),
        ("method", "GET"),
        ("scheme", "http"),
        ("host", "127.0.0.1"),
        ("port", port.to_string().as_str()),
        ("status", "200"),
    ] {
        assert_eq!(request.field(field), value, "{field} of {request:?}");
    }
    assert!(request.field("elapsed_ms").parse::<u64>().is_ok(), "{request:?}");
    for value in request.fields.values() {
        for leak in ["s3cret", "Bearer", "/api", "ticket", "q-secret"] {
            assert!(!value.contains(leak), "{leak} in the span: {request:?}");
        }
    }
    let gets = capture.calls("get");
    assert_eq!(gets.len(), 1);
    assert_eq!(gets[0].field("result"), "ok");
    let everything = format!("{:?}", capture.0.lock().unwrap());
    assert!(!everything.contains("s3cret"), "the credential reached a span or event");
}

#[tokio::test(flavor = "current_thread")]
async fn faults_are_recorded_on_the_call_span() {
    let capture = Capture::default();
    let _guard = capture.install();
    let dir = tempfile::tempdir().unwrap();
    let registry = load(
        dir.path(),
        &["fixtures/panic", "fixtures/spin", "fixtures/hog"],
        "providers:\n  - name: broken\n    plugin: panic\n  - name: stuck\n    plugin: spin\n    limits: { timeout: 200ms }\n  - name: greedy\n    plugin: hog\n    limits: { memoryMiB: 16 }\n",
    )
    .await;
    let spec = SpecBuilder::new("web-1").build();
    for (entry, class, fault) in [
        ("broken", "plugin-fault", "trap"),
        ("stuck", "timeout", "timeout"),
        ("greedy", "plugin-fault", "memory"),
    ] {
        let err = registry.provider(entry).unwrap().create(&spec).await.unwrap_err();
        assert_eq!(err.class.as_str(), class, "{entry}: {err}");
        let mut creates = capture.calls("create");
        creates.retain(|s| s.field("entry") == entry);
        assert_eq!(creates.len(), 1, "{entry}: {creates:?}");
        assert_eq!(creates[0].field("result"), class, "{entry}: {creates:?}");
        assert_eq!(creates[0].field("fault"), fault, "{entry}: {creates:?}");
    }
    // The trap's backtrace is logged inside the call it ended.
    let trap = capture
        .events()
        .into_iter()
        .find(|e| e.fields.get("message").is_some_and(|m| m.contains("plugin trapped")))
        .expect("the trap is logged");
    assert_eq!(trap.span.as_deref(), Some("provider.call"), "{trap:?}");
    assert_eq!(trap.span_fields.get("entry").map(String::as_str), Some("broken"));
}
