//! Where a pull's requests may go: the registry itself, and the places it
//! sends the pull to (a blob's redirect to object storage, its token realm)
//! only where the address policy allows.
//!
//! Registries commonly redirect blob downloads to S3 or GCS, so redirects
//! are followed. But a registry, or whoever answers in its name, must not
//! make the host request a cloud metadata service, a link-local address or
//! another special-purpose range, nor loopback or private addresses unless
//! the registry itself lives there (a registry on a private network may
//! well keep its storage beside it). Two checks hold that, both judging
//! addresses by [`proxyfleet_core::address`]:
//!
//! - the redirect policy, before anything is sent: an IP-literal target in
//!   any spelling the URL parser accepts (transports dial a literal without
//!   asking the resolver), a metadata service's name, and more than
//!   [`MAX_REDIRECTS`] redirects in a row;
//! - the resolver, for every name but the registry's own: addresses the
//!   policy refuses are dropped, and a name left with none is refused, so a
//!   name that resolves to such an address reaches nothing.
//!
//! The registry's own host is the operator's choice and is not judged; what
//! it is (loopback, private, or neither) decides what it may send the pull
//! to. A registry reached through a proxy (`HTTPS_PROXY`) has its names
//! resolved by the proxy: there only the redirect policy applies.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, OnceLock};

use proxyfleet_core::address::{AddressKind, classify, is_metadata_name, literal_ip};
use reqwest_oci::Url;
use reqwest_oci::dns::{Addrs, Name, Resolve, Resolving};
use reqwest_oci::redirect::Policy;
use thiserror::Error;

/// The longest chain of redirects a request follows.
pub const MAX_REDIRECTS: usize = 5;

/// A destination a registry sent the pull to that the host refuses.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum RefusedDestination {
    /// An IP-literal host in a refused range.
    #[error("{host} is a {kind} address")]
    Address {
        /// The host as the URL parser read it (`2852039166` is
        /// `169.254.169.254`).
        host: String,
        /// Its range.
        kind: AddressKind,
    },
    /// The name of a cloud metadata service.
    #[error("{host} is a cloud metadata service's name")]
    MetadataName {
        /// The name.
        host: String,
    },
    /// A name whose every address is refused.
    #[error("{host} resolves only to refused addresses ({})", kinds_text(kinds))]
    Resolved {
        /// The name.
        host: String,
        /// The ranges of its addresses.
        kinds: Vec<AddressKind>,
    },
    /// A redirect chain longer than [`MAX_REDIRECTS`].
    #[error("more than {max} redirects in a row")]
    TooManyRedirects {
        /// The longest chain followed.
        max: usize,
    },
}

fn kinds_text(kinds: &[AddressKind]) -> String {
    let names: Vec<&str> = kinds.iter().map(|kind| kind.as_str()).collect();
    names.join(", ")
}

/// The address policy of one registry's requests.
#[derive(Debug)]
pub(crate) struct Destinations {
    /// The registry's host, lower case, without port or brackets.
    registry: String,
    /// Whether the registry is on loopback or a private network: known
    /// from its address, or once its name is first resolved (which its
    /// first request does, before any redirect).
    local: OnceLock<bool>,
}

impl Destinations {
    /// The policy for the registry `registry` (`HOST` or `HOST:PORT`, as
    /// references spell it).
    pub(crate) fn new(registry: &str) -> Arc<Self> {
        let host = host_of(registry).to_ascii_lowercase();
        let local = OnceLock::new();
        if let Some(ip) = literal_ip(&host) {
            let _ = local.set(is_local(ip));
        } else if host == "localhost" {
            let _ = local.set(true);
        }
        Arc::new(Self { registry: host, local })
    }

    /// A redirect policy that follows only what [`Destinations::check`]
    /// allows, and at most [`MAX_REDIRECTS`] redirects in a row.
    pub(crate) fn redirect_policy(self: &Arc<Self>) -> Policy {
        let destinations = Arc::clone(self);
        Policy::custom(move |attempt| {
            // `previous` holds the first URL and each redirect followed.
            if attempt.previous().len() > MAX_REDIRECTS {
                return attempt.error(RefusedDestination::TooManyRedirects { max: MAX_REDIRECTS });
            }
            match destinations.check(attempt.url()) {
                Ok(()) => attempt.follow(),
                Err(refused) => attempt.error(refused),
            }
        })
    }

    /// A resolver that drops the addresses this policy refuses.
    pub(crate) fn resolver(self: &Arc<Self>) -> Arc<GuardedResolver> {
        Arc::new(GuardedResolver { destinations: Arc::clone(self) })
    }

    /// Whether the registry may send the pull to `url`: always to itself;
    /// to an IP literal only outside the refused ranges; to a name unless it
    /// is a metadata service's (its addresses are the resolver's to judge).
    pub(crate) fn check(&self, url: &Url) -> Result<(), RefusedDestination> {
        let Some(host) = url.host_str() else { return Ok(()) };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if self.is_registry(host) {
            return Ok(());
        }
        if let Some(ip) = literal_ip(host) {
            return match self.refused_kind(ip) {
                Some(kind) => Err(RefusedDestination::Address { host: ip.to_string(), kind }),
                None => Ok(()),
            };
        }
        if is_metadata_name(host) {
            return Err(RefusedDestination::MetadataName { host: host.to_owned() });
        }
        Ok(())
    }

    /// The addresses of `name` the pull may reach: all of them for the
    /// registry's own name (which settles whether the registry is local),
    /// the allowed ones for any other, and a refusal when none is.
    pub(crate) fn filter(
        &self,
        name: &str,
        addrs: Vec<SocketAddr>,
    ) -> Result<Vec<SocketAddr>, RefusedDestination> {
        if self.is_registry(name) {
            let _ = self.local.set(!addrs.is_empty() && addrs.iter().all(|a| is_local(a.ip())));
            return Ok(addrs);
        }
        if is_metadata_name(name) {
            return Err(RefusedDestination::MetadataName { host: name.to_owned() });
        }
        let mut kinds = Vec::new();
        let allowed: Vec<SocketAddr> = addrs
            .into_iter()
            .filter(|addr| match self.refused_kind(addr.ip()) {
                Some(kind) => {
                    if !kinds.contains(&kind) {
                        kinds.push(kind);
                    }
                    false
                }
                None => true,
            })
            .collect();
        if allowed.is_empty() && !kinds.is_empty() {
            return Err(RefusedDestination::Resolved { host: name.to_owned(), kinds });
        }
        Ok(allowed)
    }

    fn is_registry(&self, host: &str) -> bool {
        host.trim_end_matches('.').eq_ignore_ascii_case(&self.registry)
    }

    /// The range that keeps `ip` out of reach, or `None`: public addresses
    /// are reachable, loopback and private ones only from a local registry.
    fn refused_kind(&self, ip: IpAddr) -> Option<AddressKind> {
        let kind = classify(ip)?;
        let local = self.local.get().copied().unwrap_or(false);
        let beside_the_registry = kind == AddressKind::Loopback || kind.is_private_network();
        (!(local && beside_the_registry)).then_some(kind)
    }
}

/// Loopback or a private network: where a registry's storage may be too.
fn is_local(ip: IpAddr) -> bool {
    classify(ip).is_some_and(|kind| kind == AddressKind::Loopback || kind.is_private_network())
}

/// `HOST` of `HOST:PORT`, `[V6]:PORT` or `V6`, without brackets.
fn host_of(registry: &str) -> &str {
    if let Some(bracketed) = registry.strip_prefix('[') {
        return bracketed.split_once(']').map_or(bracketed, |(host, _)| host);
    }
    match registry.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => {
            host
        }
        _ => registry,
    }
}

/// The system's resolver (getaddrinfo), with the policy's filter.
#[derive(Debug)]
pub(crate) struct GuardedResolver {
    destinations: Arc<Destinations>,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let destinations = Arc::clone(&self.destinations);
        let name = name.as_str().to_owned();
        Box::pin(async move {
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((name.as_str(), 0)).await?.collect();
            let allowed = destinations.filter(&name, addrs)?;
            Ok(Box::new(allowed.into_iter()) as Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(text: &str) -> Url {
        Url::parse(text).unwrap()
    }

    fn refused(destinations: &Destinations, target: &str) -> Option<RefusedDestination> {
        destinations.check(&url(target)).err()
    }

    /// Issue 43, item 7: a redirect to a metadata or link-local address is
    /// refused in every spelling the URL parser reads as one.
    #[test]
    fn issue_43_item_7_metadata_and_link_local_redirects_are_refused_in_any_spelling() {
        for registry in
            ["registry.example.com", "127.0.0.1:5000", "10.0.0.5:5000", "localhost:5000"]
        {
            let destinations = Destinations::new(registry);
            for target in [
                "http://169.254.169.254/latest/meta-data/",
                "http://2852039166/latest/meta-data/",
                "http://0xa9fea9fe/",
                "http://0251.0376.0251.0376/",
                "http://169.254.43518/",
                "http://[::ffff:169.254.169.254]/",
                "http://[::ffff:a9fe:a9fe]/",
                "http://[fd00:ec2::254]/",
                "https://100.100.100.200/",
            ] {
                assert!(
                    matches!(
                        refused(&destinations, target),
                        Some(RefusedDestination::Address { kind: AddressKind::CloudMetadata, .. })
                    ),
                    "{registry} -> {target}"
                );
            }
            for target in ["http://169.254.1.1/", "http://[fe80::1]/", "http://0.0.0.0/"] {
                assert!(
                    refused(&destinations, target).is_some_and(|refusal| matches!(
                        refusal,
                        RefusedDestination::Address {
                            kind: AddressKind::LinkLocal | AddressKind::NonUnicast,
                            ..
                        }
                    )),
                    "{registry} -> {target}"
                );
            }
            for target in ["http://metadata.google.internal/", "http://METADATA.goog./x"] {
                assert!(
                    matches!(
                        refused(&destinations, target),
                        Some(RefusedDestination::MetadataName { .. })
                    ),
                    "{registry} -> {target}"
                );
            }
            // Public storage is where registries send blobs.
            for target in
                ["https://s3.amazonaws.com/bucket/blob?X-Amz-Signature=x", "https://8.8.8.8/"]
            {
                assert_eq!(refused(&destinations, target), None, "{registry} -> {target}");
            }
        }
    }

    /// Issue 43, item 7: loopback and private targets only from a registry
    /// that is itself on loopback or a private network.
    #[test]
    fn issue_43_item_7_loopback_and_private_targets_only_from_a_local_registry() {
        let public = Destinations::new("registry.example.com");
        assert!(
            public.filter("registry.example.com", vec![([93, 184, 216, 34], 443).into()]).is_ok()
        );
        for target in [
            "http://127.0.0.1/",
            "http://2130706433/",
            "http://127.1/",
            "http://[::1]/",
            "http://[::ffff:127.0.0.1]/",
            "http://10.1.2.3/",
            "http://0x0a.1.2.3/",
            "http://192.168.1.1/",
            "http://[fd12::1]/",
        ] {
            assert!(
                matches!(
                    refused(&public, target),
                    Some(RefusedDestination::Address {
                        kind: AddressKind::Loopback | AddressKind::Private,
                        ..
                    })
                ),
                "{target}"
            );
        }
        for registry in ["127.0.0.1:5000", "localhost:5000", "10.0.0.5", "[::1]:5000"] {
            let local = Destinations::new(registry);
            for target in ["http://127.0.0.1:9000/", "http://10.1.2.3/", "http://[::1]/"] {
                assert_eq!(refused(&local, target), None, "{registry} -> {target}");
            }
        }
        // A registry known by name is local once its name resolves there.
        let named = Destinations::new("registry.internal:5000");
        assert!(refused(&named, "http://10.1.2.3/").is_some(), "not known to be local yet");
        named.filter("registry.internal", vec![([10, 0, 0, 5], 0).into()]).unwrap();
        assert_eq!(refused(&named, "http://10.1.2.3/"), None);
    }

    /// Issue 43, item 7: a name that resolves to a refused address reaches
    /// nothing, resolved by the system's resolver as a request would.
    #[tokio::test]
    async fn issue_43_item_7_a_name_resolving_to_loopback_is_refused_for_a_public_registry() {
        let public = Destinations::new("registry.example.com");
        let resolver = public.resolver();
        let name: Name = "localhost".parse().unwrap();
        let err = match resolver.resolve(name).await {
            Ok(addrs) => panic!("resolved to {:?}", addrs.collect::<Vec<_>>()),
            Err(err) => err,
        };
        let refusal = err.downcast_ref::<RefusedDestination>().expect("the policy refused it");
        assert!(
            matches!(refusal, RefusedDestination::Resolved { host, kinds }
                if host == "localhost" && kinds == &[AddressKind::Loopback]),
            "{refusal:?}"
        );
        // Mixed answers keep only the reachable addresses.
        let mixed = public
            .filter(
                "storage.example.com",
                vec![([169, 254, 169, 254], 0).into(), ([93, 184, 216, 34], 0).into()],
            )
            .unwrap();
        assert_eq!(mixed, vec![SocketAddr::from(([93, 184, 216, 34], 0))]);
        // The same name from a loopback registry resolves.
        let local = Destinations::new("127.0.0.1:5000");
        let name: Name = "localhost".parse().unwrap();
        assert!(local.resolver().resolve(name).await.is_ok());
    }

    #[test]
    fn registry_hosts_lose_their_port_and_brackets() {
        assert_eq!(host_of("ghcr.io"), "ghcr.io");
        assert_eq!(host_of("localhost:5000"), "localhost");
        assert_eq!(host_of("[::1]:5000"), "::1");
        assert_eq!(host_of("::1"), "::1");
        let destinations = Destinations::new("Registry.Example.com:443");
        assert_eq!(refused(&destinations, "https://registry.example.com./v2/"), None);
    }
}
