//! The XML this plugin hands libvirt (volumes, the domain) and the
//! ownership mark it keeps in a domain's metadata. Values are escaped on
//! the way out; on the way in only the mark's attributes are read, in
//! either quote style, since libvirt writes back what it stores its own way.

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
        mark = mark_attributes(entry, mark),
        memory = spec.memory_mib.max(128),
        cores = spec.cores.max(1),
        overlay = escape(overlay),
        seed = escape(seed),
        network = escape(&config.network),
    )
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

/// The entry and mark a metadata element holds, as libvirt hands it back;
/// `None` when it is not a complete mark.
pub fn parse_mark(xml: &str) -> Option<(String, OwnershipMark)> {
    let entry = attribute(xml, "entry")?;
    let mark = OwnershipMark {
        installation: attribute(xml, "installation")?,
        uid: attribute(xml, "uid")?,
        namespace: attribute(xml, "namespace")?,
        name: attribute(xml, "name")?,
        created_at: attribute(xml, "created-at")?.parse().ok()?,
    };
    let complete = [&entry, &mark.uid, &mark.namespace, &mark.name]
        .iter()
        .all(|v| !v.is_empty());
    complete.then_some((entry, mark))
}

/// Escapes text for an attribute value or element content.
fn escape(text: &str) -> String {
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
    let head = &xml[..xml.find('>')?];
    let mut search = 0;
    while let Some(found) = head[search..].find(name) {
        let at = search + found;
        search = at + name.len();
        // Whole attribute names only: `name` is also the tail of `namespace`.
        let preceded = head[..at].ends_with(char::is_whitespace);
        let Some(rest) = head[search..].trim_start().strip_prefix('=') else {
            continue;
        };
        if !preceded {
            continue;
        }
        let rest = rest.trim_start();
        let quote = rest.chars().next().filter(|q| matches!(q, '"' | '\''))?;
        let value = &rest[1..];
        return unescape(&value[..value.find(quote)?]);
    }
    None
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
    fn a_mark_survives_libvirts_rewriting() {
        let element = format!("<owner {}/>", mark_attributes("lab&co", &mark()));
        assert_eq!(parse_mark(&element), Some(("lab&co".to_owned(), mark())));
        let rewritten = "<owner xmlns='x' entry='e' installation='i' uid='u' namespace='n' \
                         name='x' created-at='7'/>";
        let (entry, parsed) = parse_mark(rewritten).expect("a mark");
        assert_eq!(
            (entry.as_str(), parsed.name.as_str(), parsed.created_at),
            ("e", "x", 7)
        );
        assert_eq!(parse_mark("<owner entry='e' uid='u'/>"), None);
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
