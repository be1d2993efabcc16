//! The pod a Proxy runs as, and what a pod read back from the API server
//! says about the instance: pure functions over JSON, tested natively.

use std::collections::BTreeMap;

use proxyfleet_sdk::{Instance, InstanceState, OwnershipMark, ProviderError, ProxySpec, Result};
use serde_json::{Map, Value, json};

use crate::config::{Config, Effect, Operator, Toleration};
use crate::names::{is_dns_label, is_label_value, is_qualified_name};

pub const MANAGED_BY_KEY: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "proxyfleet";
pub const ENTRY_LABEL: &str = "proxyfleet.io/entry";
pub const UID_LABEL: &str = "proxyfleet.io/uid";
/// The installation that created the pod (the mark's installation).
pub const INSTALLATION_LABEL: &str = "proxyfleet.io/installation";
const NAME_LABEL: &str = "app.kubernetes.io/name";
const PROXY_NAMESPACE_LABEL: &str = "proxyfleet.io/proxy-namespace";
const PROXY_NAME_LABEL: &str = "proxyfleet.io/proxy-name";

// Annotations hold the whole mark: a Proxy name may be a DNS subdomain of
// up to 253 characters, which no label value can carry.
const UID_ANNOTATION: &str = "proxyfleet.io/uid";
const OWNER_ANNOTATION: &str = "proxyfleet.io/owner";
const CREATED_AT_ANNOTATION: &str = "proxyfleet.io/created-at";

const CONTAINER: &str = "proxy";
/// The environment variable holding the listening port; Kubernetes expands
/// `$(PROXY_PORT)` in `command` and `args`.
pub const PORT_ENV: &str = "PROXY_PORT";
/// Writes a tinyproxy config into the only writable place, the `/tmp`
/// emptyDir, and runs it in the foreground. No `ConnectPort` line: CONNECT
/// may reach any port, as a general egress proxy must. With a credential
/// (from the pod's Secret, see `secret.rs`) every client must send it.
const LAUNCHER: &str = "printf 'Port %s\\nTimeout 600\\nMaxClients 1024\\nLogLevel Warning\\n' \"$PROXY_PORT\" > /tmp/tinyproxy.conf && if [ -n \"$PROXY_AUTH_USERNAME\" ]; then printf 'BasicAuth %s %s\\n' \"$PROXY_AUTH_USERNAME\" \"$PROXY_AUTH_PASSWORD\" >> /tmp/tinyproxy.conf; fi && exec tinyproxy -d -c /tmp/tinyproxy.conf";

/// Hex digits of the UID's hash in a pod name: 48 bits, and an existing pod
/// of that name is adopted only when its label carries the same UID.
const POD_NAME_LEN: usize = 15;

/// The CPU request of `cores` at `millicpu_per_core` each: whole CPUs as a
/// plain number (`2`), anything else in millicpu (`250m`).
fn cpu_request(cores: u32, millicpu_per_core: u32) -> String {
    let millicpu = u64::from(cores) * u64::from(millicpu_per_core);
    if millicpu % 1000 == 0 { (millicpu / 1000).to_string() } else { format!("{millicpu}m") }
}

/// The pod name for a Proxy UID: `pf-<12 hex digits of sha256(uid)>`.
pub fn pod_name(uid: &str) -> String {
    proxyfleet_sdk::derive_name("pf", uid, POD_NAME_LEN)
}

/// A provider-id is `<namespace>/<pod name>`: the namespace stays with the
/// instance, so a changed `namespace` config still finds the old pods.
pub fn provider_id(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// The namespace and pod name of a provider-id; `None` for IDs this plugin
/// does not hand out.
pub fn parse_provider_id(id: &str) -> Option<(&str, &str)> {
    let (namespace, name) = id.split_once('/')?;
    (is_dns_label(namespace) && is_dns_label(name)).then_some((namespace, name))
}

/// The label selector of the pods an entry owns.
pub fn selector(entry: &str) -> String {
    format!("{MANAGED_BY_KEY}={MANAGED_BY},{ENTRY_LABEL}={entry},{UID_LABEL}")
}

/// Node labels and tolerations a Proxy's placement hints ask for.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Placement {
    pub node_selector: BTreeMap<String, String>,
    pub tolerations: Vec<Toleration>,
}

const PLACEMENT_KEYS: &str =
    "`node`, `zone`, `region`, `nodeSelector.<label key>`, `toleration.<taint key>`";

/// Reads the placement hints:
///
/// - `node`, `zone`, `region`: the well-known node labels
///   `kubernetes.io/hostname`, `topology.kubernetes.io/zone` and
///   `topology.kubernetes.io/region`;
/// - `nodeSelector.<label key>: <value>`: any other node label;
/// - `toleration.<taint key>: [<value>][:<effect>]`: tolerate that taint
///   (no value: any value; no effect: every effect).
pub fn placement(hints: &[(String, String)]) -> Result<Placement> {
    let mut placement = Placement::default();
    for (key, value) in hints {
        let field = format!("placement.{key}");
        let refuse = |what: &str| ProviderError::InvalidSpec(format!("{field}: {what}"));
        let well_known = match key.as_str() {
            "node" => Some("kubernetes.io/hostname"),
            "zone" => Some("topology.kubernetes.io/zone"),
            "region" => Some("topology.kubernetes.io/region"),
            _ => None,
        };
        if let Some(label) = well_known.or_else(|| key.strip_prefix("nodeSelector.")) {
            if !is_qualified_name(label) {
                return Err(refuse("is not a node label key"));
            }
            if !is_label_value(value) {
                return Err(refuse(&format!("`{value}` is not a label value")));
            }
            placement.node_selector.insert(label.to_owned(), value.clone());
        } else if let Some(taint) = key.strip_prefix("toleration.") {
            let (taint_value, effect) = match value.rsplit_once(':') {
                Some((taint_value, effect)) => (taint_value, Some(effect)),
                None => (value.as_str(), None),
            };
            let effect = match effect {
                None => None,
                Some("NoSchedule") => Some(Effect::NoSchedule),
                Some("PreferNoSchedule") => Some(Effect::PreferNoSchedule),
                Some("NoExecute") => Some(Effect::NoExecute),
                Some(other) => {
                    return Err(refuse(&format!(
                        "effect `{other}` is not NoSchedule, PreferNoSchedule or NoExecute"
                    )));
                }
            };
            if !taint_value.is_empty() && !is_label_value(taint_value) {
                return Err(refuse(&format!("`{taint_value}` is not a taint value")));
            }
            let toleration = Toleration {
                key: Some(taint.to_owned()),
                operator: Some(if taint_value.is_empty() {
                    Operator::Exists
                } else {
                    Operator::Equal
                }),
                value: (!taint_value.is_empty()).then(|| taint_value.to_owned()),
                effect,
                toleration_seconds: None,
            };
            if let Some(problem) = toleration.problem() {
                return Err(refuse(problem));
            }
            placement.tolerations.push(toleration);
        } else {
            return Err(refuse(&format!(
                "unknown placement hint; this provider takes {PLACEMENT_KEYS}"
            )));
        }
    }
    Ok(placement)
}

/// The labels of a Proxy's pod: ours first, then the Proxy's own, which
/// may not take ours.
pub fn labels(entry: &str, spec: &ProxySpec) -> Result<Map<String, Value>> {
    if !is_label_value(entry) {
        return Err(ProviderError::Permanent(format!(
            "the entry name `{entry}` cannot be a label value"
        )));
    }
    if !is_label_value(&spec.installation) {
        return Err(ProviderError::InvalidSpec(format!(
            "installation: `{}` cannot be stored as a label value",
            spec.installation
        )));
    }
    if !is_label_value(&spec.uid) {
        return Err(ProviderError::InvalidSpec(format!(
            "uid: `{}` cannot be stored as a label value",
            spec.uid
        )));
    }
    let mut labels = Map::new();
    for (key, value) in &spec.labels {
        if key == MANAGED_BY_KEY || key.starts_with("proxyfleet.io/") {
            return Err(ProviderError::InvalidSpec(format!(
                "labels.{key}: the key is reserved for proxyfleet's own labels"
            )));
        }
        if !is_qualified_name(key) {
            return Err(ProviderError::InvalidSpec(format!("labels.{key}: not a label key")));
        }
        if !value.is_empty() && !is_label_value(value) {
            return Err(ProviderError::InvalidSpec(format!(
                "labels.{key}: `{value}` is not a label value"
            )));
        }
        labels.insert(key.clone(), json!(value));
    }
    labels.insert(NAME_LABEL.to_owned(), json!("proxyfleet-proxy"));
    labels.insert(MANAGED_BY_KEY.to_owned(), json!(MANAGED_BY));
    labels.insert(ENTRY_LABEL.to_owned(), json!(entry));
    labels.insert(UID_LABEL.to_owned(), json!(spec.uid));
    labels.insert(INSTALLATION_LABEL.to_owned(), json!(spec.installation));
    // For `kubectl get -l`; the annotations carry them whole.
    for (key, value) in [(PROXY_NAMESPACE_LABEL, &spec.namespace), (PROXY_NAME_LABEL, &spec.name)] {
        if is_label_value(value) {
            labels.insert(key.to_owned(), json!(value));
        }
    }
    Ok(labels)
}

/// The port the proxy container listens on.
pub fn listen_port(config: &Config, spec: &ProxySpec) -> Result<u16> {
    match config.port {
        Some(port) => Ok(port),
        None if spec.port == 0 => {
            Err(ProviderError::InvalidSpec("port: must be 1 to 65535".to_owned()))
        }
        None => Ok(spec.port),
    }
}

/// The pod for `spec`, created by `entry` at `created_at` (Unix seconds).
pub fn manifest(config: &Config, entry: &str, spec: &ProxySpec, created_at: u64) -> Result<Value> {
    if spec.network.vlan_tag.is_some() {
        return Err(ProviderError::InvalidSpec(
            "network.vlanTag: pods join the cluster network; this provider cannot tag a VLAN"
                .to_owned(),
        ));
    }
    let image = config.image_for(&spec.image)?;
    let port = listen_port(config, spec)?;
    let placement = placement(&spec.placement)?;
    let labels = labels(entry, spec)?;
    let name = pod_name(&spec.uid);

    let mut node_selector = config.node_selector.clone();
    node_selector.extend(placement.node_selector);
    let tolerations: Vec<&Toleration> =
        config.tolerations.iter().chain(&placement.tolerations).collect();

    let mut requests = Map::new();
    let mut limits = Map::new();
    if spec.cores > 0 {
        requests.insert("cpu".to_owned(), json!(cpu_request(spec.cores, config.millicpu_per_core)));
    }
    if spec.memory_mib > 0 {
        // A memory limit equal to the request: a proxy that outgrows it is
        // restarted instead of pushing its neighbours out of the node. CPU
        // is not limited, so bursts are not throttled.
        let memory = json!(format!("{}Mi", spec.memory_mib));
        requests.insert("memory".to_owned(), memory.clone());
        limits.insert("memory".to_owned(), memory);
    }

    let mut env = vec![json!({"name": PORT_ENV, "value": port.to_string()})];
    if let Some(auth) = &spec.proxy_auth {
        if config.command.is_none() && config.args.is_none() {
            crate::secret::check_for_tinyproxy(auth)?;
        }
        env.extend(crate::secret::env(&name));
    }
    let mut container = json!({
        "name": CONTAINER,
        "image": image,
        "env": env,
        "ports": [{"name": "proxy", "containerPort": port, "protocol": "TCP"}],
        "resources": {"requests": requests, "limits": limits},
        "readinessProbe": {
            "tcpSocket": {"port": port},
            "periodSeconds": 5,
            "failureThreshold": 3
        },
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": config.run_as_user,
            "readOnlyRootFilesystem": true,
            "allowPrivilegeEscalation": false,
            "capabilities": {"drop": ["ALL"]}
        },
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}]
    });
    match (&config.command, &config.args) {
        (None, None) => {
            container["command"] = json!(["/bin/sh", "-c", LAUNCHER]);
        }
        (command, args) => {
            if let Some(command) = command.as_ref().filter(|command| !command.is_empty()) {
                container["command"] = json!(command);
            }
            if let Some(args) = args.as_ref().filter(|args| !args.is_empty()) {
                container["args"] = json!(args);
            }
        }
    }
    if let Some(policy) = config.image_pull_policy {
        container["imagePullPolicy"] = json!(policy);
    }

    let mut pod_spec = json!({
        "containers": [container],
        // The proxy needs no API access: no token in the pod.
        "automountServiceAccountToken": false,
        "enableServiceLinks": false,
        "restartPolicy": "Always",
        "securityContext": {
            "runAsNonRoot": true,
            "seccompProfile": {"type": "RuntimeDefault"}
        },
        "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "16Mi"}}]
    });
    if !node_selector.is_empty() {
        pod_spec["nodeSelector"] = json!(node_selector);
    }
    if !tolerations.is_empty() {
        pod_spec["tolerations"] = json!(tolerations);
    }
    if !config.image_pull_secrets.is_empty() {
        pod_spec["imagePullSecrets"] = config
            .image_pull_secrets
            .iter()
            .map(|name| json!({"name": name}))
            .collect::<Vec<_>>()
            .into();
    }

    Ok(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": config.namespace,
            "labels": labels,
            "annotations": {
                UID_ANNOTATION: spec.uid,
                OWNER_ANNOTATION: format!("{}/{}", spec.namespace, spec.name),
                CREATED_AT_ANNOTATION: created_at.to_string()
            }
        },
        "spec": pod_spec
    }))
}

fn metadata_str<'a>(pod: &'a Value, map: &str, key: &str) -> Option<&'a str> {
    pod.get("metadata")?.get(map)?.get(key)?.as_str()
}

/// Whether `pod` is one of ours for `uid`: our managed-by label and the
/// UID label.
pub fn is_ours_for(pod: &Value, uid: &str) -> bool {
    metadata_str(pod, "labels", MANAGED_BY_KEY) == Some(MANAGED_BY)
        && metadata_str(pod, "labels", UID_LABEL) == Some(uid)
}

/// The ownership mark a pod carries: our labels and the annotations, which
/// must agree on the UID. `None` for anyone else's pod.
pub fn mark_of(pod: &Value) -> Option<OwnershipMark> {
    let uid = metadata_str(pod, "annotations", UID_ANNOTATION)?;
    if !is_ours_for(pod, uid) {
        return None;
    }
    let (namespace, name) = metadata_str(pod, "annotations", OWNER_ANNOTATION)?.split_once('/')?;
    let created_at = metadata_str(pod, "annotations", CREATED_AT_ANNOTATION)?.parse().ok()?;
    // Pods made before marks carried an installation read as empty.
    let installation = metadata_str(pod, "labels", INSTALLATION_LABEL).unwrap_or_default();
    (!uid.is_empty() && !namespace.is_empty() && !name.is_empty()).then(|| OwnershipMark {
        installation: installation.to_owned(),
        uid: uid.to_owned(),
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        created_at,
    })
}

pub fn is_deleting(pod: &Value) -> bool {
    pod.get("metadata")
        .and_then(|metadata| metadata.get("deletionTimestamp"))
        .is_some_and(|at| !at.is_null())
}

/// How long past its grace period a deletion may stay unconfirmed before
/// the pod counts as stranded.
const DELETION_SLACK_SECS: u64 = 60;

/// Seconds since the Unix epoch of an API timestamp, which the API server
/// always writes in UTC (RFC 3339 with `Z`): `2026-01-02T03:04:05Z`, maybe
/// with a fraction.
pub fn unix_seconds(timestamp: &str) -> Option<u64> {
    let at = humantime::parse_rfc3339(timestamp).ok()?;
    at.duration_since(std::time::UNIX_EPOCH).ok().map(|since| since.as_secs())
}

/// Whether the pod's deletion should have finished long ago: the kubelet
/// never confirmed it (its node is gone), and only a forced delete frees
/// the name for a replacement.
pub fn deletion_overdue(pod: &Value, now: u64) -> bool {
    pod.pointer("/metadata/deletionTimestamp")
        .and_then(Value::as_str)
        .and_then(unix_seconds)
        .is_some_and(|deadline| deadline + DELETION_SLACK_SECS < now)
}

fn is_ready(status: &Value) -> bool {
    status.get("conditions").and_then(Value::as_array).is_some_and(|conditions| {
        conditions.iter().any(|condition| {
            condition.get("type").and_then(Value::as_str) == Some("Ready")
                && condition.get("status").and_then(Value::as_str) == Some("True")
        })
    })
}

/// The pod's IPs, `podIP` first, without repeats.
fn addresses(status: &Value) -> Vec<String> {
    let mut addresses: Vec<String> = Vec::new();
    let primary = status.get("podIP").and_then(Value::as_str);
    let others = status
        .get("podIPs")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|entry| entry.get("ip").and_then(Value::as_str));
    for address in primary.into_iter().chain(others) {
        if !address.is_empty() && !addresses.iter().any(|known| known == address) {
            addresses.push(address.to_owned());
        }
    }
    addresses
}

/// The instance state of a pod, and its addresses when it serves.
///
/// Being deleted wins over everything, unless the deletion is overdue (a
/// lost node): that pod is `failed`, so the reconciler replaces it and its
/// delete forces the name free. `Succeeded` and `Failed` are final for a
/// pod, so the reconciler replaces it; a `Running` pod serves only once it
/// is Ready (its readiness probe reached the proxy port) and has an IP.
/// `Pending`, `Unknown` and anything new are provisioning. `now` is in
/// Unix seconds.
pub fn state_of(pod: &Value, now: u64) -> (InstanceState, Vec<String>) {
    if deletion_overdue(pod, now) {
        return (InstanceState::Failed, Vec::new());
    }
    if is_deleting(pod) {
        return (InstanceState::Deleting, Vec::new());
    }
    let status = pod.get("status").unwrap_or(&Value::Null);
    match status.get("phase").and_then(Value::as_str) {
        Some("Succeeded" | "Failed") => (InstanceState::Failed, Vec::new()),
        Some("Running") if is_ready(status) => {
            let addresses = addresses(status);
            if addresses.is_empty() {
                (InstanceState::Provisioning, addresses)
            } else {
                (InstanceState::Running, addresses)
            }
        }
        _ => (InstanceState::Provisioning, Vec::new()),
    }
}

/// The instance a pod of ours is at `now` (Unix seconds); `port` is the
/// entry's fixed listening port, if it has one.
pub fn instance_of(pod: &Value, port: Option<u16>, now: u64) -> Instance {
    let metadata = pod.get("metadata").unwrap_or(&Value::Null);
    let name = metadata.get("name").and_then(Value::as_str).unwrap_or_default();
    let namespace = metadata.get("namespace").and_then(Value::as_str).unwrap_or_default();
    let (state, addresses) = state_of(pod, now);
    let mark = mark_of(pod);
    Instance {
        provider_id: provider_id(namespace, name),
        name: name.to_owned(),
        state,
        addresses,
        port,
        created_at: mark.as_ref().map(|mark| mark.created_at),
        mark,
    }
}

/// Why a pod that is not ready is not, from its container statuses
/// (`ImagePullBackOff`, `CrashLoopBackOff`, ...), for the logs.
pub fn waiting_reason(pod: &Value) -> Option<&str> {
    let status = pod.get("status")?;
    if let Some(reason) = status
        .get("containerStatuses")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find_map(|container| container.get("state")?.get("waiting")?.get("reason")?.as_str())
    {
        return Some(reason);
    }
    status.get("conditions")?.as_array()?.iter().find_map(|condition| {
        (condition.get("status").and_then(Value::as_str) == Some("False"))
            .then(|| condition.get("reason").and_then(Value::as_str))
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proxyfleet_sdk::{Network, ProxyAuth};

    fn config(extra: &str) -> Config {
        let json =
            format!(r#"{{"apiServer":"https://10.0.0.1:443","namespace":"proxies"{extra}}}"#);
        Config::parse(&json).expect("valid config")
    }

    fn spec() -> ProxySpec {
        ProxySpec {
            installation: "prod".into(),
            name: "web-1".into(),
            namespace: "egress".into(),
            uid: "0b5bd7c4-5a54-4b7e-9d0c-1f3b8f3e2a11".into(),
            cores: 2,
            memory_mib: 256,
            disk_gib: 4,
            image: String::new(),
            placement: Vec::new(),
            network: Network { vlan_tag: None },
            port: 3128,
            user_data: Vec::new(),
            labels: vec![("team".into(), "net".into())],
            proxy_auth: None,
        }
    }

    fn spec_error(result: Result<Value>) -> String {
        match result {
            Err(ProviderError::InvalidSpec(message)) => message,
            other => panic!("expected InvalidSpec, got {other:?}"),
        }
    }

    /// A Proxy's cores are a VM's vCPUs; on a node a proxy pod requests
    /// `millicpuPerCore` of them, so a pool of tinyproxies fits a small node.
    #[test]
    fn cores_request_millicpu_per_core() {
        assert_eq!(cpu_request(2, 1000), "2");
        assert_eq!(cpu_request(1, 100), "100m");
        assert_eq!(cpu_request(3, 500), "1500m");
        assert_eq!(cpu_request(4, 250), "1");
    }

    #[test]
    fn names_and_ids() {
        let name = pod_name("uid-1");
        assert_eq!(name.len(), 15);
        assert!(name.starts_with("pf-"));
        assert_eq!(name, pod_name("uid-1"));
        assert_ne!(name, pod_name("uid-2"));
        let id = provider_id("proxies", &name);
        assert_eq!(parse_provider_id(&id), Some(("proxies", name.as_str())));
        assert_eq!(parse_provider_id("pf-123"), None);
        assert_eq!(parse_provider_id("a/b/c"), None);
        assert_eq!(parse_provider_id("101"), None);
        assert_eq!(
            selector("lab"),
            "app.kubernetes.io/managed-by=proxyfleet,proxyfleet.io/entry=lab,proxyfleet.io/uid"
        );
    }

    #[test]
    fn the_pod_carries_mark_limits_probe_and_a_locked_down_context() {
        let pod = manifest(&config(""), "lab", &spec(), 1_767_225_600).expect("manifest");
        let labels = &pod["metadata"]["labels"];
        assert_eq!(labels[MANAGED_BY_KEY], "proxyfleet");
        assert_eq!(labels[UID_LABEL], "0b5bd7c4-5a54-4b7e-9d0c-1f3b8f3e2a11");
        assert_eq!(labels[ENTRY_LABEL], "lab");
        assert_eq!(labels["team"], "net");
        assert_eq!(labels[PROXY_NAME_LABEL], "web-1");
        assert_eq!(pod["metadata"]["annotations"][OWNER_ANNOTATION], "egress/web-1");
        assert_eq!(pod["metadata"]["namespace"], "proxies");

        let container = &pod["spec"]["containers"][0];
        assert_eq!(container["image"], crate::config::DEFAULT_IMAGE);
        assert_eq!(container["resources"]["requests"]["cpu"], "2");
        assert_eq!(container["resources"]["requests"]["memory"], "256Mi");
        assert_eq!(container["resources"]["limits"]["memory"], "256Mi");
        assert!(container["resources"]["limits"].get("cpu").is_none());
        assert_eq!(container["readinessProbe"]["tcpSocket"]["port"], 3128);
        assert_eq!(container["ports"][0]["containerPort"], 3128);
        let security = &container["securityContext"];
        assert_eq!(security["runAsNonRoot"], true);
        assert_eq!(security["readOnlyRootFilesystem"], true);
        assert_eq!(security["allowPrivilegeEscalation"], false);
        assert_eq!(security["capabilities"]["drop"], json!(["ALL"]));
        assert_eq!(container["command"][0], "/bin/sh");
        assert_eq!(container["env"][0], json!({"name": "PROXY_PORT", "value": "3128"}));
        assert_eq!(pod["spec"]["automountServiceAccountToken"], false);
        assert!(pod["spec"].get("nodeSelector").is_none());

        // What we write is what we read back.
        let mark = mark_of(&pod).expect("our mark");
        assert_eq!(mark, OwnershipMark::for_spec(&spec(), 1_767_225_600));
        assert!(is_ours_for(&pod, &spec().uid));
        assert!(!is_ours_for(&pod, "another-uid"));
    }

    #[test]
    fn a_credential_reaches_the_container_by_secret_reference_only() {
        let mut spec = spec();
        spec.proxy_auth =
            Some(ProxyAuth { username: "crawler".into(), password: "pw-123.x".into() });
        let pod = manifest(&config(""), "lab", &spec, 1).expect("manifest");
        let text = serde_json::to_string(&pod).expect("a test value");
        assert!(!text.contains("pw-123.x"), "the password is not in the pod: {text}");
        let env = &pod["spec"]["containers"][0]["env"];
        assert_eq!(env[1]["name"], crate::secret::USERNAME_ENV);
        assert_eq!(
            env[2]["valueFrom"]["secretKeyRef"]["name"],
            format!("{}-auth", pod_name(&spec.uid))
        );
        assert!(LAUNCHER.contains("BasicAuth"), "the default launcher writes the credential");

        // tinyproxy cannot read this password; a launcher of the entry's may.
        spec.proxy_auth =
            Some(ProxyAuth { username: "crawler".into(), password: "p@ss word".into() });
        let err = manifest(&config(""), "lab", &spec, 1).expect_err("refused").to_string();
        assert!(err.contains("proxyAuth") && !err.contains("p@ss"), "{err}");
        let squid = config(r#","command":["squid","-N"]"#);
        assert!(manifest(&squid, "lab", &spec, 1).is_ok());
    }

    #[test]
    fn overrides_replace_the_launcher_and_the_port() {
        let config = config(
            r#","images":{"squid":"ubuntu/squid:6.6"},"args":["-f","/etc/squid/squid.conf"],"port":3129,"imagePullPolicy":"IfNotPresent","imagePullSecrets":["regcred"]"#,
        );
        let mut spec = spec();
        spec.image = "squid".into();
        let pod = manifest(&config, "lab", &spec, 1).expect("manifest");
        let container = &pod["spec"]["containers"][0];
        assert_eq!(container["image"], "ubuntu/squid:6.6");
        assert!(container.get("command").is_none(), "the image's entrypoint stays");
        assert_eq!(container["args"], json!(["-f", "/etc/squid/squid.conf"]));
        assert_eq!(container["readinessProbe"]["tcpSocket"]["port"], 3129);
        assert_eq!(container["imagePullPolicy"], "IfNotPresent");
        assert_eq!(pod["spec"]["imagePullSecrets"], json!([{"name": "regcred"}]));
        assert_eq!(listen_port(&config, &spec), Ok(3129));
    }

    #[test]
    fn placement_becomes_node_selector_and_tolerations() {
        let hints = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
        };
        let placement = placement(&hints(&[
            ("zone", "eu-west-1a"),
            ("nodeSelector.node.kubernetes.io/instance-type", "m5.large"),
            ("toleration.dedicated", "proxies:NoSchedule"),
            ("toleration.spot", ""),
        ]))
        .expect("valid hints");
        assert_eq!(placement.node_selector["topology.kubernetes.io/zone"], "eu-west-1a");
        assert_eq!(placement.node_selector["node.kubernetes.io/instance-type"], "m5.large");
        assert_eq!(
            serde_json::to_value(&placement.tolerations).expect("serialises"),
            json!([
                {"key": "dedicated", "operator": "Equal", "value": "proxies", "effect": "NoSchedule"},
                {"key": "spot", "operator": "Exists"}
            ])
        );

        let mut spec = spec();
        spec.placement = hints(&[("node", "worker-3")]);
        let pod = manifest(&config(r#","nodeSelector":{"pool":"egress"}"#), "lab", &spec, 1)
            .expect("manifest");
        assert_eq!(
            pod["spec"]["nodeSelector"],
            json!({"kubernetes.io/hostname": "worker-3", "pool": "egress"})
        );

        let refused = |pairs: &[(&str, &str)]| match super::placement(&hints(pairs)) {
            Err(ProviderError::InvalidSpec(message)) => message,
            other => panic!("expected InvalidSpec, got {other:?}"),
        };
        assert!(refused(&[("rack", "r1")]).starts_with("placement.rack: unknown placement hint"));
        assert!(refused(&[("zone", "eu west")]).starts_with("placement.zone:"));
        assert!(refused(&[("toleration.x", "v:Sometimes")]).starts_with("placement.toleration.x:"));
    }

    #[test]
    fn specs_the_pod_cannot_serve_are_refused_by_field() {
        let config = config("");
        let mut vlan = spec();
        vlan.network.vlan_tag = Some(42);
        assert!(spec_error(manifest(&config, "lab", &vlan, 1)).starts_with("network.vlanTag"));
        let mut reserved = spec();
        reserved.labels = vec![("proxyfleet.io/uid".into(), "x".into())];
        assert!(
            spec_error(manifest(&config, "lab", &reserved, 1))
                .starts_with("labels.proxyfleet.io/uid")
        );
        let mut bad_label = spec();
        bad_label.labels = vec![("team".into(), "net ops".into())];
        assert!(spec_error(manifest(&config, "lab", &bad_label, 1)).starts_with("labels.team"));
        let mut no_port = spec();
        no_port.port = 0;
        assert!(spec_error(manifest(&config, "lab", &no_port, 1)).starts_with("port"));
        let mut spaced = spec();
        spaced.uid = "not a label value".into();
        assert!(spec_error(manifest(&config, "lab", &spaced, 1)).starts_with("uid"));
        let mut long_name = spec();
        long_name.name = format!("{}.example.com", "a".repeat(80));
        let pod = manifest(&config, "lab", &long_name, 1).expect("long names fit annotations");
        assert!(pod["metadata"]["labels"].get(PROXY_NAME_LABEL).is_none());
        assert_eq!(mark_of(&pod).map(|mark| mark.name), Some(long_name.name));
    }

    /// `2026-01-01T00:00:00Z`, the deletion timestamp the tests write.
    const NOW: u64 = 1_767_225_600;

    #[test]
    fn api_timestamps_are_unix_seconds() {
        assert_eq!(unix_seconds("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(unix_seconds("2026-01-01T00:00:00Z"), Some(NOW));
        assert_eq!(unix_seconds("2024-02-29T12:30:15.123456Z"), Some(1_709_209_815));
        assert_eq!(unix_seconds("2000-03-01T00:00:00Z"), Some(951_868_800));
        for bad in
            ["2026-01-01T00:00:00", "2026-13-01T00:00:00Z", "yesterday", "1969-12-31T23:59:59Z"]
        {
            assert_eq!(unix_seconds(bad), None, "{bad}");
        }
    }

    fn pod_with(status: Value) -> Value {
        let mut pod = manifest(&config(""), "lab", &spec(), 7).expect("manifest");
        pod["status"] = status;
        pod
    }

    #[test]
    fn phases_map_to_states() {
        let ready = json!([{"type": "Ready", "status": "True"}]);
        let not_ready =
            json!([{"type": "Ready", "status": "False", "reason": "ContainersNotReady"}]);
        let cases = [
            (json!({"phase": "Pending"}), InstanceState::Provisioning, vec![]),
            (
                json!({"phase": "Running", "conditions": not_ready, "podIP": "10.1.2.3"}),
                InstanceState::Provisioning,
                vec![],
            ),
            (
                json!({"phase": "Running", "conditions": ready, "podIP": "10.1.2.3",
                       "podIPs": [{"ip": "10.1.2.3"}, {"ip": "fd00::3"}]}),
                InstanceState::Running,
                vec!["10.1.2.3".to_owned(), "fd00::3".to_owned()],
            ),
            (json!({"phase": "Running", "conditions": ready}), InstanceState::Provisioning, vec![]),
            (json!({"phase": "Succeeded"}), InstanceState::Failed, vec![]),
            (json!({"phase": "Failed", "reason": "Evicted"}), InstanceState::Failed, vec![]),
            (json!({"phase": "Unknown"}), InstanceState::Provisioning, vec![]),
            (json!({}), InstanceState::Provisioning, vec![]),
        ];
        for (status, state, addresses) in cases {
            assert_eq!(state_of(&pod_with(status.clone()), NOW), (state, addresses), "{status}");
        }
        let mut deleting =
            pod_with(json!({"phase": "Running", "conditions": ready, "podIP": "10.1.2.3"}));
        deleting["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        assert_eq!(state_of(&deleting, NOW), (InstanceState::Deleting, vec![]));
        assert!(!deletion_overdue(&deleting, NOW + DELETION_SLACK_SECS));
        assert!(deletion_overdue(&deleting, NOW + DELETION_SLACK_SECS + 1));
        assert_eq!(
            state_of(&deleting, NOW + DELETION_SLACK_SECS + 1),
            (InstanceState::Failed, vec![])
        );
    }

    #[test]
    fn instances_carry_id_mark_and_port() {
        let instance = instance_of(&pod_with(json!({"phase": "Pending"})), Some(8080), NOW);
        assert_eq!(instance.provider_id, format!("proxies/{}", pod_name(&spec().uid)));
        assert_eq!(instance.port, Some(8080));
        assert_eq!(instance.created_at, Some(7));
        assert_eq!(instance.mark.map(|mark| mark.uid), Some(spec().uid));
    }

    #[test]
    fn foreign_pods_have_no_mark() {
        let foreign = json!({"metadata": {"name": "pf-x", "labels": {"app": "web"}}});
        assert_eq!(mark_of(&foreign), None);
        assert!(!is_ours_for(&foreign, "u"));
        // Our labels with annotations naming another UID are not a mark.
        let mut forged = pod_with(json!({}));
        forged["metadata"]["annotations"][UID_ANNOTATION] = json!("another");
        assert_eq!(mark_of(&forged), None);
    }

    #[test]
    fn waiting_reasons_come_from_containers_then_conditions() {
        let pulling =
            json!({"containerStatuses": [{"state": {"waiting": {"reason": "ImagePullBackOff"}}}]});
        assert_eq!(waiting_reason(&pod_with(pulling)), Some("ImagePullBackOff"));
        let unschedulable = json!({"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]});
        assert_eq!(waiting_reason(&pod_with(unschedulable)), Some("Unschedulable"));
        assert_eq!(waiting_reason(&pod_with(json!({"phase": "Pending"}))), None);
    }
}
