//! Claims on VMIDs in the entry's key-value store (`vmid/<VMID>`).
//!
//! A create claims a VMID before it clones into it, so concurrent creates
//! never pick the same one, and a clone in progress (no name, no mark yet)
//! can be told to be ours. The claim holds the ownership mark the clone
//! will carry, and stays until the VM is deleted: it also tells whose a VM
//! is while its node is unreachable and its config cannot be read.

use proxyfleet_sdk::kv::{self, CasOutcome, KvEntry};
use proxyfleet_sdk::{OwnershipMark, Result};

fn key(vmid: u32) -> String {
    format!("vmid/{vmid}")
}

/// Who holds a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The UID of the Proxy it is for.
    pub uid: String,
    /// The mark its VM carries; `None` for a claim that holds only the UID
    /// (written by versions that kept no mark).
    pub mark: Option<OwnershipMark>,
}

impl Claim {
    fn of(entry: &KvEntry) -> Self {
        let text = String::from_utf8_lossy(&entry.value);
        match OwnershipMark::from_text(&text) {
            Some(mark) => Self { uid: mark.uid.clone(), mark: Some(mark) },
            None => Self { uid: text.into_owned(), mark: None },
        }
    }
}

/// The claim on `vmid`, if any.
pub fn get(vmid: u32) -> Result<Option<Claim>> {
    Ok(kv::get(&key(vmid))?.as_ref().map(Claim::of))
}

/// Claims `vmid` for the UID of `mark`. Returns the mark the clone must
/// carry (the one claimed earlier, when the UID already holds the claim:
/// its creation time stays that of the first attempt), or `None` when
/// another UID holds it. A claim of ours that holds only the UID gets the
/// mark.
pub fn take(vmid: u32, mark: &OwnershipMark) -> Result<Option<OwnershipMark>> {
    match kv::compare_and_swap(&key(vmid), None, Some(mark.to_text().as_bytes()))? {
        CasOutcome::Applied(_) => Ok(Some(mark.clone())),
        CasOutcome::Conflict(Some(entry)) => {
            let claim = Claim::of(&entry);
            if claim.uid != mark.uid {
                return Ok(None);
            }
            if let Some(claimed) = claim.mark {
                return Ok(Some(claimed));
            }
            // A lost race here leaves the UID-only claim: still ours.
            let _ = kv::compare_and_swap(
                &entry.key,
                Some(entry.version),
                Some(mark.to_text().as_bytes()),
            )?;
            Ok(Some(mark.clone()))
        }
        // Deleted between the two looks: nobody holds it, but let the next
        // round decide rather than loop here.
        CasOutcome::Conflict(None) => Ok(None),
    }
}

/// Gives up the claim on `vmid`.
pub fn release(vmid: u32) -> Result<()> {
    if let Some(entry) = kv::get(&key(vmid))? {
        let _ = kv::compare_and_swap(&entry.key, Some(entry.version), None)?;
    }
    Ok(())
}
