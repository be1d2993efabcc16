//! Which entry a domain belongs to, as the host records it.
//!
//! Every domain a plugin defines carries an element in the host's own
//! metadata namespace naming the entry that defined it, put there by the
//! host (see `allow_list::check_domain`); plugins can neither write nor
//! forge it. A plugin sees, starts, stops, reads and removes only the
//! domains of its own entry: any other domain on a granted host, whoever
//! made it, is `not-found` to it, and defining a domain with the name or
//! UUID of one is `exists`.

use proxyfleet_libvirt_wire::ErrorCode;
use roxmltree::Document;

use super::client::{Domain, VirtError};
use super::escape::escape;

/// The host's metadata namespace.
pub(crate) const NAMESPACE: &str = "https://proxyfleet.io/xmlns/host/1";
/// The prefix the owner element is written with.
const PREFIX: &str = "proxyfleet-host";

/// The owner element for entry `entry`.
pub(crate) fn element(entry: &str) -> String {
    format!("<{PREFIX}:owner xmlns:{PREFIX}=\"{NAMESPACE}\" entry=\"{}\"/>", escape(entry))
}

/// The entry an owner element names. libvirt hands the element of the
/// namespace asked for back without its namespace (`<owner entry=".."/>`);
/// one that keeps it must keep the host's.
fn entry_of(element: &str) -> Option<String> {
    let doc = Document::parse(element).ok()?;
    let root = doc.root_element();
    let namespace = root.tag_name().namespace();
    (matches!(namespace, None | Some(NAMESPACE)) && root.tag_name().name() == "owner")
        .then(|| root.attribute("entry").map(str::to_owned))
        .flatten()
}

/// Whether `dom` belongs to entry `entry`.
pub(crate) fn owns(dom: &Domain, entry: &str) -> Result<bool, VirtError> {
    match dom.get_metadata(NAMESPACE) {
        Ok(element) => Ok(entry_of(&element).as_deref() == Some(entry)),
        Err(err) if err.code == ErrorCode::NoDomainMetadata => Ok(false),
        Err(err) => Err(err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_entry_reads_back_from_the_element_in_either_form() {
        let ours = element("a\"b&<c");
        assert_eq!(entry_of(&ours).as_deref(), Some("a\"b&<c"));
        // libvirt hands the element back without its namespace.
        assert_eq!(entry_of("<owner entry=\"kvm-a\"/>").as_deref(), Some("kvm-a"));
        let served = format!("<owner xmlns=\"{NAMESPACE}\" entry=\"kvm-a\"/>");
        assert_eq!(entry_of(&served).as_deref(), Some("kvm-a"));
        let other = "<owner xmlns=\"urn:other\" entry=\"kvm-a\"/>";
        assert_eq!(entry_of(other), None);
    }
}
