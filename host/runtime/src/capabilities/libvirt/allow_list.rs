//! The domain and volume XML a plugin may hand libvirt: an allow-list,
//! checked before anything reaches the host.
//!
//! libvirt's XML is hypervisor-level power: `qemu:commandline` runs any
//! QEMU argument, `hostdev` passes host hardware through, a disk may be
//! any host file, `<log file>` and dump actions write host files, an
//! `lxc` domain shares the host's root. A plugin gets what a proxy VM
//! needs and nothing else:
//!
//! - the root is a `kvm`, `qemu` or `test` domain; each element appears
//!   once where libvirt reads one (libvirt takes the first, a second could
//!   hide from a check), and only those listed here;
//! - namespaced elements and attributes only as `<metadata>` children,
//!   which libvirt stores without reading, and never the host's own
//!   namespace ([`super::owner::NAMESPACE`]);
//! - disks are `raw` or `qcow2` `file` or `volume` disks; their sources
//!   are checked on the host against the grant's pools (see `scope`), and
//!   the host writes each disk's checked backing chain into the definition,
//!   so QEMU never follows a chain an image's header names;
//! - NICs attach to a network or bridge the grant names, consoles and
//!   channels are ptys or libvirt-made sockets, and the random source is
//!   the host's `/dev/urandom` or `/dev/random`.
//!
//! Text is read the way libvirt reads it only when there is one piece of
//! it, so comments, processing instructions, DTDs and encodings other
//! than UTF-8 are refused outright.

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

/// Disk formats a plugin may declare: formats that name other host files
/// (vmdk extents, for one) are out.
const DISK_FORMATS: &[&str] = &["raw", "qcow2"];

/// Nodes no XML handed to libvirt has more of; a proxy VM's domain has
/// about a hundred.
const NODES_LIMIT: u32 = 10_000;

/// Where a plugin's NICs may attach: the grant's networks and bridges.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Attachments<'a> {
    /// libvirt networks.
    pub networks: &'a [String],
    /// Host bridges.
    pub bridges: &'a [String],
}

/// A disk's source, as the definition names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DiskSource {
    /// A host path.
    File(String),
    /// A volume of a pool.
    Volume { pool: String, volume: String },
}

/// One disk with a source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Disk {
    /// Where its image is.
    pub source: DiskSource,
    /// Where in the definition the host's `<backingStore>` goes (just
    /// before `</disk>`).
    end: usize,
}

/// What a checked domain definition refers to on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CheckedDomain {
    /// The domain's name.
    pub name: String,
    /// The UUID it asks for, if any.
    pub uuid: Option<String>,
    /// Its disks with a source, in order.
    pub disks: Vec<Disk>,
    xml: String,
    /// Where the owner element goes, how much it replaces, and the text.
    owner: (usize, usize, String),
}

impl CheckedDomain {
    /// The definition as libvirt gets it: the plugin's XML with the
    /// host's owner element in its metadata and, in each disk, the
    /// backing chain in `chains` (one per disk, in order).
    pub(crate) fn assemble(&self, chains: &[String]) -> String {
        let mut inserts: Vec<(usize, usize, &str)> = self
            .disks
            .iter()
            .zip(chains)
            .map(|(disk, chain)| (disk.end, 0, chain.as_str()))
            .collect();
        inserts.push((self.owner.0, self.owner.1, &self.owner.2));
        inserts.sort_by_key(|insert| insert.0);
        let mut out = String::with_capacity(self.xml.len() + 256);
        let mut at = 0;
        for (position, replace, text) in inserts {
            out.push_str(&self.xml[at..position]);
            out.push_str(text);
            at = position + replace;
        }
        out.push_str(&self.xml[at..]);
        out
    }
}

/// What a checked volume definition refers to on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CheckedVolume {
    /// The path of the volume it is an overlay on, if any.
    pub backing: Option<String>,
}

fn parse<'input>(what: &str, xml: &'input str) -> Result<Document<'input>, LibvirtError> {
    declared_utf8(what, xml)?;
    let options = ParsingOptions { allow_dtd: false, nodes_limit: NODES_LIMIT };
    let doc = Document::parse_with_options(xml, options)
        .map_err(|err| LibvirtError::Invalid(format!("{what} XML does not parse: {err}")))?;
    // libvirt reads text with XPath's string(), which joins the pieces
    // around a comment; the walk would see only the first.
    if let Some(node) = doc.descendants().find(|n| n.is_comment() || n.is_pi()) {
        return Err(refused(
            node.parent().unwrap_or(node),
            "comments and processing instructions are not allowed",
        ));
    }
    Ok(doc)
}

/// An XML declaration may name UTF-8 only: libxml2 would decode another
/// encoding, and read elements the walk sees as text.
fn declared_utf8(what: &str, xml: &str) -> Result<(), LibvirtError> {
    let Some(declaration) = xml.trim_start().strip_prefix("<?xml") else { return Ok(()) };
    let declaration = declaration.split("?>").next().unwrap_or_default().to_ascii_lowercase();
    let Some(at) = declaration.find("encoding") else { return Ok(()) };
    let value = declaration[at + "encoding".len()..]
        .trim_start()
        .trim_start_matches('=')
        .trim_start()
        .trim_start_matches(['"', '\''])
        .split(['"', '\''])
        .next()
        .unwrap_or_default();
    if matches!(value, "utf-8" | "utf8") {
        Ok(())
    } else {
        Err(LibvirtError::Invalid(format!(
            "{what} XML declares encoding {value:?}; only UTF-8 is allowed"
        )))
    }
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

/// All of an element's text, as libvirt reads it.
fn text_of(node: Node<'_, '_>) -> String {
    node.children().filter(Node::is_text).filter_map(|n| n.text()).collect()
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
        "backingStore" => "the host writes each disk's checked backing chain itself",
        "sysinfo" | "memoryBacking" | "resource" | "blkiotune" | "numatune" | "cputune"
        | "iothreads" | "iothreadids" | "launchSecurity" | "keywrap" | "idmap" => {
            "it tunes or exposes the host rather than the guest"
        }
        "graphics" => "it opens a console on the host's network",
        "script" | "downscript" | "backend" | "rom" => "it names a host script, device or file",
        _ => "it is not on the allow-list",
    }
}

/// Refuses namespaced attributes and, when `allowed` is given, any
/// attribute it does not name.
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

/// An element without namespaced parts anywhere below it, for subtrees
/// that describe only the guest (features, clock, controllers, ...).
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

/// Each child element of `node` is plain, named in `allowed`, and appears
/// once unless named in `repeats`; answers them with their names.
fn children<'a, 'input>(
    node: Node<'a, 'input>,
    allowed: &[&str],
    repeats: &[&str],
) -> Result<Vec<(&'a str, Node<'a, 'input>)>, LibvirtError> {
    let mut seen = BTreeSet::new();
    elements(node)
        .map(|child| {
            let name = child.tag_name().name();
            if child.tag_name().namespace().is_some() {
                Err(refused(
                    child,
                    "namespaced elements (such as qemu:commandline) are only allowed in <metadata>",
                ))
            } else if !allowed.contains(&name) {
                Err(refused(child, reason(name)))
            } else if !seen.insert(name) && !repeats.contains(&name) {
                Err(refused(child, "it appears twice"))
            } else {
                Ok((name, child))
            }
        })
        .collect()
}

/// Requires attribute `name` (or `absent` in its place) to be one of
/// `allowed`.
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

/// Checks a domain definition; `owner` is the host's owner element
/// (in namespace `owner_namespace`), which [`CheckedDomain::assemble`]
/// adds to its metadata.
pub(crate) fn check_domain(
    xml: &str,
    owner_namespace: &str,
    owner: &str,
    attachments: Attachments<'_>,
) -> Result<CheckedDomain, LibvirtError> {
    let doc = parse("domain", xml)?;
    let root = doc.root_element();
    if root.tag_name().name() != "domain" || root.tag_name().namespace().is_some() {
        return Err(LibvirtError::Invalid("domain XML must have <domain> as its root".into()));
    }
    attribute_in(root, "type", &["kvm", "qemu", "test"], None)?;
    attributes(root, Some(&["type", "id"]))?;
    let mut walk = DomainWalk { disks: Vec::new(), attachments };
    let (mut name, mut uuid, mut metadata) = (None, None, None);
    for (tag, child) in children(root, DOMAIN_CHILDREN, &[])? {
        match tag {
            "name" => {
                leaf(child)?;
                name = Some(child);
            }
            "uuid" => {
                leaf(child)?;
                uuid = Some(text_of(child).trim().to_ascii_lowercase());
            }
            "metadata" => {
                metadata_children(child, owner_namespace)?;
                metadata = Some(child);
            }
            "on_crash" => {
                leaf(child)?;
                if text_of(child).trim().starts_with("coredump") {
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
    let domain_name = text_of(name_node).trim().to_owned();
    if domain_name.is_empty() {
        return Err(refused(name_node, "the name is empty"));
    }
    // The owner goes in as the first metadata child; where there is no
    // metadata, a <metadata> right after the name.
    let owner = match metadata {
        Some(node) => match node.first_child() {
            Some(first) => (first.range().start, 0, owner.to_owned()),
            None => {
                (node.range().start, node.range().len(), format!("<metadata>{owner}</metadata>"))
            }
        },
        None => (name_node.range().end, 0, format!("<metadata>{owner}</metadata>")),
    };
    Ok(CheckedDomain {
        name: domain_name,
        uuid: uuid.filter(|u| !u.is_empty()),
        disks: walk.disks,
        xml: xml.to_owned(),
        owner,
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
    for (_, child) in children(node, &["type", "boot", "bootmenu", "bios"], &["boot"])? {
        leaf(child)?;
    }
    Ok(())
}

struct DomainWalk<'a> {
    disks: Vec<Disk>,
    attachments: Attachments<'a>,
}

impl DomainWalk<'_> {
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
        for (tag, child) in children(node, &allowed, &allowed)? {
            match tag {
                "disk" => self.disk(child)?,
                "interface" => self.interface(child)?,
                "channel" => character_device(child, &["unix", "pty", "spicevmc"])?,
                "serial" | "console" => character_device(child, &["pty"])?,
                "input" => {
                    attribute_in(child, "type", &["mouse", "tablet", "keyboard"], None)?;
                    attributes(child, Some(&["type", "bus"]))?;
                    for (_, below) in children(child, &["address", "alias"], &[])? {
                        leaf(below)?;
                    }
                }
                "video" => {
                    attributes(child, Some(&[]))?;
                    for (part, below) in children(child, &["model", "address", "alias"], &[])? {
                        leaf(below)?;
                        if part == "model" {
                            attributes(
                                below,
                                Some(&["type", "vram", "heads", "primary", "vgamem", "ram"]),
                            )?;
                        }
                    }
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
        let (mut source, mut format) = (None, None);
        for (tag, child) in children(node, &allowed, &[])? {
            match tag {
                "driver" => {
                    leaf(child)?;
                    attribute_in(child, "name", &["qemu"], Some("qemu"))?;
                    attributes(
                        child,
                        Some(&[
                            "name",
                            "type",
                            "cache",
                            "io",
                            "discard",
                            "detect_zeroes",
                            "queues",
                        ]),
                    )?;
                    attribute_in(child, "type", DISK_FORMATS, None)?;
                    format = child.attribute("type");
                }
                "source" => {
                    leaf(child)?;
                    source = Some(child);
                    if kind == "file" {
                        attributes(child, Some(&["file", "startupPolicy", "index"]))?;
                    } else {
                        attributes(child, Some(&["pool", "volume", "mode", "startupPolicy"]))?;
                        if child.attribute("mode") == Some("direct") {
                            return Err(refused(child, "mode='direct' reads the host's devices"));
                        }
                    }
                }
                "iotune" | "geometry" | "address" => plain_subtree(child)?,
                _ => leaf(child)?,
            }
        }
        let source = match (kind, source) {
            (_, None) => return Ok(()),
            ("file", Some(node)) => match node.attribute("file") {
                Some(file) => (node, DiskSource::File(file.to_owned())),
                None => return Ok(()),
            },
            (_, Some(node)) => match (node.attribute("pool"), node.attribute("volume")) {
                (Some(pool), Some(volume)) => {
                    (node, DiskSource::Volume { pool: pool.to_owned(), volume: volume.to_owned() })
                }
                _ => return Err(refused(node, "it needs `pool` and `volume`")),
            },
        };
        if format.is_none() {
            return Err(refused(
                source.0,
                "a disk with a source needs <driver type='raw'/> or <driver type='qcow2'/>",
            ));
        }
        // The disk has a child, so an end tag: the chain goes before it.
        let range = node.range();
        let text = &node.document().input_text()[range.clone()];
        let end = range.start + text.rfind("</").unwrap_or(text.len());
        self.disks.push(Disk { source: source.1, end });
        Ok(())
    }

    fn interface(&self, node: Node<'_, '_>) -> Result<(), LibvirtError> {
        attribute_in(node, "type", &["network", "bridge"], None)?;
        attributes(node, Some(&["type", "trustGuestRxFilters"]))?;
        let allowed = [
            "source",
            "mac",
            "model",
            "virtualport",
            "link",
            "mtu",
            "address",
            "alias",
            "boot",
            "driver",
            "bandwidth",
            "filterref",
            "coalesce",
            "vlan",
        ];
        let mut attached = false;
        for (tag, child) in children(node, &allowed, &[])? {
            match tag {
                "source" => {
                    leaf(child)?;
                    attributes(child, Some(&["network", "bridge"]))?;
                    let (granted, name, what) = match node.attribute("type") {
                        Some("network") => {
                            (self.attachments.networks, child.attribute("network"), "networks")
                        }
                        _ => (self.attachments.bridges, child.attribute("bridge"), "bridges"),
                    };
                    match name {
                        Some(name) if granted.iter().any(|g| g == name) => attached = true,
                        Some(name) => {
                            return Err(refused(
                                child,
                                &format!(
                                    "{name:?} is not in the grant's `{what}`; add it under \
                                     grants.libvirt"
                                ),
                            ));
                        }
                        None => return Err(refused(child, "it needs the network or bridge")),
                    }
                }
                "virtualport" => {
                    attribute_in(child, "type", &["openvswitch"], None)?;
                    plain_subtree(child)?;
                }
                _ => plain_subtree(child)?,
            }
        }
        if attached { Ok(()) } else { Err(refused(node, "it needs a <source>")) }
    }
}

/// A serial port, console or channel: of a type in `types`, with no host
/// source (libvirt makes the pty or socket itself) and no log file.
fn character_device(node: Node<'_, '_>, types: &[&str]) -> Result<(), LibvirtError> {
    attribute_in(node, "type", types, None)?;
    attributes(node, Some(&["type"]))?;
    for (tag, child) in children(node, &["target", "address", "alias"], &[])? {
        plain_subtree(child)?;
        // libvirt joins a channel's name onto its socket directory.
        if tag == "target"
            && let Some(name) = child.attribute("name")
            && !name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        {
            return Err(refused(child, "a channel name is letters, digits, '.', '_' and '-'"));
        }
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
    for (tag, child) in children(node, &["backend", "rate", "address", "alias"], &[])? {
        if tag == "backend" {
            leaf(child)?;
            attribute_in(child, "model", &["random", "builtin"], None)?;
            attributes(child, Some(&["model"]))?;
            let source = text_of(child);
            if !matches!(source.trim(), "" | "/dev/urandom" | "/dev/random") {
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
    for (tag, child) in children(root, &allowed, &[])? {
        match tag {
            "target" | "backingStore" => {
                attributes(child, Some(&[]))?;
                for (part, below) in children(child, &["format", "path", "compat", "nocow"], &[])? {
                    leaf(below)?;
                    match (tag, part) {
                        ("backingStore", "path") => {
                            backing = Some(text_of(below).trim().to_owned())
                        }
                        ("target", "path") => {
                            return Err(refused(below, "the pool decides where its volumes live"));
                        }
                        (_, "format") => attribute_in(below, "type", DISK_FORMATS, None)?,
                        _ => {}
                    }
                }
            }
            _ => leaf(child)?,
        }
    }
    Ok(CheckedVolume { backing })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NS: &str = "https://proxyfleet.io/xmlns/host/1";
    const OWNER: &str = "<h:owner xmlns:h='https://proxyfleet.io/xmlns/host/1' entry='a'/>";

    fn check(xml: &str) -> Result<CheckedDomain, LibvirtError> {
        let networks = ["default".to_owned()];
        let bridges = ["br-proxies".to_owned()];
        check_domain(xml, NS, OWNER, Attachments { networks: &networks, bridges: &bridges })
    }

    /// The kvm plugin's shape of domain.
    fn proxy_vm(devices: &str) -> String {
        format!(
            "<domain type='kvm'><name>vm-1</name>\
             <metadata><pf:owner xmlns:pf='https://proxyfleet.io/xmlns/kvm/1' uid='u'/></metadata>\
             <memory unit='MiB'>512</memory><vcpu>1</vcpu>\
             <os><type arch='x86_64'>hvm</type><boot dev='hd'/><boot dev='cdrom'/></os>\
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
        match check(xml) {
            Err(LibvirtError::Invalid(message)) => message,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn a_proxy_vm_passes_with_its_disks_owner_and_chains_added() {
        let checked = check(&proxy_vm(PROXY_DEVICES)).unwrap();
        assert_eq!(checked.name, "vm-1");
        let sources: Vec<&DiskSource> = checked.disks.iter().map(|d| &d.source).collect();
        assert_eq!(
            sources,
            [
                &DiskSource::File("/pool/vm-1.qcow2".into()),
                &DiskSource::File("/pool/vm-1-seed.iso".into())
            ]
        );
        let xml = checked.assemble(&["<backingStore/>".into(), "<backingStore/>".into()]);
        assert!(xml.contains(&format!("<metadata>{OWNER}<pf:owner")), "{xml}");
        assert!(xml.contains("bus='virtio'/><backingStore/></disk>"), "{xml}");
        assert!(xml.contains("<readonly/><backingStore/></disk>"), "{xml}");
        // The result is still one well-formed domain.
        let again = Document::parse(&xml).unwrap();
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
            let assembled = check(xml).unwrap().assemble(&[]);
            assert!(assembled.contains(&format!("<metadata>{OWNER}</metadata>")), "{xml}");
            Document::parse(&assembled).unwrap();
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
            ("<disk><driver type='vmdk'/><source file='/x'/></disk>", "vmdk"),
            ("<disk><source file='/x'/></disk>", "driver type"),
            ("<disk><source file='/x'/><source file='/y'/></disk>", "twice"),
            ("<interface type='ethernet'><script path='/x'/></interface>", "interface"),
            ("<interface type='direct'><source dev='eth0'/></interface>", "interface"),
            ("<interface type='network'><script path='/x'/></interface>", "script"),
            ("<interface type='bridge'><rom file='/x'/></interface>", "rom"),
            ("<interface type='bridge'><source bridge='br-mgmt'/></interface>", "bridges"),
            ("<interface type='network'><source network='hostdev-vfs'/></interface>", "networks"),
            ("<interface type='network'><target dev='eth0'/></interface>", "target"),
            ("<serial type='file'><source path='/etc/x'/></serial>", "serial"),
            ("<serial type='pty'><log file='/etc/x'/></serial>", "log"),
            ("<channel type='unix'><source path='/run/x'/></channel>", "source"),
            (
                "<channel type='unix'><target type='virtio' name='../../x'/></channel>",
                "channel name",
            ),
            ("<console type='pty'><source path='/dev/pts/1'/></console>", "source"),
            ("<graphics type='vnc' listen='0.0.0.0'/>", "graphics"),
            ("<rng model='virtio'><backend model='random'>/etc/shadow</backend></rng>", "backend"),
            ("<rng model='virtio'><backend model='egd' type='tcp'/></rng>", "backend"),
            ("<input type='passthrough'><source evdev='/dev/input/x'/></input>", "input"),
            ("<video><driver name='vhostuser'/></video>", "driver"),
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
        assert!(matches!(check(dtd), Err(LibvirtError::Invalid(_))));
        // libvirt reads the first <devices>; the walk must see every one.
        let twice = proxy_vm("</devices><devices><hostdev/>");
        assert!(refusal(&twice).contains("twice"), "{}", refusal(&twice));
    }

    /// Review of issue 15, item 10: libvirt reads text with XPath's
    /// string(), joining the pieces around a comment, while the walk read
    /// only the first piece.
    #[test]
    fn comments_cannot_split_text_past_the_walk() {
        for xml in [
            proxy_vm("<rng model='virtio'><backend model='random'><!---->/etc/shadow</backend></rng>"),
            "<domain type='kvm'><name>x</name><uuid><!---->0b5bd7c4-0000-0000-0000-000000000000</uuid></domain>".into(),
            "<domain type='kvm'><name>x<?pi?>y</name></domain>".into(),
        ] {
            assert!(refusal(&xml).contains("comments and processing instructions"), "{xml}");
        }
    }

    #[test]
    fn only_utf8_may_be_declared() {
        let utf7 =
            "<?xml version='1.0' encoding='UTF-7'?><domain type='kvm'><name>x</name></domain>";
        assert!(refusal(utf7).contains("UTF-8"), "{}", refusal(utf7));
        let utf8 =
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?><domain type='kvm'><name>x</name></domain>";
        check(utf8).unwrap();
    }

    #[test]
    fn volume_disks_are_reported_for_the_pool_check() {
        let xml = proxy_vm(
            "<disk type='volume'><driver type='qcow2'/><source pool='images' volume='vm.qcow2'/></disk>",
        );
        let checked = check(&xml).unwrap();
        assert_eq!(
            checked.disks[0].source,
            DiskSource::Volume { pool: "images".into(), volume: "vm.qcow2".into() }
        );
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
            ("<volume><name>v</name><target><format type='vmdk'/></target></volume>", "vmdk"),
            (
                "<volume><name>v</name><backingStore><path>/p/a</path><path>/etc/x</path></backingStore></volume>",
                "twice",
            ),
            (
                "<volume><name>v</name><backingStore><path>/p/a</path></backingStore><backingStore/></volume>",
                "twice",
            ),
        ] {
            match check_volume(xml) {
                Err(LibvirtError::Invalid(message)) => assert!(message.contains(at), "{message}"),
                other => panic!("{xml}: {other:?}"),
            }
        }
    }
}
