//! The installation's spec key (`proxyfleet_core::spec_key`) in Kubernetes:
//! a Secret in the operator's namespace, made by the first replica that
//! starts and read by every later one. The ConfigMaps of the plugins'
//! key-value store are no place for it: whoever may read them could test
//! password guesses against the spec hashes in Proxy statuses.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use proxyfleet_core::spec_key::{SpecKey, SpecKeyError};

/// The Secret's name.
pub const SECRET: &str = "proxyfleet-spec-key";
/// Its data key.
const DATA_KEY: &str = "key";

/// Why the key cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API refused or failed.
    #[error(
        "cannot read or create Secret {namespace}/{SECRET} (the key of the spec hashes): {source}; \
         the operator needs get and create on secrets in its namespace (the chart's Role grants them)"
    )]
    Api {
        /// The operator's namespace.
        namespace: String,
        /// What the API answered.
        source: kube::Error,
    },
    /// The Secret holds no valid key.
    #[error(transparent)]
    Key(#[from] SpecKeyError),
}

/// The key kept in the operator's namespace, or a new one kept now. Two
/// replicas starting at once agree: one create wins, the other reads it.
pub async fn settle(client: &kube::Client, namespace: &str) -> Result<SpecKey, Error> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let failed = |source| Error::Api { namespace: namespace.to_owned(), source };
    loop {
        if let Some(secret) = api.get_opt(SECRET).await.map_err(failed)? {
            let bytes = secret.data.and_then(|mut data| data.remove(DATA_KEY)).unwrap_or_default();
            let place = format!("Secret {namespace}/{SECRET}, key {DATA_KEY}");
            return Ok(SpecKey::from_bytes(&place, &bytes.0)?);
        }
        let key = SpecKey::generate();
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(SECRET.to_owned()),
                labels: Some(BTreeMap::from([(
                    "app.kubernetes.io/managed-by".to_owned(),
                    "proxyfleet".to_owned(),
                )])),
                ..ObjectMeta::default()
            },
            type_: Some("Opaque".to_owned()),
            immutable: Some(true),
            data: Some(BTreeMap::from([(
                DATA_KEY.to_owned(),
                ByteString(key.as_bytes().to_vec()),
            )])),
            ..Secret::default()
        };
        match api.create(&PostParams::default(), &secret).await {
            Ok(_) => {
                tracing::info!(secret = SECRET, namespace, "made the key of the spec hashes");
                return Ok(key);
            }
            // Another replica made it first: the next read finds it.
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(source) => return Err(failed(source)),
        }
    }
}
