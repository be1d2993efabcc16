//! Why a catalog request could not be met.

/// Why a catalog request could not be met.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CatalogError {
    /// No such proxy.
    #[error("no proxy with id {0:?}")]
    NoProxy(String),
    /// No such lease, or it expired.
    #[error("no live lease with id {0:?}: it expired or was released")]
    NoLease(String),
    /// Nothing matches and is available.
    #[error(
        "no available proxy matches{0}: none is running, healthy, unquarantined and (for an exclusive lease) unleased"
    )]
    NoneAvailable(String),
    /// A request named a pool no Proxy belongs to.
    #[error("pool {0:?} is unknown: no Proxy belongs to it; pools are named namespace/name")]
    UnknownPool(String),
    /// The lease store cannot be written now; the request may be retried.
    #[error("the lease store cannot be written now ({0}); retry the request")]
    StoreUnavailable(String),
    /// A request value is out of range.
    #[error("{field}: {message}")]
    Invalid {
        /// The field.
        field: String,
        /// What is allowed.
        message: String,
    },
}

impl CatalogError {
    /// The HTTP status that answers it, for the API and the console.
    pub fn status(&self) -> http::StatusCode {
        match self {
            Self::NoProxy(_) | Self::NoLease(_) | Self::UnknownPool(_) => {
                http::StatusCode::NOT_FOUND
            }
            Self::NoneAvailable(_) | Self::StoreUnavailable(_) => {
                http::StatusCode::SERVICE_UNAVAILABLE
            }
            Self::Invalid { .. } => http::StatusCode::BAD_REQUEST,
        }
    }
}
