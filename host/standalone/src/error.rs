//! Errors of the standalone mode.

use std::path::PathBuf;

use proxyfleet_core::installation::InstallationId;

/// Why the standalone mode cannot go on.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The state database failed.
    #[error("state database: {0}")]
    Store(String),
    /// A Proxy manifest is wrong.
    #[error("{file}: {message}")]
    Manifest {
        /// The file.
        file: PathBuf,
        /// What is wrong, naming the document and field, and the fix.
        message: String,
    },
    /// The manifests cannot be read.
    #[error("cannot read Proxy manifests at {path}: {source}")]
    Read {
        /// The file or folder.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The installation's ID is invalid, another than the kept one, or
    /// cannot be kept.
    #[error(transparent)]
    Installation(#[from] proxyfleet_core::installation::InstallationError),
    /// The key of the spec hashes cannot be kept or read.
    #[error(transparent)]
    SpecKey(#[from] proxyfleet_core::spec_key::SpecKeyError),
    /// The providers were built for another installation than the state
    /// database keeps: their marks would not be this installation's.
    #[error(
        "the providers serve installation {providers} but the state database keeps {database}; \
         build them for the database's installation"
    )]
    InstallationMismatch {
        /// The ID the database keeps.
        database: InstallationId,
        /// The ID the providers mark instances with.
        providers: InstallationId,
    },
}

/// Results of the standalone mode.
pub type Result<T, E = Error> = std::result::Result<T, E>;
