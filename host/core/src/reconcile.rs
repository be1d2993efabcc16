//! The reconciler's state machine: one pass over one Proxy.
//!
//! A pass reads the Proxy (identity, desired state, status, whether it is
//! being deleted and whether our finalizer is on it), talks to its provider
//! through the [`Provider`] trait, and returns the new status, the
//! finalizer change, events and when to look again. It knows nothing of
//! where Proxies are stored: the Kubernetes controller and the standalone
//! driver both run this same function and persist its [`Outcome`].
//!
//! Rules it keeps:
//! - the instance is deleted, and confirmed gone with `get`, before the
//!   finalizer goes; a failed delete keeps the finalizer and says why;
//! - a Proxy deleted before its create was recorded still gets its
//!   instance removed: `list` finds it by the ownership mark;
//! - a change of the spec hash replaces the instance (delete, confirm, create);
//! - final errors latch `Failed` until the spec changes: no calls meanwhile;
//! - a failed `get` never drops an address: a provider outage is not an
//!   instance outage, and a running instance that flaps to provisioning
//!   keeps its address for a few polls.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::proxy::{ConditionStatus, ConditionType, Phase, ProxyDesired, ProxyMeta, ProxyStatus};
use crate::spec_key::SpecKey;
use crate::{ErrorClass, Instance, InstanceState, Provider, ProviderError};

/// The finalizer proxyfleet puts on Proxies.
pub const FINALIZER: &str = "proxyfleet.io/instance";

/// Timing of the state machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    /// First retry after a retryable error; doubles per attempt.
    pub backoff_base: Duration,
    /// Longest retry interval.
    pub backoff_max: Duration,
    /// First retry after a quota error.
    pub quota_backoff_base: Duration,
    /// Longest retry interval after quota errors.
    pub quota_backoff_max: Duration,
    /// How often a running Proxy is looked at again.
    pub resync: Duration,
    /// First poll of an instance that is starting (or going away).
    pub provisioning_poll_first: Duration,
    /// Longest interval between polls of an instance that is starting (or
    /// going away). In between, a Proxy is polled after half the time it
    /// has waited so far: a backend that starts instances in a second is
    /// seen Running within about a second, one that takes minutes is polled
    /// no more often than this.
    pub provisioning_poll: Duration,
    /// Polls a running instance may report provisioning (an agent restart)
    /// before its address is dropped.
    pub flap_tolerance: u32,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            backoff_base: Duration::from_secs(5),
            backoff_max: Duration::from_secs(300),
            quota_backoff_base: Duration::from_secs(60),
            quota_backoff_max: Duration::from_secs(1800),
            resync: Duration::from_secs(60),
            provisioning_poll_first: Duration::from_millis(500),
            provisioning_poll: Duration::from_secs(5),
            flap_tolerance: 3,
        }
    }
}

impl Policy {
    /// Exponential backoff for the `attempts`-th failure in a row, spread by
    /// `jitter` in `[0, 1)` to ±20% so a fleet does not retry in lockstep.
    pub fn backoff(&self, class: ErrorClass, attempts: u32, jitter: f64) -> Duration {
        let (base, max) = if class == ErrorClass::QuotaExceeded {
            (self.quota_backoff_base, self.quota_backoff_max)
        } else {
            (self.backoff_base, self.backoff_max)
        };
        let exponent = attempts.saturating_sub(1).min(20);
        let raw = base.saturating_mul(1 << exponent).min(max);
        spread(raw, jitter)
    }

    /// When to look again at a running Proxy: `resync` spread by `jitter`
    /// to ±20%. Proxies that came up together (a new fleet, every Proxy of
    /// a restarted operator) would otherwise all be looked at in the same
    /// second every interval: a burst of calls at the backend's API each
    /// time, instead of a steady trickle.
    pub fn resync_after(&self, jitter: f64) -> Duration {
        spread(self.resync, jitter)
    }

    /// When to poll again an instance that has been starting (or going
    /// away) for `waited`: after half that, no sooner than
    /// `provisioning_poll_first` and no later than `provisioning_poll`.
    pub fn provisioning_poll_after(&self, waited: Duration) -> Duration {
        let first = self.provisioning_poll_first;
        (waited / 2).min(self.provisioning_poll.max(first)).max(first)
    }
}

/// `duration` spread by `jitter` in `[0, 1)` to ±20%.
fn spread(duration: Duration, jitter: f64) -> Duration {
    duration.mul_f64(0.8 + 0.4 * jitter.clamp(0.0, 1.0))
}

/// A jitter for [`reconcile`] and [`Policy::backoff`]: uniform in `[0, 1)`,
/// from the thread's random generator, so the retries of many Proxies
/// spread out.
pub fn random_jitter() -> f64 {
    rand::random()
}

/// What a pass reads.
#[derive(Debug, Clone, Copy)]
pub struct ProxyState<'a> {
    /// Identity.
    pub meta: &'a ProxyMeta,
    /// Desired state.
    pub desired: &'a ProxyDesired,
    /// Current status.
    pub status: &'a ProxyStatus,
    /// Deletion was requested.
    pub deleting: bool,
    /// Our finalizer is on the Proxy.
    pub has_finalizer: bool,
    /// The installation's key for the spec hash.
    pub spec_key: &'a SpecKey,
}

/// What to do with the finalizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinalizerChange {
    /// Leave it as it is.
    Keep,
    /// Add it (before anything is created).
    Add,
    /// Remove it: the instance is confirmed gone.
    Remove,
}

/// An event to record on the Proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyEvent {
    /// A warning rather than a normal event.
    pub warning: bool,
    /// CamelCase reason.
    pub reason: &'static str,
    /// For people.
    pub message: String,
}

/// What a pass decided.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The new status.
    pub status: ProxyStatus,
    /// The finalizer change.
    pub finalizer: FinalizerChange,
    /// Events to record.
    pub events: Vec<ProxyEvent>,
    /// When to run again; `None` waits for a change of the Proxy.
    pub requeue_after: Option<Duration>,
    /// The class of the error the pass ended in, for metrics.
    pub error: Option<ErrorClass>,
}

/// Runs one pass. `provider` is the Proxy's provider entry, or why there is
/// none (an unknown or failed entry): then no call is made. `now` is Unix
/// seconds; `jitter` in `[0, 1)` spreads retries.
pub async fn reconcile(
    state: ProxyState<'_>,
    provider: Result<&dyn Provider, ProviderError>,
    policy: &Policy,
    now: u64,
    jitter: f64,
) -> Outcome {
    let mut pass = Pass {
        state,
        policy,
        now,
        jitter,
        fresh_instance: false,
        outcome: Outcome {
            status: state.status.clone(),
            finalizer: FinalizerChange::Keep,
            events: Vec::new(),
            requeue_after: None,
            error: None,
        },
    };
    if state.deleting {
        if state.has_finalizer {
            pass.delete(provider).await;
        }
        return pass.outcome;
    }
    if !state.has_finalizer {
        // The finalizer goes on before anything exists that it must guard.
        pass.outcome.finalizer = FinalizerChange::Add;
        pass.outcome.requeue_after = Some(Duration::ZERO);
        return pass.outcome;
    }
    pass.converge(provider).await;
    pass.outcome
}

struct Pass<'a> {
    state: ProxyState<'a>,
    policy: &'a Policy,
    now: u64,
    jitter: f64,
    /// The instance was created in this pass: it has waited no time yet,
    /// whatever the Provisioned condition's age says (a create after
    /// failed attempts finds it old).
    fresh_instance: bool,
    outcome: Outcome,
}

impl Pass<'_> {
    fn status(&mut self) -> &mut ProxyStatus {
        &mut self.outcome.status
    }

    fn event(&mut self, warning: bool, reason: &'static str, message: impl Into<String>) {
        self.outcome.events.push(ProxyEvent { warning, reason, message: message.into() });
    }

    fn set_provisioned(
        &mut self,
        status: ConditionStatus,
        reason: &str,
        message: impl Into<String>,
    ) {
        let now = self.now;
        self.status().set_condition(ConditionType::Provisioned, status, reason, message, now);
        self.update_ready();
    }

    /// Looks again soon while an instance is new, less often as it keeps
    /// the Proxy waiting; call after setting the Provisioned condition.
    fn poll_later(&mut self) {
        let since = self
            .outcome
            .status
            .condition(ConditionType::Provisioned)
            .map_or(self.now, |condition| condition.last_transition_time);
        let waited = if self.fresh_instance {
            Duration::ZERO
        } else {
            Duration::from_secs(self.now.saturating_sub(since))
        };
        self.outcome.requeue_after = Some(self.policy.provisioning_poll_after(waited));
    }

    fn update_ready(&mut self) {
        let now = self.now;
        self.status().refresh_ready(now);
    }

    async fn converge(&mut self, provider: Result<&dyn Provider, ProviderError>) {
        let hash = self.state.desired.spec_hash(self.state.spec_key);
        self.status().observed_generation = self.state.meta.generation;
        if self.outcome.status.failed_spec_hash.as_deref() == Some(hash.as_str()) {
            // Latched: nothing changes until the spec does.
            return;
        }
        if self.outcome.status.failed_spec_hash.take().is_some() {
            self.status().attempts = 0;
            self.status().phase = Phase::Pending;
        }
        let provider = match provider {
            Ok(provider) => provider,
            Err(err) => return self.fail(&err, "ProviderUnavailable"),
        };
        let info = provider.info();
        self.status().plugin = Some(info.name);
        self.status().plugin_version = Some(info.version);

        if let Some(id) = self.outcome.status.provider_id.clone()
            && self.outcome.status.spec_hash.as_deref() != Some(hash.as_str())
            && !self.replace(provider, &id).await
        {
            return;
        }
        match self.outcome.status.provider_id.clone() {
            None => self.create(provider, hash).await,
            Some(id) => match provider.get(&id).await {
                Ok(instance) => self.observe(provider, instance).await,
                Err(err) if err.class == ErrorClass::NotFound => {
                    self.event(true, "InstanceLost", format!("instance {id} is gone: {err}"));
                    self.forget_instance();
                    self.set_provisioned(
                        ConditionStatus::False,
                        "InstanceLost",
                        format!("instance {id} is gone; creating a new one"),
                    );
                    self.outcome.requeue_after = Some(Duration::ZERO);
                }
                // The provider failed, not the instance: keep what we know.
                Err(err) => self.retry_later(&err, "ProviderError"),
            },
        }
    }

    /// Deletes the instance made for an older spec. Returns whether it is
    /// confirmed gone, so a new one may be created.
    async fn replace(&mut self, provider: &dyn Provider, id: &str) -> bool {
        self.status().phase = Phase::Provisioning;
        match delete_confirmed(provider, id).await {
            Ok(true) => {
                self.event(
                    false,
                    "Replaced",
                    format!("deleted instance {id} made for the previous spec"),
                );
                self.forget_instance();
                true
            }
            Ok(false) => {
                self.set_provisioned(
                    ConditionStatus::False,
                    "Replacing",
                    format!("waiting for instance {id} to go"),
                );
                self.poll_later();
                false
            }
            Err(err) => {
                self.fail(&err, "ReplaceFailed");
                false
            }
        }
    }

    async fn create(&mut self, provider: &dyn Provider, hash: String) {
        let spec = self.state.desired.to_spec(self.state.meta);
        self.status().phase = Phase::Provisioning;
        match provider.create(&spec).await {
            Ok(instance) => {
                self.status().spec_hash = Some(hash);
                self.status().provider_id = Some(instance.provider_id.clone());
                self.event(false, "Created", format!("instance {} created", instance.provider_id));
                self.fresh_instance = true;
                self.observe(provider, instance).await;
            }
            Err(err) => self.fail(&err, "CreateFailed"),
        }
    }

    async fn observe(&mut self, provider: &dyn Provider, instance: Instance) {
        let address = instance.addresses.first().cloned();
        match (instance.state, address) {
            (InstanceState::Running, Some(ip)) => {
                let status = self.status();
                status.phase = Phase::Running;
                status.ip = Some(ip.clone());
                status.port = instance.port;
                status.attempts = 0;
                status.flaps = 0;
                self.set_provisioned(
                    ConditionStatus::True,
                    "Running",
                    format!("instance {} runs at {ip}", instance.provider_id),
                );
                self.outcome.requeue_after = Some(self.policy.resync_after(self.jitter));
            }
            (InstanceState::Failed, _) => {
                self.event(
                    true,
                    "InstanceFailed",
                    format!(
                        "the provider reports instance {} failed; replacing it",
                        instance.provider_id
                    ),
                );
                match delete_confirmed(provider, &instance.provider_id).await {
                    Ok(_) => {
                        self.forget_instance();
                        self.status().attempts += 1;
                        self.set_provisioned(
                            ConditionStatus::False,
                            "InstanceFailed",
                            "the failed instance is being replaced",
                        );
                        let attempts = self.outcome.status.attempts;
                        self.outcome.requeue_after =
                            Some(self.policy.backoff(ErrorClass::Transient, attempts, self.jitter));
                    }
                    Err(err) => self.fail(&err, "DeleteFailed"),
                }
            }
            (state, _) => {
                let was_serving =
                    self.outcome.status.phase == Phase::Running && self.outcome.status.ip.is_some();
                if was_serving && self.outcome.status.flaps < self.policy.flap_tolerance {
                    // An agent restart must not pull a healthy proxy out of
                    // rotation: keep the address for a few polls.
                    self.status().flaps += 1;
                } else {
                    let status = self.status();
                    status.phase = Phase::Provisioning;
                    status.ip = None;
                    status.flaps = 0;
                    let reason = if state == InstanceState::Stopped {
                        "InstanceStopped"
                    } else {
                        "Provisioning"
                    };
                    self.set_provisioned(
                        ConditionStatus::False,
                        reason,
                        format!(
                            "instance {} is {state:?} with no usable address",
                            instance.provider_id
                        ),
                    );
                }
                self.poll_later();
            }
        }
    }

    fn forget_instance(&mut self) {
        let status = self.status();
        status.provider_id = None;
        status.ip = None;
        status.port = None;
        status.spec_hash = None;
        status.flaps = 0;
    }

    /// A failure of create, delete or replace: final classes latch `Failed`,
    /// the others back off.
    fn fail(&mut self, err: &ProviderError, retry_reason: &'static str) {
        let final_reason = match err.class {
            ErrorClass::Permanent => Some("PermanentError"),
            ErrorClass::InvalidSpec => Some("InvalidSpec"),
            ErrorClass::InvalidConfig => Some("InvalidConfig"),
            ErrorClass::Unauthorized => Some("Unauthorized"),
            _ => None,
        };
        match final_reason {
            Some(reason) => {
                self.outcome.error = Some(err.class);
                let hash = self.state.desired.spec_hash(self.state.spec_key);
                let status = self.status();
                status.phase = Phase::Failed;
                status.failed_spec_hash = Some(hash);
                self.set_provisioned(ConditionStatus::False, reason, err.to_string());
                self.event(
                    true,
                    reason,
                    format!("{err}; no further attempts until the spec changes"),
                );
                self.outcome.requeue_after = None;
            }
            None => {
                let reason = match err.class {
                    ErrorClass::QuotaExceeded => "QuotaExceeded",
                    ErrorClass::PluginFault => "PluginFault",
                    ErrorClass::Timeout => "ProviderTimeout",
                    ErrorClass::Unavailable => "ProviderUnavailable",
                    _ => retry_reason,
                };
                self.set_provisioned(ConditionStatus::False, reason, err.to_string());
                self.retry_later(err, reason);
            }
        }
    }

    fn retry_later(&mut self, err: &ProviderError, reason: &'static str) {
        self.outcome.error = Some(err.class);
        self.status().attempts += 1;
        let attempts = self.outcome.status.attempts;
        let wait = self.policy.backoff(err.class, attempts, self.jitter);
        self.event(true, reason, format!("{err}; retrying in {}s", wait.as_secs()));
        self.outcome.requeue_after = Some(wait);
    }

    async fn delete(&mut self, provider: Result<&dyn Provider, ProviderError>) {
        self.status().phase = Phase::Deleting;
        let provider = match provider {
            Ok(provider) => provider,
            Err(err) => return self.delete_failed(&err),
        };
        let ids = match self.outcome.status.provider_id.clone() {
            Some(id) => vec![id],
            // Deleted before a create was recorded: find what a create may
            // have left by our mark.
            None => match provider.list().await {
                Ok(instances) => instances
                    .into_iter()
                    .filter(|i| i.mark.as_ref().is_some_and(|m| m.uid == self.state.meta.uid))
                    .map(|i| i.provider_id)
                    .collect(),
                Err(err) => return self.delete_failed(&err),
            },
        };
        for id in ids {
            match delete_confirmed(provider, &id).await {
                Ok(true) => self.event(false, "Deleted", format!("instance {id} deleted")),
                Ok(false) => {
                    self.set_provisioned(
                        ConditionStatus::False,
                        "Deleting",
                        format!("waiting for instance {id} to go"),
                    );
                    self.poll_later();
                    return;
                }
                Err(err) => return self.delete_failed(&err),
            }
        }
        self.forget_instance();
        self.outcome.finalizer = FinalizerChange::Remove;
    }

    fn delete_failed(&mut self, err: &ProviderError) {
        self.set_provisioned(ConditionStatus::False, "DeleteFailed", err.to_string());
        self.outcome.error = Some(err.class);
        self.status().attempts += 1;
        let attempts = self.outcome.status.attempts;
        // Deletion retries even after final errors: the finalizer must not
        // hang forever on a fixed credential or config.
        let class = if err.class.is_retryable() { err.class } else { ErrorClass::Transient };
        let wait = self.policy.backoff(class, attempts, self.jitter);
        self.event(
            true,
            "DeleteFailed",
            format!("{err}; the finalizer stays; retrying in {}s", wait.as_secs()),
        );
        self.outcome.requeue_after = Some(wait);
    }
}

/// Deletes and confirms with `get`: `Ok(true)` when gone, `Ok(false)` while
/// the backend still shows it.
async fn delete_confirmed(provider: &dyn Provider, id: &str) -> Result<bool, ProviderError> {
    provider.delete(id).await?;
    match provider.get(id).await {
        Err(err) if err.class == ErrorClass::NotFound => Ok(true),
        Err(err) => Err(err),
        Ok(_) => Ok(false),
    }
}

#[cfg(test)]
mod tests;
