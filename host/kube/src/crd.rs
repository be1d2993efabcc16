//! The `proxyfleet.io/v1alpha1` resources: `Proxy` and `ProxyPool`. The
//! CRDs are generated from these types (`proxyfleet crd`); the schema
//! carries defaults and ranges so the API server refuses bad specs before
//! the controller sees them.

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::kube_version::KubeVersion;

/// The field manager of everything proxyfleet writes, and the name it
/// reports Events as.
pub const MANAGER: &str = "proxyfleet";

/// Label naming the pool a Proxy belongs to.
pub const POOL_LABEL: &str = "proxyfleet.io/pool";

/// The annotation an operator sets on a Proxy, to a new value each time,
/// to have its instance replaced (the console does; so can
/// `kubectl annotate --overwrite proxy NAME proxyfleet.io/replace=$(date +%s)`).
pub const REPLACE_ANNOTATION: &str = "proxyfleet.io/replace";

/// The Secret label that marks Secrets proxyfleet may read user-data from.
pub const USER_DATA_SECRET_LABEL: &str = "proxyfleet.io/user-data";

/// The Secret label that marks Secrets proxyfleet may read a proxy's
/// credential from.
pub const PROXY_AUTH_SECRET_LABEL: &str = "proxyfleet.io/proxy-auth";

/// The label that gives a ClusterProxyProvider to one installation: its
/// value is the installation's ID (the one its ownership marks carry), and
/// only that installation serves the provider. Without it, every
/// installation in the cluster does.
pub const INSTALLATION_LABEL: &str = "proxyfleet.io/installation";

/// The pattern of a provider entry name (a DNS-1123 label).
const DNS_LABEL: &str = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";

/// A proxy instance on one provider entry.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "proxyfleet.io",
    version = "v1alpha1",
    kind = "Proxy",
    namespaced,
    shortname = "px",
    category = "proxyfleet",
    doc = "One egress proxy: an instance (VM, pod, ...) that a provider entry makes, runs an HTTP \
           proxy on `spec.port`, and replaces when the spec changes. The `Ready` condition says \
           whether it may be handed out; `Provisioned` and `Healthy` say why not.",
    status = "ProxyStatus",
    derive = "PartialEq",
    printcolumn = r#"{"name":"Provider","type":"string","jsonPath":".spec.provider"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"IP","type":"string","jsonPath":".status.ip"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","priority":1,"jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Message","type":"string","priority":1,"jsonPath":".status.conditions[?(@.type==\"Ready\")].message"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ProxySpec {
    /// Name of the provider entry that serves this Proxy.
    #[schemars(length(min = 1, max = 63), regex(pattern = DNS_LABEL))]
    pub provider: String,
    /// Virtual CPUs.
    #[serde(default = "default_cores")]
    #[schemars(range(min = 1, max = 256))]
    pub cores: u32,
    /// Memory in MiB.
    #[serde(default = "default_memory_mib", rename = "memoryMiB")]
    #[schemars(range(min = 64, max = 1048576))]
    pub memory_mib: u64,
    /// Boot disk size in GiB; disks grow, never shrink.
    #[serde(default = "default_disk_gib", rename = "diskGiB")]
    #[schemars(range(min = 1, max = 65536))]
    pub disk_gib: u64,
    /// Provider-specific image key (template, image family, ...).
    // An Option rather than a defaulted String: Kubernetes 1.20 reads an
    // empty-string schema default as null and refuses the CRD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Placement hints such as a node, zone or host.
    #[serde(default)]
    pub placement: BTreeMap<String, String>,
    /// Network settings.
    #[serde(default)]
    pub network: ProxyNetwork,
    /// Port the proxy listens on.
    #[serde(default = "default_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: u16,
    /// A Secret (labelled `proxyfleet.io/user-data: "true"`) holding
    /// cloud-init user-data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data_secret_ref: Option<SecretKeyRef>,
    /// A Secret (labelled `proxyfleet.io/proxy-auth: "true"`, with the keys
    /// `username` and `password`, as a `kubernetes.io/basic-auth` Secret
    /// has) holding the credential the proxy asks its clients for: probes
    /// and the gateway send it, the discovery API hands it to token
    /// holders.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_auth_secret_ref: Option<SecretRef>,
    /// Labels for the instance.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// Network settings of a Proxy.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxyNetwork {
    /// 802.1Q VLAN tag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 4094))]
    pub vlan_tag: Option<u16>,
}

/// A key of a Secret in the Proxy's namespace.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct SecretKeyRef {
    /// Secret name.
    pub name: String,
    /// Key in the Secret; `user-data` when not given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// A Secret in the Proxy's namespace.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SecretRef {
    /// Secret name.
    pub name: String,
}

fn default_cores() -> u32 {
    1
}
fn default_memory_mib() -> u64 {
    512
}
fn default_disk_gib() -> u64 {
    8
}
fn default_port() -> u16 {
    proxyfleet_core::proxy::DEFAULT_PORT
}

/// Phases a Proxy reports.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ProxyPhase {
    /// Nothing done yet.
    #[default]
    Pending,
    /// Being created, or without an address.
    Provisioning,
    /// Running with an address.
    Running,
    /// Stopped until the spec changes.
    Failed,
    /// Being deleted.
    Deleting,
}

/// Whether a condition holds, as `metav1.Condition` spells it.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ConditionStatus {
    /// It holds.
    True,
    /// It does not hold.
    False,
    /// Not known yet.
    Unknown,
}

/// A condition, shaped like `metav1.Condition` so that `kubectl wait
/// --for=condition=Ready`, kstatus and Argo CD's health checks read it.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// `Ready` sums up the others; see each resource for the rest.
    #[serde(rename = "type")]
    #[schemars(length(min = 1, max = 316), regex(pattern = CONDITION_TYPE))]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: ConditionStatus,
    /// The `metadata.generation` the condition was set from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub observed_generation: Option<i64>,
    /// RFC 3339 time the status last changed.
    #[schemars(extend("format" = "date-time"))]
    pub last_transition_time: String,
    /// CamelCase reason, for programs.
    #[schemars(length(min = 1, max = 1024), regex(pattern = CONDITION_REASON))]
    pub reason: String,
    /// For people (optional for the same reason as `ProxySpec::image`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32768))]
    pub message: Option<String>,
}

/// `metav1.Condition`'s pattern for `type`.
const CONDITION_TYPE: &str = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$";

/// `metav1.Condition`'s pattern for `reason`.
const CONDITION_REASON: &str = "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$";

/// The longest message a condition holds (`metav1.Condition`'s bound).
pub const CONDITION_MESSAGE_MAX: usize = 32768;

impl Condition {
    /// Whether `conditions` holds one of `type_` with status `True`.
    pub fn is_true(conditions: &[Self], type_: &str) -> bool {
        conditions.iter().any(|c| c.type_ == type_ && c.status == ConditionStatus::True)
    }
}

/// What the controller reports about a Proxy.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxyStatus {
    /// Phase.
    #[serde(default)]
    pub phase: ProxyPhase,
    /// The provider's ID of the instance.
    #[serde(default, rename = "providerID", skip_serializing_if = "Option::is_none")]
    pub provider_id: Option<String>,
    /// Address of the instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    /// Proxy port when the provider decides it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// `Provisioned` (the instance runs with an address), `Healthy` (probes
    /// through it pass; absent while unprobed) and `Ready` (provisioned and
    /// not unhealthy: it may be handed out).
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// Generation this status describes.
    #[serde(default)]
    pub observed_generation: i64,
    /// Hash of the spec fields the instance was made for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec_hash: Option<String>,
    /// Plugin serving the provider entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin: Option<String>,
    /// Its version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin_version: Option<String>,
    /// Failed attempts in a row.
    #[serde(default)]
    pub attempts: u32,
    /// Spec hash a final failure is latched for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_spec_hash: Option<String>,
    /// Polls in a row the running instance reported provisioning.
    #[serde(default)]
    pub flaps: u32,
}

/// A set of Proxies kept at a size, spread over provider entries.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "proxyfleet.io",
    version = "v1alpha1",
    kind = "ProxyPool",
    namespaced,
    shortname = "pxp",
    category = "proxyfleet",
    doc = "A set of Proxies kept at `spec.replicas`, made from `spec.template` and spread over \
           provider entries by weight; members older than `spec.maxAge` are replaced one at a \
           time. The `Ready` condition holds when every wanted member is Ready, `Available` \
           when at least `spec.minAvailable` (and at least one) are.",
    status = "ProxyPoolStatus",
    derive = "PartialEq",
    scale = r#"{"specReplicasPath":".spec.replicas","statusReplicasPath":".status.replicas","labelSelectorPath":".status.selector"}"#,
    printcolumn = r#"{"name":"Desired","type":"integer","jsonPath":".spec.replicas"}"#,
    printcolumn = r#"{"name":"Ready","type":"integer","jsonPath":".status.readyReplicas"}"#,
    printcolumn = r#"{"name":"Total","type":"integer","jsonPath":".status.replicas"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","priority":1,"jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Message","type":"string","priority":1,"jsonPath":".status.conditions[?(@.type==\"Ready\")].message"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
// What OpenAPI cannot say, as CEL rules: enforced by Kubernetes 1.25 and
// later, left out of the CRDs for older servers (`kube_version`).
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "!has(self.minAvailable) || self.minAvailable <= self.replicas",
    "message": "must not be more than spec.replicas; to scale below it, lower spec.minAvailable first",
    "fieldPath": ".minAvailable",
    "reason": "FieldValueInvalid",
}]))]
pub struct ProxyPoolSpec {
    /// Proxies wanted.
    #[schemars(range(min = 0, max = 10000))]
    pub replicas: u32,
    /// The Proxies to make.
    pub template: ProxyTemplate,
    /// Spread over several provider entries by weight; when empty the
    /// template's provider is used. Each entry appears once.
    #[serde(default)]
    // A map keyed by name: the API server refuses an entry named twice (on
    // every version), and server-side apply merges entries by name.
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub providers: Vec<WeightedProvider>,
    /// Proxies older than this (e.g. `24h`) are replaced one at a time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = "^[0-9]+[smhd]$"))]
    pub max_age: Option<String>,
    /// Ready Proxies recycling must leave.
    #[serde(default)]
    pub min_available: u32,
}

/// The Proxy template of a pool.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct ProxyTemplate {
    /// Labels for the Proxies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateMetadata>,
    /// Their spec.
    pub spec: ProxySpec,
}

/// Metadata of a pool's Proxies.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct TemplateMetadata {
    /// Labels; `proxyfleet.io/pool` is the pool's to set.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "!('proxyfleet.io/pool' in self)",
        "message": "proxyfleet.io/pool is set by the pool to its own name; remove it from the template's labels",
        "reason": "FieldValueForbidden",
    }]))]
    pub labels: BTreeMap<String, String>,
}

/// A provider entry and its share of a pool.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct WeightedProvider {
    /// Provider entry name.
    #[schemars(length(min = 1, max = 63), regex(pattern = DNS_LABEL))]
    pub name: String,
    /// Relative share.
    #[serde(default = "default_weight")]
    #[schemars(range(min = 1, max = 1000))]
    pub weight: u32,
}

fn default_weight() -> u32 {
    1
}

/// What the controller reports about a pool.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxyPoolStatus {
    /// Proxies that are not being deleted.
    #[serde(default)]
    pub replicas: u32,
    /// Of those, Ready.
    #[serde(default)]
    pub ready_replicas: u32,
    /// Label selector of the members, for the scale subresource (an Option
    /// for the same reason as `ProxySpec::image`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// Generation this status describes.
    #[serde(default)]
    pub observed_generation: i64,
    /// `Ready` (every wanted member exists and is Ready) and `Available`
    /// (at least `spec.minAvailable` members, and at least one, are Ready).
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// A provider entry declared as a resource by the platform team, beside
/// the providers file's: applied, edited and deleted with `kubectl` or a
/// GitOps tool, served by every replica without a restart.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "proxyfleet.io",
    version = "v1alpha1",
    kind = "ClusterProxyProvider",
    shortname = "cpxprov",
    category = "proxyfleet",
    doc = "A provider entry for the whole cluster: the plugin that serves it, its config, what \
           it may reach and use, as an entry of the providers file has them. Proxies name it \
           by `spec.provider`, in the namespaces `spec.allowedNamespaces` selects (all when \
           absent). The `Ready` condition says whether it serves; `ConfigValid` and \
           `PluginLoaded` say why not. Deleting it waits until no Proxy names it.",
    status = "ClusterProxyProviderStatus",
    derive = "PartialEq",
    printcolumn = r#"{"name":"Plugin","type":"string","jsonPath":".spec.plugin"}"#,
    printcolumn = r#"{"name":"Version","type":"string","jsonPath":".status.version"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Message","type":"string","priority":1,"jsonPath":".status.conditions[?(@.type==\"Ready\")].message"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterProxyProviderSpec {
    /// A plugin file of the operator's plugin directory (without
    /// `.wasm`), or an `oci://REGISTRY/REPOSITORY:TAG` reference.
    #[schemars(length(min = 1, max = 1024))]
    pub plugin: String,
    /// The plugin's own config, handed to it as JSON; its
    /// `validate-config` judges it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_object")]
    pub config: Option<serde_json::Value>,
    /// The ranges this entry's proxies live in (CIDRs); an address the
    /// plugin reports outside them is dropped.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub proxy_addresses: Vec<String>,
    /// What the plugin may reach (`http`, `caFile`, `libvirt`), as in the
    /// providers file (docs/providers-config.md); unknown keys are refused
    /// in the `ConfigValid` condition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_object")]
    pub grants: Option<serde_json::Value>,
    /// What the plugin may use (`timeout`, `memoryMiB`, `concurrency`, ...),
    /// as in the providers file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_object")]
    pub limits: Option<serde_json::Value>,
    /// The only build of the plugin this entry accepts (`version` or
    /// `digest`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pin: Option<ProviderPin>,
    /// Public keys an `oci://` plugin's builds must be signed with, as in
    /// the providers file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_object")]
    pub verify: Option<serde_json::Value>,
    /// The namespaces whose Proxies this provider serves: a label selector
    /// over namespaces (`kubernetes.io/metadata.name` selects by name).
    /// Every namespace when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_namespaces: Option<NamespaceSelector>,
}

/// A label selector over namespaces, as `metav1.LabelSelector` writes one:
/// every label of `matchLabels` and every requirement of
/// `matchExpressions` must hold.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceSelector {
    /// Labels a namespace must carry, with these values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    /// Requirements on a namespace's labels.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<LabelRequirement>,
}

/// One requirement of a [`NamespaceSelector`].
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LabelRequirement {
    /// The label.
    #[schemars(length(min = 1, max = 317))]
    pub key: String,
    /// `In` or `NotIn` (`values` must not be empty), `Exists` or
    /// `DoesNotExist` (`values` must be).
    pub operator: LabelOperator,
    /// The values `In` and `NotIn` compare with.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

/// How a [`LabelRequirement`] compares.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum LabelOperator {
    /// The label has one of the values.
    In,
    /// The label is absent or has none of the values.
    NotIn,
    /// The label is present.
    Exists,
    /// The label is absent.
    DoesNotExist,
}

/// The one build a provider entry accepts.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderPin {
    /// The version the plugin's `describe` reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// `sha256:` and the component file's 64 hex digits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
}

/// A cluster provider as the leading operator last applied it.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterProxyProviderStatus {
    /// Generation this status describes.
    #[serde(default)]
    pub observed_generation: i64,
    /// `Ready` (the entry serves this generation's spec), `ConfigValid`
    /// (the spec parses and its plugin accepts the config) and
    /// `PluginLoaded` (a build of the plugin serves the entry).
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// Name of the serving plugin build.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin: Option<String>,
    /// Its version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// sha256 of its component.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// RFC 3339 time the serving build was activated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activated_at: Option<String>,
    /// The build `proxyfleet plugin rollback` would bring back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<PluginRevisionRef>,
    /// The most recent builds refused before activation, oldest first,
    /// each with the check that refused it and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rejected: Vec<RejectedRevision>,
}

/// An object of any shape, kept as written: the operator validates it.
fn any_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({ "type": "object", "x-kubernetes-preserve-unknown-fields": true })
}

/// One plugin revision.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PluginRevisionRef {
    /// Plugin version.
    pub version: String,
    /// sha256 of the component.
    pub digest: String,
}

/// A candidate revision that was not activated.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RejectedRevision {
    /// Plugin version, when the candidate got as far as saying it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// sha256 of the file.
    pub digest: String,
    /// Which check refused it: load, pin, capabilities or config.
    pub kind: String,
    /// Why.
    pub reason: String,
}

/// Every CRD, labelled with the version that made it (the chart's version
/// too: the two move together), so `kubectl get crd -l
/// app.kubernetes.io/part-of=proxyfleet -L app.kubernetes.io/version`
/// shows which are installed.
pub fn crds() -> [CustomResourceDefinition; 3] {
    use kube::CustomResourceExt as _;
    [Proxy::crd(), ProxyPool::crd(), ClusterProxyProvider::crd()].map(|mut crd| {
        crd.metadata.labels = Some(BTreeMap::from([
            ("app.kubernetes.io/part-of".to_owned(), "proxyfleet".to_owned()),
            ("app.kubernetes.io/version".to_owned(), env!("CARGO_PKG_VERSION").to_owned()),
        ]));
        crd
    })
}

/// Every CRD of [`crds`] as a multi-document YAML stream, for a server of
/// `version` (`None`: a current one; see [`crate::kube_version`]).
pub fn crds_yaml(version: Option<KubeVersion>) -> Result<String, yaml_serde::Error> {
    let crds = crate::kube_version::crds_for(crds(), version);
    let documents = crds.iter().map(yaml_serde::to_string).collect::<Result<Vec<_>, _>>()?;
    Ok(documents.join("---\n"))
}
