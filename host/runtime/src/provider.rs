//! Provider calls into a plugin: one fresh instance per call, under the
//! entry's deadline, memory cap and concurrency cap, with failures
//! classified at the boundary (plugin errors are values, traps are not).
//!
//! Every call is one `provider.call` span (entry, plugin, version,
//! operation, proxy; its result and fault recorded when it ends), and is
//! reported to the runtime's [`CallObserver`](proxyfleet_core::observe::CallObserver).

use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use async_trait::async_trait;
use proxyfleet_core::installation::InstallationId;
use proxyfleet_core::kv::KvStore;
use proxyfleet_core::{
    ErrorClass, Health, HealthIssue, HealthReason, Instance, InstanceState, OwnershipMark,
    PluginInfo, Provider, ProviderError, ProxySpec,
};
use tokio::sync::Semaphore;
use tracing::Instrument as _;
use wasmtime::Store;

use crate::bindings::{Guest, types as wit};
use crate::bounds::{self, Oversize};
use crate::capabilities::CallScope;
use crate::capabilities::Redactor;
use crate::capabilities::address::refused_proxy_address;
use crate::capabilities::config::{CallConfig, ConfigTable};
use crate::capabilities::http::EntryHttp;
use crate::capabilities::kv::{EntryKv, KvQuota};
use crate::config::EntryConfig;
use crate::engine::Runtime;
use crate::plugin::{PluginRevision, new_store};
use crate::state::PluginState;

/// A provider entry served by a plugin. The revision sits behind a
/// swappable handle: a call takes the current revision when it starts and
/// finishes on it even if a newer one is swapped in meanwhile.
pub struct PluginProvider {
    runtime: Runtime,
    config: EntryConfig,
    config_json: Arc<str>,
    bound: ArcSwap<Bound>,
    permits: Semaphore,
    mutation_permits: Semaphore,
    http: Arc<EntryHttp>,
    kv: Arc<EntryKv>,
    redactor: Arc<Redactor>,
    /// The entry's libvirt hosts, their connections pooled across calls.
    libvirt: Arc<crate::capabilities::libvirt::EntryLibvirt>,
}

impl std::fmt::Debug for PluginProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginProvider")
            .field("entry", &self.config.name)
            .field("revision", &self.bound.load().revision.digest)
            .finish_non_exhaustive()
    }
}

/// A plugin revision bound to an entry: the plugin, and the lookup table
/// its `validate-config` answered for the entry's config. They travel
/// together, so a call never reads one revision's table on another.
#[derive(Debug)]
pub struct Bound {
    revision: Arc<PluginRevision>,
    table: Arc<ConfigTable>,
}

impl Bound {
    /// The revision bound to nothing yet: what validates the config.
    fn unvalidated(revision: Arc<PluginRevision>) -> Self {
        Self { revision, table: Arc::default() }
    }

    /// The plugin revision.
    pub fn revision(&self) -> &Arc<PluginRevision> {
        &self.revision
    }

    /// How many keys the revision's lookup table holds for the entry.
    pub fn table_len(&self) -> usize {
        self.table.len()
    }
}

/// The operations of the contract, as one value so that a single code path
/// sets up, runs and classifies every call.
enum Operation<'a> {
    ValidateConfig,
    Create(&'a ProxySpec),
    Get(&'a str),
    Delete(&'a str),
    List,
    Check,
}

enum Answer {
    Unit,
    Table(Vec<(String, String)>),
    Instance(wit::Instance),
    Instances(Vec<wit::Instance>),
    Health(wit::Health),
}

/// How a plugin itself failed, as opposed to an error it answered with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// It trapped: a panic, an out-of-bounds access, a bug.
    Trap,
    /// It ran past its deadline and was stopped.
    Timeout,
    /// It trapped because it reached its memory cap.
    Memory,
}

impl Fault {
    fn as_str(self) -> &'static str {
        match self {
            Self::Trap => "trap",
            Self::Timeout => "timeout",
            Self::Memory => "memory",
        }
    }
}

/// A failed call: what callers get, and whether the plugin itself failed,
/// which they cannot tell from the class alone (a `timeout` may also come
/// from the plugin's own answer).
struct Failure {
    error: ProviderError,
    fault: Option<Fault>,
}

impl From<ProviderError> for Failure {
    fn from(error: ProviderError) -> Self {
        Self { error, fault: None }
    }
}

impl Operation<'_> {
    fn name(&self) -> &'static str {
        match self {
            Self::ValidateConfig => "validate-config",
            Self::Create(_) => "create",
            Self::Get(_) => "get",
            Self::Delete(_) => "delete",
            Self::List => "list",
            Self::Check => "check",
        }
    }

    fn proxy(&self) -> Option<String> {
        match self {
            Self::Create(spec) => Some(format!("{}/{}", spec.namespace, spec.name)),
            Self::Get(id) | Self::Delete(id) => Some((*id).to_owned()),
            _ => None,
        }
    }
}

impl PluginProvider {
    /// Binds an entry to a plugin revision and has the plugin validate the
    /// entry's config. An entry whose config is refused is not created.
    pub async fn new(
        runtime: &Runtime,
        config: EntryConfig,
        revision: Arc<PluginRevision>,
        kv: Arc<dyn KvStore>,
    ) -> Result<Self, ProviderError> {
        let redactor = Arc::new(Redactor::default());
        let kv = Arc::new(EntryKv::new(kv, KvQuota::from_limits(&config.limits)));
        let http = crate::plugin::entry_http(runtime, &config, Arc::clone(&redactor))
            .map_err(ProviderError::invalid_config)?;
        let mut provider = Self {
            runtime: runtime.clone(),
            config_json: config.config.to_string().into(),
            libvirt: Arc::new(crate::capabilities::libvirt::EntryLibvirt::new(
                &config.name,
                &config.grants.libvirt,
                &runtime.inner.libvirt,
            )),
            permits: Semaphore::new(config.limits.concurrency),
            mutation_permits: Semaphore::new(config.limits.mutations),
            config,
            bound: ArcSwap::from_pointee(Bound::unvalidated(Arc::clone(&revision))),
            http,
            kv,
            redactor,
        };
        let bound = provider.validate_config_with(revision).await?;
        provider.bound = ArcSwap::from_pointee(bound);
        Ok(provider)
    }

    /// The revision new calls go to.
    pub fn revision(&self) -> Arc<PluginRevision> {
        Arc::clone(&self.bound.load().revision)
    }

    /// The revision new calls go to, with its lookup table.
    pub fn bound(&self) -> Arc<Bound> {
        self.bound.load_full()
    }

    /// Makes `bound` serve new calls; calls in flight finish on the old
    /// one, which is dropped when the last of them ends. Returns the old one.
    pub fn swap_revision(&self, bound: Arc<Bound>) -> Arc<Bound> {
        self.bound.swap(bound)
    }

    /// Has `revision` validate the entry's config without making it serve
    /// anything: a candidate revision must accept the config before it may
    /// replace the current one. Answers the revision bound to the entry,
    /// with the lookup table it answered.
    pub async fn validate_config_with(
        &self,
        revision: Arc<PluginRevision>,
    ) -> Result<Bound, ProviderError> {
        let unvalidated = Bound::unvalidated(revision);
        match self.observed(&unvalidated, Operation::ValidateConfig).await? {
            Answer::Table(pairs) => {
                let table = ConfigTable::from_answer(pairs, self.config_json.len())
                    .map_err(|error| ProviderError::plugin_fault(error.to_string()))?;
                Ok(Bound { revision: unvalidated.revision, table: Arc::new(table) })
            }
            _ => Err(ProviderError::plugin_fault("unexpected answer shape")),
        }
    }

    /// The entry's config.
    pub fn config(&self) -> &EntryConfig {
        &self.config
    }

    fn scope(&self, revision: &PluginRevision, operation: &Operation<'_>) -> CallScope {
        CallScope {
            entry: self.config.name.as_str().into(),
            plugin: revision.info.name.as_str().into(),
            operation: operation.name(),
            proxy: operation.proxy(),
            kv: Arc::clone(&self.kv),
            redactor: Arc::clone(&self.redactor),
        }
    }

    fn context(&self, deadline_ms: u64) -> wit::CallContext {
        wit::CallContext { entry: self.config.name.clone(), deadline_ms }
    }

    /// What the call's `config` import reads on `bound`.
    fn call_config(&self, bound: &Bound) -> CallConfig {
        CallConfig { json: Arc::clone(&self.config_json), table: Arc::clone(&bound.table) }
    }

    async fn call(&self, operation: Operation<'_>) -> Result<Answer, ProviderError> {
        let bound = self.bound.load_full();
        self.observed(&bound, operation).await
    }

    /// Runs one call on `revision` inside its `provider.call` span (so the
    /// plugin's log lines and HTTP requests land in it) and reports how it
    /// ended. The elapsed time includes waiting for a permit: it is what
    /// the caller waited.
    async fn observed(
        &self,
        bound: &Bound,
        operation: Operation<'_>,
    ) -> Result<Answer, ProviderError> {
        let span = self.call_span(&bound.revision, &operation);
        let name = operation.name();
        // From when the call got its slot: a wait for one is the entry's
        // limits at work, not the provider's time.
        let mut began = None;
        let outcome = self.call_on(bound, operation, &mut began).instrument(span.clone()).await;
        let failure = outcome.as_ref().err();
        self.report(
            &span,
            name,
            began.map_or(Duration::ZERO, |began: Instant| began.elapsed()),
            failure.map(|f| f.error.class),
            failure.and_then(|f| f.fault),
        );
        outcome.map_err(|failure| failure.error)
    }

    fn call_span(&self, revision: &PluginRevision, operation: &Operation<'_>) -> tracing::Span {
        tracing::info_span!(
            "provider.call",
            entry = %self.config.name,
            plugin = %revision.info.name,
            plugin_version = %revision.info.version,
            operation = operation.name(),
            proxy = operation.proxy().unwrap_or_default(),
            result = tracing::field::Empty,
            fault = tracing::field::Empty,
            elapsed_ms = tracing::field::Empty,
        )
    }

    /// Records the end of a call on its span and tells the observer.
    fn report(
        &self,
        span: &tracing::Span,
        operation: &'static str,
        elapsed: Duration,
        error: Option<ErrorClass>,
        fault: Option<Fault>,
    ) {
        span.record("result", error.map_or("ok", ErrorClass::as_str));
        if let Some(fault) = fault {
            span.record("fault", fault.as_str());
        }
        span.record("elapsed_ms", u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX));
        // Span fields show up in text and JSON logs only with an event in
        // the span; this one carries the recorded result.
        tracing::debug!(parent: span, "call ended");
        if let Some(observer) = &self.runtime.inner.observer {
            observer.provider_call(&self.config.name, operation, elapsed, error, fault.is_some());
        }
    }

    async fn call_on(
        &self,
        bound: &Bound,
        operation: Operation<'_>,
        began: &mut Option<Instant>,
    ) -> Result<Answer, Failure> {
        let limits = &self.config.limits;
        let shutting_down = |_| ProviderError::unavailable("the entry is shutting down");
        // The mutation permit first, so a queue of creates never holds the
        // general permits that reads need meanwhile.
        let _mutation = match operation {
            Operation::Create(_) | Operation::Delete(_) => {
                Some(self.mutation_permits.acquire().await.map_err(shutting_down)?)
            }
            _ => None,
        };
        let _permit = self.permits.acquire().await.map_err(shutting_down)?;
        *began = Some(Instant::now());
        let revision = &bound.revision;
        let mut state = PluginState::new(
            self.scope(revision, &operation),
            Arc::clone(&self.http),
            limits.memory_bytes,
        );
        state.libvirt = Arc::clone(&self.libvirt);
        state.config = self.call_config(bound);
        let mut store = new_store(&self.runtime, state, limits);
        let ctx = self.context(limits.call_timeout.as_millis() as u64);
        let run = run_operation(
            &mut store,
            revision,
            &ctx,
            &operation,
            &self.config_json,
            &self.runtime.installation,
        );
        // The epoch callback stops guest code at the deadline; this timeout
        // also bounds time spent in host calls (HTTP, store) and cancels them.
        let outcome =
            tokio::time::timeout(limits.call_timeout + crate::engine::EPOCH_TICK, run).await;
        match outcome {
            Err(_) => Err(Failure {
                error: ProviderError::timeout(format!(
                    "{} did not finish within its {:?} deadline",
                    operation.name(),
                    limits.call_timeout
                )),
                fault: Some(Fault::Timeout),
            }),
            Ok(Err(trap)) => Err(self.classify_trap(&trap, store.data().memory.hit, &operation)),
            Ok(Ok(Err(plugin_error))) => Err(self.classify_plugin_error(plugin_error).into()),
            Ok(Ok(Ok(answer))) => Ok(answer),
        }
    }

    fn classify_trap(
        &self,
        trap: &wasmtime::Error,
        memory_cap_hit: bool,
        operation: &Operation<'_>,
    ) -> Failure {
        let limits = &self.config.limits;
        if matches!(trap.downcast_ref::<wasmtime::Trap>(), Some(wasmtime::Trap::Interrupt)) {
            return Failure {
                error: ProviderError::timeout(format!(
                    "{} was stopped at its {:?} deadline",
                    operation.name(),
                    limits.call_timeout
                )),
                fault: Some(Fault::Timeout),
            };
        }
        let detail = format!("{trap:?}");
        let detail = self.redactor.redact(&detail);
        tracing::error!(backtrace = %detail, "plugin trapped; its instance is discarded");
        let (reason, fault) = if memory_cap_hit {
            (format!("memory cap of {} MiB reached", limits.memory_bytes >> 20), Fault::Memory)
        } else {
            (self.redactor.redact(&trap.to_string()).into_owned(), Fault::Trap)
        };
        Failure {
            error: ProviderError::plugin_fault(format!("{} trapped: {reason}", operation.name())),
            fault: Some(fault),
        }
    }

    fn classify_plugin_error(&self, err: wit::ProviderError) -> ProviderError {
        use wit::ProviderError as E;
        let (class, message) = match err {
            E::NotFound(m) => (ErrorClass::NotFound, m),
            E::Transient(m) => (ErrorClass::Transient, m),
            E::Permanent(m) => (ErrorClass::Permanent, m),
            E::QuotaExceeded(m) => (ErrorClass::QuotaExceeded, m),
            E::Conflict(m) => (ErrorClass::Conflict, m),
            E::Unauthorized(m) => (ErrorClass::Unauthorized, m),
            E::InvalidConfig(m) => (ErrorClass::InvalidConfig, m),
            E::InvalidSpec(m) => (ErrorClass::InvalidSpec, m),
        };
        if let Err(oversize) = bounds::check_error_message(&message, class.as_str()) {
            return oversize_fault(&oversize);
        }
        ProviderError::new(class, self.redactor.redact(&message).into_owned())
    }

    fn expect_instance(&self, answer: Answer) -> Result<Instance, ProviderError> {
        match answer {
            Answer::Instance(instance) => self.checked_instance(instance),
            _ => Err(ProviderError::plugin_fault("unexpected answer shape")),
        }
    }

    /// An instance the plugin returned, within the bounds of every field
    /// (refused otherwise, before anything reads it further), with no
    /// credential the host injected left in it (a backend can echo one
    /// back, and these fields go on into statuses, spans and Events): the
    /// name and the mark are redacted, such an address is dropped, and an
    /// instance whose id holds one is refused, since a changed id would
    /// name another instance. Addresses are then held to the entry's rule.
    fn checked_instance(&self, instance: wit::Instance) -> Result<Instance, ProviderError> {
        bounds::check_instance(&instance).map_err(|oversize| oversize_fault(&oversize))?;
        let mut instance = instance_from_wit(instance);
        let redactor = &self.redactor;
        if redactor.holds_secret(&instance.provider_id) {
            return Err(ProviderError::plugin_fault(
                "the plugin returned an instance whose id holds a credential the host injected; \
                 the answer was dropped",
            ));
        }
        let redact = |field: &mut String| {
            if redactor.holds_secret(field) {
                *field = redactor.redact(field).into_owned();
            }
        };
        redact(&mut instance.name);
        if let Some(mark) = &mut instance.mark {
            redact(&mut mark.uid);
            redact(&mut mark.namespace);
            redact(&mut mark.name);
        }
        instance.addresses.retain(|address| {
            !redactor.holds_secret(address)
                && self.proxy_address_taken(&instance.provider_id, address)
        });
        Ok(instance)
    }

    /// Whether an address the plugin reports for an instance may be probed
    /// and handed out: IP addresses are held to the entry's rule (names
    /// are never probed or handed out, so they pass as they are).
    fn proxy_address_taken(&self, provider_id: &str, address: &str) -> bool {
        let Ok(ip) = address.parse::<std::net::IpAddr>() else { return true };
        let Some(why) = refused_proxy_address(ip, &self.config.proxy_addresses) else {
            return true;
        };
        tracing::warn!(
            entry = %self.config.name,
            provider_id,
            "dropped the address {ip} the plugin reported: it is {why}; if the entry's proxies \
             live there, add its range to the entry's proxyAddresses"
        );
        false
    }
}

/// Instantiates the revision in `store` and runs one operation. The outer
/// error is a trap; the inner one the plugin's own answer.
async fn run_operation(
    store: &mut Store<PluginState>,
    revision: &PluginRevision,
    ctx: &wit::CallContext,
    operation: &Operation<'_>,
    config_json: &str,
    installation: &InstallationId,
) -> wasmtime::Result<Result<Answer, wit::ProviderError>> {
    let plugin = revision.pre.instantiate_async(&mut *store).await?;
    let guest: &Guest = plugin.proxyfleet_provider_provider();
    Ok(match operation {
        Operation::ValidateConfig => {
            guest.call_validate_config(&mut *store, config_json).await?.map(Answer::Table)
        }
        Operation::Create(spec) => guest
            .call_create(&mut *store, ctx, &spec_to_wit(spec, installation))
            .await?
            .map(Answer::Instance),
        Operation::Get(id) => guest.call_get(&mut *store, ctx, id).await?.map(Answer::Instance),
        Operation::Delete(id) => {
            guest.call_delete(&mut *store, ctx, id).await?.map(|()| Answer::Unit)
        }
        Operation::List => guest.call_list(&mut *store, ctx).await?.map(Answer::Instances),
        Operation::Check => Ok(Answer::Health(guest.call_check(&mut *store, ctx).await?)),
    })
}

#[async_trait]
impl Provider for PluginProvider {
    fn entry(&self) -> &str {
        &self.config.name
    }

    fn info(&self) -> PluginInfo {
        self.bound.load().revision.info.clone()
    }

    async fn create(&self, spec: &ProxySpec) -> Result<Instance, ProviderError> {
        if let Some(credential) = &spec.proxy_auth {
            self.redactor.remember_proxy_credential(credential.username(), credential.password());
        }
        self.expect_instance(self.call(Operation::Create(spec)).await?)
    }

    async fn get(&self, provider_id: &str) -> Result<Instance, ProviderError> {
        self.expect_instance(self.call(Operation::Get(provider_id)).await?)
    }

    async fn delete(&self, provider_id: &str) -> Result<(), ProviderError> {
        // Deletes reach only what this installation made: the plugin's
        // delete carries no installation, so the host reads the mark
        // first. An instance marked by another installation sharing the
        // backend is not-found to this one, and left alone; one gone
        // already, unmarked or marked before marks named installations is
        // the plugin's to delete (its delete also clears what a create
        // left behind).
        match self.get(provider_id).await {
            Ok(instance) => {
                let ours = self.runtime.installation().as_str();
                if let Some(mark) = instance.mark.as_ref()
                    && !mark.installation.is_empty()
                    && mark.installation != ours
                {
                    return Err(ProviderError::new(
                        ErrorClass::NotFound,
                        format!(
                            "{provider_id} is marked by installation {:?}, not this one \
                             ({ours:?}); it is left alone",
                            mark.installation
                        ),
                    ));
                }
            }
            Err(err) if err.class == ErrorClass::NotFound => {}
            Err(err) => return Err(err),
        }
        self.call(Operation::Delete(provider_id)).await.map(|_| ())
    }

    async fn list(&self) -> Result<Vec<Instance>, ProviderError> {
        match self.call(Operation::List).await? {
            Answer::Instances(list) => {
                // A list past its bound is refused whole: cut, it would
                // read as "these are all".
                bounds::check_list_len(list.len()).map_err(|oversize| oversize_fault(&oversize))?;
                // One bad instance does not hide the others (orphan
                // collection needs the list); it is left out, and said so.
                Ok(list
                    .into_iter()
                    .filter_map(|instance| {
                        self.checked_instance(instance)
                            .inspect_err(|err| {
                                tracing::error!(entry = %self.config.name, "list: {err}");
                            })
                            .ok()
                    })
                    .collect())
            }
            _ => Err(ProviderError::plugin_fault("unexpected answer shape")),
        }
    }

    async fn check(&self) -> Health {
        match self.call(Operation::Check).await {
            Ok(Answer::Health(health)) => match bounds::check_health(&health) {
                Ok(()) => health_from_wit(health, &self.redactor),
                Err(oversize) => {
                    Health::unhealthy(HealthReason::Other, oversize_fault(&oversize).to_string())
                }
            },
            Ok(_) => Health::unhealthy(HealthReason::Other, "unexpected answer shape"),
            Err(err) => {
                let reason = match err.class {
                    ErrorClass::Timeout => HealthReason::Timeout,
                    _ => HealthReason::Other,
                };
                Health::unhealthy(reason, err.to_string())
            }
        }
    }
}

/// A plugin's answer over a bound, as callers get it.
fn oversize_fault(oversize: &Oversize) -> ProviderError {
    ProviderError::plugin_fault(format!("{oversize}; the answer was dropped"))
}

fn spec_to_wit(spec: &ProxySpec, installation: &InstallationId) -> wit::ProxySpec {
    wit::ProxySpec {
        installation: installation.as_str().to_owned(),
        name: spec.name.clone(),
        namespace: spec.namespace.clone(),
        uid: spec.uid.clone(),
        cores: spec.cores,
        memory_mib: spec.memory_mib,
        disk_gib: spec.disk_gib,
        image: spec.image.clone(),
        placement: spec.placement.clone(),
        network: wit::Network { vlan_tag: spec.vlan_tag },
        port: spec.port,
        user_data: spec.user_data.clone(),
        labels: spec.labels.clone(),
        proxy_auth: spec.proxy_auth.as_ref().map(|credential| wit::ProxyAuth {
            username: credential.username().to_owned(),
            password: credential.password().to_owned(),
        }),
    }
}

fn instance_from_wit(instance: wit::Instance) -> Instance {
    Instance {
        provider_id: instance.provider_id,
        name: instance.name,
        state: match instance.state {
            wit::InstanceState::Provisioning => InstanceState::Provisioning,
            wit::InstanceState::Running => InstanceState::Running,
            wit::InstanceState::Stopped => InstanceState::Stopped,
            wit::InstanceState::Failed => InstanceState::Failed,
            wit::InstanceState::Deleting => InstanceState::Deleting,
        },
        addresses: instance.addresses,
        port: instance.port,
        created_at: instance.created_at,
        mark: instance.mark.map(|m| OwnershipMark {
            installation: m.installation,
            uid: m.uid,
            namespace: m.namespace,
            name: m.name,
            created_at: m.created_at,
        }),
    }
}

fn health_from_wit(health: wit::Health, redactor: &Redactor) -> Health {
    Health {
        healthy: health.healthy,
        issues: health
            .issues
            .into_iter()
            .map(|issue| HealthIssue {
                reason: match issue.reason {
                    wit::HealthReason::CredentialsUnavailable => {
                        HealthReason::CredentialsUnavailable
                    }
                    wit::HealthReason::CertificateInvalid => HealthReason::CertificateInvalid,
                    wit::HealthReason::StorageNotFound => HealthReason::StorageNotFound,
                    wit::HealthReason::TemplateNotFound => HealthReason::TemplateNotFound,
                    wit::HealthReason::Timeout => HealthReason::Timeout,
                    wit::HealthReason::Unreachable => HealthReason::Unreachable,
                    wit::HealthReason::Unauthorized => HealthReason::Unauthorized,
                    wit::HealthReason::Misconfigured => HealthReason::Misconfigured,
                    wit::HealthReason::Other => HealthReason::Other,
                },
                message: redactor.redact(&issue.message).into_owned(),
            })
            .collect(),
    }
}

/// One instance kept across calls, for callers that trade per-call
/// isolation for speed (benchmarks, batch reads). It holds one of the
/// entry's concurrency permits while it lives, and keeps the runtime's
/// invariant: an instance that trapped is never entered again.
pub struct PinnedInstance<'a> {
    provider: &'a PluginProvider,
    revision: Arc<PluginRevision>,
    store: Store<PluginState>,
    plugin: crate::bindings::ProviderPlugin,
    trapped: Option<String>,
    _permit: tokio::sync::SemaphorePermit<'a>,
}

impl std::fmt::Debug for PinnedInstance<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedInstance")
            .field("entry", &self.provider.config.name)
            .field("trapped", &self.trapped)
            .finish_non_exhaustive()
    }
}

impl PluginProvider {
    /// Instantiates the current revision once for several calls.
    pub async fn pin(&self) -> Result<PinnedInstance<'_>, ProviderError> {
        let permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| ProviderError::unavailable("the entry is shutting down"))?;
        let bound = self.bound.load_full();
        let revision = Arc::clone(&bound.revision);
        let operation = Operation::Get("");
        let mut state = PluginState::new(
            self.scope(&revision, &operation),
            Arc::clone(&self.http),
            self.config.limits.memory_bytes,
        );
        state.libvirt = Arc::clone(&self.libvirt);
        state.config = self.call_config(&bound);
        let mut store = new_store(&self.runtime, state, &self.config.limits);
        let plugin =
            revision.pre.instantiate_async(&mut store).await.map_err(|trap| {
                self.classify_trap(&trap, store.data().memory.hit, &operation).error
            })?;
        Ok(PinnedInstance {
            provider: self,
            revision,
            store,
            plugin,
            trapped: None,
            _permit: permit,
        })
    }
}

impl PinnedInstance<'_> {
    /// `get` on the pinned instance; observed like any other call.
    pub async fn get(&mut self, provider_id: &str) -> Result<Instance, ProviderError> {
        let provider = self.provider;
        let span = provider.call_span(&self.revision, &Operation::Get(provider_id));
        let started = Instant::now();
        let outcome = self.get_in_span(provider_id).instrument(span.clone()).await;
        let failure = outcome.as_ref().err();
        provider.report(
            &span,
            "get",
            started.elapsed(),
            failure.map(|f| f.error.class),
            failure.and_then(|f| f.fault),
        );
        outcome.map_err(|failure| failure.error)
    }

    async fn get_in_span(&mut self, provider_id: &str) -> Result<Instance, Failure> {
        if let Some(reason) = &self.trapped {
            return Err(ProviderError::plugin_fault(format!(
                "this instance trapped earlier ({reason}) and is not entered again"
            ))
            .into());
        }
        let limits = &self.provider.config.limits;
        self.store.data_mut().deadline = Instant::now() + limits.call_timeout;
        let ctx = self.provider.context(limits.call_timeout.as_millis() as u64);
        let guest = self.plugin.proxyfleet_provider_provider();
        match guest.call_get(&mut self.store, &ctx, provider_id).await {
            Err(trap) => {
                let failure = self.provider.classify_trap(
                    &trap,
                    self.store.data().memory.hit,
                    &Operation::Get(provider_id),
                );
                self.trapped = Some(failure.error.message.clone());
                Err(failure)
            }
            Ok(Err(plugin_error)) => Err(self.provider.classify_plugin_error(plugin_error).into()),
            Ok(Ok(instance)) => Ok(self.provider.checked_instance(instance)?),
        }
    }
}
