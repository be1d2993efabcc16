//! Reading a credential's secret from where its grant says: a file of the
//! host, or a key of a Kubernetes Secret through the mode's
//! [`SecretStore`]. Read each time it is needed (the store keeps a short
//! cache), so a rotated secret is used without a restart.

use std::sync::Arc;

use proxyfleet_core::secret_store::{SecretReadError, SecretStore};

use super::config::{Credential, HttpGrant, SecretSource};

/// Why a secret could not be read. Names where it was looked for, never
/// what it holds.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SecretUnavailable {
    /// The file could not be read.
    #[error("cannot read {source_name}: {error}")]
    File {
        /// `the file PATH`.
        source_name: String,
        /// Why.
        error: std::io::Error,
    },
    /// The Secret's key could not be read.
    #[error(transparent)]
    Ref(#[from] SecretReadError),
}

/// The secret at `source`, as stored.
pub(crate) async fn read_secret(
    source: &SecretSource,
    store: Option<&Arc<dyn SecretStore>>,
) -> Result<Vec<u8>, SecretUnavailable> {
    match source {
        SecretSource::File(path) => tokio::fs::read(path)
            .await
            .map_err(|error| SecretUnavailable::File { source_name: source.to_string(), error }),
        SecretSource::Ref(at) => match store {
            Some(store) => Ok(store.read(at).await?),
            None => Err(SecretReadError::NoStore.into()),
        },
    }
}

/// The secret a grant's credential reads, when it reads one.
fn secret_of(grant: &HttpGrant) -> Option<&SecretSource> {
    match &grant.credential {
        Some(Credential::Header(header)) => Some(&header.secret),
        Some(Credential::GoogleServiceAccount(google)) => Some(&google.key),
        Some(Credential::GoogleMetadata(_)) | None => None,
    }
}

/// Whether a grant of `grants` names a Secret's key (`secretRef`).
pub(crate) fn names_secrets(grants: &[HttpGrant]) -> bool {
    grants.iter().any(|grant| matches!(secret_of(grant), Some(SecretSource::Ref(_))))
}

/// Reads every Secret key `grants` name (`secretRef`), so that an entry
/// whose Secret or key is missing is refused before it serves, with the
/// grant named. Files are read only when a request needs them.
pub(crate) async fn check_refs(
    grants: &[HttpGrant],
    store: Option<&Arc<dyn SecretStore>>,
) -> Result<(), String> {
    for (i, grant) in grants.iter().enumerate() {
        if let Some(source @ SecretSource::Ref(_)) = secret_of(grant) {
            read_secret(source, store)
                .await
                .map_err(|err| format!("grants.http[{i}].credential.secretRef: {err}"))?;
        }
    }
    Ok(())
}
