//! The generated CRDs carry what the API server needs to refuse bad specs
//! and what kubectl needs to show Proxies well.

use kube::CustomResourceExt as _;
use proxyfleet_kube::crd::{Proxy, ProxyPool, ProxySpec, crds_yaml};
use serde_json::Value;

fn schema_of(
    crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> Value {
    let version = &crd.spec.versions[0];
    serde_json::to_value(&version.schema.as_ref().unwrap().open_api_v3_schema).unwrap()
}

#[test]
fn the_proxy_crd_has_ranges_defaults_columns_and_a_short_name() {
    let crd = Proxy::crd();
    assert_eq!(crd.metadata.name.as_deref(), Some("proxies.proxyfleet.io"));
    assert_eq!(crd.spec.names.short_names.as_deref(), Some(&["px".to_owned()][..]));
    let version = &crd.spec.versions[0];
    assert_eq!(version.name, "v1alpha1");
    assert!(version.subresources.as_ref().unwrap().status.is_some());
    let columns: Vec<_> = version
        .additional_printer_columns
        .as_ref()
        .unwrap()
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(columns, ["Provider", "Phase", "IP", "Ready", "Reason", "Message", "Age"]);

    let spec = &schema_of(&crd)["properties"]["spec"]["properties"];
    assert_eq!(spec["cores"]["minimum"].as_f64(), Some(1.0));
    assert_eq!(spec["cores"]["maximum"].as_f64(), Some(256.0));
    assert_eq!(spec["cores"]["default"], 1);
    assert_eq!(spec["memoryMiB"]["minimum"].as_f64(), Some(64.0));
    assert_eq!(spec["port"]["default"], 3128);
    assert_eq!(spec["network"]["properties"]["vlanTag"]["maximum"].as_f64(), Some(4094.0));
    assert_eq!(spec["provider"]["pattern"], "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$");
    let required = schema_of(&crd)["properties"]["spec"]["required"].clone();
    assert_eq!(required, serde_json::json!(["provider"]));
}

/// `kubectl wait --for=condition=Ready`, kstatus and Argo CD read
/// conditions shaped like `metav1.Condition`: a status enum, a map keyed by
/// type (so server-side apply merges them by type), and the reason and
/// message behind `kubectl get -o wide`.
#[test]
fn both_crds_carry_standard_conditions_categories_and_descriptions() {
    for crd in [Proxy::crd(), ProxyPool::crd()] {
        let kind = crd.spec.names.kind.clone();
        assert_eq!(crd.spec.names.categories.as_deref(), Some(&["proxyfleet".to_owned()][..]));
        let schema = schema_of(&crd);
        let description = schema["description"].as_str().unwrap();
        assert!(!description.contains("Auto-generated"), "{kind}: {description}");
        let conditions = &schema["properties"]["status"]["properties"]["conditions"];
        assert_eq!(conditions["x-kubernetes-list-type"], "map", "{kind}");
        assert_eq!(conditions["x-kubernetes-list-map-keys"], serde_json::json!(["type"]), "{kind}");
        let item = &conditions["items"];
        assert_eq!(
            item["properties"]["status"]["enum"],
            serde_json::json!(["True", "False", "Unknown"]),
            "{kind}"
        );
        assert_eq!(item["properties"]["lastTransitionTime"]["format"], "date-time", "{kind}");
        assert_eq!(item["properties"]["observedGeneration"]["minimum"].as_f64(), Some(0.0));
        let mut required: Vec<_> =
            item["required"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
        required.sort_unstable();
        assert_eq!(required, ["lastTransitionTime", "reason", "status", "type"], "{kind}");
        let columns = crd.spec.versions[0].additional_printer_columns.clone().unwrap();
        for name in ["Reason", "Message"] {
            let column = columns.iter().find(|c| c.name == name).unwrap();
            assert_eq!(column.priority, Some(1), "{kind}: {name} shows with -o wide");
        }
    }
}

#[test]
fn the_pool_crd_has_the_scale_subresource() {
    let crd = ProxyPool::crd();
    let scale = crd.spec.versions[0].subresources.as_ref().unwrap().scale.as_ref().unwrap();
    assert_eq!(scale.spec_replicas_path, ".spec.replicas");
    assert_eq!(scale.status_replicas_path, ".status.replicas");
    assert_eq!(scale.label_selector_path.as_deref(), Some(".status.selector"));
}

#[test]
fn a_minimal_manifest_gets_the_defaults() {
    let spec: ProxySpec = yaml_serde::from_str("provider: lab\n").unwrap();
    assert_eq!((spec.cores, spec.memory_mib, spec.disk_gib, spec.port), (1, 512, 8, 3128));
}

#[test]
fn the_stream_holds_every_crd() {
    let yaml = crds_yaml(None).unwrap();
    assert_eq!(yaml.matches("kind: CustomResourceDefinition").count(), 3);
    assert!(yaml.contains("name: proxypools.proxyfleet.io"));
    assert!(!yaml.contains("name: proxyproviders.proxyfleet.io"), "the status-only kind is gone");
    assert!(yaml.contains("name: clusterproxyproviders.proxyfleet.io"));
    assert!(yaml.contains("scope: Cluster"), "provider objects are cluster-scoped");
    assert_eq!(
        yaml.matches(&format!("app.kubernetes.io/version: {}", env!("CARGO_PKG_VERSION"))).count(),
        3,
        "each CRD says which version made it"
    );
}

/// Kubernetes 1.20 reads an empty-string schema default as null and refuses
/// the whole CRD; this pins that no field has one.
#[test]
fn no_schema_default_is_an_empty_string() {
    fn walk(path: &str, value: &Value) {
        match value {
            Value::Object(map) => {
                assert_ne!(map.get("default"), Some(&Value::String(String::new())), "{path}");
                for (key, child) in map {
                    walk(&format!("{path}.{key}"), child);
                }
            }
            Value::Array(items) => items.iter().for_each(|item| walk(path, item)),
            _ => {}
        }
    }
    walk("Proxy", &schema_of(&Proxy::crd()));
    walk("ProxyPool", &schema_of(&ProxyPool::crd()));
}

/// The chart's CRDs (which `cargo xtask render` copies to
/// deploy/kubernetes/crds.yaml) are what the types generate.
#[test]
fn chart_crds_match_the_types() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/helm/proxyfleet/files/crds.yaml");
    let committed = std::fs::read_to_string(&path).unwrap();
    assert!(
        committed == crds_yaml(None).unwrap(),
        "{} is stale: run `proxyfleet crd > deploy/helm/proxyfleet/files/crds.yaml && cargo xtask render`",
        path.display()
    );
}

/// The chart's CRDs for servers before 1.25 are the same without their
/// CEL rules.
#[test]
fn chart_crds_for_older_servers_match_the_types() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/helm/proxyfleet/files/crds-before-1.25.yaml");
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    let version = proxyfleet_kube::kube_version::KubeVersion::parse("1.24").unwrap();
    assert!(
        committed == crds_yaml(Some(version)).unwrap(),
        "{} is stale: run `proxyfleet crd --kube-version 1.24 > \
         deploy/helm/proxyfleet/files/crds-before-1.25.yaml`",
        path.display()
    );
}

/// What OpenAPI cannot say about a pool is a CEL rule: `minAvailable` at
/// most `replicas` (reported on `spec.minAvailable`), and the pool label
/// left to the pool. Entries of `spec.providers` are keyed by name.
#[test]
fn the_pool_crd_carries_its_rules() {
    let schema = schema_of(&ProxyPool::crd());
    let spec = &schema["properties"]["spec"];
    let rules = spec["x-kubernetes-validations"].as_array().unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0]["fieldPath"], ".minAvailable");
    assert!(rules[0]["rule"].as_str().unwrap().contains("self.minAvailable <= self.replicas"));
    let labels = &spec["properties"]["template"]["properties"]["metadata"]["properties"]["labels"];
    let rule = labels["x-kubernetes-validations"][0]["rule"].as_str().unwrap();
    assert!(rule.contains("'proxyfleet.io/pool' in self"), "{rule}");
    let providers = &spec["properties"]["providers"];
    assert_eq!(providers["x-kubernetes-list-type"], "map");
    assert_eq!(providers["x-kubernetes-list-map-keys"], serde_json::json!(["name"]));
}

/// A server before 1.25 gets the CRDs without their CEL rules, and
/// nothing else changes.
#[test]
fn the_crds_keep_their_rules_only_where_they_are_enforced() {
    let has_rules = |crds: &[k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition]| {
        crds.iter().any(|crd| serde_json::to_string(crd).unwrap().contains(proxyfleet_kube::kube_version::RULES_KEY))
    };
    let all = proxyfleet_kube::crd::crds();
    assert!(has_rules(&all), "the generated CRDs carry rules");
    let old = proxyfleet_kube::kube_version::crds_for(
        all.clone(),
        Some(proxyfleet_kube::kube_version::KubeVersion::parse("1.20").unwrap()),
    );
    assert!(!has_rules(&old));
    assert_eq!(old.len(), all.len());
    assert_eq!(
        serde_json::to_value(&old[0]).unwrap()["spec"]["names"],
        serde_json::to_value(&all[0]).unwrap()["spec"]["names"],
        "everything else stays"
    );
    assert!(has_rules(&proxyfleet_kube::kube_version::crds_for(
        all.clone(),
        Some(proxyfleet_kube::kube_version::KubeVersion::parse("1.25").unwrap())
    )));
    assert!(
        has_rules(&proxyfleet_kube::kube_version::crds_for(all, None)),
        "an unknown version gets them"
    );
}

/// The reference page is what the CRDs generate.
#[test]
fn the_reference_page_matches_the_types() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/crd-reference.md");
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    let generated = proxyfleet_kube::crd_reference::markdown(&proxyfleet_kube::crd::crds());
    assert!(
        committed == generated,
        "{} is stale: run `proxyfleet crd --reference > docs/crd-reference.md`",
        path.display()
    );
}
