//! Logs on stderr and, when a collector is configured, spans over OTLP.
//!
//! One `tracing` subscriber: JSON (a plugin's fields nested as an object)
//! or text lines on stderr filtered by the verbosity (`RUST_LOG` overrides
//! it), and with an OTLP endpoint an
//! OpenTelemetry layer that exports the spans of proxyfleet's own crates
//! (`provider.call`, `plugin.http`, ...) over OTLP/HTTP with protobuf
//! bodies, batched on a thread of their own. [`Guard`] flushes what is
//! still queued when it drops.

use anyhow::Context as _;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use proxyfleet_runtime::capabilities::loggable::REQUEST_LOG_TARGET;
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// The service name spans are exported under.
const SERVICE_NAME: &str = "proxyfleet";

/// Where OTLP/HTTP receivers take traces, below the endpoint's base URL.
const TRACES_PATH: &str = "/v1/traces";

/// Keeps the span exporter alive; dropping it exports what is queued and
/// shuts the exporter down. Hold it until the program ends.
#[derive(Debug)]
#[must_use = "dropping the guard shuts the span exporter down"]
pub struct Guard {
    provider: Option<SdkTracerProvider>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take()
            && let Err(err) = provider.shutdown()
        {
            // The subscriber may already be unusable this late; stderr is not.
            eprintln!("proxyfleet: exporting the last spans failed: {err}");
        }
    }
}

/// Caps the registry client's logs, which carry bearer tokens at debug.
const QUIET_REGISTRY_CLIENT: &str = "oci_client=info";

/// Installs the global subscriber: logs on stderr as JSON lines (`json`) or
/// text, at info, debug (`verbose` 1) or trace (2 and more) unless
/// `RUST_LOG` says otherwise, and, with `otlp_endpoint` (a base URL such as
/// `http://collector:4318`), span export to `<endpoint>/v1/traces`.
///
/// # Errors
/// When the endpoint is not a usable URL or a subscriber is already set.
pub fn init(json: bool, verbose: u8, otlp_endpoint: Option<&str>) -> anyhow::Result<Guard> {
    let default = match verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    let filter = || {
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
        // The registry client logs a token server's whole answer (the
        // token) at debug: capped at info whenever anything asks for more.
        let verbose = filter
            .max_level_hint()
            .is_none_or(|level| level > tracing_subscriber::filter::LevelFilter::INFO);
        if verbose {
            filter.add_directive(QUIET_REGISTRY_CLIENT.parse().expect("a valid directive"))
        } else {
            filter
        }
    };
    // Colours only for a terminal: a file or a pipe gets plain text.
    let stderr = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let stderr = if json {
        stderr.json().event_format(crate::plugin_fields::NestPluginFields::default()).boxed()
    } else {
        stderr.boxed()
    };
    let Some(endpoint) = otlp_endpoint.filter(|e| !e.is_empty()) else {
        tracing_subscriber::registry()
            .with(stderr.with_filter(filter()))
            .try_init()
            .context("installing the log subscriber")?;
        return Ok(Guard { provider: None });
    };
    let url = format!("{}{TRACES_PATH}", endpoint.trim_end_matches('/'));
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(&url)
        .build()
        .with_context(|| format!("--otlp-endpoint {endpoint}: cannot export spans to {url}"))?;
    let provider = SdkTracerProvider::builder()
        .with_resource(Resource::builder().with_service_name(SERVICE_NAME).build())
        .with_batch_exporter(exporter)
        .build();
    let tracer = provider.tracer(SERVICE_NAME);
    // Only our own crates' spans: the exporter's HTTP client (hyper,
    // reqwest) would otherwise export spans about exporting at trace level.
    // The per-request lines (with paths) stay in the logs.
    let ours = tracing_subscriber::filter::filter_fn(|meta| {
        meta.target().starts_with("proxyfleet") && meta.target() != REQUEST_LOG_TARGET
    });
    let otel =
        tracing_opentelemetry::layer().with_tracer(tracer).with_filter(ours).with_filter(filter());
    tracing_subscriber::registry()
        .with(stderr.with_filter(filter()))
        .with(otel)
        .try_init()
        .context("installing the log subscriber")?;
    tracing::info!(endpoint = %url, "exporting spans over OTLP");
    Ok(Guard { provider: Some(provider) })
}
