//! The XML this plugin hands libvirt: volumes, and the domain with the
//! ownership mark in its metadata (the SDK's XML-attribute encoding, read
//! back with `OwnershipMark::from_xml_attributes`). Values are escaped.

use proxyfleet_sdk::xml::escape;
use proxyfleet_sdk::{OwnershipMark, ProxySpec};

use crate::config::Config;

/// Namespace of the mark element in a domain's `<metadata>`.
pub const MARK_NAMESPACE: &str = "https://proxyfleet.io/xmlns/{{name}}/1";

/// A volume of `capacity` bytes in `format`, an overlay on the volume at
/// `backing` when given.
pub fn volume(name: &str, capacity: u64, format: &str, backing: Option<&str>) -> String {
    let backing = backing
        .map(|path| {
            format!(
                "<backingStore><path>{}</path><format type='qcow2'/></backingStore>",
                escape(path)
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

/// A persistent domain: the overlay as its disk, the seed as a CD-ROM, one
/// NIC on the entry's network, and the mark in its metadata, so that the
/// domain never exists without it.
pub fn domain(
    config: &Config,
    spec: &ProxySpec,
    name: &str,
    entry: &str,
    mark: &OwnershipMark,
    disks: (&str, &str),
) -> String {
    let (overlay, seed) = disks;
    format!(
        "<domain type='{domain_type}'><name>{name}</name>\
         <metadata><proxyfleet:owner xmlns:proxyfleet='{MARK_NAMESPACE}' {mark}/></metadata>\
         <memory unit='MiB'>{memory}</memory><vcpu>{cores}</vcpu>\
         <os><type arch='x86_64'>hvm</type><boot dev='hd'/></os>\
         <devices>\
         <disk type='file' device='disk'><driver name='qemu' type='qcow2'/>\
         <source file='{overlay}'/><target dev='vda' bus='virtio'/></disk>\
         <disk type='file' device='cdrom'><driver name='qemu' type='raw'/>\
         <source file='{seed}'/><target dev='sda' bus='sata'/><readonly/></disk>\
         <interface type='network'><source network='{network}'/><model type='virtio'/></interface>\
         <serial type='pty'/><console type='pty'/>\
         </devices></domain>",
        domain_type = escape(&config.domain_type),
        name = escape(name),
        mark = mark.to_xml_attributes(entry),
        memory = spec.memory_mib.max(128),
        cores = spec.cores.max(1),
        overlay = escape(overlay),
        seed = escape(seed),
        network = escape(&config.network),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark() -> OwnershipMark {
        OwnershipMark {
            installation: "prod".into(),
            uid: "0b5bd7c4".into(),
            namespace: "crawl".into(),
            name: "p-1".into(),
            created_at: 1_767_225_600,
        }
    }

    #[test]
    fn the_domain_carries_its_mark_and_disks() {
        let config = Config::parse(r#"{"host":"h","images":{"d":"base.qcow2"}}"#).expect("valid");
        let spec = proxyfleet_sdk_testkit::spec("web-1");
        let xml = domain(
            &config,
            &spec,
            "pf-1",
            "lab",
            &mark(),
            ("/p/pf-1.qcow2", "/p/seed.iso"),
        );
        assert!(
            xml.starts_with("<domain type='kvm'><name>pf-1</name>"),
            "{xml}"
        );
        assert!(xml.contains(&format!(
            "xmlns:proxyfleet='{MARK_NAMESPACE}' entry=\"lab\""
        )));
        assert!(xml.contains("<source file='/p/pf-1.qcow2'/>") && xml.contains("/p/seed.iso"));
        let overlay = volume("a&b.qcow2", 10, "qcow2", Some("/p/base.qcow2"));
        assert!(overlay.contains("<name>a&amp;b.qcow2</name><capacity unit='bytes'>10"));
        assert!(overlay.contains("<backingStore><path>/p/base.qcow2</path>"));
    }
}
