//! Operators' actions in Kubernetes mode: a replacement asked for by the
//! [`REPLACE_ANNOTATION`] on the Proxy, and every action recorded as an
//! Event on the object it concerns (the Proxy, or the entry's
//! ClusterProxyProvider), so `kubectl describe` and `kubectl get events` show who
//! did what to the fleet next to what the controller did.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Api;
use kube::api::{Patch, PatchParams};
use proxyfleet_fleet::action::{Action, ProxyRef};
use proxyfleet_fleet::mode::Refusal;

use crate::crd::{MANAGER, Proxy, REPLACE_ANNOTATION};
use crate::events::{Event, EventType, Recorder, Reporter};

/// Carries out and records operators' actions as one replica.
pub struct OperatorActions {
    client: kube::Client,
    recorder: Recorder,
}

impl std::fmt::Debug for OperatorActions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorActions").field("recorder", &self.recorder).finish_non_exhaustive()
    }
}

impl OperatorActions {
    /// Actions reported as replica `instance`.
    pub fn new(client: kube::Client, instance: String) -> Self {
        let reporter = Reporter { controller: MANAGER.to_owned(), instance: Some(instance) };
        Self { recorder: Recorder::new(client.clone(), reporter), client }
    }

    /// Sets the replace annotation of `proxy` to a new value. The patch
    /// names the Proxy's UID: a Proxy deleted and made again under the same
    /// name in between is refused (the UID cannot change), not replaced.
    ///
    /// # Errors
    /// [`Refusal::NotFound`] when the Proxy is gone or is another one now,
    /// [`Refusal::Unavailable`] when the API server did not take the patch.
    pub async fn replace(&self, proxy: &ProxyRef) -> Result<(), Refusal> {
        let api: Api<Proxy> = Api::namespaced(self.client.clone(), &proxy.namespace);
        let token = uuid::Uuid::new_v4().to_string();
        let patch = serde_json::json!({
            "metadata": {
                "uid": proxy.id,
                "annotations": { REPLACE_ANNOTATION: token },
            }
        });
        match api.patch(&proxy.name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => {
                Err(Refusal::NotFound(format!("Proxy {} is gone", proxy.qualified())))
            }
            Err(kube::Error::Api(status)) if matches!(status.code, 409 | 422) => {
                Err(Refusal::NotFound(format!(
                    "Proxy {} was deleted and made again; open its page anew",
                    proxy.qualified()
                )))
            }
            Err(err) => Err(Refusal::Unavailable(format!(
                "the Kubernetes API did not take the replacement of Proxy {}: {err}",
                proxy.qualified()
            ))),
        }
    }

    /// Publishes `action` as an Event on the Proxy or the ClusterProxyProvider it
    /// concerns; a failure is logged.
    pub async fn record(&self, action: &Action) {
        let reference = match (action.proxy(), action.entry()) {
            (Some(proxy), _) => ObjectReference {
                api_version: Some("proxyfleet.io/v1alpha1".to_owned()),
                kind: Some("Proxy".to_owned()),
                name: Some(proxy.name.clone()),
                namespace: Some(proxy.namespace.clone()),
                uid: Some(proxy.id.clone()),
                ..ObjectReference::default()
            },
            // Events of cluster-scoped objects live in `default`.
            (None, Some(entry)) => ObjectReference {
                api_version: Some("proxyfleet.io/v1alpha1".to_owned()),
                kind: Some("ClusterProxyProvider".to_owned()),
                name: Some(entry.to_owned()),
                namespace: Some("default".to_owned()),
                ..ObjectReference::default()
            },
            (None, None) => return,
        };
        let event = Event {
            type_: EventType::Normal,
            reason: action.reason().to_owned(),
            note: Some(action.note()),
            action: "Operate".to_owned(),
            secondary: None,
        };
        if let Err(err) = self.recorder.publish(&event, &reference).await {
            tracing::warn!(reason = action.reason(), "cannot record an operator's action: {err}");
        }
    }
}
