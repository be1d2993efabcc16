//! The XML the plugin hands libvirt (domains, volumes) and the ownership
//! mark it keeps in a domain's metadata. Values are escaped on the way out;
//! on the way in only the mark's attributes are read, in either quote
//! style, since libvirt re-serialises what it stores.

use proxyfleet_sdk::{OwnershipMark, ProxySpec};

use crate::config::{Attachment, Config, ImageFormat};

/// Namespace of the mark element in a domain's `<metadata>`.
pub const MARK_NAMESPACE: &str = "https://proxyfleet.io/xmlns/kvm/1";
/// Prefix the mark element is written with.
pub const MARK_PREFIX: &str = "proxyfleet";

/// Escapes text for an attribute value or element content.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '\'' => out.push_str("&apos;"),
            '"' => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
    out
}

fn unescape(text: &str) -> Option<String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find('&') {
        out.push_str(&rest[..start]);
        let end = rest[start..].find(';')? + start;
        out.push(match &rest[start + 1..end] {
            "amp" => '&',
            "lt" => '<',
            "gt" => '>',
            "apos" => '\'',
            "quot" => '"',
            _ => return None,
        });
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    Some(out)
}

/// The value of attribute `name` on the first element of `xml`.
fn attribute(xml: &str, name: &str) -> Option<String> {
    let head_end = xml.find('>')?;
    let head = &xml[..head_end];
    let mut search = 0;
    while let Some(found) = head[search..].find(name) {
        let at = search + found;
        search = at + name.len();
        let preceded = head[..at].ends_with(char::is_whitespace);
        let rest = head[search..].trim_start();
        let Some(rest) = rest.strip_prefix('=') else { continue };
        if !preceded {
            continue;
        }
        let rest = rest.trim_start();
        let quote = rest.chars().next().filter(|q| matches!(q, '"' | '\''))?;
        let value = &rest[1..];
        let end = value.find(quote)?;
        return unescape(&value[..end]);
    }
    None
}

/// The attributes that carry entry `entry`'s mark.
fn mark_attributes(entry: &str, mark: &OwnershipMark) -> String {
    format!(
        "entry=\"{}\" installation=\"{}\" uid=\"{}\" namespace=\"{}\" name=\"{}\" created-at=\"{}\"",
        escape(entry),
        escape(&mark.installation),
        escape(&mark.uid),
        escape(&mark.namespace),
        escape(&mark.name),
        mark.created_at
    )
}

/// The entry and mark a domain's metadata element holds, as libvirt hands
/// the element back; `None` when it is not a complete mark.
pub fn parse_mark(xml: &str) -> Option<(String, OwnershipMark)> {
    let entry = attribute(xml, "entry")?;
    let mark = OwnershipMark {
        // Domains marked before marks carried an installation read as empty.
        installation: attribute(xml, "installation").unwrap_or_default(),
        uid: attribute(xml, "uid")?,
        namespace: attribute(xml, "namespace")?,
        name: attribute(xml, "name")?,
        created_at: attribute(xml, "created-at")?.parse().ok()?,
    };
    let complete = [&entry, &mark.uid, &mark.namespace, &mark.name].iter().all(|v| !v.is_empty());
    complete.then_some((entry, mark))
}

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
        mark = mark_attributes(parts.entry, parts.mark),
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
    fn a_mark_survives_either_quote_style_and_escapes() {
        let element = format!("<owner {}/>", mark_attributes("kvm-lab", &mark()));
        assert_eq!(parse_mark(&element), Some(("kvm-lab".to_owned(), mark())));
        // libvirt hands the element back with its namespace and its own quoting.
        let single = "<owner xmlns='https://proxyfleet.io/xmlns/kvm/1' entry='a&amp;b' \
                      uid='u' namespace='n' name='x' created-at='7'/>";
        let (entry, parsed) = parse_mark(single).expect("valid");
        assert_eq!((entry.as_str(), parsed.uid.as_str(), parsed.created_at), ("a&b", "u", 7));
        // `name` must not match the tail of `namespace` or `xname`.
        let tricky = "<owner xname=\"no\" entry=\"e\" uid=\"u\" namespace=\"n\" name=\"yes\" \
                      created-at=\"1\"/>";
        assert_eq!(parse_mark(tricky).expect("valid").1.name, "yes");
        assert_eq!(
            parse_mark(tricky).expect("valid").1.installation,
            "",
            "marked before installations"
        );
        assert_eq!(parse_mark("<owner entry=\"e\" uid=\"u\"/>"), None);
        assert_eq!(
            parse_mark("<owner entry='e' uid='' namespace='n' name='x' created-at='1'/>"),
            None
        );
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
