//! Where a crawler may send a request through the gateway.
//!
//! The fleet's proxies run inside provider networks, next to cloud
//! metadata services, the nodes and (in a cluster) the Kubernetes API: a
//! request the gateway hands to a proxy is fetched from there. So the
//! gateway judges every target before it picks a proxy:
//!
//! 1. a name of a cloud metadata service is refused outright;
//! 2. any other name is resolved here, once; an IP literal is read the way
//!    transports read URLs (`2852039166` is 169.254.169.254);
//! 3. each address is judged ([`TargetPolicy::judge`]) and the first one
//!    allowed is the target: the proxy is asked for that address, never
//!    for the name, so it cannot resolve the name again to somewhere else.
//!
//! Refusals answer 403 with an RFC 9209 `Proxy-Status` header naming the
//! reason.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use ipnet::IpNet;
use proxyfleet_core::address::{self, AddressKind};

/// How long the host's own interface addresses are taken as known before
/// they are read again.
const LOCAL_ADDRESSES_FOR: Duration = Duration::from_secs(30);

/// Resolves target names; the system resolver in production.
#[async_trait]
pub trait Resolve: Send + Sync + fmt::Debug {
    /// The addresses `host` resolves to, in the resolver's order.
    async fn resolve(&self, host: &str) -> std::io::Result<Vec<IpAddr>>;
}

/// The system resolver (getaddrinfo, through tokio's blocking pool).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

#[async_trait]
impl Resolve for SystemResolver {
    async fn resolve(&self, host: &str) -> std::io::Result<Vec<IpAddr>> {
        let addresses = tokio::net::lookup_host((host, 0)).await?;
        Ok(addresses.map(|address| address.ip()).collect())
    }
}

/// What the gateway lets crawlers reach.
#[derive(Debug, Clone)]
pub struct TargetPolicy {
    /// Special-purpose ranges crawlers may reach after all
    /// (`--gateway-allow-targets`); never a metadata address, never the
    /// operator's own listeners.
    pub allow: Vec<IpNet>,
    /// Ranges crawlers may never reach, public or not
    /// (`--gateway-deny-targets`): the cluster's service and pod ranges,
    /// say. They win over `allow`.
    pub deny: Vec<IpNet>,
    /// The operator's own listeners (API, gateway, metrics).
    pub own: OwnAddresses,
}

impl Default for TargetPolicy {
    fn default() -> Self {
        Self { allow: Vec::new(), deny: Vec::new(), own: OwnAddresses::new(Vec::new(), Vec::new()) }
    }
}

/// Why a target is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetRefusal {
    /// A name of a cloud metadata service.
    MetadataName(String),
    /// An address no crawler may reach.
    Prohibited { ip: IpAddr, why: Prohibited },
    /// The name did not resolve.
    Unresolved { host: String, error: String },
    /// The resolver did not answer in time.
    ResolveTimeout { host: String, after: Duration },
}

/// What kind of address a refused target is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prohibited {
    /// A special-purpose address not in `--gateway-allow-targets`
    /// (metadata ones never are).
    Special(AddressKind),
    /// In `--gateway-deny-targets`.
    Denied,
    /// One of the operator's own listeners.
    Own,
}

impl TargetRefusal {
    /// The RFC 9209 error type of the `Proxy-Status` header.
    pub fn error_type(&self) -> &'static str {
        match self {
            Self::MetadataName(_) | Self::Prohibited { .. } => "destination_ip_prohibited",
            Self::Unresolved { .. } => "dns_error",
            Self::ResolveTimeout { .. } => "dns_timeout",
        }
    }
}

impl fmt::Display for TargetRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::MetadataName(host) => {
                write!(f, "{host} names a cloud metadata service, which crawlers may not reach")
            }
            Self::Prohibited { ip, why: Prohibited::Special(kind) } => {
                let fix = if *kind == AddressKind::CloudMetadata {
                    "crawlers may never reach it"
                } else {
                    "an operator can allow such targets with --gateway-allow-targets"
                };
                write!(f, "the target {ip} is a {kind} address; {fix}")
            }
            Self::Prohibited { ip, why: Prohibited::Denied } => {
                write!(f, "the target {ip} is in --gateway-deny-targets")
            }
            Self::Prohibited { ip, why: Prohibited::Own } => {
                write!(f, "the target {ip} is this operator's own listener")
            }
            Self::Unresolved { host, error } => {
                write!(f, "the name {host} does not resolve: {error}")
            }
            Self::ResolveTimeout { host, after } => {
                write!(f, "the name {host} did not resolve within {after:?}")
            }
        }
    }
}

impl TargetPolicy {
    /// Why `target` may not be reached, or `None`.
    pub fn judge(&self, target: SocketAddr) -> Option<Prohibited> {
        let ip = target.ip();
        if address::is_metadata(ip) {
            return Some(Prohibited::Special(AddressKind::CloudMetadata));
        }
        if self.own.contains(target) {
            return Some(Prohibited::Own);
        }
        if self.deny.iter().any(|net| covers(net, ip)) {
            return Some(Prohibited::Denied);
        }
        address::refused_kind(ip, &self.allow).map(Prohibited::Special)
    }

    /// The address to send a request for `host:port` to: `host` read as
    /// an IP literal, or resolved once by `resolver` within `budget`; the
    /// first address allowed wins.
    pub async fn target(
        &self,
        resolver: &dyn Resolve,
        host: &str,
        port: u16,
        budget: Duration,
    ) -> Result<SocketAddr, TargetRefusal> {
        let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
        let addresses = match address::literal_ip(host) {
            Some(ip) => vec![ip],
            None if address::is_metadata_name(host) => {
                return Err(TargetRefusal::MetadataName(host.to_owned()));
            }
            None => match tokio::time::timeout(budget, resolver.resolve(host)).await {
                Err(_) => {
                    return Err(TargetRefusal::ResolveTimeout {
                        host: host.to_owned(),
                        after: budget,
                    });
                }
                Ok(Err(err)) => {
                    return Err(TargetRefusal::Unresolved {
                        host: host.to_owned(),
                        error: err.to_string(),
                    });
                }
                Ok(Ok(addresses)) => addresses,
            },
        };
        let mut first_refusal = None;
        for ip in addresses {
            let target = SocketAddr::new(ip, port);
            match self.judge(target) {
                None => return Ok(target),
                Some(why) => {
                    first_refusal.get_or_insert(TargetRefusal::Prohibited { ip, why });
                }
            }
        }
        Err(first_refusal.unwrap_or_else(|| TargetRefusal::Unresolved {
            host: host.to_owned(),
            error: "no address".to_owned(),
        }))
    }
}

/// Whether `net` holds `ip`, also when `ip` carries an IPv4 address in an
/// IPv6 form (`::ffff:10.0.0.1`, `64:ff9b::a00:1` are denied by
/// `10.0.0.0/8`), as the address policy reads them.
fn covers(net: &IpNet, ip: IpAddr) -> bool {
    net.contains(&ip) || address::embedded_ipv4(ip).is_some_and(|v4| net.contains(&IpAddr::V4(v4)))
}

/// The operator's own listeners, as targets: a listener on a specific
/// address is that socket address; one on the unspecified address is its
/// port on every address of this host (read from the interfaces, again
/// every [`LOCAL_ADDRESSES_FOR`]) and on loopback. `extra` are further
/// addresses of this operator's (a pod's own IP, the API server a cluster
/// gives it) refused on every port.
#[derive(Debug, Clone)]
pub struct OwnAddresses {
    listeners: Vec<SocketAddr>,
    extra: Vec<IpAddr>,
    local: Arc<Mutex<Option<LocalAddresses>>>,
}

/// This host's interface addresses and when they were read.
type LocalAddresses = (Instant, Vec<IpAddr>);

impl OwnAddresses {
    /// Own addresses from the listeners' local addresses and `extra`.
    pub fn new(listeners: Vec<SocketAddr>, extra: Vec<IpAddr>) -> Self {
        Self { listeners, extra, local: Arc::default() }
    }

    /// Whether `target` reaches one of them.
    pub fn contains(&self, target: SocketAddr) -> bool {
        let ip = plain(target.ip());
        if self.extra.iter().any(|own| plain(*own) == ip) {
            return true;
        }
        let on_port: Vec<&SocketAddr> =
            self.listeners.iter().filter(|listener| listener.port() == target.port()).collect();
        if on_port.is_empty() {
            return false;
        }
        if on_port.iter().any(|listener| plain(listener.ip()) == ip) {
            return true;
        }
        // A listener on 0.0.0.0 or :: answers on every local address.
        on_port.iter().any(|listener| listener.ip().is_unspecified())
            && (ip.is_loopback() || ip.is_unspecified() || self.is_local(ip))
    }

    fn is_local(&self, ip: IpAddr) -> bool {
        let mut local = self.local.lock().unwrap_or_else(PoisonError::into_inner);
        let fresh = local.as_ref().is_some_and(|(read, _)| read.elapsed() < LOCAL_ADDRESSES_FOR);
        if !fresh {
            let addresses = match if_addrs::get_if_addrs() {
                Ok(interfaces) => interfaces.into_iter().map(|interface| interface.ip()).collect(),
                Err(err) => {
                    tracing::warn!("gateway: cannot list this host's addresses: {err}");
                    Vec::new()
                }
            };
            *local = Some((Instant::now(), addresses));
        }
        local.as_ref().is_some_and(|(_, addresses)| addresses.iter().any(|own| plain(*own) == ip))
    }
}

/// `ip` as the IPv4 address it carries when it is an IPv6 form of one
/// (mapped, translated, NAT64, 6to4), so that every spelling of an own
/// address compares equal.
fn plain(ip: IpAddr) -> IpAddr {
    address::embedded_ipv4(ip).map_or(ip, IpAddr::V4)
}

#[cfg(test)]
pub(crate) mod tests;
