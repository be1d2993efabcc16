//! Secrets a provider entry's credential names by reference (`secretRef`)
//! instead of by file: a key of a Kubernetes Secret, read by the host when
//! the entry is bound and again (through a short cache) when a request
//! needs it. The plugin never sees one.
//!
//! A mode that can read Secrets hands the runtime a [`SecretStore`]; the
//! Kubernetes adapter reads each by name (`get`, never `list`). Without a
//! store (standalone) a reference cannot be read, and the entry says so.

use std::collections::BTreeMap;
use std::sync::Mutex;

use async_trait::async_trait;

/// A key of a Secret.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SecretKeyRef {
    /// The Secret's namespace; `None`: the operator's own.
    pub namespace: Option<String>,
    /// The Secret's name.
    pub name: String,
    /// The key in its `data`.
    pub key: String,
}

impl std::fmt::Display for SecretKeyRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "key {:?} of Secret {:?}", self.key, self.name)?;
        match &self.namespace {
            Some(namespace) => write!(f, " in namespace {namespace:?}"),
            None => write!(f, " in the operator's namespace"),
        }
    }
}

/// Why a Secret's key could not be read. Never holds a secret value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretReadError {
    /// No Secret of that name.
    #[error("Secret {name:?} not found in namespace {namespace:?}; create it or correct the name")]
    NotFound {
        /// Where it was looked for.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// The Secret exists without the key.
    #[error(
        "Secret {name:?} in namespace {namespace:?} has no key {key:?} (it has: {present}); \
         add it or correct the key"
    )]
    NoKey {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// The key asked for.
        key: String,
        /// The keys it has, comma-separated, or `none`.
        present: String,
    },
    /// The operator may not read it.
    #[error(
        "the operator may not read Secret {name:?} in namespace {namespace:?} (forbidden); \
         grant its ServiceAccount `get` on Secrets there"
    )]
    Forbidden {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// The store could not be asked; worth retrying.
    #[error("cannot read Secret {name:?} in namespace {namespace:?}: {message}")]
    Unavailable {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// Why, without the Secret's content.
        message: String,
    },
    /// This mode has no Secrets to read.
    #[error(
        "a secretRef names a Kubernetes Secret, which only the operator in a cluster reads; \
         here, give the credential by file (`secretFile`, `keyFile`)"
    )]
    NoStore,
}

/// Reads keys of Secrets.
#[async_trait]
pub trait SecretStore: Send + Sync + std::fmt::Debug {
    /// The value of `at`, as stored (bytes, not base64).
    async fn read(&self, at: &SecretKeyRef) -> Result<Vec<u8>, SecretReadError>;
}

/// A Secret's `data`: key to value.
pub type SecretData = BTreeMap<String, Vec<u8>>;

/// Secrets by namespace and name.
type Secrets = BTreeMap<(String, String), SecretData>;

/// Secrets held in memory, for tests and the plugin test harness: every
/// namespace is the one given at creation when a reference names none.
#[derive(Debug)]
pub struct MemorySecrets {
    namespace: String,
    secrets: Mutex<Secrets>,
}

impl MemorySecrets {
    /// An empty store whose own namespace is `namespace`.
    pub fn new(namespace: &str) -> Self {
        Self { namespace: namespace.to_owned(), secrets: Mutex::default() }
    }

    /// Sets (or replaces) Secret `name` in `namespace` with `data`.
    pub fn put(&self, namespace: &str, name: &str, data: &[(&str, &[u8])]) {
        let data = data.iter().map(|(key, value)| ((*key).to_owned(), value.to_vec())).collect();
        self.lock().insert((namespace.to_owned(), name.to_owned()), data);
    }

    /// Removes Secret `name` in `namespace`.
    pub fn remove(&self, namespace: &str, name: &str) {
        self.lock().remove(&(namespace.to_owned(), name.to_owned()));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Secrets> {
        self.secrets.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[async_trait]
impl SecretStore for MemorySecrets {
    async fn read(&self, at: &SecretKeyRef) -> Result<Vec<u8>, SecretReadError> {
        let namespace = at.namespace.clone().unwrap_or_else(|| self.namespace.clone());
        let secrets = self.lock();
        let Some(data) = secrets.get(&(namespace.clone(), at.name.clone())) else {
            return Err(SecretReadError::NotFound { namespace, name: at.name.clone() });
        };
        value_of(&namespace, &at.name, &at.key, data)
    }
}

/// The value under `key` of a Secret's `data`, or [`SecretReadError::NoKey`]
/// naming the keys it has (names only, never values).
pub fn value_of(
    namespace: &str,
    name: &str,
    key: &str,
    data: &SecretData,
) -> Result<Vec<u8>, SecretReadError> {
    data.get(key).cloned().ok_or_else(|| SecretReadError::NoKey {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        key: key.to_owned(),
        present: if data.is_empty() {
            "none".to_owned()
        } else {
            data.keys().cloned().collect::<Vec<_>>().join(", ")
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(name: &str, key: &str) -> SecretKeyRef {
        SecretKeyRef { namespace: None, name: name.into(), key: key.into() }
    }

    #[tokio::test]
    async fn a_missing_secret_or_key_is_named_without_any_value() {
        let store = MemorySecrets::new("proxyfleet");
        store.put("proxyfleet", "pve", &[("token", b"t0k3n"), ("user", b"root@pam")]);
        assert_eq!(store.read(&at("pve", "token")).await.unwrap(), b"t0k3n");
        let missing = store.read(&at("gone", "token")).await.unwrap_err().to_string();
        assert!(missing.contains("\"gone\"") && missing.contains("\"proxyfleet\""), "{missing}");
        let no_key = store.read(&at("pve", "secret")).await.unwrap_err().to_string();
        assert!(no_key.contains("no key \"secret\"") && no_key.contains("token, user"), "{no_key}");
        assert!(!no_key.contains("t0k3n") && !no_key.contains("root@pam"), "{no_key}");
        let elsewhere = SecretKeyRef { namespace: Some("team-a".into()), ..at("pve", "token") };
        assert!(matches!(
            store.read(&elsewhere).await,
            Err(SecretReadError::NotFound { namespace, .. }) if namespace == "team-a"
        ));
    }
}
