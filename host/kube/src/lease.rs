//! Leader election on a `coordination.k8s.io/v1` Lease: only the holder
//! reconciles, collects orphans and checks providers.
//!
//! The holder renews the Lease every `renew_every`; a candidate takes it
//! over once `renewTime + leaseDurationSeconds` has passed. Every write is a
//! conditional update on the Lease's resourceVersion, so two candidates can
//! never both believe they won. A holder that cannot renew within the lease
//! duration stops leading before anyone else may start.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};

/// How a candidate takes part in the election.
#[derive(Debug, Clone)]
pub struct ElectionConfig {
    /// Lease name.
    pub lease: String,
    /// This candidate's identity (pod name).
    pub identity: String,
    /// How long a Lease is valid without renewal.
    pub lease_duration: Duration,
    /// How often the holder renews (and a candidate retries).
    pub renew_every: Duration,
}

/// A candidate for leadership.
#[derive(Debug, Clone)]
pub struct LeaderElector {
    api: Api<Lease>,
    config: ElectionConfig,
}

impl LeaderElector {
    /// A candidate using a Lease in `namespace`.
    pub fn new(client: kube::Client, namespace: &str, config: ElectionConfig) -> Self {
        Self { api: Api::namespaced(client, namespace), config }
    }

    /// This candidate's identity.
    pub fn identity(&self) -> &str {
        &self.config.identity
    }

    /// Takes or renews the Lease; `Ok(true)` while this candidate holds it.
    pub async fn try_acquire_or_renew(&self) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        let duration = i32::try_from(self.config.lease_duration.as_secs()).unwrap_or(i32::MAX);
        let Some(mut lease) = self.api.get_opt(&self.config.lease).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.lease.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.config.identity.clone()),
                    lease_duration_seconds: Some(duration),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(err) if is_conflict(&err) => Ok(false),
                Err(err) => Err(err),
            };
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        let mine = spec.holder_identity.as_deref() == Some(self.config.identity.as_str());
        if !mine {
            let held = spec.holder_identity.as_deref().is_some_and(|h| !h.is_empty());
            let valid_until = spec.renew_time.as_ref().map(|t| {
                let seconds = i64::from(spec.lease_duration_seconds.unwrap_or(duration));
                t.0.as_second().saturating_add(seconds)
            });
            if held && valid_until.is_some_and(|until| until > now.as_second()) {
                return Ok(false);
            }
            spec.holder_identity = Some(self.config.identity.clone());
            spec.acquire_time = Some(MicroTime(now));
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.renew_time = Some(MicroTime(now));
        spec.lease_duration_seconds = Some(duration);
        // The resourceVersion from the read makes this a conditional update.
        match self.api.replace(&self.config.lease, &PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(err) if is_conflict(&err) => Ok(false),
            Err(err) => Err(err),
        }
    }

    /// Gives the Lease up so another candidate can take over at once.
    pub async fn release(&self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.config.lease).await? else { return Ok(()) };
        let Some(spec) = lease.spec.as_mut() else { return Ok(()) };
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.renew_time = None;
        match self.api.replace(&self.config.lease, &PostParams::default(), &lease).await {
            Ok(_) => Ok(()),
            Err(err) if is_conflict(&err) => Ok(()),
            Err(err) => Err(err),
        }
    }

    /// Runs `lead` whenever this candidate holds the Lease, until `shutdown`.
    /// `lead` gets a future that resolves when leadership is lost (or on
    /// shutdown) and must return soon after it does.
    pub async fn run<F, Fut>(&self, mut lead: F, shutdown: impl Future<Output = ()>)
    where
        F: FnMut(tokio::sync::watch::Receiver<bool>) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        tokio::pin!(shutdown);
        let mut leading: Option<(tokio::sync::watch::Sender<bool>, tokio::task::JoinHandle<()>)> =
            None;
        let mut last_renewal = Instant::now();
        loop {
            let holds = match self.try_acquire_or_renew().await {
                Ok(holds) => holds,
                Err(err) => {
                    tracing::warn!(identity = %self.config.identity, "lease: {err}");
                    // Keep leading only while the last renewal is still valid.
                    leading.is_some() && last_renewal.elapsed() < self.config.lease_duration
                }
            };
            match (holds, leading.is_some()) {
                (true, false) => {
                    tracing::info!(identity = %self.config.identity, lease = %self.config.lease, "leading");
                    let (stop, stopped) = tokio::sync::watch::channel(false);
                    leading = Some((stop, tokio::spawn(lead(stopped))));
                    last_renewal = Instant::now();
                }
                (true, true) => last_renewal = Instant::now(),
                (false, true) => {
                    tracing::warn!(identity = %self.config.identity, "lost the lease; stopping");
                    stop_leading(leading.take()).await;
                }
                (false, false) => {}
            }
            tokio::select! {
                () = &mut shutdown => break,
                () = tokio::time::sleep(self.config.renew_every) => {}
            }
        }
        stop_leading(leading.take()).await;
        if let Err(err) = self.release().await {
            tracing::warn!(identity = %self.config.identity, "cannot release the lease: {err}");
        }
    }
}

async fn stop_leading(
    leading: Option<(tokio::sync::watch::Sender<bool>, tokio::task::JoinHandle<()>)>,
) {
    if let Some((stop, task)) = leading {
        let _ = stop.send(true);
        if let Err(err) = task.await {
            tracing::error!("the leader's work ended abnormally: {err}");
        }
    }
}

fn is_conflict(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 409)
}
