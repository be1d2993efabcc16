//! The libvirt grant of a provider entry: which hosts, over which SSH
//! key and known_hosts, with which pools, networks and bridges; parsed
//! from the providers file and validated here, beside the capability.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::error::ConfigError;

/// One hypervisor host reached through libvirt over SSH.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LibvirtGrant {
    /// The name plugins address the host by and the SSH server's address;
    /// unique within the entry.
    pub host: String,
    /// SSH port.
    pub port: u16,
    /// SSH user.
    pub user: String,
    /// OpenSSH private key, read on every dial so a rotated key applies to
    /// the next connection.
    pub key_file: PathBuf,
    /// known_hosts file the host's key must be listed in; there is no
    /// trust on first use.
    pub known_hosts_file: PathBuf,
    /// The storage pools the plugin may use on the host: its volumes,
    /// and its domains' disks and backing images, come only from these.
    pub pools: Vec<String>,
    /// The libvirt networks its domains' NICs may attach to.
    pub networks: Vec<String>,
    /// The host bridges its domains' NICs may attach to.
    pub bridges: Vec<String>,
    /// The libvirt socket on the host, forwarded over SSH.
    pub socket: String,
    /// The libvirt driver URI on the host, e.g. `qemu:///system`.
    pub uri: String,
    /// The driver URI for storage pool and volume calls: `uri` unless the
    /// grant names another (a host whose domains are served by a driver
    /// without storage of its own, such as libvirt's `test` driver).
    pub storage_uri: String,
    /// Budget of one libvirt call (the connect included); a call that
    /// runs over it closes its connection.
    pub call_timeout: Duration,
}

/// Where libvirt listens on a host unless a grant says otherwise.
pub const DEFAULT_LIBVIRT_SOCKET: &str = "/var/run/libvirt/libvirt-sock";
/// The driver a grant talks to unless it says otherwise.
pub const DEFAULT_LIBVIRT_URI: &str = "qemu:///system";

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct RawLibvirtGrant {
    host: String,
    port: Option<u16>,
    user: String,
    key_file: PathBuf,
    known_hosts_file: Option<PathBuf>,
    pools: Option<Vec<String>>,
    #[serde(default)]
    networks: Vec<String>,
    #[serde(default)]
    bridges: Vec<String>,
    socket: Option<String>,
    uri: Option<String>,
    storage_uri: Option<String>,
    call_timeout: Option<String>,
}

/// Names of libvirt objects or host interfaces a grant lists: plain
/// names, each once.
fn validate_names(
    at: &str,
    key: &str,
    names: Vec<String>,
    what: &str,
) -> Result<Vec<String>, ConfigError> {
    for (i, name) in names.iter().enumerate() {
        let plain = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '+'));
        if !plain {
            return Err(ConfigError::invalid(
                at,
                format!("{key}[{i}]"),
                format!("{name:?} is not a {what} name"),
            ));
        }
        if names[..i].contains(name) {
            return Err(ConfigError::invalid(
                at,
                format!("{key}[{i}]"),
                format!("{name:?} is listed twice; list each {what} once"),
            ));
        }
    }
    Ok(names)
}

pub(crate) fn validate_libvirt_grants(
    at: &str,
    raw: Vec<RawLibvirtGrant>,
) -> Result<Vec<LibvirtGrant>, ConfigError> {
    let mut grants: Vec<LibvirtGrant> = Vec::with_capacity(raw.len());
    for (i, grant) in raw.into_iter().enumerate() {
        let key = |field: &str| format!("grants.libvirt[{i}].{field}");
        let host = grant.host.trim().to_ascii_lowercase();
        if host.is_empty() || host.contains(['*', '/', '@', ' ']) {
            return Err(ConfigError::invalid(
                at,
                key("host"),
                format!("{:?} must be one host name or IP address", grant.host),
            ));
        }
        if grants.iter().any(|g| g.host == host) {
            return Err(ConfigError::invalid(
                at,
                key("host"),
                format!("{host:?} is granted twice; list each host once"),
            ));
        }
        if grant.user.trim().is_empty() {
            return Err(ConfigError::invalid(at, key("user"), "must name the SSH user"));
        }
        // Without a known_hosts file the host key could only be trusted on
        // first use, which is exactly what lets a man in the middle in.
        let known_hosts_file = grant.known_hosts_file.ok_or_else(|| {
            ConfigError::invalid(
                at,
                key("knownHostsFile"),
                "is required: name a known_hosts file that lists the host's key \
                 (e.g. from `ssh-keyscan -p PORT HOST`, checked out of band)",
            )
        })?;
        let pools = grant.pools.unwrap_or_default();
        if pools.is_empty() {
            return Err(ConfigError::invalid(
                at,
                key("pools"),
                "is required: list the storage pools the plugin may use on this host, e.g. \
                 `pools: [default]`; its disks and images come only from these",
            ));
        }
        let pools = validate_names(at, &key("pools"), pools, "storage pool")?;
        let networks = validate_names(at, &key("networks"), grant.networks, "libvirt network")?;
        let bridges = validate_names(at, &key("bridges"), grant.bridges, "bridge")?;
        let socket = grant.socket.unwrap_or_else(|| DEFAULT_LIBVIRT_SOCKET.to_owned());
        if !socket.starts_with('/') {
            return Err(ConfigError::invalid(
                at,
                key("socket"),
                format!("{socket:?} must be an absolute path on the host"),
            ));
        }
        let uri = grant.uri.unwrap_or_else(|| DEFAULT_LIBVIRT_URI.to_owned());
        check_driver_uri(at, &key("uri"), &uri)?;
        let storage_uri = grant.storage_uri.unwrap_or_else(|| uri.clone());
        check_driver_uri(at, &key("storageUri"), &storage_uri)?;
        let call_timeout = match grant.call_timeout {
            None => Duration::from_secs(30),
            Some(text) => match humantime::parse_duration(&text) {
                Ok(d) if !d.is_zero() => d,
                _ => {
                    return Err(ConfigError::invalid(
                        at,
                        key("callTimeout"),
                        format!("{text:?} is not a positive duration such as \"30s\""),
                    ));
                }
            },
        };
        grants.push(LibvirtGrant {
            host,
            port: grant.port.unwrap_or(22),
            user: grant.user,
            key_file: grant.key_file,
            known_hosts_file,
            pools,
            networks,
            bridges,
            socket,
            uri,
            storage_uri,
            call_timeout,
        });
    }
    Ok(grants)
}

/// A driver URI the host can route through its own transport.
fn check_driver_uri(at: &str, key: &str, uri: &str) -> Result<(), ConfigError> {
    match uri.split_once("://") {
        Some((scheme, rest))
            if !scheme.is_empty()
                && scheme.bytes().all(|b| b.is_ascii_alphanumeric())
                && !rest.contains("socket=") =>
        {
            Ok(())
        }
        _ => Err(ConfigError::invalid(
            at,
            key,
            format!(
                "{uri:?} must be a local driver URI such as \"qemu:///system\"; the \
                 transport (SSH to the host and `socket`) is the host's to choose"
            ),
        )),
    }
}
