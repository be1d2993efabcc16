//! The Proxies as this process's last status writes left them, until the
//! controller's cache holds those writes.
//!
//! A create is the one step a pass cannot take back, and the cache may not
//! yet hold the status the previous pass wrote: a pass that polls a new
//! instance runs half a second after the create, and on a busy API server
//! the watch often has not brought that write back by then. On the cached
//! object, which records no instance, the pass would make the instance
//! again (438 of 1,000 Proxies in the scale bench). So every pass works on
//! the later ([`crate::resource_version`]) of the cached object and the API
//! server's answer to this process's last write of it. A write is
//! remembered only until a pass finds the cache as late; one that records a
//! new instance (a first create or a replacement) is the only kind
//! remembered at all.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use kube::ResourceExt as _;

use crate::crd::Proxy;
use crate::resource_version::later;

/// Answers to status writes, by the Proxy's UID.
#[derive(Debug, Default)]
pub(crate) struct OwnWrites {
    written: Mutex<HashMap<String, Arc<Proxy>>>,
}

impl OwnWrites {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<Proxy>>> {
        // Every update is a single insert or remove.
        self.written.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Remembers `written`, the API server's answer to a status write.
    pub(crate) fn record(&self, mut written: Proxy) {
        let Some(uid) = written.uid() else { return };
        written.metadata.managed_fields = None;
        self.lock().insert(uid, Arc::new(written));
    }

    /// The later of `cached` and the remembered write of the same Proxy.
    /// Forgets the write once the cache is as late.
    pub(crate) fn latest(&self, cached: Arc<Proxy>) -> Arc<Proxy> {
        let Some(uid) = cached.uid() else { return cached };
        let mut written = self.lock();
        let Some(held) = written.get(&uid) else { return cached };
        let held_version = held.metadata.resource_version.as_deref();
        match later(held_version, cached.metadata.resource_version.as_deref()) {
            Some(true) => Arc::clone(held),
            // The cache holds the write, or something later; or the
            // versions cannot be compared, and the watch's state stands.
            Some(false) | None => {
                written.remove(&uid);
                cached
            }
        }
    }

    /// Forgets the Proxy `uid`: its finalizer is off.
    pub(crate) fn forget(&self, uid: &str) {
        self.lock().remove(uid);
    }

    /// How many writes are remembered.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proxy(version: &str, provider_id: Option<&str>) -> Proxy {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "proxyfleet.io/v1alpha1", "kind": "Proxy",
            "metadata": { "name": "a", "namespace": "ns", "uid": "uid-a", "resourceVersion": version },
            "spec": { "provider": "lab" },
            "status": { "providerID": provider_id },
        }))
        .unwrap()
    }

    fn provider_id(proxy: &Proxy) -> Option<&str> {
        proxy.status.as_ref()?.provider_id.as_deref()
    }

    #[test]
    fn a_cache_behind_the_last_write_is_overridden_until_it_catches_up() {
        let own = OwnWrites::default();
        own.record(proxy("8", Some("lab-1")));
        let seen = own.latest(Arc::new(proxy("7", None)));
        assert_eq!(provider_id(&seen), Some("lab-1"), "the write, not the stale cache");
        assert_eq!(own.len(), 1);
        let seen = own.latest(Arc::new(proxy("8", Some("lab-1"))));
        assert_eq!(provider_id(&seen), Some("lab-1"));
        assert_eq!(own.len(), 0, "forgotten once the cache holds it");
    }

    #[test]
    fn a_later_cached_state_wins_and_versions_compare_as_integers() {
        let own = OwnWrites::default();
        own.record(proxy("9", Some("lab-1")));
        let seen = own.latest(Arc::new(proxy("10", None)));
        assert_eq!(provider_id(&seen), None, "10 is later than 9");
        assert_eq!(own.len(), 0);
    }

    #[test]
    fn forgotten_when_the_finalizer_goes() {
        let own = OwnWrites::default();
        own.record(proxy("8", Some("lab-1")));
        own.forget("uid-a");
        assert_eq!(provider_id(&own.latest(Arc::new(proxy("7", None)))), None);
    }
}
