//! Kubernetes Events about Proxies and entries, a repeat of a recent Event
//! folded into it as a series (`series.count`), as client-go does.
//!
//! kube-runtime's `Recorder` does the same but keeps every Event it
//! published, whole, for six minutes to count repeats: in the scale bench
//! that was the operator's largest allocation once 1,000 Proxies had come
//! up (3 MiB of 18 MiB). This recorder keeps, per recent Event, only what a
//! repeat needs: the Event's name, its count and when it was last seen.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as KubeEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Api;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
pub use kube::runtime::events::{Event, EventType, Reporter};

/// How long a published Event takes repeats into its series.
const SERIES_WINDOW: SignedDuration = SignedDuration::from_mins(6);

/// How often Events past the window are forgotten.
const SWEEP_EVERY: SignedDuration = SignedDuration::from_mins(1);

/// Publishes Events as one reporter.
pub struct Recorder {
    client: kube::Client,
    reporter: Reporter,
    recent: Mutex<Recent>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder").field("reporter", &self.reporter).finish_non_exhaustive()
    }
}

/// What makes a repeat: the same kind of Event about the same object.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    type_: EventType,
    action: String,
    reason: String,
    namespace: String,
    kind: String,
    name: String,
    uid: String,
}

/// A published Event, as far as its repeats need it.
#[derive(Debug)]
struct Published {
    name: String,
    count: i32,
    last: Timestamp,
}

#[derive(Debug)]
struct Recent {
    by_key: HashMap<Key, Published>,
    swept: Timestamp,
}

impl Recorder {
    /// A recorder publishing as `reporter`.
    pub fn new(client: kube::Client, reporter: Reporter) -> Self {
        Self {
            client,
            reporter,
            recent: Mutex::new(Recent { by_key: HashMap::new(), swept: Timestamp::now() }),
        }
    }

    /// Publishes `event` about `regarding`: a new Event, or one more of a
    /// series when the same Event was published within the last six
    /// minutes. Events of cluster-scoped objects go to `default`.
    ///
    /// # Errors
    ///
    /// The API server's refusal.
    pub async fn publish(
        &self,
        event: &Event,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        let namespace = regarding.namespace.clone().unwrap_or_else(|| "default".to_owned());
        let key = Key {
            type_: event.type_,
            action: event.action.clone(),
            reason: event.reason.clone(),
            namespace: namespace.clone(),
            kind: regarding.kind.clone().unwrap_or_default(),
            name: regarding.name.clone().unwrap_or_default(),
            uid: regarding.uid.clone().unwrap_or_default(),
        };
        let repeat = self.repeat_of(&key, now);
        let events: Api<KubeEvent> = Api::namespaced(self.client.clone(), &namespace);
        if let Some((name, count)) = repeat {
            let patch = serde_json::json!({
                "series": EventSeries { count, last_observed_time: MicroTime(now) },
            });
            match events.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                Ok(_) => return Ok(()),
                // Gone (the API server's own expiry, or deleted by hand):
                // this one starts anew.
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(err) => return Err(err),
            }
        }
        let created =
            events.create(&PostParams::default(), &self.new_event(event, regarding, now)).await?;
        if let Some(name) = created.metadata.name {
            self.lock().by_key.insert(key, Published { name, count: 1, last: now });
        }
        Ok(())
    }

    /// The name and next count of the recent Event `key` repeats, counted
    /// as published now.
    fn repeat_of(&self, key: &Key, now: Timestamp) -> Option<(String, i32)> {
        let mut recent = self.lock();
        if now.duration_since(recent.swept) > SWEEP_EVERY {
            recent.by_key.retain(|_, published| now.duration_since(published.last) < SERIES_WINDOW);
            recent.swept = now;
        }
        let published = recent.by_key.get_mut(key)?;
        if now.duration_since(published.last) >= SERIES_WINDOW {
            return None;
        }
        published.count = published.count.saturating_add(1);
        published.last = now;
        Some((published.name.clone(), published.count))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Recent> {
        // A panic elsewhere while holding it leaves nothing half-written
        // that matters: the map only decides between a series and a new
        // Event.
        self.recent.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn new_event(&self, event: &Event, regarding: &ObjectReference, now: Timestamp) -> KubeEvent {
        let controller = &self.reporter.controller;
        KubeEvent {
            metadata: ObjectMeta {
                namespace: regarding.namespace.clone(),
                // Unique per object and moment, as client-go names them.
                name: Some(format!(
                    "{}.{:x}",
                    regarding.name.as_deref().unwrap_or(controller),
                    now.as_nanosecond()
                )),
                ..ObjectMeta::default()
            },
            action: Some(event.action.clone()),
            reason: Some(event.reason.clone()),
            note: event.note.clone(),
            type_: Some(
                match event.type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .to_owned(),
            ),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            related: event.secondary.clone(),
            reporting_controller: Some(controller.clone()),
            reporting_instance: Some(
                self.reporter.instance.clone().unwrap_or_else(|| controller.clone()),
            ),
            ..KubeEvent::default()
        }
    }
}
