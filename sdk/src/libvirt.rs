//! Hypervisors driven through libvirt over SSH: the host dials only the
//! hosts the entry's `grants.libvirt` names, checks their host keys, and
//! runs each operation under a budget. A plugin that never calls into this
//! module does not import the interface.
//!
//! Errors convert into [`ProviderError`] with `?`: a lost connection or a
//! budget overrun is `transient`, a refused host key or login
//! `unauthorized`, a host outside the grants `unauthorized` too.
//!
//! ```no_run
//! use proxyfleet_sdk::libvirt::{self, DomainState, LibvirtError};
//! # fn example() -> proxyfleet_sdk::Result<()> {
//! match libvirt::get_domain("kvm1.example", "pf-6f1c2a9e0b7d") {
//!     Ok(domain) if domain.state == DomainState::Running => {}
//!     Ok(_) => libvirt::start_domain("kvm1.example", "pf-6f1c2a9e0b7d")?,
//!     // Another reading than the default: gone is fine here.
//!     Err(LibvirtError::NotFound(_)) => {}
//!     Err(error) => return Err(error.into()),
//! }
//! # Ok(())
//! # }
//! ```

use crate::ProviderError;
use crate::bindings::proxyfleet::provider::libvirt as wit;

pub use wit::{
    AddressSource, DomainInfo, DomainState, InterfaceAddress, LibvirtError, PoolInfo, Upload,
    Volume, begin_upload, clone_volume, create_volume, define_domain, delete_volume,
    destroy_domain, get_domain, get_metadata, get_pool, get_volume, hosts, interface_addresses,
    list_domains, list_volumes, ping, set_metadata, start_domain, undefine_domain,
};

impl LibvirtError {
    /// The message, whatever the variant.
    ///
    /// ```
    /// use proxyfleet_sdk::ProviderError;
    /// use proxyfleet_sdk::libvirt::LibvirtError;
    ///
    /// let error = LibvirtError::Exists("domain pf-1 already exists".into());
    /// assert_eq!(error.message(), "domain pf-1 already exists");
    /// assert!(matches!(ProviderError::from(error), ProviderError::Conflict(_)));
    /// ```
    pub fn message(&self) -> &str {
        match self {
            Self::NotGranted(m)
            | Self::Unauthorized(m)
            | Self::Transient(m)
            | Self::Timeout(m)
            | Self::NotFound(m)
            | Self::Exists(m)
            | Self::InvalidState(m)
            | Self::Invalid(m)
            | Self::Unsupported(m)
            | Self::Failed(m) => m,
        }
    }
}

/// What a plugin usually means by each libvirt error; match on the
/// variant first where another reading fits (e.g. `not-found` on delete).
impl From<LibvirtError> for ProviderError {
    fn from(error: LibvirtError) -> Self {
        match error {
            LibvirtError::NotGranted(m) | LibvirtError::Unauthorized(m) => Self::Unauthorized(m),
            LibvirtError::Transient(m) | LibvirtError::Timeout(m) => Self::Transient(m),
            LibvirtError::NotFound(m) => Self::NotFound(m),
            LibvirtError::Exists(m) | LibvirtError::InvalidState(m) => Self::Conflict(m),
            LibvirtError::Invalid(m) | LibvirtError::Unsupported(m) | LibvirtError::Failed(m) => {
                Self::Permanent(m)
            }
        }
    }
}
