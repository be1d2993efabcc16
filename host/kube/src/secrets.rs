//! The Secrets a Proxy's spec names (user-data, proxy credential) as
//! triggers: a change of one wakes every Proxy that names it, so a rotated
//! credential reaches the instance, the health engine and the gateway when
//! it is written, not at the Proxy's next resync.
//!
//! Only Secrets carrying one of the labels the controller reads are
//! watched (one watch per label: a label selector cannot say "either").
//! A Secret that gains or loses the label comes and goes from the watch,
//! which wakes its Proxies too.

use futures::{Stream, StreamExt as _};
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt as _;
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{PredicateConfig, WatchStreamExt as _, predicates, watcher};

use crate::crd::{PROXY_AUTH_SECRET_LABEL, Proxy, USER_DATA_SECRET_LABEL};

/// Changed labelled Secrets in `namespace` (every namespace when `None`):
/// each applied, deleted or newly listed one, once per resource version.
///
/// A failing watch (Secrets not readable there, or not served at all) is
/// logged here and retried with backoff, and its errors go no further: in
/// a controller's triggers each one held up the Proxies' own passes until
/// the backoff ended (seconds per pass, measured).
pub fn changes(
    client: &kube::Client,
    namespace: Option<&str>,
) -> impl Stream<Item = Secret> + Send + 'static {
    let watch = |label: &'static str| {
        let api: Api<Secret> = match namespace {
            Some(namespace) => Api::namespaced(client.clone(), namespace),
            None => Api::all(client.clone()),
        };
        watcher(api, watcher::Config::default().labels(&format!("{label}=true")))
            .default_backoff()
            .touched_objects()
            .filter_map(move |changed| {
                std::future::ready(match changed {
                    Ok(secret) => Some(secret),
                    Err(err) => {
                        tracing::warn!(
                            "cannot watch Secrets labelled {label}=true; retrying: {err}"
                        );
                        None
                    }
                })
            })
    };
    futures::stream::select(watch(USER_DATA_SECRET_LABEL), watch(PROXY_AUTH_SECRET_LABEL))
        .map(Ok::<_, watcher::Error>)
        // A watch that resumes after a break lists its Secrets again:
        // one that did not change meanwhile wakes nothing.
        .predicate_filter(predicates::resource_version, PredicateConfig::default())
        .filter_map(|secret| std::future::ready(secret.ok()))
        .boxed()
}

/// The Proxies in `proxies` that name `secret`, for user-data or as their
/// credential. A scan of the cache: Secrets change rarely, and a Proxy
/// holds no index of the Secrets that name it.
pub fn proxies_naming(proxies: &Store<Proxy>, secret: &Secret) -> Vec<ObjectRef<Proxy>> {
    let (Some(namespace), name) = (secret.namespace(), secret.name_any()) else {
        return Vec::new();
    };
    proxies
        .state()
        .iter()
        .filter(|proxy| proxy.namespace().as_deref() == Some(namespace.as_str()))
        .filter(|proxy| {
            let spec = &proxy.spec;
            spec.user_data_secret_ref.as_ref().is_some_and(|r| r.name == name)
                || spec.proxy_auth_secret_ref.as_ref().is_some_and(|r| r.name == name)
        })
        .map(|proxy| ObjectRef::from_obj(proxy.as_ref()))
        .collect()
}

#[cfg(test)]
mod tests {
    use kube::runtime::reflector;

    use super::*;

    fn proxy(namespace: &str, name: &str, spec: serde_json::Value) -> Proxy {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "proxyfleet.io/v1alpha1",
            "kind": "Proxy",
            "metadata": { "name": name, "namespace": namespace, "uid": format!("uid-{name}") },
            "spec": spec,
        }))
        .unwrap()
    }

    fn secret(namespace: &str, name: &str) -> Secret {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": { "name": name, "namespace": namespace },
        }))
        .unwrap()
    }

    #[test]
    fn a_secret_wakes_the_proxies_of_its_namespace_that_name_it_and_no_others() {
        let (reader, mut writer) = reflector::store();
        for proxy in [
            proxy(
                "a",
                "auth",
                serde_json::json!({ "provider": "lab", "proxyAuthSecretRef": { "name": "s" } }),
            ),
            proxy(
                "a",
                "boot",
                serde_json::json!({ "provider": "lab", "userDataSecretRef": { "name": "s" } }),
            ),
            proxy(
                "a",
                "other",
                serde_json::json!({ "provider": "lab", "proxyAuthSecretRef": { "name": "t" } }),
            ),
            proxy("a", "plain", serde_json::json!({ "provider": "lab" })),
            proxy(
                "b",
                "elsewhere",
                serde_json::json!({ "provider": "lab", "proxyAuthSecretRef": { "name": "s" } }),
            ),
        ] {
            writer.apply_watcher_event(&watcher::Event::Apply(proxy));
        }
        let mut woken: Vec<String> =
            proxies_naming(&reader, &secret("a", "s")).into_iter().map(|r| r.name).collect();
        woken.sort();
        assert_eq!(woken, ["auth", "boot"]);
        assert!(proxies_naming(&reader, &secret("c", "s")).is_empty());
    }
}
