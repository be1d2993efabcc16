//! What a disk or volume may refer to on a host: volumes of the grant's
//! storage pools, and nothing else, down the whole backing chain.
//!
//! A path is resolved by the host's storage driver to a volume, and that
//! volume's pool must be granted. The chain is then followed through the
//! backing file each volume's own header names, as libvirt reads it: an
//! image uploaded with a qcow2 header that backs onto `/etc/shadow` is as
//! much a host file as a disk naming it directly.

use virt::connect::Connect;
use virt::error::ErrorNumber;
use virt::storage_pool::StoragePool;
use virt::storage_vol::StorageVol;

use super::LibvirtError;
use super::allow_list::reported_backing;
use super::pool::CallError;

/// Links a backing chain may have; deeper chains are refused.
const MAX_CHAIN: usize = 16;

/// The refusal of a storage pool outside the grant.
pub(crate) fn pool_not_granted(host: &str, pool: &str) -> LibvirtError {
    LibvirtError::NotGranted(format!(
        "storage pool {pool:?} on {host} is not granted to this entry; add it to the grant's \
         `pools` under grants.libvirt"
    ))
}

/// Checks that `path`, and every image it is backed by, is a volume of
/// one of `pools`. `what` says where the path came from, for messages.
pub(crate) fn check_path(
    storage: &Connect,
    host: &str,
    pools: &[String],
    what: &str,
    path: &str,
) -> Result<(), CallError> {
    let mut current = path.to_owned();
    for _ in 0..MAX_CHAIN {
        let vol = match StorageVol::lookup_by_path(storage, &current) {
            Ok(vol) => vol,
            Err(err) if err.code() == ErrorNumber::NoStorageVolume => {
                return Err(CallError::Refused(LibvirtError::Invalid(format!(
                    "{what}: {current} is not a volume of a storage pool on {host}; disks and \
                     backing images must be volumes of the grant's pools"
                ))));
            }
            Err(err) => return Err(err.into()),
        };
        check_volume(&vol, host, pools)?;
        match reported_backing(&vol.get_xml_desc(0)?).map_err(CallError::Refused)? {
            Some(next) => current = next,
            None => return Ok(()),
        }
    }
    Err(CallError::Refused(LibvirtError::Invalid(format!(
        "{what}: the backing chain of {path} is longer than {MAX_CHAIN} images"
    ))))
}

/// Checks that volume `name` of pool `pool` is granted, and its chain.
pub(crate) fn check_volume_ref(
    storage: &Connect,
    host: &str,
    pools: &[String],
    what: &str,
    pool: &str,
    name: &str,
) -> Result<(), CallError> {
    if !pools.iter().any(|p| p == pool) {
        return Err(CallError::Refused(pool_not_granted(host, pool)));
    }
    let vol = StorageVol::lookup_by_name(&StoragePool::lookup_by_name(storage, pool)?, name)?;
    check_path(storage, host, pools, what, &vol.get_path()?)
}

fn check_volume(vol: &StorageVol, host: &str, pools: &[String]) -> Result<(), CallError> {
    let pool = StoragePool::lookup_by_volume(vol)?.get_name()?;
    if pools.contains(&pool) {
        Ok(())
    } else {
        Err(CallError::Refused(pool_not_granted(host, &pool)))
    }
}
