//! Before a replica campaigns to lead: the installed CRDs must carry every
//! field this build writes. Helm never upgrades what a chart keeps in
//! `crds/`, so after an upgrade of the operator alone the API server would
//! silently prune the status fields it does not know (conditions'
//! `observedGeneration`, a pool's conditions), and the operator would act
//! on a status that loses what it wrote. A CRD newer than this build (a
//! rollback of the operator) passes: it has every field this build needs.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::Api;
use serde_json::Value;

/// What to run to bring the CRDs in line with this build.
pub const FIX: &str = "apply the CRDs of this version: `helm upgrade` with the chart's \
                       crds.enabled (add --take-ownership once if the release does not own \
                       them yet), or `proxyfleet crd | kubectl apply --server-side \
                       --force-conflicts -f -` (the same as deploy/kubernetes/crds.yaml; before \
                       Kubernetes 1.25, `proxyfleet crd --kube-version 1.24`); then this replica \
                       goes on by itself";

/// Why the installed CRDs do not serve this build.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A CRD is not installed.
    #[error("CustomResourceDefinition {name} is not installed; {FIX}")]
    Missing {
        /// The CRD's name.
        name: String,
    },
    /// A CRD does not serve this build's version.
    #[error("CustomResourceDefinition {name} does not serve {version}; {FIX}")]
    NoVersion {
        /// The CRD's name.
        name: String,
        /// The version this build uses.
        version: String,
    },
    /// A CRD lacks fields or subresources this build writes.
    #[error(
        "CustomResourceDefinition {name} is older than this operator: it lacks {}; the API \
         server would drop what the operator writes there; {FIX}",
        .lacking.join(", ")
    )]
    Outdated {
        /// The CRD's name.
        name: String,
        /// What it lacks, as paths such as `status.conditions[].observedGeneration`.
        lacking: Vec<String>,
    },
    /// The API server could not be asked.
    #[error("reading CustomResourceDefinition {name}: {source}")]
    Kube {
        /// The CRD's name.
        name: String,
        /// The API's error.
        source: kube::Error,
    },
}

/// Checks every CRD this build uses against the installed ones.
pub async fn check(client: &kube::Client) -> Result<(), Error> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for needed in crate::crd::crds() {
        let name = needed.metadata.name.clone().unwrap_or_default();
        let installed = api
            .get_opt(&name)
            .await
            .map_err(|source| Error::Kube { name: name.clone(), source })?
            .ok_or_else(|| Error::Missing { name: name.clone() })?;
        compare(&needed, &installed)?;
    }
    Ok(())
}

/// Checks until the CRDs serve this build, saying at every check why they
/// do not; `false` when `stop` ends the wait first.
pub async fn wait_until_served(
    client: &kube::Client,
    every: std::time::Duration,
    stop: impl Future<Output = ()>,
) -> bool {
    let mut stop = std::pin::pin!(stop);
    loop {
        match check(client).await {
            Ok(()) => return true,
            Err(err) => tracing::error!("not leading: {err}"),
        }
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = &mut stop => return false,
        }
    }
}

/// Whether `installed` serves everything `needed` (this build's CRD) has:
/// its version, its subresources and every property of its schema.
pub fn compare(
    needed: &CustomResourceDefinition,
    installed: &CustomResourceDefinition,
) -> Result<(), Error> {
    let name = needed.metadata.name.clone().unwrap_or_default();
    let mut lacking = Vec::new();
    for version in &needed.spec.versions {
        let Some(served) =
            installed.spec.versions.iter().find(|v| v.name == version.name && v.served)
        else {
            return Err(Error::NoVersion { name, version: version.name.clone() });
        };
        let subresources = version.subresources.as_ref();
        let have = served.subresources.as_ref();
        if subresources.is_some_and(|s| s.status.is_some())
            && have.is_none_or(|s| s.status.is_none())
        {
            lacking.push("the status subresource".to_owned());
        }
        if subresources.is_some_and(|s| s.scale.is_some()) && have.is_none_or(|s| s.scale.is_none())
        {
            lacking.push("the scale subresource".to_owned());
        }
        let schema = |v: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinitionVersion| {
            v.schema
                .as_ref()
                .and_then(|s| s.open_api_v3_schema.as_ref())
                .map(|s| serde_json::to_value(s).unwrap_or(Value::Null))
                .unwrap_or(Value::Null)
        };
        missing_properties("", &schema(version), &schema(served), &mut lacking);
    }
    if lacking.is_empty() { Ok(()) } else { Err(Error::Outdated { name, lacking }) }
}

/// Adds to `lacking` the path of every property of `needed` that
/// `installed` neither declares nor keeps as unknown fields.
fn missing_properties(path: &str, needed: &Value, installed: &Value, lacking: &mut Vec<String>) {
    if installed.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true)) {
        return;
    }
    if let Some(properties) = needed.get("properties").and_then(Value::as_object) {
        for (key, child) in properties {
            let child_path = if path.is_empty() { key.clone() } else { format!("{path}.{key}") };
            match installed.get("properties").and_then(|p| p.get(key)) {
                Some(theirs) => missing_properties(&child_path, child, theirs, lacking),
                None => lacking.push(child_path),
            }
        }
    }
    if let Some(items) = needed.get("items") {
        let theirs = installed.get("items").unwrap_or(&Value::Null);
        missing_properties(&format!("{path}[]"), items, theirs, lacking);
    }
    if let Some(values) = needed.get("additionalProperties").filter(|v| v.is_object()) {
        let theirs = installed.get("additionalProperties").unwrap_or(&Value::Null);
        missing_properties(&format!("{path}.*"), values, theirs, lacking);
    }
}

#[cfg(test)]
mod tests {
    use kube::CustomResourceExt as _;

    use super::*;
    use crate::crd::{ClusterProxyProvider, Proxy, ProxyPool};

    fn pool_crd() -> CustomResourceDefinition {
        ProxyPool::crd()
    }

    /// `f` applied to the pool CRD's schema, as JSON.
    fn edited(f: impl FnOnce(&mut Value)) -> CustomResourceDefinition {
        let mut value = serde_json::to_value(pool_crd()).unwrap();
        f(&mut value["spec"]["versions"][0]["schema"]["openAPIV3Schema"]);
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn the_crds_this_build_generates_pass() {
        for crd in [Proxy::crd(), ProxyPool::crd(), ClusterProxyProvider::crd()] {
            compare(&crd, &crd).unwrap();
        }
    }

    #[test]
    fn a_crd_without_a_status_field_this_build_writes_is_outdated_and_names_it() {
        let old = edited(|schema| {
            let status = &mut schema["properties"]["status"]["properties"];
            status.as_object_mut().unwrap().remove("conditions");
        });
        let err = compare(&pool_crd(), &old).unwrap_err();
        let Error::Outdated { lacking, .. } = &err else { panic!("{err}") };
        assert_eq!(lacking, &["status.conditions"]);
        let message = err.to_string();
        assert!(message.contains("proxypools.proxyfleet.io"), "{message}");
        assert!(message.contains("kubectl apply --server-side"), "{message}");
    }

    #[test]
    fn fields_inside_list_items_are_compared_too() {
        let needed = Proxy::crd();
        let mut value = serde_json::to_value(&needed).unwrap();
        let conditions = &mut value["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
            ["status"]["properties"]["conditions"]["items"]["properties"];
        conditions.as_object_mut().unwrap().remove("observedGeneration");
        let old: CustomResourceDefinition = serde_json::from_value(value).unwrap();
        let Err(Error::Outdated { lacking, .. }) = compare(&needed, &old) else { panic!() };
        assert_eq!(lacking, ["status.conditions[].observedGeneration"]);
    }

    #[test]
    fn a_newer_crd_with_more_fields_serves_this_build() {
        let newer = edited(|schema| {
            schema["properties"]["status"]["properties"]["later"] =
                serde_json::json!({ "type": "string" });
        });
        compare(&pool_crd(), &newer).unwrap();
    }

    #[test]
    fn a_field_kept_as_unknown_is_not_lacking() {
        let open = edited(|schema| {
            let status = &mut schema["properties"]["status"];
            *status = serde_json::json!({
                "type": "object", "x-kubernetes-preserve-unknown-fields": true,
            });
        });
        compare(&pool_crd(), &open).unwrap();
    }

    #[test]
    fn a_missing_version_or_subresource_is_named() {
        let mut other = pool_crd();
        other.spec.versions[0].name = "v1alpha0".into();
        assert!(matches!(compare(&pool_crd(), &other), Err(Error::NoVersion { .. })));
        let mut unscaled = pool_crd();
        unscaled.spec.versions[0].subresources.as_mut().unwrap().scale = None;
        let Err(Error::Outdated { lacking, .. }) = compare(&pool_crd(), &unscaled) else {
            panic!()
        };
        assert_eq!(lacking, ["the scale subresource"]);
    }
}
