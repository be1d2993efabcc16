//! What can go wrong reaching a registry, reading an artifact or keeping it.
//!
//! Every message names the reference (registry and repository) and never
//! a credential: the registry client's own errors carry URLs and status
//! texts, and credentials travel only in headers.

use std::path::PathBuf;

use thiserror::Error;

use crate::answer::{Overrun, without_query};
use crate::destination::RefusedDestination;
use crate::layout::LayoutError;

/// A failed pull, push or store operation.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum OciError {
    /// A file that `registries[]` names could not be read.
    #[error("registry {registry}: cannot read {field} {}: {source}", path.display())]
    AccessFile {
        /// The registry host.
        registry: String,
        /// The key naming the file.
        field: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The registry refused the credentials, or gave none access.
    #[error(
        "{reference}: registry {registry} refused access to repository {repository}: check \
         the credentials its registries item names ({detail})"
    )]
    Denied {
        /// The reference.
        reference: String,
        /// The registry host.
        registry: String,
        /// The repository.
        repository: String,
        /// The registry client's account, which holds no credential.
        detail: String,
    },
    /// The tag or digest does not exist in the repository.
    #[error("{reference}: not found in registry {registry} ({detail})")]
    NotFound {
        /// The reference.
        reference: String,
        /// The registry host.
        registry: String,
        /// The registry client's account.
        detail: String,
    },
    /// The registry could not be reached or answered with an error.
    #[error("{reference}: registry {registry}: {source}")]
    Registry {
        /// The reference.
        reference: String,
        /// The registry host.
        registry: String,
        /// The registry client's error.
        source: oci_client::errors::OciDistributionError,
    },
    /// A registry reached over TLS answered in plain HTTP.
    #[error(
        "{reference}: registry {registry} answered in plain HTTP where TLS was expected: if it \
         serves only plain HTTP, set `plainHttp: true` on its registries item (`--plain-http` \
         for the plugin commands; off loopback also `insecure: true`, `--insecure`)"
    )]
    PlainHttp {
        /// The reference.
        reference: String,
        /// The registry host.
        registry: String,
    },
    /// The registry sent the pull (a redirect, its token realm) somewhere
    /// the address policy refuses; nothing was sent there.
    #[error(
        "{reference}: registry {registry} sent the pull elsewhere, and the host refused: {source}"
    )]
    Refused {
        /// The reference.
        reference: String,
        /// The registry host.
        registry: String,
        /// Where it sent the pull, and why that is refused.
        source: RefusedDestination,
    },
    /// No HTTP client could be made for the registry.
    #[error("registry {registry}: cannot make an HTTP client: {source}")]
    Client {
        /// The registry host.
        registry: String,
        /// Why.
        source: reqwest_oci::Error,
    },
    /// A manifest, or what a tag points at, is larger than any manifest the
    /// host reads.
    #[error("{reference}: the manifest {size}, over the limit of {limit} bytes for a manifest")]
    ManifestTooLarge {
        /// The reference.
        reference: String,
        /// What its `Content-Length` declared, or what had arrived when it
        /// was cut off.
        size: Overrun,
        /// The limit.
        limit: u64,
    },
    /// The registry took longer than a pull or a look may take.
    #[error("{reference}: the registry did not finish within {after:?}")]
    TimedOut {
        /// The reference.
        reference: String,
        /// The deadline.
        after: std::time::Duration,
    },
    /// The artifact is not a Wasm component in the Wasm OCI layout.
    #[error("{reference}: {source}")]
    Layout {
        /// The reference.
        reference: String,
        /// What is wrong with it.
        source: LayoutError,
    },
    /// The artifact is larger than the host accepts.
    #[error(
        "{reference}: the component layer is {size} bytes, over the limit of {limit} bytes \
         (raise --plugin-max-bytes if this build is meant to be that large)"
    )]
    TooLarge {
        /// The reference.
        reference: String,
        /// What the manifest declared or what arrived, whichever showed first.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// Content did not hash to the digest that names it.
    #[error("{reference}: the {what} does not match its digest: expected {expected}, got {actual}")]
    Digest {
        /// The reference.
        reference: String,
        /// `manifest`, `config` or `component layer`.
        what: &'static str,
        /// The digest that names it.
        expected: String,
        /// What the content hashes to.
        actual: String,
    },
    /// A signature policy applies and the build has no signature artifact.
    #[error(
        "{reference}: manifest {manifest} is not signed (no {tag} in the repository), and \
         {policy} asks for a signature: sign it with `proxyfleet plugin sign` or `cosign sign \
         --key`"
    )]
    Unsigned {
        /// The reference.
        reference: String,
        /// The manifest that has no signature.
        manifest: String,
        /// The tag a signature would be at.
        tag: String,
        /// The first policy that asks for one.
        policy: String,
    },
    /// The build's signatures do not satisfy a policy, or its signature
    /// artifact is malformed.
    #[error("{reference}: signature refused: {reason}")]
    Signature {
        /// The reference.
        reference: String,
        /// Which policy, and what was found instead.
        reason: String,
    },
    /// A key a signature policy names cannot be used.
    #[error("{reference}: {field}: {source}")]
    VerifyKey {
        /// The reference being checked.
        reference: String,
        /// The key's field, e.g. `registries[0].verify.keys[1]`.
        field: String,
        /// What is wrong with the key file.
        source: crate::cosign_key::KeyError,
    },
    /// The local store could not be read or written.
    #[error("plugin store {}: {source}", path.display())]
    Store {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file to push is not a usable component.
    #[error("{path}: not a WebAssembly component that can be published: {reason}")]
    Component {
        /// The file.
        path: String,
        /// The decoder's account (the layout crate reports it as text).
        reason: String,
    },
}

/// What a registry client error means to a caller.
enum Meaning {
    Denied,
    NotFound,
    PlainHttp,
    Other,
}

/// True when a TLS handshake in `error`'s sources got a record that is no
/// TLS at all: a plain HTTP server's answer.
fn plain_http_answer(error: &(dyn std::error::Error + 'static)) -> bool {
    let is_plain = |error: &(dyn std::error::Error + 'static)| {
        matches!(
            error.downcast_ref::<rustls::Error>(),
            Some(rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType))
        )
    };
    let mut cause = Some(error);
    while let Some(error) = cause {
        if is_plain(error) {
            return true;
        }
        // An I/O error's `source` skips the error it wraps: look at it too.
        if let Some(inner) =
            error.downcast_ref::<std::io::Error>().and_then(std::io::Error::get_ref)
            && (is_plain(inner) || plain_http_answer(inner))
        {
            return true;
        }
        cause = error.source();
    }
    false
}

fn meaning(source: &oci_client::errors::OciDistributionError) -> Meaning {
    use oci_client::errors::{OciDistributionError as E, OciErrorCode as C};
    if plain_http_answer(source) {
        return Meaning::PlainHttp;
    }
    match source {
        E::UnauthorizedError { .. }
        | E::AuthenticationFailure(_)
        | E::ServerError { code: 401 | 403, .. } => Meaning::Denied,
        E::ImageManifestNotFoundError(_) | E::ServerError { code: 404, .. } => Meaning::NotFound,
        E::RegistryError { envelope, .. } => {
            let codes = || envelope.errors.iter().map(|error| &error.code);
            if codes().any(|code| matches!(code, C::Unauthorized | C::Denied)) {
                Meaning::Denied
            } else if codes().any(|code| {
                matches!(code, C::ManifestUnknown | C::NameUnknown | C::BlobUnknown | C::NotFound)
            }) {
                Meaning::NotFound
            } else {
                Meaning::Other
            }
        }
        _ => Meaning::Other,
    }
}

impl OciError {
    /// True when the build itself is refused (its layout, its size, its
    /// digests, its signatures under the policies), so pulling the same
    /// manifest again cannot help (for signatures, see
    /// [`OciError::is_signature_refusal`]); false for what may pass (the
    /// registry, credentials, the store).
    pub fn refuses_the_build(&self) -> bool {
        matches!(
            self,
            Self::Layout { .. }
                | Self::TooLarge { .. }
                | Self::ManifestTooLarge { .. }
                | Self::Digest { .. }
        ) || self.is_signature_refusal()
    }

    /// True when the build is refused for its signatures (none, none
    /// valid, or a key of the policy unusable): unlike its content, that
    /// can change without the tag moving (a signature pushed later, a key
    /// file fixed), so the same build is checked again.
    pub fn is_signature_refusal(&self) -> bool {
        matches!(self, Self::Unsigned { .. } | Self::Signature { .. } | Self::VerifyKey { .. })
    }

    /// A request that failed on its way: refused by the address policy
    /// (found by type in the error's sources, wherever the transport wraps
    /// it), or the transport's error, its URL shown without its query.
    pub(crate) fn from_transport(
        reference: &crate::PluginReference,
        source: reqwest_oci::Error,
    ) -> Self {
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&source);
        while let Some(error) = cause {
            if let Some(refused) = error.downcast_ref::<RefusedDestination>() {
                return Self::Refused {
                    reference: reference.to_string(),
                    registry: reference.registry().to_owned(),
                    source: refused.clone(),
                };
            }
            cause = error.source();
        }
        Self::from_client(
            reference,
            oci_client::errors::OciDistributionError::RequestError(without_query(source)),
        )
    }

    /// Sorts a registry client error into the cases callers act on.
    pub(crate) fn from_client(
        reference: &crate::PluginReference,
        source: oci_client::errors::OciDistributionError,
    ) -> Self {
        let registry = reference.registry().to_owned();
        match meaning(&source) {
            Meaning::Denied => Self::Denied {
                reference: reference.to_string(),
                registry,
                repository: reference.repository().to_owned(),
                detail: source.to_string(),
            },
            Meaning::NotFound => Self::NotFound {
                reference: reference.to_string(),
                registry,
                detail: source.to_string(),
            },
            Meaning::PlainHttp => Self::PlainHttp { reference: reference.to_string(), registry },
            Meaning::Other => Self::Registry { reference: reference.to_string(), registry, source },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// However deep the transport wraps it, and through an I/O error whose
    /// `source` skips what it wraps, the handshake's plain-HTTP error is
    /// found, and nothing else counts as one.
    #[test]
    fn a_plain_http_answer_is_found_by_type_through_io_errors() {
        let plain = rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType);
        let wrapped = std::io::Error::other(std::io::Error::other(plain));
        assert!(plain_http_answer(&wrapped));
        let other = std::io::Error::other(rustls::Error::InvalidMessage(
            rustls::InvalidMessage::InvalidCcs,
        ));
        assert!(!plain_http_answer(&other));
        assert!(!plain_http_answer(&std::io::Error::other("InvalidContentType")));
    }
}
