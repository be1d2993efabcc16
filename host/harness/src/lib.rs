//! Runs a built provider plugin the way the operator does, with scripted
//! HTTP answers and an in-memory key-value store, so a plugin's tests need
//! no backend.
//!
//! ```no_run
//! # async fn example() -> Result<(), proxyfleet_harness::HarnessError> {
//! use proxyfleet_core::Provider as _;
//! use proxyfleet_harness::{Harness, ScriptedResponse, SpecBuilder};
//!
//! let harness = Harness::builder("target/plugins/myplugin.wasm")
//!     .config(serde_json::json!({ "endpoint": "https://api.example.test" }))
//!     .grant_http("https://api.example.test")
//!     .respond("POST", "https://api.example.test/v1/vms", ScriptedResponse::json(201, r#"{"id":"vm-1"}"#))
//!     .build()
//!     .await?;
//! let instance = harness.provider().create(&SpecBuilder::new("web-1").build()).await?;
//! assert_eq!(instance.provider_id, "vm-1");
//! assert_eq!(harness.requests()[0].method, "POST");
//! # Ok(()) }
//! ```
//!
//! The host's rules stay in force: requests must match the grants given
//! with [`HarnessBuilder::grant_http`], limits apply, and a request with no
//! scripted answer gets a `501` naming it, so a missing script is obvious.

mod binder;
mod declared;
mod scripted;
mod spec;

use std::path::PathBuf;
use std::sync::Arc;

use proxyfleet_core::ProviderError;
use proxyfleet_core::kv::MemoryKv;
use proxyfleet_runtime::config::{EntryConfig, Grants, HttpGrant, Limits};
use proxyfleet_runtime::{LoadError, PluginProvider, Runtime, RuntimeError, RuntimeOptions};

pub use binder::EntryBinder;
pub use declared::{DeclaredBackend, DeclaredError};
pub use scripted::{RecordedRequest, ScriptedHttp, ScriptedResponse};
pub use spec::SpecBuilder;

/// Why a harness could not be built.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// The runtime could not start.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// The plugin did not load.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The plugin refused the config, or a grant is malformed.
    #[error("the entry could not be bound: {0}")]
    Entry(#[from] ProviderError),
    /// A grant URL given to the builder is malformed.
    #[error("grant {url:?}: {message}")]
    Grant {
        /// The URL.
        url: String,
        /// What is wrong.
        message: String,
    },
}

/// Builds a [`Harness`].
#[derive(Debug)]
pub struct HarnessBuilder {
    plugin: PathBuf,
    entry: String,
    config: serde_json::Value,
    grants: Vec<String>,
    limits: Limits,
    http: ScriptedHttp,
    kv: Arc<MemoryKv>,
}

impl HarnessBuilder {
    /// Names the provider entry (default `test`).
    pub fn entry(mut self, name: impl Into<String>) -> Self {
        self.entry = name.into();
        self
    }

    /// The entry config handed to the plugin.
    pub fn config(mut self, config: serde_json::Value) -> Self {
        self.config = config;
        self
    }

    /// Grants HTTP to `url` (scheme, host and port), including loopback and
    /// private addresses, since scripted answers never leave the process.
    pub fn grant_http(mut self, url: impl Into<String>) -> Self {
        self.grants.push(url.into());
        self
    }

    /// Resource limits of the entry.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Answers `method url` with `response`; several answers for the same
    /// request are given in order, the last one repeating.
    pub fn respond(self, method: &str, url: &str, response: ScriptedResponse) -> Self {
        self.http.respond(method, url, response);
        self
    }

    /// Uses an existing store, e.g. to start from prepared state or to
    /// share it between two harnesses.
    pub fn kv(mut self, kv: Arc<MemoryKv>) -> Self {
        self.kv = kv;
        self
    }

    /// Loads the plugin and binds the entry, which runs `validate-config`.
    pub async fn build(self) -> Result<Harness, HarnessError> {
        let mut http = Vec::with_capacity(self.grants.len());
        for url in &self.grants {
            http.push(parse_grant(url)?);
        }
        let runtime = Runtime::new(RuntimeOptions {
            http_transport: Some(Arc::new(self.http.clone())),
            ..RuntimeOptions::default()
        })?;
        let revision = runtime.load_plugin(&self.plugin).await?;
        let entry = EntryConfig {
            name: self.entry,
            plugin: revision.info.name.clone(),
            oci: None,
            config: self.config,
            grants: Grants { http, ca_file: None, libvirt: Vec::new() },
            limits: self.limits,
            pin: None,
            verify: None,
            proxy_addresses: Vec::new(),
        };
        let provider =
            PluginProvider::new(&runtime, entry, revision, Arc::clone(&self.kv) as _).await?;
        Ok(Harness { provider: Arc::new(provider), http: self.http, kv: self.kv })
    }
}

fn parse_grant(url: &str) -> Result<HttpGrant, HarnessError> {
    let uri: http::Uri = url
        .parse()
        .map_err(|err| HarnessError::Grant { url: url.to_owned(), message: format!("{err}") })?;
    let (Some(scheme), Some(host)) = (uri.scheme_str(), uri.host()) else {
        return Err(HarnessError::Grant {
            url: url.to_owned(),
            message: "needs a scheme and a host".into(),
        });
    };
    Ok(HttpGrant {
        destination: proxyfleet_core::HttpDestination {
            scheme: scheme.to_ascii_lowercase(),
            host: host.trim_matches(['[', ']']).to_ascii_lowercase(),
            port: uri.port_u16(),
        },
        allow_addresses: vec!["0.0.0.0/0".parse().expect("valid"), "::/0".parse().expect("valid")],
        credential: None,
    })
}

/// A plugin bound to a test entry.
#[derive(Debug)]
pub struct Harness {
    provider: Arc<PluginProvider>,
    http: ScriptedHttp,
    kv: Arc<MemoryKv>,
}

impl Harness {
    /// Starts building a harness for the component at `plugin`.
    pub fn builder(plugin: impl Into<PathBuf>) -> HarnessBuilder {
        HarnessBuilder {
            plugin: plugin.into(),
            entry: "test".into(),
            config: serde_json::json!({}),
            grants: Vec::new(),
            limits: Limits::default(),
            http: ScriptedHttp::default(),
            kv: Arc::new(MemoryKv::new()),
        }
    }

    /// The entry, as the reconciler sees it.
    pub fn provider(&self) -> Arc<PluginProvider> {
        Arc::clone(&self.provider)
    }

    /// Every request the plugin sent, in order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.http.requests()
    }

    /// The scripted HTTP side, to add answers between calls.
    pub fn http(&self) -> &ScriptedHttp {
        &self.http
    }

    /// The entry's key-value store.
    pub fn kv(&self) -> &Arc<MemoryKv> {
        &self.kv
    }
}
