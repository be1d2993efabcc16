//! Proxies' credentials as the controller last read them from their
//! Secrets, for the fleet publisher: the Proxy resource holds only the
//! reference, and the publisher builds catalog members from the cache of
//! Proxies, not from Secrets.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use proxyfleet_core::credential::ProxyCredential;

/// Proxy UID → the credential its Secret held at its last reconcile.
#[derive(Debug, Default)]
pub struct Credentials(Mutex<HashMap<String, ProxyCredential>>);

impl Credentials {
    /// Records what the Proxy `uid` names now (`None`: nothing).
    pub fn set(&self, uid: &str, credential: Option<ProxyCredential>) {
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match credential {
            Some(credential) => {
                map.insert(uid.to_owned(), credential);
            }
            None => {
                map.remove(uid);
            }
        }
    }

    /// The credential of Proxy `uid`, if it names one.
    pub fn get(&self, uid: &str) -> Option<ProxyCredential> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).get(uid).cloned()
    }

    /// Forgets Proxies `keep` says are gone.
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).retain(|uid, _| keep(uid));
    }
}
