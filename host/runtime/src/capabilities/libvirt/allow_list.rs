//! The domain and volume XML a plugin may hand libvirt: an allow-list,
//! checked before anything reaches the host.
//!
//! libvirt's XML is hypervisor-level power: `qemu:commandline` runs any
//! QEMU argument, `hostdev` passes host hardware through, a disk may be
//! any host file, `<log file>` and dump actions write host files, an
//! `lxc` domain shares the host's root. A plugin gets what a proxy VM
//! needs and nothing else:
//!
//! - the root is a `kvm`, `qemu` or `test` domain; each top-level element
//!   appears once, and only those listed in [`DOMAIN_CHILDREN`];
//! - namespaced elements and attributes only as `<metadata>` children,
//!   which libvirt stores without reading, and never the host's own
//!   namespace ([`super::owner::NAMESPACE`]);
//! - disks are `file` or `volume` disks; their sources are checked on the
//!   host against the grant's pools (see `scope`), backing chains
//!   included;
//! - NICs attach to a libvirt network or a bridge, consoles and channels
//!   are ptys or libvirt-made sockets, and the random source is the
//!   host's `/dev/urandom` or `/dev/random`.
//!
//! The parser refuses DTDs, so no entity can smuggle text past the walk.

use std::collections::BTreeSet;

use roxmltree::{Document, Node, ParsingOptions};

use super::LibvirtError;

/// Top-level elements of a domain a plugin may use.
const DOMAIN_CHILDREN: &[&str] = &[
    "name",
    "uuid",
    "title",
    "description",
    "metadata",
    "memory",
    "currentMemory",
    "vcpu",
    "os",
    "features",
    "cpu",
    "clock",
    "pm",
    "on_poweroff",
    "on_reboot",
    "on_crash",
    "devices",
];

/// Elements no XML handed to libvirt gets more nodes than; a domain of a
/// proxy VM has about a hundred.
const NODES_LIMIT: u32 = 10_000;

/// What a checked domain definition refers to on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CheckedDomain {
    /// The domain's name.
    pub name: String,
    /// The UUID it asks for, if any.
    pub uuid: Option<String>,
    /// Disk sources given as host paths.
    pub files: Vec<String>,
    /// Disk sources given as (pool, volume).
    pub volumes: Vec<(String, String)>,
    /// The definition as libvirt gets it: the plugin's XML with the host's
    /// owner element added to its metadata.
    pub xml: String,
}

/// What a checked volume definition refers to on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CheckedVolume {
    /// The path of the volume it is an overlay on, if any.
    pub backing: Option<String>,
}

fn parse<'input>(what: &str, xml: &'input str) -> Result<Document<'input>, LibvirtError> {
    let options = ParsingOptions { allow_dtd: false, nodes_limit: NODES_LIMIT };
    Document::parse_with_options(xml, options)
        .map_err(|err| LibvirtError::Invalid(format!("{what} XML does not parse: {err}")))
}

/// `/domain/devices/disk`, for messages.
fn path_of(node: Node<'_, '_>) -> String {
    let mut names: Vec<&str> =
        node.ancestors().filter(Node::is_element).map(|n| n.tag_name().name()).collect();
    names.reverse();
    format!("/{}", names.join("/"))
}

fn refused(node: Node<'_, '_>, why: &str) -> LibvirtError {
    LibvirtError::Invalid(format!(
        "{} is not allowed: {why} (see \"libvirt XML\" in docs/providers-config.md)",
        path_of(node)
    ))
}

fn elements<'a, 'input>(node: Node<'a, 'input>) -> impl Iterator<Item = Node<'a, 'input>> {
    node.children().filter(Node::is_element)
}

/// Why a well-known element is off the list; a generic reason otherwise.
fn reason(name: &str) -> &'static str {
    match name {
        "hostdev" | "redirdev" | "smartcard" | "hub" | "tpm" => {
            "it passes host devices through to the guest"
        }
        "filesystem" => "it shares host directories with the guest",
        "emulator" => "it names a host binary",
        "seclabel" => "it changes the domain's security labels",
        "log" => "it writes a host file",
        "loader" | "nvram" | "kernel" | "initrd" | "dtb" | "acpi" | "smbios" => {
            "it reads host files or host firmware tables"
        }
        "backingStore" => "backing chains are read from the volumes themselves",
        "sysinfo" | "memoryBacking" | "resource" | "blkiotune" | "numatune" | "cputune"
        | "iothreads" | "iothreadids" | "launchSecurity" | "keywrap" | "idmap" => {
            "it tunes or exposes the host rather than the guest"
        }
        "graphics" => "it opens a console on the host's network",
        "script" | "downscript" | "backend" | "rom" => "it names a host script, device or file",
        _ => "it is not on the allow-list",
    }
}

/// No namespaced attribute, nor one of `names`' complement when `names` is
/// given.
fn attributes(node: Node<'_, '_>, allowed: Option<&[&str]>) -> Result<(), LibvirtError> {
    for attribute in node.attributes() {
        if attribute.namespace().is_some() {
            return Err(refused(node, "namespaced attributes are not allowed outside <metadata>"));
        }
        if let Some(allowed) = allowed
            && !allowed.contains(&attribute.name())
        {
            return Err(refused(
                node,
                &format!("attribute `{}` is not on the allow-list", attribute.name()),
            ));
        }
    }
    Ok(())
}

/// An element without namespaced parts anywhere below it (for subtrees
/// that describe only the guest: features, clock, controllers, ...).
fn plain_subtree(node: Node<'_, '_>) -> Result<(), LibvirtError> {
    for below in node.descendants().filter(Node::is_element) {
        if below.tag_name().namespace().is_some() {
            return Err(refused(below, "namespaced elements are only allowed in <metadata>"));
        }
        attributes(below, None)?;
    }
    Ok(())
}

/// An element with attributes but no child elements.
fn leaf(node: Node<'_, '_>) -> Result<(), LibvirtError> {
    if let Some(child) = elements(node).next() {
        return Err(refused(child, reason(child.tag_name().name())));
    }
    attributes(node, None)
}

/// Each child element of `node` is plain and named in `allowed`; answers
/// them with their names.
fn children<'a, 'input>(
    node: Node<'a, 'input>,
    allowed: &[&str],
) -> Result<Vec<(&'a str, Node<'a, 'input>)>, LibvirtError> {
    elements(node)
        .map(|child| {
            let name = child.tag_name().name();
            if child.tag_name().namespace().is_some() {
                Err(refused(
                    child,
                    "namespaced elements (such as qemu:commandline) are only allowed in <metadata>",
                ))
            } else if allowed.contains(&name) {
                Ok((name, child))
            } else {
                Err(refused(child, reason(name)))
            }
        })
        .collect()
}

fn attribute_in(
    node: Node<'_, '_>,
    name: &str,
    allowed: &[&str],
    absent: Option<&'static str>,
) -> Result<(), LibvirtError> {
    match node.attribute(name).or(absent) {
        Some(value) if allowed.contains(&value) => Ok(()),
        Some(value) => {
            Err(refused(node, &format!("{name}='{value}' is not one of {}", allowed.join(", "))))
        }
        None => Err(refused(node, &format!("it needs a `{name}` attribute"))),
    }
}

/// Checks a domain definition and adds the owner element `owner` (an
/// element in the host's namespace) to its metadata.
pub(crate) fn check_domain(
    xml: &str,
    owner_namespace: &str,
    owner: &str,
) -> Result<CheckedDomain, LibvirtError> {
    let doc = parse("domain", xml)?;
    let root = doc.root_element();
    if root.tag_name().name() != "domain" || root.tag_name().namespace().is_some() {
        return Err(LibvirtError::Invalid("domain XML must have <domain> as its root".into()));
    }
    attribute_in(root, "type", &["kvm", "qemu", "test"], None)?;
    attributes(root, Some(&["type", "id"]))?;
    let mut walk = DomainWalk { files: Vec::new(), volumes: Vec::new() };
    let mut seen = BTreeSet::new();
    let (mut name, mut uuid, mut metadata) = (None, None, None);
    for (tag, child) in children(root, DOMAIN_CHILDREN)? {
        if !seen.insert(tag) {
            return Err(refused(child, "it appears twice"));
        }
        match tag {
            "name" => {
                leaf(child)?;
                name = Some(child);
            }
            "uuid" => {
                leaf(child)?;
                uuid = child.text().map(|t| t.trim().to_ascii_lowercase());
            }
            "metadata" => {
                metadata_children(child, owner_namespace)?;
                metadata = Some(child);
            }
            "on_crash" => {
                leaf(child)?;
                let action = child.text().unwrap_or_default().trim();
                if action.starts_with("coredump") {
                    return Err(refused(child, "core dumps write host files"));
                }
            }
            "os" => os(child)?,
            "features" | "cpu" | "clock" | "pm" => plain_subtree(child)?,
            "devices" => walk.devices(child)?,
            _ => leaf(child)?,
        }
    }
    let Some(name_node) = name else {
        return Err(LibvirtError::Invalid("domain XML needs a <name>".into()));
    };
    let domain_name = name_node.text().unwrap_or_default().trim().to_owned();
    if domain_name.is_empty() {
        return Err(refused(name_node, "the name is empty"));
    }
    // The owner goes in as the first metadata child; where there is no
    // metadata, a <metadata> right after the name.
    let (at, replace, text) = match metadata {
        Some(node) => match node.first_child() {
            Some(first) => (first.range().start, 0, owner.to_owned()),
            None => {
                (node.range().start, node.range().len(), format!("<metadata>{owner}</metadata>"))
            }
        },
        None => (name_node.range().end, 0, format!("<metadata>{owner}</metadata>")),
    };
    let mut with_owner = String::with_capacity(xml.len() + text.len());
    with_owner.push_str(&xml[..at]);
    with_owner.push_str(&text);
    with_owner.push_str(&xml[at + replace..]);
    Ok(CheckedDomain {
        name: domain_name,
        uuid: uuid.filter(|u| !u.is_empty()),
        files: walk.files,
        volumes: walk.volumes,
        xml: with_owner,
    })
}

/// Metadata children are namespaced (libvirt stores them without reading
/// them), never in the host's namespace.
fn metadata_children(node: Node<'_, '_>, owner_namespace: &str) -> Result<(), LibvirtError> {
    attributes(node, None)?;
    for child in elements(node) {
        match child.tag_name().namespace() {
            Some(namespace) if namespace == owner_namespace => {
                return Err(refused(child, "this namespace is the host's own"));
            }
            Some(_) => {}
            None => return Err(refused(child, "metadata elements need a namespace of their own")),
        }
    }
    Ok(())
}

fn os(node: Node<'_, '_>) -> Result<(), LibvirtError> {
    attributes(node, Some(&["firmware"]))?;
    for (_, child) in children(node, &["type", "boot", "bootmenu", "bios"])? {
        leaf(child)?;
    }
    Ok(())
}

struct DomainWalk {
    files: Vec<String>,
    volumes: Vec<(String, String)>,
}

impl DomainWalk {
    fn devices(&mut self, node: Node<'_, '_>) -> Result<(), LibvirtError> {
        attributes(node, Some(&[]))?;
        let allowed = [
            "disk",
            "interface",
            "channel",
            "serial",
            "console",
            "controller",
            "input",
            "video",
            "memballoon",
            "watchdog",
            "rng",
            "panic",
        ];
        for (tag, child) in children(node, &allowed)? {
            match tag {
                "disk" => self.disk(child)?,
                "interface" => interface(child)?,
                "channel" => character_device(child, &["unix", "pty", "spicevmc"])?,
                "serial" | "console" => character_device(child, &["pty"])?,
                "input" => {
                    attribute_in(child, "type", &["mouse", "tablet", "keyboard"], None)?;
                    plain_subtree(child)?;
                    children(child, &["address", "alias"])?;
                }
                "watchdog" => {
                    if child.attribute("action") == Some("dump") {
                        return Err(refused(child, "core dumps write host files"));
                    }
                    plain_subtree(child)?;
                }
                "rng" => rng(child)?,
                _ => plain_subtree(child)?,
            }
        }
        Ok(())
    }

    fn disk(&mut self, node: Node<'_, '_>) -> Result<(), LibvirtError> {
        attribute_in(node, "type", &["file", "volume"], Some("file"))?;
        attribute_in(node, "device", &["disk", "cdrom"], Some("disk"))?;
        attributes(node, Some(&["type", "device", "model", "snapshot"]))?;
        let kind = node.attribute("type").unwrap_or("file");
        let allowed = [
            "driver",
            "source",
            "target",
            "readonly",
            "shareable",
            "transient",
            "serial",
            "boot",
            "address",
            "alias",
            "iotune",
            "blockio",
            "geometry",
        ];
        for (tag, child) in children(node, &allowed)? {
            match tag {
                "source" => {
                    leaf(child)?;
                    if kind == "file" {
                        attributes(child, Some(&["file", "startupPolicy", "index"]))?;
                        if let Some(file) = child.attribute("file") {
                            self.files.push(file.to_owned());
                        }
                    } else {
                        attributes(child, Some(&["pool", "volume", "mode", "startupPolicy"]))?;
                        if child.attribute("mode") == Some("direct") {
                            return Err(refused(child, "mode='direct' reads the host's devices"));
                        }
                        match (child.attribute("pool"), child.attribute("volume")) {
                            (Some(pool), Some(volume)) => {
                                self.volumes.push((pool.to_owned(), volume.to_owned()));
                            }
                            _ => return Err(refused(child, "it needs `pool` and `volume`")),
                        }
                    }
                }
                "iotune" | "geometry" | "address" => plain_subtree(child)?,
                _ => leaf(child)?,
            }
        }
        Ok(())
    }
}

fn interface(node: Node<'_, '_>) -> Result<(), LibvirtError> {
    attribute_in(node, "type", &["network", "bridge"], None)?;
    attributes(node, Some(&["type", "trustGuestRxFilters"]))?;
    let allowed = [
        "source",
        "mac",
        "model",
        "virtualport",
        "vlan",
        "link",
        "mtu",
        "address",
        "alias",
        "boot",
        "driver",
        "target",
        "bandwidth",
        "filterref",
        "coalesce",
    ];
    for (tag, child) in children(node, &allowed)? {
        match tag {
            "source" => {
                leaf(child)?;
                attributes(child, Some(&["network", "bridge", "portgroup"]))?;
            }
            "virtualport" => {
                attribute_in(child, "type", &["openvswitch"], None)?;
                plain_subtree(child)?;
            }
            "target" => {
                leaf(child)?;
                attributes(child, Some(&["dev"]))?;
            }
            _ => plain_subtree(child)?,
        }
    }
    Ok(())
}

/// A serial port, console or channel: of a type in `types`, with no host
/// source (libvirt makes the pty or socket itself) and no log file.
fn character_device(node: Node<'_, '_>, types: &[&str]) -> Result<(), LibvirtError> {
    attribute_in(node, "type", types, None)?;
    attributes(node, Some(&["type"]))?;
    for (_, child) in children(node, &["target", "address", "alias"])? {
        plain_subtree(child)?;
    }
    Ok(())
}

fn rng(node: Node<'_, '_>) -> Result<(), LibvirtError> {
    attribute_in(
        node,
        "model",
        &["virtio", "virtio-transitional", "virtio-non-transitional"],
        None,
    )?;
    attributes(node, Some(&["model"]))?;
    for (tag, child) in children(node, &["backend", "rate", "address", "alias"])? {
        if tag == "backend" {
            leaf(child)?;
            attribute_in(child, "model", &["random", "builtin"], None)?;
            attributes(child, Some(&["model"]))?;
            let source = child.text().unwrap_or_default().trim();
            if !matches!(source, "" | "/dev/urandom" | "/dev/random") {
                return Err(refused(child, "the random source is /dev/urandom or /dev/random"));
            }
        } else {
            plain_subtree(child)?;
        }
    }
    Ok(())
}

/// Checks a volume definition: a name, sizes, a format, and optionally
/// the volume it is an overlay on; nothing that sets host ownership,
/// permissions or paths.
pub(crate) fn check_volume(xml: &str) -> Result<CheckedVolume, LibvirtError> {
    let doc = parse("volume", xml)?;
    let root = doc.root_element();
    if root.tag_name().name() != "volume" || root.tag_name().namespace().is_some() {
        return Err(LibvirtError::Invalid("volume XML must have <volume> as its root".into()));
    }
    attribute_in(root, "type", &["file"], Some("file"))?;
    attributes(root, Some(&["type"]))?;
    let mut backing = None;
    let allowed = ["name", "key", "capacity", "allocation", "target", "backingStore"];
    for (tag, child) in children(root, &allowed)? {
        match tag {
            "target" | "backingStore" => {
                attributes(child, Some(&[]))?;
                for (part, below) in children(child, &["format", "path", "compat", "nocow"])? {
                    leaf(below)?;
                    match (tag, part) {
                        ("backingStore", "path") => {
                            backing = below.text().map(|t| t.trim().to_owned());
                        }
                        ("target", "path") => {
                            return Err(refused(below, "the pool decides where its volumes live"));
                        }
                        _ => {}
                    }
                }
            }
            _ => leaf(child)?,
        }
    }
    Ok(CheckedVolume { backing })
}

/// The backing path libvirt reports in a volume's own description (read
/// from the image's header), if any.
pub(crate) fn reported_backing(description: &str) -> Result<Option<String>, LibvirtError> {
    let doc = parse("volume description", description)?;
    Ok(doc
        .root_element()
        .children()
        .find(|n| n.has_tag_name("backingStore"))
        .and_then(|store| store.children().find(|n| n.has_tag_name("path")))
        .and_then(|path| path.text())
        .map(|text| text.trim().to_owned())
        .filter(|text| !text.is_empty()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NS: &str = "https://proxyfleet.io/xmlns/host/1";
    const OWNER: &str = "<h:owner xmlns:h='https://proxyfleet.io/xmlns/host/1' entry='a'/>";

    /// The kvm plugin's shape of domain.
    fn proxy_vm(devices: &str) -> String {
        format!(
            "<domain type='kvm'><name>vm-1</name>\
             <metadata><pf:owner xmlns:pf='https://proxyfleet.io/xmlns/kvm/1' uid='u'/></metadata>\
             <memory unit='MiB'>512</memory><vcpu>1</vcpu>\
             <os><type arch='x86_64'>hvm</type><boot dev='hd'/></os>\
             <features><acpi/><apic/></features><cpu mode='host-passthrough'/>\
             <on_crash>destroy</on_crash><devices>{devices}</devices></domain>"
        )
    }

    const PROXY_DEVICES: &str = "<disk type='file' device='disk'><driver name='qemu' \
        type='qcow2'/><source file='/pool/vm-1.qcow2'/><target dev='vda' bus='virtio'/></disk>\
        <disk type='file' device='cdrom'><driver name='qemu' type='raw'/>\
        <source file='/pool/vm-1-seed.iso'/><target dev='sda' bus='sata'/><readonly/></disk>\
        <interface type='network'><source network='default'/><model type='virtio'/></interface>\
        <channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel>\
        <serial type='pty'/><console type='pty'/>";

    fn refusal(xml: &str) -> String {
        match check_domain(xml, NS, OWNER) {
            Err(LibvirtError::Invalid(message)) => message,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn a_proxy_vm_passes_with_its_disks_and_the_owner_added() {
        let checked = check_domain(&proxy_vm(PROXY_DEVICES), NS, OWNER).unwrap();
        assert_eq!(checked.name, "vm-1");
        assert_eq!(checked.files, ["/pool/vm-1.qcow2", "/pool/vm-1-seed.iso"]);
        assert!(checked.xml.contains(&format!("<metadata>{OWNER}<pf:owner")), "{}", checked.xml);
        // The result is still one well-formed domain.
        let again = Document::parse(&checked.xml).unwrap();
        let metadata = again.root_element().children().find(|n| n.has_tag_name("metadata"));
        assert_eq!(metadata.unwrap().children().filter(Node::is_element).count(), 2);
    }

    #[test]
    fn the_owner_is_added_where_there_is_no_metadata_or_an_empty_one() {
        for xml in [
            "<domain type='test'><name>x</name><memory>1</memory></domain>",
            "<domain type='test'><name>x</name><metadata/><memory>1</memory></domain>",
            "<domain type='test'><name>x</name><metadata></metadata></domain>",
        ] {
            let checked = check_domain(xml, NS, OWNER).unwrap();
            assert!(checked.xml.contains(&format!("<metadata>{OWNER}</metadata>")), "{xml}");
            Document::parse(&checked.xml).unwrap();
        }
    }

    #[test]
    fn qemu_commandline_is_refused() {
        let xml = "<domain type='kvm' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>\
            <name>x</name><qemu:commandline><qemu:arg value='-device'/></qemu:commandline></domain>";
        assert!(refusal(xml).contains("/domain/commandline"), "{}", refusal(xml));
    }

    #[test]
    fn host_devices_files_and_binaries_are_refused() {
        for (devices, at) in [
            ("<hostdev mode='subsystem' type='pci'/>", "hostdev"),
            ("<filesystem type='mount'><source dir='/'/></filesystem>", "filesystem"),
            ("<emulator>/bin/sh</emulator>", "emulator"),
            ("<disk type='block'><source dev='/dev/sda'/></disk>", "disk"),
            ("<disk type='network'><source protocol='nbd'/></disk>", "disk"),
            ("<disk device='lun'><source file='/x'/></disk>", "disk"),
            ("<disk><source file='/x'><seclabel relabel='no'/></source></disk>", "seclabel"),
            ("<disk><source file='/x'/><backingStore type='file'/></disk>", "backingStore"),
            ("<interface type='ethernet'><script path='/x'/></interface>", "interface"),
            ("<interface type='direct'><source dev='eth0'/></interface>", "interface"),
            ("<interface type='network'><script path='/x'/></interface>", "script"),
            ("<interface type='bridge'><rom file='/x'/></interface>", "rom"),
            ("<serial type='file'><source path='/etc/x'/></serial>", "serial"),
            ("<serial type='pty'><log file='/etc/x'/></serial>", "log"),
            ("<channel type='unix'><source path='/run/x'/></channel>", "source"),
            ("<console type='pty'><source path='/dev/pts/1'/></console>", "source"),
            ("<graphics type='vnc' listen='0.0.0.0'/>", "graphics"),
            ("<rng model='virtio'><backend model='random'>/etc/shadow</backend></rng>", "backend"),
            ("<rng model='virtio'><backend model='egd' type='tcp'/></rng>", "backend"),
            ("<input type='passthrough'><source evdev='/dev/input/x'/></input>", "input"),
            ("<watchdog model='i6300esb' action='dump'/>", "watchdog"),
            ("<shmem name='x'/>", "shmem"),
        ] {
            let message = refusal(&proxy_vm(devices));
            assert!(message.contains(at), "{devices}: {message}");
        }
    }

    #[test]
    fn host_level_domain_elements_are_refused() {
        for (element, at) in [
            ("<sysinfo type='fwcfg'><entry name='opt/x' file='/etc/shadow'/></sysinfo>", "sysinfo"),
            ("<os><type>hvm</type><kernel>/boot/vmlinuz</kernel></os>", "kernel"),
            ("<os><type>hvm</type><loader>/etc/x</loader></os>", "loader"),
            ("<os><type>hvm</type><smbios mode='host'/></os>", "smbios"),
            ("<memoryBacking><hugepages/></memoryBacking>", "memoryBacking"),
            ("<seclabel type='none'/>", "seclabel"),
            ("<on_crash>coredump-destroy</on_crash>", "on_crash"),
            ("<blkiotune><device><path>/dev/sda</path></device></blkiotune>", "blkiotune"),
        ] {
            let xml = format!("<domain type='kvm'><name>x</name>{element}</domain>");
            let message = refusal(&xml);
            assert!(message.contains(at), "{element}: {message}");
        }
    }

    #[test]
    fn other_domain_types_are_refused() {
        for kind in ["lxc", "xen", "vbox"] {
            let xml = format!("<domain type='{kind}'><name>x</name></domain>");
            assert!(refusal(&xml).contains("type='"), "{kind}");
        }
    }

    #[test]
    fn namespaces_only_inside_metadata_and_never_the_hosts() {
        let attr = "<domain type='kvm' xmlns:x='urn:x'><name x:a='1'>x</name></domain>";
        assert!(refusal(attr).contains("namespaced attributes"), "{}", refusal(attr));
        let forged =
            format!("<domain type='kvm'><name>x</name><metadata>{OWNER}</metadata></domain>");
        assert!(refusal(&forged).contains("the host's own"), "{}", refusal(&forged));
        let bare = "<domain type='kvm'><name>x</name><metadata><mark/></metadata></domain>";
        assert!(refusal(bare).contains("namespace of their own"), "{}", refusal(bare));
    }

    #[test]
    fn doctypes_and_duplicates_are_refused() {
        let dtd = "<!DOCTYPE domain [<!ENTITY e SYSTEM 'file:///etc/shadow'>]>\
            <domain type='kvm'><name>&e;</name></domain>";
        assert!(matches!(check_domain(dtd, NS, OWNER), Err(LibvirtError::Invalid(_))));
        // libvirt reads the first <devices>; the walk must see every one.
        let twice = proxy_vm("</devices><devices><hostdev/>");
        assert!(refusal(&twice).contains("twice"), "{}", refusal(&twice));
    }

    #[test]
    fn volume_disks_are_reported_for_the_pool_check() {
        let xml = proxy_vm("<disk type='volume'><source pool='images' volume='vm.qcow2'/></disk>");
        let checked = check_domain(&xml, NS, OWNER).unwrap();
        assert_eq!(checked.volumes, [("images".to_owned(), "vm.qcow2".to_owned())]);
    }

    #[test]
    fn volumes_take_sizes_formats_and_a_backing_volume_only() {
        let overlay = "<volume type='file'><name>o.qcow2</name><capacity unit='bytes'>1</capacity>\
            <target><format type='qcow2'/></target><backingStore><path>/pool/base</path>\
            <format type='qcow2'/></backingStore></volume>";
        assert_eq!(check_volume(overlay).unwrap().backing.as_deref(), Some("/pool/base"));
        for (xml, at) in [
            (
                "<volume><name>v</name><target><permissions><owner>0</owner></permissions></target></volume>",
                "permissions",
            ),
            ("<volume><name>v</name><target><path>/etc/shadow</path></target></volume>", "path"),
            ("<volume type='block'><name>v</name></volume>", "type"),
            ("<volume><name>v</name><source><device path='/dev/sda'/></source></volume>", "source"),
        ] {
            match check_volume(xml) {
                Err(LibvirtError::Invalid(message)) => assert!(message.contains(at), "{message}"),
                other => panic!("{xml}: {other:?}"),
            }
        }
    }

    #[test]
    fn the_reported_backing_path_is_read_from_a_volume_description() {
        let description = "<volume type='file'><name>o</name><target><path>/pool/o</path>\
            </target><backingStore><path>/etc/shadow</path><format type='raw'/></backingStore>\
            </volume>";
        assert_eq!(reported_backing(description).unwrap().as_deref(), Some("/etc/shadow"));
        let plain = "<volume type='file'><name>b</name><backingStore/></volume>";
        assert_eq!(reported_backing(plain).unwrap(), None);
    }
}
