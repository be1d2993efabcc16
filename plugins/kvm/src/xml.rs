//! The XML the plugin hands libvirt (domains, volumes) and the ownership
//! mark it keeps in a domain's metadata (the SDK's XML-attribute encoding,
//! which libvirt hands back in its own quoting). Values are escaped on the
//! way out.

use proxyfleet_sdk::xml::escape;
use proxyfleet_sdk::{OwnershipMark, ProxySpec};

use crate::config::{Attachment, Config, ImageFormat};

/// Namespace of the mark element in a domain's `<metadata>`.
pub const MARK_NAMESPACE: &str = "https://proxyfleet.io/xmlns/kvm/1";
/// Prefix the mark element is written with.
pub const MARK_PREFIX: &str = "proxyfleet";

/// A volume of `capacity` bytes in `format`, optionally an overlay on
/// `backing` (a path and its format).
pub fn volume(
    name: &str,
    capacity: u64,
    format: &str,
    backing: Option<(&str, ImageFormat)>,
) -> String {
    let backing = backing
        .map(|(path, format)| {
            format!(
                "<backingStore><path>{}</path><format type='{}'/></backingStore>",
                escape(path),
                format.as_str()
            )
        })
        .unwrap_or_default();
    format!(
        "<volume type='file'><name>{}</name><capacity unit='bytes'>{capacity}</capacity>\
         <target><format type='{}'/></target>{backing}</volume>",
        escape(name),
        escape(format)
    )
}

/// What a domain definition needs besides the config and the spec.
#[derive(Debug)]
pub struct DomainParts<'a> {
    pub name: &'a str,
    pub entry: &'a str,
    pub mark: &'a OwnershipMark,
    pub overlay_path: &'a str,
    pub seed_path: &'a str,
    pub attachment: &'a Attachment,
}

/// A persistent domain: the overlay as its disk, the seed as a CD-ROM,
/// one NIC, a guest-agent channel, and the mark in its metadata, so the
/// domain never exists without it.
pub fn domain(config: &Config, spec: &ProxySpec, parts: &DomainParts<'_>) -> String {
    let cpu = config
        .cpu_mode
        .as_deref()
        .map(|mode| format!("<cpu mode='{}'/>", escape(mode)))
        .unwrap_or_default();
    let nic = match parts.attachment {
        Attachment::Network(network) => {
            format!("<interface type='network'><source network='{}'/>", escape(network))
        }
        Attachment::Bridge { bridge, openvswitch, vlan } => {
            let mut nic = format!("<interface type='bridge'><source bridge='{}'/>", escape(bridge));
            if *openvswitch {
                nic.push_str("<virtualport type='openvswitch'/>");
            }
            if let Some(tag) = vlan {
                nic.push_str(&format!("<vlan><tag id='{tag}'/></vlan>"));
            }
            nic
        }
    };
    format!(
        "<domain type='{domain_type}'>\
         <name>{name}</name>\
         <metadata><{MARK_PREFIX}:owner xmlns:{MARK_PREFIX}='{MARK_NAMESPACE}' {mark}/>\
         </metadata>\
         <memory unit='MiB'>{memory}</memory>\
         <vcpu>{cores}</vcpu>\
         <os><type arch='{arch}'>hvm</type><boot dev='hd'/></os>\
         <features><acpi/><apic/></features>{cpu}\
         <on_crash>destroy</on_crash>\
         <devices>\
         <disk type='file' device='disk'><driver name='qemu' type='qcow2'/>\
         <source file='{overlay}'/><target dev='vda' bus='virtio'/></disk>\
         <disk type='file' device='cdrom'><driver name='qemu' type='raw'/>\
         <source file='{seed}'/><target dev='sda' bus='sata'/><readonly/></disk>\
         {nic}<model type='{model}'/></interface>\
         <channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel>\
         <serial type='pty'/><console type='pty'/>\
         </devices></domain>",
        domain_type = escape(&config.domain_type),
        name = escape(parts.name),
        mark = parts.mark.to_xml_attributes(parts.entry),
        memory = spec.memory_mib.max(128),
        cores = spec.cores.max(1),
        arch = escape(&config.arch),
        overlay = escape(parts.overlay_path),
        seed = escape(parts.seed_path),
        model = escape(&config.interface.model),
    )
}

#[cfg(test)]
mod tests {
    use proxyfleet_sdk::Network;

    use super::*;

    fn mark() -> OwnershipMark {
        OwnershipMark {
            installation: "prod".into(),
            uid: "0b5bd7c4-5a54".into(),
            namespace: "crawl".into(),
            name: "p-1".into(),
            created_at: 1_767_225_600,
        }
    }

    #[test]
    fn volumes_escape_names_and_carry_their_backing() {
        let xml = volume("a&b.qcow2", 10, "qcow2", Some(("/p/base.qcow2", ImageFormat::Qcow2)));
        assert!(xml.contains("<name>a&amp;b.qcow2</name>"), "{xml}");
        assert!(xml.contains("<backingStore><path>/p/base.qcow2</path><format type='qcow2'/>"));
        assert!(!volume("s.iso", 1, "raw", None).contains("backingStore"));
    }

    #[test]
    fn a_domain_carries_its_mark_disks_and_nic() {
        let config = crate::config::Config::parse(
            r#"{"hosts":[{"name":"h"}],"images":{"d":{"url":"https://x/d","sha256":"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"}},"interface":{"bridge":"br0","openvswitch":true},"cpuMode":"host-passthrough"}"#,
        )
        .expect("valid");
        let spec = ProxySpec {
            installation: "prod".into(),
            name: "p-1".into(),
            namespace: "crawl".into(),
            uid: "u".into(),
            cores: 2,
            memory_mib: 1024,
            disk_gib: 4,
            image: "d".into(),
            placement: Vec::new(),
            network: Network { vlan_tag: Some(42) },
            port: 8888,
            user_data: Vec::new(),
            labels: Vec::new(),
            proxy_auth: None,
        };
        let attachment = config.interface.attachment(Some(42)).expect("valid");
        let mark = mark();
        let xml = domain(
            &config,
            &spec,
            &DomainParts {
                name: "pf-abc",
                entry: "lab",
                mark: &mark,
                overlay_path: "/pool/pf-abc.qcow2",
                seed_path: "/pool/pf-abc-seed.iso",
                attachment: &attachment,
            },
        );
        assert!(xml.starts_with("<domain type='kvm'><name>pf-abc</name>"), "{xml}");
        assert!(
            xml.contains(&format!(
                "<metadata><proxyfleet:owner xmlns:proxyfleet='{MARK_NAMESPACE}' entry=\"lab\""
            )),
            "{xml}"
        );
        assert!(xml.contains("<memory unit='MiB'>1024</memory><vcpu>2</vcpu>"));
        assert!(xml.contains("<cpu mode='host-passthrough'/>"));
        assert!(xml.contains("<source file='/pool/pf-abc.qcow2'/>"));
        assert!(xml.contains("<source file='/pool/pf-abc-seed.iso'/>"));
        assert!(xml.contains(
            "<interface type='bridge'><source bridge='br0'/><virtualport type='openvswitch'/>\
             <vlan><tag id='42'/></vlan><model type='virtio'/></interface>"
        ));
    }
}
