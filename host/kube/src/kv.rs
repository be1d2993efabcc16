//! The plugins' key-value store on ConfigMaps: one ConfigMap per provider
//! entry (`proxyfleet-kv-<entry>`) in the operator's namespace.
//!
//! Every compare-and-swap is a read, a check of the key's version, and an
//! update with the ConfigMap's `resourceVersion` as precondition. When the
//! update loses a race (409) the whole operation starts over from a fresh
//! read, so two operator replicas or a restart can never both win the same
//! key: the API server serialises the writes, the versions decide.
//!
//! A store made with [`ConfigMapKv::watched`] answers `get` and `list` from
//! a watch of its ConfigMaps ([`cache`]): this process's own writes at once,
//! other replicas' within the watch's delay. Compare-and-swap always reads
//! the API server.

mod cache;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;
use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use proxyfleet_core::kv::{self, CasOutcome, KvEntry, KvError, KvStore};

use self::cache::{Cache, Lookup};

/// Label on every store ConfigMap.
pub const KV_LABEL: &str = "proxyfleet.io/kv";
/// Annotation holding the last version handed out in one ConfigMap.
const VERSION_ANNOTATION: &str = "proxyfleet.io/kv-version";
/// Attempts before a contended write gives up as `unavailable`.
const MAX_ATTEMPTS: u32 = 16;

/// The store, scoped by entry to one ConfigMap each.
#[derive(Debug, Clone)]
pub struct ConfigMapKv {
    api: Api<ConfigMap>,
    /// `None`: every read is a request.
    cache: Option<Arc<Cache>>,
}

impl ConfigMapKv {
    /// A store in `namespace` whose every read is a request to the API
    /// server.
    pub fn new(client: kube::Client, namespace: &str) -> Self {
        Self { api: Api::namespaced(client, namespace), cache: None }
    }

    /// A store in `namespace` that answers reads from a watch of its
    /// ConfigMaps, and the watch to run beside it for as long as the store
    /// is used (until its first list, reads are requests). Needs `list` and
    /// `watch` on ConfigMaps in `namespace`.
    pub fn watched(
        client: kube::Client,
        namespace: &str,
    ) -> (Self, impl Future<Output = ()> + Send + 'static) {
        let api = Api::namespaced(client, namespace);
        let cache = Arc::new(Cache::default());
        let follow = follow(api.clone(), Arc::clone(&cache));
        (Self { api, cache: Some(cache) }, follow)
    }

    /// Whether reads are answered from the watch now: a store made with
    /// [`ConfigMapKv::watched`] whose watch has listed the ConfigMaps.
    pub fn follows_watch(&self) -> bool {
        self.cache.as_ref().is_some_and(|cache| cache.synced())
    }

    fn name(scope: &str) -> String {
        format!("proxyfleet-kv-{scope}")
    }

    /// The scope's ConfigMap as the cache knows it, or from the server.
    async fn read(&self, scope: &str) -> Result<Option<Arc<ConfigMap>>, KvError> {
        if let Some(cache) = &self.cache
            && let Lookup::Known(map) = cache.lookup(&Self::name(scope))
        {
            return Ok(map);
        }
        Ok(self.read_fresh(scope).await?.map(Arc::new))
    }

    /// The scope's ConfigMap from the server.
    async fn read_fresh(&self, scope: &str) -> Result<Option<ConfigMap>, KvError> {
        let map = self.api.get_opt(&Self::name(scope)).await.map_err(|err| unavailable(&err))?;
        if let (Some(cache), Some(map)) = (&self.cache, &map) {
            cache.observe(Cow::Borrowed(map));
        }
        Ok(map)
    }
}

/// Feeds `cache` from a watch of every store ConfigMap `api` reaches.
async fn follow(api: Api<ConfigMap>, cache: Arc<Cache>) {
    let config = watcher::Config::default().labels(KV_LABEL);
    let mut events = std::pin::pin!(watcher(api, config).default_backoff());
    while let Some(event) = events.next().await {
        match event {
            Ok(event) => cache.apply(event),
            // The watcher resumes from the last version it saw, or lists
            // again when that is gone: no change is lost, only late, as
            // in any informer. The process's own writes are in the cache
            // already.
            Err(err) => {
                tracing::warn!(error = %err, "watch of the plugins' store ConfigMaps failed; retrying")
            }
        }
    }
}

/// ConfigMap keys allow `[-._a-zA-Z0-9]`; store keys are free text, so they
/// are hex-encoded.
fn encode_key(key: &str) -> String {
    key.bytes().map(|b| format!("{b:02x}")).collect()
}

fn decode_key(encoded: &str) -> Option<String> {
    let bytes: Option<Vec<u8>> = (0..encoded.len())
        .step_by(2)
        .map(|i| encoded.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
        .collect();
    String::from_utf8(bytes?).ok()
}

fn entries(map: &ConfigMap) -> BTreeMap<String, KvEntry> {
    map.binary_data
        .iter()
        .flatten()
        .filter_map(|(encoded, stored)| {
            let key = decode_key(encoded)?;
            Some((key.clone(), kv::decode_versioned(&key, &stored.0)))
        })
        .collect()
}

fn unavailable(err: &kube::Error) -> KvError {
    KvError::Unavailable(format!("Kubernetes API: {err}"))
}

fn is_conflict(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 409)
}

#[async_trait]
impl KvStore for ConfigMapKv {
    async fn get(&self, scope: &str, key: &str) -> Result<Option<KvEntry>, KvError> {
        kv::validate_request(key, None)?;
        Ok(self.read(scope).await?.and_then(|map| entries(&map).remove(key)))
    }

    async fn compare_and_swap(
        &self,
        scope: &str,
        key: &str,
        expected: Option<u64>,
        value: Option<Vec<u8>>,
    ) -> Result<CasOutcome, KvError> {
        kv::validate_request(key, value.as_deref())?;
        for _ in 0..MAX_ATTEMPTS {
            let current = self.read_fresh(scope).await?;
            let existing = current.as_ref().and_then(|map| entries(map).remove(key));
            if existing.as_ref().map(|e| e.version) != expected {
                return Ok(CasOutcome::Conflict(existing));
            }
            let mut map = current.unwrap_or_else(|| ConfigMap {
                metadata: ObjectMeta {
                    name: Some(Self::name(scope)),
                    labels: Some(BTreeMap::from([(KV_LABEL.to_owned(), scope.to_owned())])),
                    ..ObjectMeta::default()
                },
                ..ConfigMap::default()
            });
            let annotations = map.metadata.annotations.get_or_insert_with(BTreeMap::new);
            let last: u64 =
                annotations.get(VERSION_ANNOTATION).and_then(|v| v.parse().ok()).unwrap_or(0);
            let data = map.binary_data.get_or_insert_with(BTreeMap::new);
            let outcome = match &value {
                Some(value) => {
                    // Versions come from a per-ConfigMap counter so a deleted
                    // and re-created key never repeats a version.
                    let version = last + 1;
                    annotations.insert(VERSION_ANNOTATION.to_owned(), version.to_string());
                    data.insert(encode_key(key), ByteString(kv::encode_versioned(version, value)));
                    CasOutcome::Applied(version)
                }
                None => {
                    data.remove(&encode_key(key));
                    CasOutcome::Applied(0)
                }
            };
            let written = if map.metadata.resource_version.is_some() {
                // The resourceVersion in the body makes this a conditional
                // update: it fails with 409 if anyone wrote in between.
                self.api.replace(&Self::name(scope), &PostParams::default(), &map).await
            } else {
                self.api.create(&PostParams::default(), &map).await
            };
            match written {
                Ok(written) => {
                    if let Some(cache) = &self.cache {
                        cache.observe(Cow::Owned(written));
                    }
                    return Ok(outcome);
                }
                Err(err) if is_conflict(&err) => continue,
                Err(err) => return Err(unavailable(&err)),
            }
        }
        Err(KvError::Unavailable(format!(
            "the store of {scope:?} stayed contended for {MAX_ATTEMPTS} attempts"
        )))
    }

    async fn list(&self, scope: &str, prefix: &str) -> Result<Vec<KvEntry>, KvError> {
        Ok(self
            .read(scope)
            .await?
            .map(|map| entries(&map).into_values().filter(|e| e.key.starts_with(prefix)).collect())
            .unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_survive_the_encoding() {
        for key in ["endpoint/127.0.0.1:3128", "a", "ünïcode/😀", ""] {
            let encoded = encode_key(key);
            assert!(encoded.bytes().all(|b| b.is_ascii_hexdigit()));
            assert_eq!(decode_key(&encoded).as_deref(), Some(key));
        }
        assert_eq!(decode_key("zz"), None);
    }
}
