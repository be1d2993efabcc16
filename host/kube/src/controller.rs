//! The Proxy controller: a kube-runtime `Controller` whose reconcile runs
//! the core state machine and writes back what it decided: the finalizer,
//! the status (server-side apply on the status subresource) and Events.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::{PredicateConfig, WatchStreamExt as _, reflector, watcher};
use kube::{Resource as _, ResourceExt as _};
use proxyfleet_core::clock::unix_now;
use proxyfleet_core::liveness::Heartbeat;
use proxyfleet_core::proxy::ProxyMeta;
use proxyfleet_core::reconcile::{
    FINALIZER, FinalizerChange, Policy, ProxyState, random_jitter, reconcile,
};
use proxyfleet_core::source::ProviderSource;
use proxyfleet_core::spec_key::SpecKey;
use proxyfleet_core::{Provider, ProviderError};
use proxyfleet_fleet::Fleet;
use proxyfleet_metrics::Metrics;

use crate::convert;
use crate::crd::{MANAGER, Proxy, REPLACE_ANNOTATION};
use crate::credentials::Credentials;
use crate::events::{Event, EventType, Recorder, Reporter};
use crate::fleet::Wakes;
use crate::namespace_gate::NamespaceGate;
use crate::own_writes::OwnWrites;
use crate::spec_secrets::{SecretError, proxy_auth, user_data};

/// Why a reconcile could not finish; the Proxy is retried later.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Kubernetes API failed.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// A Secret the spec names (user-data, credential) cannot be used.
    #[error("{0}")]
    SpecSecret(String),
    /// The Proxy has no namespace or UID (never true of a stored object).
    #[error("the Proxy object lacks {0}")]
    Incomplete(&'static str),
}

impl From<SecretError> for Error {
    fn from(err: SecretError) -> Self {
        match err {
            SecretError::Kube(err) => Self::Kube(err),
            SecretError::Refused(message) => Self::SpecSecret(message),
        }
    }
}

/// What every reconcile shares.
pub struct Context {
    client: kube::Client,
    providers: Arc<dyn ProviderSource>,
    policy: Policy,
    recorder: Recorder,
    metrics: Arc<Metrics>,
    fleet: Option<Arc<Fleet>>,
    wakes: Option<Arc<Wakes>>,
    credentials: Arc<Credentials>,
    spec_key: SpecKey,
    own_writes: OwnWrites,
    heartbeat: Option<Arc<Heartbeat>>,
    namespace_gate: Option<NamespaceGate>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("policy", &self.policy).finish_non_exhaustive()
    }
}

impl Context {
    /// A context taking providers from `providers` (the plugin registry,
    /// or fakes in tests), reporting Events as `instance` and hashing specs
    /// with `spec_key` (the installation's: [`crate::spec_key::settle`]).
    pub fn new(
        client: kube::Client,
        providers: Arc<dyn ProviderSource>,
        policy: Policy,
        instance: Option<String>,
        spec_key: SpecKey,
    ) -> Self {
        let reporter = Reporter { controller: MANAGER.to_owned(), instance };
        let recorder = Recorder::new(client.clone(), reporter);
        Self {
            client,
            providers,
            policy,
            recorder,
            metrics: Arc::new(Metrics::new()),
            fleet: None,
            wakes: None,
            credentials: Arc::default(),
            spec_key,
            own_writes: OwnWrites::default(),
            heartbeat: None,
            namespace_gate: None,
        }
    }

    /// Provisions a Proxy only with a provider that serves its namespace
    /// (a ClusterProxyProvider's `spec.allowedNamespaces`).
    #[must_use]
    pub fn with_namespace_gate(mut self, gate: NamespaceGate) -> Self {
        self.namespace_gate = Some(gate);
        self
    }

    /// Marks every pass on `heartbeat`, so `/livez` fails when one runs
    /// past its bound. Its owner retires it.
    #[must_use]
    pub fn with_heartbeat(mut self, heartbeat: Arc<Heartbeat>) -> Self {
        self.heartbeat = Some(heartbeat);
        self
    }

    /// Merges `fleet`'s health verdicts into the Proxies' status, runs a
    /// pass for each Proxy whose verdict changed (`wakes`, which the fleet
    /// services fill) and records the credentials passes read into
    /// `credentials`, which they publish.
    #[must_use]
    pub fn with_fleet(
        mut self,
        fleet: Arc<Fleet>,
        wakes: Arc<Wakes>,
        credentials: Arc<Credentials>,
    ) -> Self {
        self.fleet = Some(fleet);
        self.wakes = Some(wakes);
        self.credentials = credentials;
        self
    }

    /// Records into `metrics` instead of a registry of its own.
    #[must_use]
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// The metrics reconciles record into.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }
}

/// Runs the controller over Proxies in `namespace` (every namespace when
/// `None`) until `shutdown`.
pub async fn run(
    context: Arc<Context>,
    namespace: Option<&str>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let proxies: Api<Proxy> = match namespace {
        Some(namespace) => Api::namespaced(context.client.clone(), namespace),
        None => Api::all(context.client.clone()),
    };
    // Only changes a pass must answer wake a Proxy: its own status writes
    // (every pass's) and the publisher's health merges would otherwise
    // each come back as a watch event and run another pass with a `get`.
    let (reader, writer) = reflector::store();
    let changes = watcher(proxies, watcher::Config::default())
        .default_backoff()
        // Server-side apply's field records are most of a stored Proxy's
        // bytes, and nothing here reads them.
        .modify(|proxy| proxy.managed_fields_mut().clear())
        .reflect(writer)
        .applied_objects()
        .predicate_filter(spec_or_finalizers, PredicateConfig::default());
    let controller = Controller::for_stream(changes, reader);
    let cached = controller.store();
    let controller = controller.watches_stream(
        crate::secrets::changes(&context.client, namespace).map(Ok),
        move |secret| crate::secrets::proxies_naming(&cached, &secret),
    );
    // The fleet services publish the Proxies and probe them on every
    // replica (`crate::fleet_services`); the leader's passes write the
    // verdicts that changed.
    let controller = match &context.wakes {
        Some(wakes) => {
            let woken = futures::stream::unfold(wakes.listen(), |mut rx| async move {
                rx.recv().await.map(|proxy| (proxy, rx))
            });
            controller.reconcile_on(woken)
        }
        None => controller,
    };
    controller
        .with_config(kube::runtime::controller::Config::default().concurrency(PASSES))
        .graceful_shutdown_on(shutdown)
        .run(watched_pass, error_policy, context)
        .for_each(|result| async move {
            match result {
                Ok((proxy, _)) => tracing::debug!(proxy = %proxy, "reconciled"),
                Err(err) => tracing::warn!("reconcile failed: {err}"),
            }
        })
        .await;
}

/// [`reconcile_proxy`], marked on the context's heartbeat while it runs.
async fn watched_pass(proxy: Arc<Proxy>, context: Arc<Context>) -> Result<Action, Error> {
    let _pass = context.heartbeat.as_ref().map(|heartbeat| heartbeat.pass());
    reconcile_proxy(proxy, context).await
}

/// What a pass answers to in the object: the spec (its generation, which
/// deletion also bumps), the finalizers (someone else's, or ours removed by
/// hand) and an operator's request for a new instance. Status and metadata
/// other than these wake nothing; a pass's requeue covers the rest.
fn spec_or_finalizers(proxy: &Proxy) -> Option<u64> {
    use std::hash::{Hash as _, Hasher as _};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    proxy.metadata.generation.hash(&mut hasher);
    proxy.metadata.deletion_timestamp.is_some().hash(&mut hasher);
    proxy.finalizers().hash(&mut hasher);
    proxy.annotations().get(REPLACE_ANNOTATION).hash(&mut hasher);
    Some(hasher.finish())
}

/// Passes in flight at once, at most. Provider calls are bounded by each
/// entry's limits in the runtime, and API requests (each of which holds a
/// connection of kube's HTTP/1.1 client) by the client itself
/// ([`crate::client`]); this bounds the passes' own state. Unbounded,
/// 1,000 Proxies woken together (their health verdicts arriving in one
/// round) all ran at once. At 256 the scale bench converges as fast as
/// unbounded (9.0 s unbounded, 10.0 s at 256, 12.1 s at 128, within this
/// bench's spread). A bound of one entry's 64 filled only half of its call
/// slots: a pass holds its place through its API writes.
const PASSES: u16 = 256;

/// When a pass that put the finalizer on runs again if the watch has not
/// woken it before.
const AFTER_FINALIZER_FALLBACK: Duration = Duration::from_secs(10);

fn error_policy(proxy: Arc<Proxy>, err: &Error, _context: Arc<Context>) -> Action {
    tracing::warn!(proxy = %proxy.name_any(), "{err}; retrying in 15s");
    Action::requeue(Duration::from_secs(15))
}

/// One pass over one Proxy.
pub async fn reconcile_proxy(proxy: Arc<Proxy>, context: Arc<Context>) -> Result<Action, Error> {
    let namespace = proxy.namespace().ok_or(Error::Incomplete("a namespace"))?;
    let name = proxy.name_any();
    let api: Api<Proxy> = Api::namespaced(context.client.clone(), &namespace);
    // The cache may not hold the previous pass's status write yet.
    let proxy = context.own_writes.latest(proxy);
    let meta = ProxyMeta {
        uid: proxy.uid().ok_or(Error::Incomplete("a UID"))?,
        namespace: namespace.clone(),
        name: name.clone(),
        generation: proxy.metadata.generation.unwrap_or(0),
    };
    let deleting = proxy.metadata.deletion_timestamp.is_some();
    // Deletion needs no Secret; an unreadable one must not block it.
    let secrets = if deleting {
        Ok((Vec::new(), None))
    } else {
        match user_data(&context.client, &namespace, &proxy).await {
            Ok(user_data) => proxy_auth(&context.client, &namespace, &proxy)
                .await
                .map(|credential| (user_data, credential)),
            Err(err) => Err(err),
        }
    };
    let status = proxy.status.as_ref().map(convert::status_from_crd).unwrap_or_default();
    let written = status.clone();
    let mut status = status;
    if let Some(fleet) = &context.fleet
        && !deleting
    {
        fleet.merge_verdict(&meta.uid, &mut status, unix_now());
    }
    let (user_data, proxy_auth) = match secrets {
        Ok(secrets) => secrets,
        Err(SecretError::Refused(message)) => {
            return refuse_spec(&proxy, &context, &namespace, status, message).await;
        }
        Err(err) => return Err(err.into()),
    };
    if !deleting {
        context.credentials.set(&meta.uid, proxy_auth.clone());
    }
    let replace_token = proxy.annotations().get(REPLACE_ANNOTATION).cloned();
    let desired = convert::desired(&proxy.spec, user_data, proxy_auth, replace_token);
    if !deleting && let Err(err) = desired.validate() {
        // The schema refuses most of this; what it cannot express ends here.
        return refuse_spec(&proxy, &context, &namespace, status, err.to_string()).await;
    }
    // Deleting needs the provider whatever the gate says now: the instance
    // goes with the Proxy.
    let gated = match &context.namespace_gate {
        Some(gate) if !deleting => gate.check(&desired.provider, &namespace),
        _ => Ok(()),
    };
    let provider = match gated {
        Ok(()) => context.providers.provider(&desired.provider),
        Err(why) => Err(ProviderError::unavailable(why)),
    };
    let provider_ref: Result<&dyn Provider, ProviderError> = match &provider {
        Ok(provider) => Ok(provider.as_ref()),
        Err(err) => Err(err.clone()),
    };
    let state = ProxyState {
        meta: &meta,
        desired: &desired,
        status: &status,
        deleting,
        has_finalizer: proxy.finalizers().iter().any(|f| f == FINALIZER),
        spec_key: &context.spec_key,
    };
    let started = std::time::Instant::now();
    let outcome =
        reconcile(state, provider_ref, &context.policy, unix_now(), random_jitter()).await;
    context.metrics.record_reconcile(started.elapsed(), outcome.error);

    let reference = proxy.object_ref(&());
    for event in &outcome.events {
        // The console's activity, beside the Event.
        if let Some(fleet) = &context.fleet {
            fleet.record_activity_at(
                unix_now(),
                Some((&meta.uid, format!("{namespace}/{name}"))),
                format!("{}: {}", event.reason, event.message),
            );
        }
        let published = context
            .recorder
            .publish(
                &Event {
                    type_: if event.warning { EventType::Warning } else { EventType::Normal },
                    reason: event.reason.to_owned(),
                    note: Some(truncate(&event.message, 1000)),
                    action: "Reconcile".to_owned(),
                    secondary: None,
                },
                &reference,
            )
            .await;
        if let Err(err) = published {
            tracing::warn!(proxy = %name, "cannot record event {}: {err}", event.reason);
        }
    }

    if outcome.status != written {
        let patch = serde_json::json!({
            "apiVersion": "proxyfleet.io/v1alpha1",
            "kind": "Proxy",
            "status": convert::status_to_crd(&outcome.status),
        });
        let answer = api
            .patch_status(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&patch))
            .await?;
        // A new instance recorded: a first create, or a replacement.
        if outcome.status.provider_id.is_some() && outcome.status.provider_id != written.provider_id
        {
            context.own_writes.record(answer);
        }
    }
    let finalizers = match outcome.finalizer {
        FinalizerChange::Keep => None,
        FinalizerChange::Add => {
            let mut list = proxy.finalizers().to_vec();
            list.push(FINALIZER.to_owned());
            Some(list)
        }
        FinalizerChange::Remove => {
            context.own_writes.forget(&meta.uid);
            Some(proxy.finalizers().iter().filter(|f| *f != FINALIZER).cloned().collect())
        }
    };
    if let Some(list) = finalizers {
        // A resourceVersion in a patch body is a precondition: a concurrent
        // change of the object fails this patch (409) and the pass runs again.
        let patch = serde_json::json!({
            "metadata": { "resourceVersion": proxy.resource_version(), "finalizers": list }
        });
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    }
    if outcome.finalizer == FinalizerChange::Add {
        // The watch brings the patched object back, and its new finalizers
        // wake the next pass on a cache that holds them. A requeue right
        // away would often run before that, on the object as it was, and
        // patch again with the old resourceVersion (409); going on here with
        // the patch's answer would race the same watch event into a second
        // pass that has not seen this one's status. The requeue is only a
        // fallback should the event not come.
        return Ok(Action::requeue(AFTER_FINALIZER_FALLBACK));
    }
    Ok(match outcome.requeue_after {
        Some(after) => Action::requeue(after.max(Duration::from_millis(100))),
        None => Action::await_change(),
    })
}

/// Reports a spec that cannot be served: `Provisioned=False/InvalidSpec`
/// naming the field, a warning Event when the message is new, and no
/// provider call. A spec change wakes the Proxy, and so does a change of a
/// labelled Secret it names ([`crate::secrets`]): one that appears later,
/// or gains its label.
async fn refuse_spec(
    proxy: &Proxy,
    context: &Context,
    namespace: &str,
    mut status: proxyfleet_core::proxy::ProxyStatus,
    message: String,
) -> Result<Action, Error> {
    use proxyfleet_core::proxy::{ConditionStatus, ConditionType};
    let before = status.clone();
    let now = unix_now();
    status.observed_generation = proxy.metadata.generation.unwrap_or(0);
    status.set_condition(
        ConditionType::Provisioned,
        ConditionStatus::False,
        "InvalidSpec",
        message.clone(),
        now,
    );
    status.set_condition(
        ConditionType::Ready,
        ConditionStatus::False,
        "InvalidSpec",
        message.clone(),
        now,
    );
    if status != before {
        let api: Api<Proxy> = Api::namespaced(context.client.clone(), namespace);
        let patch = serde_json::json!({
            "apiVersion": "proxyfleet.io/v1alpha1",
            "kind": "Proxy",
            "status": convert::status_to_crd(&status),
        });
        api.patch_status(
            &proxy.name_any(),
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await?;
        let event = Event {
            type_: EventType::Warning,
            reason: "InvalidSpec".to_owned(),
            note: Some(truncate(&message, 1000)),
            action: "Reconcile".to_owned(),
            secondary: None,
        };
        if let Err(err) = context.recorder.publish(&event, &proxy.object_ref(&())).await {
            tracing::warn!(proxy = %proxy.name_any(), "cannot record event InvalidSpec: {err}");
        }
    }
    Ok(Action::requeue(Duration::from_secs(60)))
}

fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proxy(change: impl FnOnce(&mut serde_json::Value)) -> Proxy {
        let mut object = serde_json::json!({
            "apiVersion": "proxyfleet.io/v1alpha1",
            "kind": "Proxy",
            "metadata": {
                "name": "a", "namespace": "ns", "uid": "uid-a", "generation": 1,
                "resourceVersion": "7", "finalizers": [FINALIZER],
            },
            "spec": { "provider": "lab" },
        });
        change(&mut object);
        serde_json::from_value(object).unwrap()
    }

    /// Every pass writes the status; that write used to come back as a
    /// watch event and run one more pass, with a `get`, per Proxy (2.4
    /// provider calls per Proxy to bring 1,000 up, measured by the scale
    /// bench).
    #[test]
    fn regression_a_status_write_wakes_no_pass_and_spec_deletion_and_finalizers_do() {
        let base = spec_or_finalizers(&proxy(|_| {}));
        let status = proxy(|p| {
            p["metadata"]["resourceVersion"] = "8".into();
            p["status"] = serde_json::json!({ "phase": "Running" });
        });
        assert_eq!(spec_or_finalizers(&status), base, "a status write");
        let labelled = proxy(|p| p["metadata"]["labels"] = serde_json::json!({ "team": "a" }));
        assert_eq!(spec_or_finalizers(&labelled), base, "a label");
        let spec = proxy(|p| p["metadata"]["generation"] = 2.into());
        assert_ne!(spec_or_finalizers(&spec), base, "a spec change");
        let deleting =
            proxy(|p| p["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z".into());
        assert_ne!(spec_or_finalizers(&deleting), base, "deletion");
        let unguarded = proxy(|p| p["metadata"]["finalizers"] = serde_json::json!([]));
        assert_ne!(spec_or_finalizers(&unguarded), base, "our finalizer removed");
    }
}
