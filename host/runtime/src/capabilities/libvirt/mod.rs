//! `proxyfleet:provider/libvirt`: hypervisors driven through libvirt over
//! SSH, limited to the hosts the entry's `grants.libvirt` names.
//!
//! - `ssh`: dialling, host-key verification against known_hosts, login;
//! - `helper`: the process that holds libvirt's C client (the operator
//!   never loads it); `client`: libvirt's objects, each call one request
//!   to that process;
//! - `pool`: one pooled connection per host (SSH, the forwarded libvirt
//!   socket, the libvirt client), call budgets, killing a connection;
//! - `ops`: the typed operations plugins get (volumes, uploads, domains,
//!   metadata, addresses); no raw command runner;
//! - `allow_list`: the domain and volume XML a plugin may hand libvirt;
//! - `scope`: disks and backing images only from the grant's pools;
//! - `owner`: each domain belongs to the entry that defined it;
//! - `escape`: text the host writes into that XML;
//! - `wit`: the WIT imports, mapped onto the above.

mod allow_list;
mod client;
pub mod config;
mod escape;
mod helper;
mod ops;
mod owner;
mod pool;
mod scope;
mod ssh;
mod wit;

use std::collections::BTreeMap;
use std::sync::Arc;

use proxyfleet_libvirt_wire::ErrorCode;

pub use helper::{HELPER_NAME, LibvirtHelper};
pub use ops::{AddressSource, DomainInfo, DomainState, InterfaceAddress, PoolInfo, Upload, Volume};
pub use pool::HostPool;
pub(crate) use wit::{LibvirtImport, LibvirtView};

use self::config::LibvirtGrant;

/// Why a libvirt operation failed; the variant is what the plugin acts on.
/// Messages never carry key material.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LibvirtError {
    /// The entry has no grant for the host.
    #[error("{0}")]
    NotGranted(String),
    /// The host key was refused, or the key or login was.
    #[error("{0}")]
    Unauthorized(String),
    /// Worth retrying: the host was unreachable, the connection died, or
    /// libvirt timed out itself.
    #[error("{0}")]
    Transient(String),
    /// The call ran over the grant's `callTimeout` budget; its connection
    /// was closed. Worth retrying.
    #[error("{0}")]
    Timeout(String),
    /// The domain, pool, volume or metadata does not exist.
    #[error("{0}")]
    NotFound(String),
    /// An object of that name exists already.
    #[error("{0}")]
    Exists(String),
    /// The object is not in a state that allows the operation (e.g. a
    /// domain that is not running cannot be destroyed).
    #[error("{0}")]
    InvalidState(String),
    /// The request was malformed (XML, names, arguments).
    #[error("{0}")]
    Invalid(String),
    /// The host's driver does not support the operation.
    #[error("{0}")]
    Unsupported(String),
    /// Anything else libvirt refused.
    #[error("{0}")]
    Failed(String),
}

impl LibvirtError {
    pub(crate) fn transient(message: impl Into<String>) -> Self {
        Self::Transient(message.into())
    }

    /// A short name of the variant, for spans and tests.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::NotGranted(_) => "not-granted",
            Self::Unauthorized(_) => "unauthorized",
            Self::Transient(_) => "transient",
            Self::Timeout(_) => "timeout",
            Self::NotFound(_) => "not-found",
            Self::Exists(_) => "exists",
            Self::InvalidState(_) => "invalid-state",
            Self::Invalid(_) => "invalid",
            Self::Unsupported(_) => "unsupported",
            Self::Failed(_) => "failed",
        }
    }
}

/// Maps a libvirt error of a live connection to what a plugin can act on.
/// (Errors of a dead connection never get here: they are `transient`.)
pub(crate) fn classify(op: &str, host: &str, err: &client::VirtError) -> LibvirtError {
    let message = format!("{op} on {host}: {}", err.message);
    match err.code {
        ErrorCode::NoDomain
        | ErrorCode::NoStoragePool
        | ErrorCode::NoStorageVolume
        | ErrorCode::NoDomainMetadata
        | ErrorCode::NoNetwork => LibvirtError::NotFound(message),
        ErrorCode::DomExist | ErrorCode::StorageVolExist => LibvirtError::Exists(message),
        ErrorCode::OperationInvalid => LibvirtError::InvalidState(message),
        ErrorCode::XmlError
        | ErrorCode::XmlDetail
        | ErrorCode::XmlInvalidSchema
        | ErrorCode::InvalidArg
        | ErrorCode::ConfigUnsupported => LibvirtError::Invalid(message),
        ErrorCode::NoSupport | ErrorCode::OperationUnsupported | ErrorCode::ArgumentUnsupported => {
            LibvirtError::Unsupported(message)
        }
        ErrorCode::AuthFailed
        | ErrorCode::AuthCancelled
        | ErrorCode::AuthUnavailable
        | ErrorCode::AccessDenied
        | ErrorCode::OperationDenied => LibvirtError::Unauthorized(message),
        ErrorCode::SystemError
        | ErrorCode::Rpc
        | ErrorCode::NoConnect
        | ErrorCode::InvalidConn
        | ErrorCode::OperationTimeout
        | ErrorCode::AgentUnresponsive
        | ErrorCode::AgentCommandTimeout
        | ErrorCode::ResourceBusy
        | ErrorCode::Unavailable => LibvirtError::Transient(message),
        ErrorCode::Other | ErrorCode::Helper => LibvirtError::Failed(message),
    }
}

/// The libvirt hosts of one provider entry.
#[derive(Debug, Default)]
pub struct EntryLibvirt {
    hosts: BTreeMap<String, Arc<HostPool>>,
}

impl EntryLibvirt {
    /// One pool per host entry `entry` is granted, their libvirt calls
    /// made by `helper`; nothing is dialled yet.
    pub fn new(entry: &str, grants: &[LibvirtGrant], helper: &Arc<LibvirtHelper>) -> Self {
        Self {
            hosts: grants
                .iter()
                .map(|grant| {
                    let pool = HostPool::new(grant.clone(), entry, Arc::clone(helper));
                    (grant.host.clone(), Arc::new(pool))
                })
                .collect(),
        }
    }

    /// The granted host names, sorted.
    pub fn hosts(&self) -> Vec<String> {
        self.hosts.keys().cloned().collect()
    }

    /// The pool of a granted host; `NotGranted` for any other name.
    pub fn host(&self, name: &str) -> Result<&Arc<HostPool>, LibvirtError> {
        self.hosts.get(&name.to_ascii_lowercase()).ok_or_else(|| {
            LibvirtError::NotGranted(format!(
                "libvirt host {name:?} is not granted to this entry; add it under \
                 grants.libvirt"
            ))
        })
    }
}
