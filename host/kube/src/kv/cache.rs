//! What the store knows of its ConfigMaps between requests, so that a
//! plugin's `get` and `list` need not each be a request to a busy API
//! server.
//!
//! Three sources feed it: a watch of every store ConfigMap in the
//! namespace (other replicas' writes, deletions), this process's own writes
//! (the API server's answer to them, at once), and the fresh reads every
//! compare-and-swap makes. The watch can still be delivering an older state
//! of a ConfigMap this process has just written, so each source replaces
//! what the cache holds only with a later state
//! ([`crate::resource_version`]). Where a version is not an integer, the
//! state that arrived last is taken.
//!
//! Until the watch has listed the namespace once, and while it lists again,
//! the cache answers nothing and reads go to the API server.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::runtime::watcher::Event;

/// The cache of one namespace's store ConfigMaps, by name.
#[derive(Debug, Default)]
pub(super) struct Cache {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Whether `maps` follows the server: listed, and not listing again.
    synced: bool,
    maps: HashMap<String, Arc<ConfigMap>>,
    /// A list in progress (the watch started or restarted).
    relist: Option<Relist>,
}

#[derive(Debug, Default)]
struct Relist {
    listed: HashMap<String, Arc<ConfigMap>>,
    /// Written by this process since the list began: a ConfigMap created
    /// meanwhile may be missing from the list and still exist.
    written: HashSet<String>,
}

/// What the cache says of one ConfigMap.
#[derive(Debug, PartialEq)]
pub(super) enum Lookup {
    /// The cache follows the server: the ConfigMap, or `None` when there
    /// is none.
    Known(Option<Arc<ConfigMap>>),
    /// The cache cannot tell; ask the server.
    Unknown,
}

/// Whether `candidate` is a later state than `held`; not when either
/// version is not a number.
fn later(candidate: &ConfigMap, held: &ConfigMap) -> bool {
    crate::resource_version::later(
        candidate.metadata.resource_version.as_deref(),
        held.metadata.resource_version.as_deref(),
    )
    .unwrap_or(false)
}

/// What a cached ConfigMap keeps: field-manager records are never read.
fn trimmed(mut map: ConfigMap) -> Arc<ConfigMap> {
    map.metadata.managed_fields = None;
    Arc::new(map)
}

impl Inner {
    /// Whether `map` replaces what is held under `name`: nothing is held,
    /// `map` is the later state, or the versions cannot be compared (the
    /// state that arrived last is taken). The same version is the same
    /// state, and is not copied again.
    fn takes(&self, name: &str, map: &ConfigMap) -> bool {
        self.maps.get(name).is_none_or(|held| {
            crate::resource_version::later(
                map.metadata.resource_version.as_deref(),
                held.metadata.resource_version.as_deref(),
            ) != Some(false)
        })
    }
}

impl Cache {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every update leaves `Inner` whole; a panic elsewhere cannot
        // leave it half-written.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The ConfigMap named `name`, as far as the cache knows.
    pub(super) fn lookup(&self, name: &str) -> Lookup {
        let inner = self.lock();
        if inner.synced { Lookup::Known(inner.maps.get(name).cloned()) } else { Lookup::Unknown }
    }

    /// Whether lookups are answered.
    pub(super) fn synced(&self) -> bool {
        self.lock().synced
    }

    /// A state this process read or wrote with a request of its own: kept
    /// when later than the held one. A read's answer is borrowed, and
    /// copied only when kept: a compare-and-swap mostly reads the state the
    /// cache holds already.
    pub(super) fn observe(&self, map: Cow<'_, ConfigMap>) {
        let name = map.name_any();
        let mut inner = self.lock();
        if inner.takes(&name, &map) {
            inner.maps.insert(name.clone(), trimmed(map.into_owned()));
        }
        if let Some(relist) = inner.relist.as_mut() {
            relist.written.insert(name);
        }
    }

    /// One event of the watch.
    pub(super) fn apply(&self, event: Event<ConfigMap>) {
        let mut inner = self.lock();
        match event {
            Event::Init => {
                inner.synced = false;
                inner.relist = Some(Relist::default());
            }
            Event::InitApply(map) => {
                if let Some(relist) = inner.relist.as_mut() {
                    relist.listed.insert(map.name_any(), trimmed(map));
                }
            }
            Event::InitDone => {
                let Relist { mut listed, written } = inner.relist.take().unwrap_or_default();
                for (name, held) in inner.maps.drain() {
                    match listed.get(&name) {
                        Some(seen) if !later(&held, seen) => {}
                        // Written here after the list's state: keep ours.
                        Some(_) => {
                            listed.insert(name, held);
                        }
                        None if written.contains(&name) => {
                            listed.insert(name, held);
                        }
                        // Gone while the watch was away.
                        None => {}
                    }
                }
                inner.maps = listed;
                inner.synced = true;
            }
            Event::Apply(map) => {
                let name = map.name_any();
                if inner.takes(&name, &map) {
                    inner.maps.insert(name, trimmed(map));
                }
            }
            Event::Delete(map) => {
                let name = map.name_any();
                if inner.takes(&name, &map) {
                    inner.maps.remove(&name);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use kube::api::ObjectMeta;

    use super::*;

    fn map(name: &str, version: &str, value: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                resource_version: Some(version.into()),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([("k".to_owned(), value.to_owned())])),
            ..ConfigMap::default()
        }
    }

    fn value(cache: &Cache, name: &str) -> Option<String> {
        match cache.lookup(name) {
            Lookup::Known(map) => map.and_then(|m| m.data.as_ref()?.get("k").cloned()),
            Lookup::Unknown => panic!("the cache should know {name}"),
        }
    }

    fn listed(cache: &Cache, maps: Vec<ConfigMap>) {
        cache.apply(Event::Init);
        for m in maps {
            cache.apply(Event::InitApply(m));
        }
        cache.apply(Event::InitDone);
    }

    #[test]
    fn answers_nothing_until_listed() {
        let cache = Cache::default();
        cache.observe(Cow::Owned(map("a", "5", "mine")));
        assert_eq!(cache.lookup("a"), Lookup::Unknown);
        listed(&cache, vec![map("a", "5", "mine")]);
        assert_eq!(value(&cache, "a").as_deref(), Some("mine"));
        assert_eq!(cache.lookup("b"), Lookup::Known(None), "listed, so known absent");
    }

    /// The watch delivers this process's own write after the request's
    /// answer: an older state arriving later must not undo it.
    #[test]
    fn an_own_write_is_not_undone_by_the_watch_catching_up() {
        let cache = Cache::default();
        listed(&cache, vec![map("a", "5", "old")]);
        cache.observe(Cow::Owned(map("a", "9", "mine")));
        assert_eq!(value(&cache, "a").as_deref(), Some("mine"));
        cache.apply(Event::Apply(map("a", "7", "between")));
        assert_eq!(value(&cache, "a").as_deref(), Some("mine"));
        cache.apply(Event::Apply(map("a", "9", "mine")));
        cache.apply(Event::Apply(map("a", "12", "another replica's")));
        assert_eq!(value(&cache, "a").as_deref(), Some("another replica's"));
    }

    #[test]
    fn a_fresh_read_older_than_the_watch_is_ignored() {
        let cache = Cache::default();
        listed(&cache, vec![map("a", "12", "new")]);
        cache.observe(Cow::Owned(map("a", "9", "answered late")));
        assert_eq!(value(&cache, "a").as_deref(), Some("new"));
    }

    #[test]
    fn deletion_is_followed_and_a_stale_one_ignored() {
        let cache = Cache::default();
        listed(&cache, vec![map("a", "5", "x"), map("b", "6", "y")]);
        cache.apply(Event::Delete(map("a", "8", "x")));
        assert_eq!(cache.lookup("a"), Lookup::Known(None));
        cache.observe(Cow::Owned(map("b", "10", "rewritten")));
        cache.apply(Event::Delete(map("b", "7", "y")));
        assert_eq!(value(&cache, "b").as_deref(), Some("rewritten"));
    }

    #[test]
    fn a_relist_drops_what_went_and_keeps_what_was_written_meanwhile() {
        let cache = Cache::default();
        listed(&cache, vec![map("gone", "3", "x"), map("kept", "4", "x")]);
        cache.apply(Event::Init);
        assert_eq!(cache.lookup("kept"), Lookup::Unknown, "no answers while listing");
        cache.observe(Cow::Owned(map("new", "20", "created while listing")));
        cache.observe(Cow::Owned(map("kept", "21", "written while listing")));
        cache.apply(Event::InitApply(map("kept", "15", "listed")));
        cache.apply(Event::InitDone);
        assert_eq!(cache.lookup("gone"), Lookup::Known(None));
        assert_eq!(value(&cache, "new").as_deref(), Some("created while listing"));
        assert_eq!(value(&cache, "kept").as_deref(), Some("written while listing"));
    }

    #[test]
    fn versions_that_are_not_numbers_defer_to_the_watch() {
        let cache = Cache::default();
        listed(&cache, vec![map("a", "opaque-1", "listed")]);
        cache.apply(Event::Apply(map("a", "opaque-0", "watched")));
        assert_eq!(value(&cache, "a").as_deref(), Some("watched"));
    }

    #[test]
    fn the_same_version_read_again_is_not_copied() {
        let cache = Cache::default();
        listed(&cache, vec![map("a", "5", "x")]);
        let Lookup::Known(Some(held)) = cache.lookup("a") else { panic!("listed") };
        let read = map("a", "5", "x");
        cache.observe(Cow::Borrowed(&read));
        let Lookup::Known(Some(after)) = cache.lookup("a") else { panic!("still held") };
        assert!(Arc::ptr_eq(&held, &after), "the held state stays");
        cache.observe(Cow::Borrowed(&map("a", "6", "y")));
        assert_eq!(value(&cache, "a").as_deref(), Some("y"), "a later read is kept");
    }
}
