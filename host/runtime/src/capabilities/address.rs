//! Which addresses a plugin's HTTP may reach: the ranges refused unless a
//! grant's `allowAddresses` names them, and IP literals read the way the
//! transport's URL parser reads them. The policy itself lives in
//! [`proxyfleet_core::address`], which the gateway and the registry
//! client judge addresses by too; the providers file's ranges are parsed
//! here, into the runtime's config errors.

use ipnet::IpNet;

use crate::error::ConfigError;

pub use proxyfleet_core::address::{
    AddressKind, literal_ip, non_canonical, refused_kind, refused_proxy_address,
};

/// IP addresses and CIDR ranges, e.g. `allowAddresses`.
pub(crate) fn parse_ranges(
    at: &str,
    key: &str,
    texts: &[String],
) -> Result<Vec<IpNet>, ConfigError> {
    texts
        .iter()
        .enumerate()
        .map(|(j, text)| {
            text.parse::<IpNet>()
                .or_else(|_| text.parse::<std::net::IpAddr>().map(IpNet::from))
                .map_err(|_| {
                    ConfigError::invalid(
                        at,
                        format!("{key}[{j}]"),
                        format!(
                            "{text:?} is neither an IP address nor a CIDR range like 10.0.0.0/8"
                        ),
                    )
                })
        })
        .collect()
}
