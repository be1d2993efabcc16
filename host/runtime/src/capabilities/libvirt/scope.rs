//! What a disk or volume may refer to on a host: volumes of the grant's
//! storage pools, and nothing else, down the whole backing chain.
//!
//! A path is resolved by the host's storage driver to a volume, and that
//! volume's pool must be granted. The chain is then followed through the
//! backing file each volume's own header names, as libvirt reads it: an
//! image uploaded with a qcow2 header that backs onto `/etc/shadow` is as
//! much a host file as a disk naming it directly.
//!
//! libvirt reads headers when a pool is refreshed, so what it reports can
//! lag behind an upload. Where the host itself acts on an image's header
//! (cloning flattens the chain; an overlay's creation opens its backing)
//! the pool is refreshed first, and a pool that cannot be refreshed
//! refuses the call. A domain does not depend on it: the host writes each
//! disk's checked chain into the definition, ending in an empty
//! `<backingStore/>`, and QEMU opens that chain and no other.

use std::collections::BTreeSet;

use proxyfleet_libvirt_wire::ErrorCode;
use roxmltree::Document;

use super::LibvirtError;
use super::allow_list::DiskSource;
use super::client::{Connect, StoragePool, StorageVol};
use super::escape::escape;
use super::pool::CallError;

/// Links a backing chain may have; deeper chains are refused.
const MAX_CHAIN: usize = 16;

/// Whether reading a chain refreshes the pools it passes through first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refresh {
    /// Refresh, and refuse when a pool cannot be refreshed.
    Required,
    /// Refresh where the pool allows it.
    BestEffort,
}

/// The grant's pools on one host.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pools<'a> {
    /// The host, for messages.
    pub host: &'a str,
    /// The pools the grant names.
    pub granted: &'a [String],
}

/// One image below a disk's or volume's own: its path and format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Backing {
    path: String,
    format: String,
}

impl<'a> Pools<'a> {
    /// Refuses a pool outside the grant.
    pub(crate) fn check(&self, pool: &str) -> Result<(), LibvirtError> {
        if self.granted.iter().any(|p| p == pool) {
            Ok(())
        } else {
            Err(LibvirtError::NotGranted(format!(
                "storage pool {pool:?} on {} is not granted to this entry; add it to the \
                 grant's `pools` under grants.libvirt",
                self.host
            )))
        }
    }

    /// A reader of chains on `storage` for one call, refreshing as
    /// `refresh` says.
    pub(crate) fn reader<'c>(self, storage: &'c Connect, refresh: Refresh) -> ChainReader<'c>
    where
        'a: 'c,
    {
        ChainReader { pools: self, storage, refresh, refreshed: BTreeSet::new() }
    }
}

/// Reads backing chains for one call: each pool is refreshed at most once
/// however many disks or links pass through it.
pub(crate) struct ChainReader<'c> {
    pools: Pools<'c>,
    storage: &'c Connect,
    refresh: Refresh,
    refreshed: BTreeSet<String>,
}

impl ChainReader<'_> {
    /// Checks that `path` and every image below it are volumes of the
    /// granted pools, and answers the images below it, top down. `what`
    /// says where the path came from, for messages.
    pub(crate) fn chain(&mut self, what: &str, path: &str) -> Result<Vec<Backing>, CallError> {
        let host = self.pools.host;
        let mut below = Vec::new();
        let mut current = path.to_owned();
        for _ in 0..=MAX_CHAIN {
            let mut vol = match StorageVol::lookup_by_path(self.storage, &current) {
                Ok(vol) => vol,
                Err(err) if err.code == ErrorCode::NoStorageVolume => {
                    return Err(CallError::Refused(LibvirtError::Invalid(format!(
                        "{what}: {current} is not a volume of a storage pool on {host}; disks \
                         and backing images must be volumes of the grant's pools"
                    ))));
                }
                Err(err) => return Err(err.into()),
            };
            let pool = StoragePool::lookup_by_volume(&vol)?;
            let pool_name = pool.get_name()?;
            self.pools.check(&pool_name).map_err(CallError::Refused)?;
            if self.refreshed.insert(pool_name.clone()) {
                match (pool.refresh(), self.refresh) {
                    (Ok(_), _) => {
                        // A refresh replaces the pool's volumes.
                        vol = StorageVol::lookup_by_path(self.storage, &current)?;
                    }
                    (Err(_), Refresh::BestEffort) => {}
                    (Err(err), Refresh::Required) => {
                        return Err(CallError::Refused(LibvirtError::Transient(format!(
                            "{what}: cannot refresh pool {pool_name:?} on {host} to read \
                             {current}'s header: {}",
                            err.message
                        ))));
                    }
                }
            }
            let (format, next) = described(&vol.get_xml_desc()?).map_err(CallError::Refused)?;
            if current != path {
                if !matches!(format.as_str(), "raw" | "qcow2") {
                    return Err(CallError::Refused(LibvirtError::Invalid(format!(
                        "{what}: {current} is a {format} image; backing images are raw or qcow2"
                    ))));
                }
                below.push(Backing { path: current.clone(), format });
            }
            match next {
                Some(next) => current = next,
                None => return Ok(below),
            }
        }
        Err(CallError::Refused(LibvirtError::Invalid(format!(
            "{what}: the backing chain of {path} is longer than {MAX_CHAIN} images"
        ))))
    }

    /// The chain of a disk's source (see [`ChainReader::chain`]).
    pub(crate) fn disk_chain(&mut self, source: &DiskSource) -> Result<Vec<Backing>, CallError> {
        match source {
            DiskSource::File(path) => self.chain("disk source", path),
            DiskSource::Volume { pool, volume } => {
                self.pools.check(pool).map_err(CallError::Refused)?;
                let vol = StorageVol::lookup_by_name(
                    &StoragePool::lookup_by_name(self.storage, pool)?,
                    volume,
                )?;
                self.chain("disk source", &vol.get_path()?)
            }
        }
    }
}

/// A chain as a disk's `<backingStore>`: each image with its format, the
/// last one closed by an empty `<backingStore/>` ("nothing below").
pub(crate) fn backing_store(chain: &[Backing]) -> String {
    let mut xml = String::new();
    for link in chain {
        xml.push_str(&format!(
            "<backingStore type='file'><format type='{}'/><source file='{}'/>",
            escape(&link.format),
            escape(&link.path)
        ));
    }
    xml.push_str("<backingStore/>");
    for _ in chain {
        xml.push_str("</backingStore>");
    }
    xml
}

fn child<'a, 'input>(
    node: roxmltree::Node<'a, 'input>,
    name: &str,
) -> Option<roxmltree::Node<'a, 'input>> {
    node.children().find(|n| n.has_tag_name(name))
}

/// A volume's format and the backing path libvirt reports in its own
/// description (read from the image's header).
fn described(description: &str) -> Result<(String, Option<String>), LibvirtError> {
    let doc = Document::parse(description).map_err(|err| {
        LibvirtError::Failed(format!("the host's volume description does not parse: {err}"))
    })?;
    let root = doc.root_element();
    let format = child(root, "target")
        .and_then(|target| child(target, "format"))
        .and_then(|format| format.attribute("type"))
        .unwrap_or("raw")
        .to_owned();
    let backing = child(root, "backingStore")
        .and_then(|store| child(store, "path"))
        .and_then(|path| path.text())
        .map(|text| text.trim().to_owned())
        .filter(|text| !text.is_empty());
    Ok((format, backing))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_format_and_backing_path_are_read_from_a_volume_description() {
        let description = "<volume type='file'><name>o</name><target><path>/pool/o</path>\
            <format type='qcow2'/></target><backingStore><path>/etc/shadow</path>\
            <format type='raw'/></backingStore></volume>";
        assert_eq!(
            described(description).unwrap(),
            ("qcow2".to_owned(), Some("/etc/shadow".to_owned()))
        );
        let plain = "<volume type='file'><name>b</name><backingStore/></volume>";
        assert_eq!(described(plain).unwrap(), ("raw".to_owned(), None));
    }

    #[test]
    fn a_chain_is_written_out_to_its_end() {
        assert_eq!(backing_store(&[]), "<backingStore/>");
        let chain = [Backing { path: "/p/base'.qcow2".into(), format: "qcow2".into() }];
        assert_eq!(
            backing_store(&chain),
            "<backingStore type='file'><format type='qcow2'/><source file='/p/base&apos;.qcow2'/>\
             <backingStore/></backingStore>"
        );
    }
}
