//! Proxies' credentials as the controller last read them from their
//! Secrets, for the fleet publisher: the Proxy resource holds only the
//! reference, and the publisher builds catalog members from the cache of
//! Proxies, not from Secrets.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use proxyfleet_core::credential::ProxyCredential;

/// Proxy UID → the credential its Secret held at its last reconcile.
#[derive(Debug, Default)]
pub struct Credentials {
    by_uid: Mutex<HashMap<String, ProxyCredential>>,
    /// Bumped by every [`Credentials::set`] that changed what a Proxy has,
    /// so the publisher rebuilds the catalog only then.
    changes: AtomicU64,
}

impl Credentials {
    /// Records what the Proxy `uid` names now (`None`: nothing).
    pub fn set(&self, uid: &str, credential: Option<ProxyCredential>) {
        let mut map = self.lock();
        let changed = match credential {
            Some(credential) if map.get(uid) == Some(&credential) => false,
            Some(credential) => {
                map.insert(uid.to_owned(), credential);
                true
            }
            None => map.remove(uid).is_some(),
        };
        if changed {
            self.changes.fetch_add(1, Ordering::Release);
        }
    }

    /// The credential of Proxy `uid`, if it names one.
    pub fn get(&self, uid: &str) -> Option<ProxyCredential> {
        self.lock().get(uid).cloned()
    }

    /// Forgets Proxies `keep` says are gone. Not a change: nothing
    /// publishes a Proxy that is gone.
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.lock().retain(|uid, _| keep(uid));
    }

    /// How many times [`Credentials::set`] changed something.
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, ProxyCredential>> {
        self.by_uid.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
