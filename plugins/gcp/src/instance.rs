//! Instances as this plugin names, marks and reads them: names and request
//! IDs derived from the Proxy UID, the labels that carry the ownership
//! mark, the insert body, and the mapping of an instance resource to the
//! contract's `Instance`.

use proxyfleet_sdk::{Instance, InstanceState, OwnershipMark, ProviderError, ProxySpec, Result};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::config::{AddressKind, Config, Source};
use crate::names::{is_label_value, is_resource_id};

/// The label every instance of an entry carries, with the entry's name as
/// its value; `list` filters on it.
pub const FLEET_LABEL: &str = "proxyfleet";
/// The metadata item the Compute Engine simulator sets to the proxy's port.
/// Real instances never carry it (the plugin does not write it), so against
/// Compute Engine the Proxy's own port applies.
pub const PORT_METADATA_KEY: &str = "proxyfleet-port";
/// Longest instance name.
const NAME_MAX: usize = 63;

/// The instance name for a Proxy UID: `<prefix>-<hash>`, a valid RFC 1035
/// label of 63 characters at most.
pub fn instance_name(prefix: &str, uid: &str) -> String {
    proxyfleet_sdk::derive_name(prefix, uid, NAME_MAX)
}

/// The provider ID of an instance: `<zone>/<name>`.
pub fn provider_id(zone: &str, name: &str) -> String {
    format!("{zone}/{name}")
}

/// Zone and name of a provider ID this plugin handed out.
pub fn parse_provider_id(id: &str) -> Option<(&str, &str)> {
    let (zone, name) = id.split_once('/')?;
    let valid = |part: &str| is_resource_id(part);
    (valid(zone) && valid(name)).then_some((zone, name))
}

/// A UUID (RFC 9562 version 8, name-based with SHA-256) derived from
/// `parts`: the same parts give the same `requestId`, so a retried request
/// gets the operation of the first instead of doing the work again.
pub fn request_id(parts: &[&str]) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part.as_bytes());
        // A separator that cannot occur in the parts keeps ("ab","c") and
        // ("a","bc") apart.
        hasher.update([0]);
    }
    let digest = hasher.finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    bytes[6] = (bytes[6] & 0x0f) | 0x80;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..])
}

/// The labels of a new instance: the config's, the ownership mark's and
/// the fleet label naming the entry.
pub fn labels(config: &Config, entry: &str, mark: &OwnershipMark) -> Result<Value> {
    let mut labels = serde_json::Map::new();
    for (key, value) in &config.labels {
        labels.insert(key.clone(), json!(value));
    }
    for (key, value) in mark.to_labels()? {
        labels.insert(key, json!(value));
    }
    if !is_label_value(entry) {
        return Err(ProviderError::InvalidConfig(format!(
            "the entry name `{entry}` cannot be a label value"
        )));
    }
    labels.insert(FLEET_LABEL.to_owned(), json!(entry));
    Ok(Value::Object(labels))
}

/// The `instances.insert` body for `spec` in `zone`.
pub fn insert_body(
    config: &Config,
    entry: &str,
    spec: &ProxySpec,
    zone: &str,
    name: &str,
    mark: &OwnershipMark,
) -> Result<Value> {
    let source = config.source_for(&spec.image)?;
    let machine_type = match &config.machine_type {
        Some(machine_type) => machine_type.clone(),
        None => crate::config::machine_type_for(spec.cores, spec.memory_mib)?,
    };
    let user_data =
        proxyfleet_sdk::cloud_init::user_data(&spec.user_data, spec.proxy_auth.as_ref())?;
    let user_data = std::str::from_utf8(&user_data).map_err(|_| {
        ProviderError::InvalidSpec(
            "userData: Compute Engine metadata values are text; the user-data is not UTF-8"
                .to_owned(),
        )
    })?;
    let mut interface = json!({"network": config.network});
    if let Some(subnetwork) = &config.subnetwork {
        interface["subnetwork"] = json!(subnetwork);
    }
    if config.external_address {
        interface["accessConfigs"] =
            json!([{"type": "ONE_TO_ONE_NAT", "name": "External NAT", "networkTier": "PREMIUM"}]);
    }
    let mut metadata = Vec::new();
    if !user_data.is_empty() {
        metadata.push(json!({"key": "user-data", "value": user_data}));
    }
    let mut body = json!({
        "name": name,
        "machineType": format!("zones/{zone}/machineTypes/{machine_type}"),
        "labels": labels(config, entry, mark)?,
        "tags": {"items": config.network_tags},
        "metadata": {"items": metadata},
        "networkInterfaces": [interface],
    });
    if let Source::Image(image) = source {
        body["disks"] = json!([{
            "boot": true,
            "autoDelete": true,
            "initializeParams": {
                "sourceImage": image,
                "diskSizeGb": spec.disk_gib.max(10).to_string(),
                "diskType": format!("zones/{zone}/diskTypes/{}", config.disk_type),
            },
        }]);
    }
    if let Some(account) = &config.service_account {
        body["serviceAccounts"] = json!([{"email": account, "scopes": ["https://www.googleapis.com/auth/cloud-platform"]}]);
    }
    Ok(body)
}

/// The contract's state for a Compute Engine status.
pub fn state_of(status: &str) -> InstanceState {
    match status {
        "RUNNING" => InstanceState::Running,
        "STOPPING" | "SUSPENDING" | "SUSPENDED" | "TERMINATED" | "STOPPED" => {
            InstanceState::Stopped
        }
        // PROVISIONING, STAGING, REPAIRING (a host failure being fixed),
        // and whatever Compute Engine adds later: not usable yet, not lost.
        _ => InstanceState::Provisioning,
    }
}

/// The mark carried by an instance resource's labels, if any.
pub fn mark_of(instance: &Value) -> Option<OwnershipMark> {
    let labels = instance.get("labels")?.as_object()?;
    OwnershipMark::from_labels(labels.iter().filter_map(|(k, v)| Some((k.as_str(), v.as_str()?))))
}

/// The fleet label of an instance resource.
pub fn fleet_of(instance: &Value) -> Option<&str> {
    instance.get("labels")?.get(FLEET_LABEL)?.as_str()
}

fn address_of(instance: &Value, kind: AddressKind) -> Option<String> {
    let interface = instance.get("networkInterfaces")?.get(0)?;
    let address = match kind {
        AddressKind::Internal => interface.get("networkIP")?,
        AddressKind::External => interface.get("accessConfigs")?.get(0)?.get("natIP")?,
    };
    address.as_str().filter(|a| !a.is_empty()).map(str::to_owned)
}

fn port_of(instance: &Value) -> Option<u16> {
    instance.get("metadata")?.get("items")?.as_array()?.iter().find_map(|item| {
        (item.get("key")?.as_str()? == PORT_METADATA_KEY)
            .then(|| item.get("value")?.as_str()?.parse().ok())
            .flatten()
    })
}

/// An instance resource as the contract's `Instance`. A running instance
/// without the configured address yet counts as provisioning.
pub fn to_instance(instance: &Value, zone: &str, kind: AddressKind) -> Instance {
    let name = instance.get("name").and_then(Value::as_str).unwrap_or_default().to_owned();
    let mut state = state_of(instance.get("status").and_then(Value::as_str).unwrap_or_default());
    let addresses: Vec<String> = address_of(instance, kind).into_iter().collect();
    if state == InstanceState::Running && addresses.is_empty() {
        state = InstanceState::Provisioning;
    }
    let mark = mark_of(instance);
    Instance {
        provider_id: provider_id(zone, &name),
        name,
        state,
        addresses,
        port: port_of(instance),
        created_at: mark.as_ref().map(|mark| mark.created_at),
        mark,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> ProxySpec {
        ProxySpec {
            installation: "prod".into(),
            name: "web.example".into(),
            namespace: "edge".into(),
            uid: "0b5bd7c4-5a54-4b7e-9d0c-1f3b8f3e2a11".into(),
            cores: 2,
            memory_mib: 2048,
            disk_gib: 12,
            image: "debian-12".into(),
            placement: Vec::new(),
            network: proxyfleet_sdk::Network { vlan_tag: None },
            port: 3128,
            user_data: b"#cloud-config\n".to_vec(),
            labels: Vec::new(),
            proxy_auth: None,
        }
    }

    fn config() -> Config {
        Config::parse(
            r#"{"project":"p-1","zones":["europe-west1-b"],"images":{"debian-12":"projects/debian-cloud/global/images/family/debian-12"},"labels":{"team":"edge"}}"#,
        )
        .expect("valid")
    }

    #[test]
    fn names_are_gce_names_and_stable() {
        let name = instance_name("pf", &spec().uid);
        assert_eq!(name, instance_name("pf", &spec().uid));
        assert!(name.len() <= 63 && name.starts_with("pf-"));
        assert!(name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'));
        assert_eq!(
            parse_provider_id(&provider_id("europe-west1-b", &name)),
            Some(("europe-west1-b", name.as_str()))
        );
        assert_eq!(parse_provider_id("no-slash"), None);
        assert_eq!(parse_provider_id("Zone/x"), None);
    }

    #[test]
    fn request_ids_are_version_8_uuids_fixed_by_their_parts() {
        let id = request_id(&["insert", "uid-1", "europe-west1-b", "0"]);
        assert_eq!(id, request_id(&["insert", "uid-1", "europe-west1-b", "0"]));
        assert_ne!(id, request_id(&["insert", "uid-1", "europe-west1-b", "1"]));
        assert_ne!(request_id(&["ab", "c"]), request_id(&["a", "bc"]));
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "8", "version nibble");
        assert!(matches!(&id[19..20], "8" | "9" | "a" | "b"), "RFC variant");
    }

    #[test]
    fn the_insert_body_carries_mark_labels_tags_and_user_data() {
        let spec = spec();
        let mark = OwnershipMark::for_spec(&spec, 1_767_225_600);
        let body = insert_body(&config(), "gcp-lab", &spec, "europe-west1-b", "pf-1", &mark)
            .expect("a body");
        assert_eq!(body["machineType"], "zones/europe-west1-b/machineTypes/e2-highcpu-2");
        assert_eq!(body["labels"]["proxyfleet"], "gcp-lab");
        assert_eq!(body["labels"]["team"], "edge");
        assert_eq!(body["labels"]["proxyfleet-uid"], spec.uid);
        assert_eq!(body["labels"]["proxyfleet-name"], "web_example");
        assert_eq!(body["tags"]["items"][0], "proxyfleet-proxy");
        assert_eq!(body["metadata"]["items"][0]["key"], "user-data");
        assert_eq!(body["disks"][0]["initializeParams"]["diskSizeGb"], "12");
        assert_eq!(body["networkInterfaces"][0]["accessConfigs"][0]["type"], "ONE_TO_ONE_NAT");
        let back = mark_of(&body).expect("the mark reads back");
        assert_eq!((back.uid.as_str(), back.name.as_str()), (spec.uid.as_str(), "web.example"));

        let mut binary = spec.clone();
        binary.user_data = vec![0xff, 0xfe];
        assert!(matches!(
            insert_body(&config(), "gcp-lab", &binary, "europe-west1-b", "pf-1", &mark),
            Err(ProviderError::InvalidSpec(m)) if m.starts_with("userData")
        ));
    }

    #[test]
    fn statuses_map_to_states() {
        for (status, state) in [
            ("PROVISIONING", InstanceState::Provisioning),
            ("STAGING", InstanceState::Provisioning),
            ("RUNNING", InstanceState::Running),
            ("STOPPING", InstanceState::Stopped),
            ("SUSPENDING", InstanceState::Stopped),
            ("SUSPENDED", InstanceState::Stopped),
            ("TERMINATED", InstanceState::Stopped),
            ("REPAIRING", InstanceState::Provisioning),
        ] {
            assert_eq!(state_of(status), state, "{status}");
        }
    }

    #[test]
    fn instances_read_address_port_and_mark() {
        let resource = json!({
            "name": "pf-1", "status": "RUNNING",
            "labels": {"proxyfleet-uid": "u1", "proxyfleet-namespace": "ns", "proxyfleet-name": "n", "proxyfleet-created-at": "5"},
            "networkInterfaces": [{"networkIP": "10.0.0.2", "accessConfigs": [{"natIP": "203.0.113.9"}]}],
            "metadata": {"items": [{"key": "proxyfleet-port", "value": "40123"}]},
        });
        let external = to_instance(&resource, "z-a-b", AddressKind::External);
        assert_eq!(external.provider_id, "z-a-b/pf-1");
        assert_eq!(external.state, InstanceState::Running);
        assert_eq!(external.addresses, ["203.0.113.9"]);
        assert_eq!(external.port, Some(40123));
        assert_eq!(external.created_at, Some(5));
        assert_eq!(to_instance(&resource, "z-a-b", AddressKind::Internal).addresses, ["10.0.0.2"]);
        let booting = json!({"name": "pf-1", "status": "RUNNING", "networkInterfaces": [{"accessConfigs": [{}]}]});
        let booting = to_instance(&booting, "z-a-b", AddressKind::External);
        assert_eq!(booting.state, InstanceState::Provisioning, "no address yet");
        assert!(booting.mark.is_none() && booting.port.is_none());
    }
}
