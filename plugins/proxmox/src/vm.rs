//! Pure rules about the VMs this plugin manages: names, seed files, what a
//! cluster resource entry says, and how PVE's states map to ours.

use proxyfleet_sdk::{InstanceState, OwnershipMark, ProviderError, Result};
use serde_json::Value;

/// The tag that marks our VMs for `list`. PVE tags are
/// `[a-z0-9_][a-z0-9_\-+.]*` (lowercased on write since PVE 8.1).
pub const TAG: &str = "proxyfleet";
/// PVE VM names are DNS names; 63 keeps them one label.
pub const NAME_MAX: usize = 63;
const NAME_PREFIX: &str = "pf";

/// Locks a VM holds while it is being made: it has no name (and no
/// readable mark) yet.
pub fn is_creation_lock(lock: &str) -> bool {
    matches!(lock, "clone" | "create")
}

/// The lock of a hibernated VM (`qm suspend --todisk`): it keeps it until
/// it is started again. `suspending` passes by itself, so it is not one.
pub fn is_hibernation_lock(lock: &str) -> bool {
    lock == "suspended"
}

/// Whether a VM name is one this plugin gives (`pf-` and a hash): such a VM
/// is worth reading for our mark even outside the range and untagged.
pub fn has_our_name(name: &str) -> bool {
    name.strip_prefix(NAME_PREFIX)
        .and_then(|rest| rest.strip_prefix('-'))
        .is_some_and(|hash| !hash.is_empty() && hash.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The VM name for a Proxy UID.
pub fn vm_name(uid: &str) -> String {
    proxyfleet_sdk::derive_name(NAME_PREFIX, uid, NAME_MAX)
}

/// The seed ISO's file name for a VMID; derivable from the provider ID
/// alone so that `delete` finds it even when the VM is gone.
pub fn seed_name(vmid: u32) -> String {
    format!("proxyfleet-{vmid}-cidata.iso")
}

/// The VMID in a provider ID (the VMID in decimal).
pub fn parse_vmid(provider_id: &str) -> Option<u32> {
    provider_id.parse().ok().filter(|vmid| (100..=999_999_999).contains(vmid))
}

/// One `qemu` entry of `/cluster/resources`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmEntry {
    pub vmid: u32,
    pub node: String,
    pub name: Option<String>,
    pub status: String,
    pub lock: Option<String>,
    pub tags: Vec<String>,
    pub template: bool,
}

impl VmEntry {
    /// Reads a resource entry; `None` for other types (LXC, nodes, storage).
    pub fn from_resource(value: &Value) -> Option<Self> {
        if value.get("type").and_then(Value::as_str) != Some("qemu") {
            return None;
        }
        let text = |key: &str| value.get(key).and_then(Value::as_str).map(str::to_owned);
        Some(Self {
            vmid: u32::try_from(value.get("vmid")?.as_u64()?).ok()?,
            node: text("node")?,
            name: text("name"),
            status: text("status").unwrap_or_else(|| "unknown".to_owned()),
            lock: text("lock").filter(|lock| !lock.is_empty()),
            tags: text("tags")
                .map(|tags| {
                    tags.split([';', ',', ' '])
                        .filter(|tag| !tag.is_empty())
                        .map(str::to_ascii_lowercase)
                        .collect()
                })
                .unwrap_or_default(),
            template: value.get("template").and_then(Value::as_u64) == Some(1),
        })
    }

    pub fn has_tag(&self) -> bool {
        self.tags.iter().any(|tag| tag == TAG)
    }
}

/// The mark in a VM config's description, if it is one of ours whose name
/// also matches: a VM someone renamed or re-described is not adopted.
pub fn mark_of(config: &Value) -> Option<OwnershipMark> {
    let description = config.get("description").and_then(Value::as_str)?;
    let mark = OwnershipMark::from_text(description)?;
    let name = config.get("name").and_then(Value::as_str)?;
    (name == vm_name(&mark.uid)).then_some(mark)
}

/// The instance state for a VM's `status/current`: paused and suspended
/// VMs serve nothing, so they count as stopped.
pub fn state_of(current: &Value) -> InstanceState {
    let text = |key: &str| current.get(key).and_then(Value::as_str).unwrap_or("");
    if matches!(text("qmpstatus"), "paused" | "suspended" | "prelaunch")
        || matches!(text("lock"), "suspended" | "suspending")
    {
        return InstanceState::Stopped;
    }
    match text("status") {
        "running" => InstanceState::Running,
        _ => InstanceState::Stopped,
    }
}

/// Addresses from the agent's `network-get-interfaces` result: every
/// interface but `lo`, IPv4 before IPv6, link-local left out.
pub fn addresses_of(agent: &Value) -> Vec<String> {
    let mut v4 = Vec::new();
    let mut v6 = Vec::new();
    let interfaces = agent.get("result").and_then(Value::as_array).cloned().unwrap_or_default();
    for interface in &interfaces {
        if interface.get("name").and_then(Value::as_str) == Some("lo") {
            continue;
        }
        let addresses =
            interface.get("ip-addresses").and_then(Value::as_array).cloned().unwrap_or_default();
        for address in &addresses {
            let Some(ip) = address.get("ip-address").and_then(Value::as_str) else { continue };
            match address.get("ip-address-type").and_then(Value::as_str) {
                Some("ipv4") if !ip.starts_with("169.254.") => v4.push(ip.to_owned()),
                Some("ipv6") if !ip.to_ascii_lowercase().starts_with("fe80:") => {
                    v6.push(ip.to_owned())
                }
                _ => {}
            }
        }
    }
    v4.extend(v6);
    v4
}

/// `size=32G` of a drive string, in GiB (`T` and `M` too).
pub fn disk_size_gib(drive: &str) -> Option<u64> {
    let size = drive.split(',').find_map(|part| part.strip_prefix("size="))?;
    let (number, unit) = size.split_at(size.len().checked_sub(1)?);
    let number: u64 = number.parse().ok()?;
    match unit {
        "T" => Some(number * 1024),
        "G" => Some(number),
        "M" => Some(number / 1024),
        "K" => Some(number / (1024 * 1024)),
        _ => None,
    }
}

/// `net0` for the bridge and, when set, the VLAN tag (1 to 4094).
pub fn net0(bridge: &str, vlan_tag: Option<u16>) -> Result<String> {
    match vlan_tag {
        None => Ok(format!("virtio,bridge={bridge}")),
        Some(tag @ 1..=4094) => Ok(format!("virtio,bridge={bridge},tag={tag}")),
        Some(tag) => Err(ProviderError::InvalidSpec(format!(
            "network.vlanTag: {tag} is not a VLAN ID (1 to 4094)"
        ))),
    }
}

/// NoCloud `meta-data`.
pub fn meta_data(name: &str) -> String {
    format!("instance-id: {name}\nlocal-hostname: {name}\n")
}

/// NoCloud `network-config` (v2): DHCP on the first Ethernet interface,
/// which is net0.
pub const NETWORK_CONFIG: &str = "version: 2\nethernets:\n  net0:\n    match:\n      name: \"e*\"\n    dhcp4: true\n    dhcp6: true\n";

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn our_names_are_told_from_others() {
        assert!(has_our_name(&vm_name("0f8e6c1e-2d4b-4f7a-9a51-3c7f0e2b9d11")));
        for other in ["pf-", "pf-xyz", "pfa-00", "web-01", "Copy-of-VM-debian"] {
            assert!(!has_our_name(other), "{other}");
        }
        assert!(is_hibernation_lock("suspended"));
        assert!(!is_hibernation_lock("suspending") && !is_hibernation_lock("backup"));
    }

    fn mark() -> OwnershipMark {
        OwnershipMark {
            installation: "prod".into(),
            uid: "u-1".into(),
            namespace: "ns".into(),
            name: "p".into(),
            created_at: 7,
        }
    }

    #[test]
    fn resources_are_read_with_lock_and_tags() {
        let entry = VmEntry::from_resource(&json!({
            "id": "qemu/101", "type": "qemu", "vmid": 101, "node": "pve1",
            "status": "stopped", "lock": "clone", "template": 0
        }))
        .expect("a qemu entry");
        assert_eq!(entry.name, None, "a VM being cloned has no name yet");
        assert_eq!(entry.lock.as_deref(), Some("clone"));
        let tagged = VmEntry::from_resource(&json!({
            "type": "qemu", "vmid": 102, "node": "pve1", "name": "x", "tags": "Prod;proxyfleet"
        }))
        .expect("a qemu entry");
        assert!(tagged.has_tag());
        assert_eq!(tagged.status, "unknown");
        assert!(
            VmEntry::from_resource(&json!({"type": "lxc", "vmid": 103, "node": "pve1"})).is_none()
        );
    }

    #[test]
    fn marks_need_the_matching_name() {
        let ours = json!({"name": vm_name("u-1"), "description": mark().to_text()});
        assert_eq!(mark_of(&ours), Some(mark()));
        let renamed = json!({"name": "web", "description": mark().to_text()});
        assert_eq!(mark_of(&renamed), None);
        let cloning = json!({"lock": "clone", "description": "qmclone temporary file\n"});
        assert_eq!(mark_of(&cloning), None);
    }

    #[test]
    fn paused_and_suspended_count_as_stopped() {
        assert_eq!(
            state_of(&json!({"status": "running", "qmpstatus": "running"})),
            InstanceState::Running
        );
        assert_eq!(
            state_of(&json!({"status": "running", "qmpstatus": "paused"})),
            InstanceState::Stopped
        );
        assert_eq!(
            state_of(&json!({"status": "running", "qmpstatus": "suspended"})),
            InstanceState::Stopped
        );
        assert_eq!(
            state_of(&json!({"status": "stopped", "lock": "suspended"})),
            InstanceState::Stopped
        );
        assert_eq!(state_of(&json!({"status": "stopped"})), InstanceState::Stopped);
    }

    #[test]
    fn agent_addresses_skip_loopback_interface_and_link_local() {
        let agent = json!({"result": [
            {"name": "lo", "ip-addresses": [{"ip-address": "127.0.0.1", "ip-address-type": "ipv4"}]},
            {"name": "eth0", "ip-addresses": [
                {"ip-address": "fe80::1", "ip-address-type": "ipv6"},
                {"ip-address": "2001:db8::5", "ip-address-type": "ipv6"},
                {"ip-address": "10.0.0.5", "ip-address-type": "ipv4"}]}
        ]});
        assert_eq!(addresses_of(&agent), ["10.0.0.5", "2001:db8::5"]);
        assert!(addresses_of(&json!({"result": []})).is_empty());
    }

    #[test]
    fn disk_sizes_and_nets() {
        assert_eq!(disk_size_gib("local-lvm:vm-1-disk-0,iothread=1,size=32G"), Some(32));
        assert_eq!(disk_size_gib("ceph:vm-1-disk-0,size=1T"), Some(1024));
        assert_eq!(disk_size_gib("local:vm-1-disk-0"), None);
        assert_eq!(net0("vmbr0", None).as_deref(), Ok("virtio,bridge=vmbr0"));
        assert_eq!(net0("vmbr1", Some(42)).as_deref(), Ok("virtio,bridge=vmbr1,tag=42"));
        assert!(
            matches!(net0("vmbr0", Some(4095)), Err(ProviderError::InvalidSpec(m)) if m.contains("network.vlanTag"))
        );
    }

    #[test]
    fn ids_and_names_are_stable() {
        assert_eq!(parse_vmid("100123"), Some(100_123));
        assert_eq!(parse_vmid("99"), None);
        assert_eq!(parse_vmid("pve1/101"), None);
        assert_eq!(seed_name(101), "proxyfleet-101-cidata.iso");
        assert_eq!(vm_name("u-1"), vm_name("u-1"));
        assert!(vm_name("u-1").len() <= NAME_MAX && vm_name("u-1").starts_with("pf-"));
        assert!(is_creation_lock("clone") && !is_creation_lock("backup"));
    }
}
