//! Which namespaces a ClusterProxyProvider serves: all of them, unless its
//! `spec.allowedNamespaces` label selector says otherwise.
//!
//! The Proxy controller asks before a pass uses a provider; a Proxy in a
//! namespace the selector leaves out is not provisioned, and its
//! condition names the provider and the selector (its instance, if it has
//! one, is still deleted with it). The answers come from caches of the
//! providers and the namespaces, so a pass asks the API server nothing, and
//! relabelling a namespace or editing the selector takes effect at the
//! next pass.

use std::collections::BTreeMap;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::Api;
use kube::core::{Selector, SelectorExt as _};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt as _, watcher};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

use crate::crd::{ClusterProxyProvider, LabelOperator, NamespaceSelector};

/// The caches the answers come from; cheap to clone.
#[derive(Clone)]
pub struct NamespaceGate {
    providers: Store<ClusterProxyProvider>,
    namespaces: Store<Namespace>,
}

impl std::fmt::Debug for NamespaceGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NamespaceGate")
            .field("providers", &self.providers.len())
            .field("namespaces", &self.namespaces.len())
            .finish()
    }
}

impl NamespaceGate {
    /// A gate over watches of the providers and the namespaces, with the
    /// future that runs them (until dropped).
    pub fn watching(client: &kube::Client) -> (Self, impl Future<Output = ()> + Send + 'static) {
        let (providers, provider_writer) = reflector::store();
        let (namespaces, namespace_writer) = reflector::store();
        let provider_events =
            watcher(Api::<ClusterProxyProvider>::all(client.clone()), watcher::Config::default())
                .default_backoff()
                .reflect(provider_writer)
                .for_each(|event| async move {
                    if let Err(err) = event {
                        tracing::warn!("ClusterProxyProvider watch of the namespace gate: {err}");
                    }
                });
        let namespace_events =
            watcher(Api::<Namespace>::all(client.clone()), watcher::Config::default())
                .default_backoff()
                .reflect(namespace_writer)
                .for_each(|event| async move {
                    if let Err(err) = event {
                        tracing::warn!("Namespace watch of the namespace gate: {err}");
                    }
                });
        let run = async move {
            tokio::join!(provider_events, namespace_events);
        };
        (Self { providers, namespaces }, run)
    }

    /// A gate over caches the caller fills (tests).
    pub fn over(providers: Store<ClusterProxyProvider>, namespaces: Store<Namespace>) -> Self {
        Self { providers, namespaces }
    }

    /// Whether the entry `provider` may serve Proxies of `namespace`; why
    /// not, naming the provider and its selector. An entry that no
    /// ClusterProxyProvider declares (a providers-file entry) serves every
    /// namespace.
    pub fn check(&self, provider: &str, namespace: &str) -> Result<(), String> {
        let Some(declared) = self.providers.get(&ObjectRef::new(provider)) else {
            return Ok(());
        };
        let Some(selector) = declared.spec.allowed_namespaces.clone() else {
            return Ok(());
        };
        let shown = serde_json::to_string(&selector).unwrap_or_default();
        let selector = Selector::try_from(label_selector(selector)).map_err(|err| {
            format!(
                "ClusterProxyProvider {provider:?} has an unusable spec.allowedNamespaces \
                 ({shown}): {err}"
            )
        })?;
        let Some(found) = self.namespaces.get(&ObjectRef::new(namespace)) else {
            return Err(format!(
                "namespace {namespace:?} is not known yet to check it against \
                 ClusterProxyProvider {provider:?}'s spec.allowedNamespaces"
            ));
        };
        let mut labels: BTreeMap<String, String> =
            found.metadata.labels.clone().unwrap_or_default();
        // Set by the API server from 1.21 on; the same before.
        labels
            .entry("kubernetes.io/metadata.name".to_owned())
            .or_insert_with(|| namespace.to_owned());
        if selector.matches(&labels) {
            Ok(())
        } else {
            Err(format!(
                "ClusterProxyProvider {provider:?} does not serve namespace {namespace:?}: its \
                 spec.allowedNamespaces ({shown}) does not select it; ask its owners to widen it, \
                 or name another provider in spec.provider"
            ))
        }
    }
}

/// The selector as Kubernetes' own type, which kube matches with.
fn label_selector(selector: NamespaceSelector) -> LabelSelector {
    let expressions = selector
        .match_expressions
        .into_iter()
        .map(|requirement| LabelSelectorRequirement {
            key: requirement.key,
            operator: match requirement.operator {
                LabelOperator::In => "In",
                LabelOperator::NotIn => "NotIn",
                LabelOperator::Exists => "Exists",
                LabelOperator::DoesNotExist => "DoesNotExist",
            }
            .to_owned(),
            values: Some(requirement.values).filter(|values| !values.is_empty()),
        })
        .collect::<Vec<_>>();
    LabelSelector {
        match_labels: Some(selector.match_labels).filter(|labels| !labels.is_empty()),
        match_expressions: Some(expressions).filter(|expressions| !expressions.is_empty()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(providers: &[serde_json::Value], namespaces: &[serde_json::Value]) -> NamespaceGate {
        let (provider_store, mut provider_writer) = reflector::store();
        for object in providers {
            provider_writer.apply_watcher_event(&watcher::Event::Apply(
                serde_json::from_value::<ClusterProxyProvider>(object.clone()).unwrap(),
            ));
        }
        let (namespace_store, mut namespace_writer) = reflector::store();
        for object in namespaces {
            namespace_writer.apply_watcher_event(&watcher::Event::Apply(
                serde_json::from_value::<Namespace>(object.clone()).unwrap(),
            ));
        }
        NamespaceGate::over(provider_store, namespace_store)
    }

    fn provider(name: &str, allowed: Option<serde_json::Value>) -> serde_json::Value {
        let mut spec = serde_json::json!({ "plugin": "static" });
        if let Some(allowed) = allowed {
            spec["allowedNamespaces"] = allowed;
        }
        serde_json::json!({
            "apiVersion": "proxyfleet.io/v1alpha1",
            "kind": "ClusterProxyProvider",
            "metadata": { "name": name },
            "spec": spec,
        })
    }

    fn namespace(name: &str, labels: serde_json::Value) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": { "name": name, "labels": labels },
        })
    }

    #[test]
    fn a_provider_serves_the_namespaces_its_selector_picks() {
        let gate = gate(
            &[
                provider("open", None),
                provider("team-a", Some(serde_json::json!({ "matchLabels": { "team": "a" } }))),
                provider(
                    "by-name",
                    Some(serde_json::json!({ "matchExpressions": [
                        { "key": "kubernetes.io/metadata.name", "operator": "In", "values": ["crawl-b"] }
                    ] })),
                ),
            ],
            &[
                namespace("crawl-a", serde_json::json!({ "team": "a" })),
                namespace("crawl-b", serde_json::json!({})),
            ],
        );
        assert_eq!(gate.check("open", "crawl-b"), Ok(()));
        assert_eq!(gate.check("team-a", "crawl-a"), Ok(()));
        let refused = gate.check("team-a", "crawl-b").unwrap_err();
        assert!(refused.contains("\"team-a\"") && refused.contains("spec.allowedNamespaces"));
        assert!(refused.contains(r#""team":"a""#), "the selector is shown: {refused}");
        assert_eq!(gate.check("by-name", "crawl-b"), Ok(()), "the name label is always there");
        assert!(gate.check("by-name", "crawl-a").is_err());
        assert_eq!(gate.check("file-entry", "crawl-b"), Ok(()), "not a resource: no gate");
        assert!(gate.check("team-a", "unknown").unwrap_err().contains("not known yet"));
    }

    #[test]
    fn an_unusable_selector_is_named() {
        let bad = serde_json::json!({ "matchExpressions": [
            { "key": "team", "operator": "In" }
        ] });
        let gate = gate(&[provider("odd", Some(bad))], &[namespace("n", serde_json::json!({}))]);
        let refused = gate.check("odd", "n").unwrap_err();
        assert!(refused.contains("unusable spec.allowedNamespaces"), "{refused}");
    }
}
