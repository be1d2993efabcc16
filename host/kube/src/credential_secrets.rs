//! The Secrets provider credentials name by `secretRef`, read for the
//! plugin runtime ([`SecretStore`]): each by name (`get`, never `list`),
//! only when an entry is bound or a request needs its credential.
//!
//! Answers are kept for [`FRESH_FOR`], so a plugin sending many requests
//! costs the API server one read per Secret in that time, and a rotated
//! Secret is used within it. A missing or forbidden Secret is remembered as
//! long, so a plugin cannot make the host ask again on every request;
//! a failed request to the API server is not remembered.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use proxyfleet_core::secret_store::{
    SecretData, SecretKeyRef, SecretReadError, SecretStore, value_of,
};

/// How long an answer is used before the Secret is read again.
pub const FRESH_FOR: Duration = Duration::from_secs(10);

/// A Secret's data as last read, or why it could not be.
type Answer = Result<Arc<SecretData>, SecretReadError>;

/// Reads Secrets for credentials; a reference without a namespace reads
/// the operator's own.
pub struct CredentialSecrets {
    client: kube::Client,
    namespace: String,
    read: Mutex<HashMap<(String, String), (Instant, Answer)>>,
}

impl std::fmt::Debug for CredentialSecrets {
    // Never the data.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CredentialSecrets")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl CredentialSecrets {
    /// A reader whose own namespace (the operator's) is `namespace`.
    pub fn new(client: kube::Client, namespace: &str) -> Self {
        Self { client, namespace: namespace.to_owned(), read: Mutex::default() }
    }

    fn remembered(&self, at: &(String, String)) -> Option<Answer> {
        let read = self.read.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        read.get(at)
            .filter(|(when, _)| when.elapsed() < FRESH_FOR)
            .map(|(_, answer)| answer.clone())
    }

    async fn fetch(&self, namespace: &str, name: &str) -> Answer {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        let owned = || (namespace.to_owned(), name.to_owned());
        match api.get_opt(name).await {
            Ok(Some(secret)) => Ok(Arc::new(
                secret
                    .data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(key, value)| (key, value.0))
                    .collect(),
            )),
            Ok(None) => {
                let (namespace, name) = owned();
                Err(SecretReadError::NotFound { namespace, name })
            }
            Err(kube::Error::Api(status)) if status.code == 403 => {
                let (namespace, name) = owned();
                Err(SecretReadError::Forbidden { namespace, name })
            }
            Err(err) => {
                let (namespace, name) = owned();
                Err(SecretReadError::Unavailable { namespace, name, message: err.to_string() })
            }
        }
    }
}

#[async_trait]
impl SecretStore for CredentialSecrets {
    async fn read(&self, at: &SecretKeyRef) -> Result<Vec<u8>, SecretReadError> {
        let namespace = at.namespace.clone().unwrap_or_else(|| self.namespace.clone());
        let key = (namespace, at.name.clone());
        let answer = match self.remembered(&key) {
            Some(answer) => answer,
            None => {
                let answer = self.fetch(&key.0, &key.1).await;
                if !matches!(answer, Err(SecretReadError::Unavailable { .. })) {
                    let mut read =
                        self.read.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    read.insert(key.clone(), (Instant::now(), answer.clone()));
                }
                answer
            }
        };
        value_of(&key.0, &key.1, &at.key, answer?.as_ref())
    }
}
