//! The `kvm` provider: each proxy is a libvirt domain on one of the entry's
//! hypervisors, reached over SSH through the host's libvirt capability
//! (the plugin names hosts; the host holds the keys and checks host keys).
//!
//! Per proxy, on the host its placement or its UID picks:
//! - a qcow2 overlay (`<name>.qcow2`) on the entry's base image for the
//!   Proxy's image key (see [`image`]);
//! - a NoCloud seed ISO (`<name>-seed.iso`) with the Proxy's user-data;
//! - a persistent domain `<name>` with both disks, one NIC, a guest-agent
//!   channel and the ownership mark in its metadata, started.
//!
//! `<name>` comes from the Proxy UID, so a retried create finds what an
//! earlier attempt left: a domain of that name with our mark is adopted,
//! one without is a conflict. A create that fails before its domain is
//! defined removes the overlay and seed it made, so nothing unowned is
//! left behind. The provider ID is `<host>/<name>`.
//!
//! See `docs/providers/kvm.md` for prerequisites and the config.

mod address;
mod config;
mod image;
mod lease;
mod xml;

use proxyfleet_sdk::libvirt::{self, AddressSource, DomainInfo, DomainState, LibvirtError};
use proxyfleet_sdk::{
    CallContext, Capabilities, Health, HealthReason, Instance, InstanceState, OwnershipMark,
    PluginInfo, Provider, ProviderError, ProxySpec, Result, export_provider, log,
};

use crate::config::{AddressSourceName, Config, HostConfig, NAME_MAX, config_schema};
use crate::image::Place;
use crate::lease::Lease;

/// The provider exported by this plugin.
struct Kvm;

/// A domain of this entry's, as its provider ID names it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct DomainRef {
    host: String,
    name: String,
}

impl DomainRef {
    fn parse(provider_id: &str) -> Result<Self> {
        match provider_id.split_once('/') {
            Some((host, name)) if !host.is_empty() && config::is_plain_name(name) => {
                Ok(Self { host: host.to_owned(), name: name.to_owned() })
            }
            _ => Err(ProviderError::NotFound(format!(
                "`{provider_id}` is not a kvm provider ID (host/domain)"
            ))),
        }
    }

    fn provider_id(&self) -> String {
        format!("{}/{}", self.host, self.name)
    }

    fn overlay(&self) -> String {
        format!("{}.qcow2", self.name)
    }

    fn seed(&self) -> String {
        format!("{}-seed.iso", self.name)
    }
}

fn domain_name(config: &Config, uid: &str) -> String {
    proxyfleet_sdk::derive_name(&config.name_prefix, uid, NAME_MAX)
}

/// The host a Proxy goes to: its placement's `host`, or one its UID picks.
fn pick_host<'a>(config: &'a Config, spec: &ProxySpec) -> Result<&'a HostConfig> {
    if let Some((_, wanted)) = spec.placement.iter().find(|(key, _)| key == "host") {
        return config.host(wanted).ok_or_else(|| {
            ProviderError::InvalidSpec(format!(
                "placement.host: `{wanted}` is not one of the entry's config key `hosts`"
            ))
        });
    }
    let count = u32::try_from(config.hosts.len()).unwrap_or(u32::MAX);
    let index = proxyfleet_sdk::derive_number(&spec.uid, 0..=count.saturating_sub(1), 0)
        .and_then(|i| usize::try_from(i).ok())
        .unwrap_or(0);
    Ok(&config.hosts[index])
}

/// The storage pool of `host`; a host taken out of the config keeps the
/// entry's `pool` so its domains can still be read and deleted (as long as
/// its grant stays).
fn pool_on<'a>(config: &'a Config, host: &str) -> &'a str {
    config.host(host).map_or(config.pool.as_str(), |host| config.pool_of(host))
}

/// The mark a domain carries for `entry`; `None` when it carries none, or
/// another entry's.
fn read_mark(host: &str, name: &str, entry: &str) -> Result<Option<OwnershipMark>> {
    match libvirt::get_metadata(host, name, xml::MARK_NAMESPACE) {
        Ok(element) => Ok(OwnershipMark::from_xml_attributes(&element)
            .filter(|(owner, _)| owner == entry)
            .map(|(_, mark)| mark)),
        Err(LibvirtError::NotFound(_)) => Ok(None),
        Err(error) => Err(error.into()),
    }
}

fn state_of(state: DomainState) -> InstanceState {
    match state {
        DomainState::NoState => InstanceState::Provisioning,
        DomainState::Running | DomainState::Blocked => InstanceState::Running,
        DomainState::Paused
        | DomainState::Shutdown
        | DomainState::Shutoff
        | DomainState::Suspended => InstanceState::Stopped,
        DomainState::Crashed => InstanceState::Failed,
    }
}

fn wit_source(source: AddressSourceName) -> AddressSource {
    match source {
        AddressSourceName::Agent => AddressSource::Agent,
        AddressSourceName::Lease => AddressSource::Lease,
        AddressSourceName::Arp => AddressSource::Arp,
    }
}

/// How a failed address lookup counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lookup {
    Strict,
    Lenient,
}

/// The instance for a domain of ours: addresses only while it runs.
///
/// `get` reports a failed address lookup (every source failing) as the
/// error it is; a create that has just started the domain reports no
/// address yet instead, since the domain exists and runs either way.
fn instance_of(
    config: &Config,
    domain: &DomainRef,
    info: &DomainInfo,
    mark: Option<OwnershipMark>,
    lookup: Lookup,
) -> Result<Instance> {
    let state = state_of(info.state);
    let addresses = if state == InstanceState::Running {
        let found = address::resolve(&config.address_sources, |source| {
            libvirt::interface_addresses(&domain.host, &domain.name, wit_source(source))
        });
        match (found, lookup) {
            (Ok(addresses), _) => addresses,
            (Err(error), Lookup::Strict) => return Err(error),
            (Err(error), Lookup::Lenient) => {
                log::debug!("no address yet", domain = domain.name, reason = error);
                Vec::new()
            }
        }
    } else {
        Vec::new()
    };
    Ok(Instance {
        provider_id: domain.provider_id(),
        name: domain.name.clone(),
        state,
        addresses,
        port: None,
        created_at: mark.as_ref().map(|mark| mark.created_at),
        mark,
    })
}

/// Adopts the existing domain `domain` for `spec` when it is ours, making
/// sure it runs.
fn adopt(
    ctx: &CallContext,
    config: &Config,
    domain: &DomainRef,
    spec: &ProxySpec,
) -> Result<Instance> {
    let mark = read_mark(&domain.host, &domain.name, &ctx.entry)?;
    match mark {
        Some(mark) if mark.uid == spec.uid => {
            log::info!("adopting our domain", host = domain.host, domain = domain.name);
            start(domain)?;
            let info = libvirt::get_domain(&domain.host, &domain.name)?;
            instance_of(config, domain, &info, Some(mark), Lookup::Lenient)
        }
        Some(mark) => Err(ProviderError::Conflict(format!(
            "domain `{}` on {} belongs to Proxy {}/{} (uid {}), not to uid {}",
            domain.name, domain.host, mark.namespace, mark.name, mark.uid, spec.uid
        ))),
        None => Err(ProviderError::Conflict(format!(
            "domain `{}` on {} exists without this entry's mark; it is not ours to adopt",
            domain.name, domain.host
        ))),
    }
}

/// Starts the domain unless it is up already (an earlier attempt started
/// it); drivers disagree on the error for starting a running domain, so
/// the state is asked first.
fn start(domain: &DomainRef) -> Result<()> {
    let info = libvirt::get_domain(&domain.host, &domain.name)?;
    if matches!(info.state, DomainState::Running | DomainState::Blocked | DomainState::Paused) {
        return Ok(());
    }
    match libvirt::start_domain(&domain.host, &domain.name) {
        // Started meanwhile by a concurrent attempt.
        Ok(()) | Err(LibvirtError::InvalidState(_)) => Ok(()),
        Err(error) => Err(error.into()),
    }
}

fn create(ctx: &CallContext, spec: &ProxySpec) -> Result<Instance> {
    let config = Config::parse(&ctx.config_json())?;
    // The spec is checked before anything is asked of a host.
    let Some(image) = config.images.get(&spec.image) else {
        let known: Vec<&str> = config.images.keys().map(String::as_str).collect();
        return Err(ProviderError::InvalidSpec(format!(
            "image: `{}` is not a key of the entry's config key `images` (known: {})",
            spec.image,
            known.join(", ")
        )));
    };
    config.interface.attachment(spec.network.vlan_tag)?;
    let host = pick_host(&config, spec)?;
    let domain = DomainRef { host: host.name.clone(), name: domain_name(&config, &spec.uid) };
    match libvirt::get_domain(&domain.host, &domain.name) {
        Ok(_) => return adopt(ctx, &config, &domain, spec),
        Err(LibvirtError::NotFound(_)) => {}
        Err(error) => return Err(error.into()),
    }
    let place = Place { host: &domain.host, pool: config.pool_of(host) };
    // One create per domain at a time: the disk steps replace leftovers of
    // earlier attempts, which must never be a concurrent attempt's disks.
    let lease = Lease::take(ctx, create_lease_key(&domain.host, &domain.name), || {
        ProviderError::Transient(format!(
            "another create of domain `{}` on {} is running",
            domain.name, domain.host
        ))
    })?;
    let created = create_leased(ctx, &config, spec, image, place, &domain);
    lease.release();
    created
}

/// The lease a create of domain `name` on `host` holds.
fn create_lease_key(host: &str, name: &str) -> String {
    format!("create/{}/{name}", host.to_ascii_lowercase())
}

/// The create of `domain`, holding its lease.
fn create_leased(
    ctx: &CallContext,
    config: &Config,
    spec: &ProxySpec,
    image: &config::Image,
    place: Place<'_>,
    domain: &DomainRef,
) -> Result<Instance> {
    // The attempt that held the lease before may have got this far.
    match libvirt::get_domain(&domain.host, &domain.name) {
        Ok(_) => return adopt(ctx, config, domain, spec),
        Err(LibvirtError::NotFound(_)) => {}
        Err(error) => return Err(error.into()),
    }
    let attachment = config.interface.attachment(spec.network.vlan_tag)?;
    let base = image::ensure(ctx, place, &spec.image, image)?;
    let mark = OwnershipMark::for_spec(spec, proxyfleet_sdk::now_unix());
    let defined = make_disks(place, domain, &base, image.format, spec).and_then(
        |(overlay_path, seed_path)| {
            let xml = xml::domain(
                config,
                spec,
                &xml::DomainParts {
                    name: &domain.name,
                    entry: &ctx.entry,
                    mark: &mark,
                    overlay_path: &overlay_path,
                    seed_path: &seed_path,
                    attachment: &attachment,
                },
            );
            Ok(libvirt::define_domain(&domain.host, &xml)?)
        },
    );
    if let Err(error) = defined {
        // Whatever the error says, a domain of this name that exists now
        // may be using the disks: adopt it (or refuse it) and keep them.
        match libvirt::get_domain(&domain.host, &domain.name) {
            Ok(_) => return adopt(ctx, config, domain, spec),
            Err(LibvirtError::NotFound(_)) => {}
            Err(lookup) => {
                log::warn!("cannot tell whether the domain exists", error = lookup);
                return Err(error);
            }
        }
        // No domain refers to them, and nothing else would find them.
        for volume in [domain.overlay(), domain.seed()] {
            if let Err(cleanup) = image::delete_volume(place, &volume) {
                log::warn!("could not remove a volume", volume = volume, error = cleanup);
            }
        }
        return Err(error);
    }
    log::info!("domain defined", host = domain.host, domain = domain.name);
    start(domain)?;
    let info = libvirt::get_domain(&domain.host, &domain.name)?;
    instance_of(config, domain, &info, Some(mark), Lookup::Lenient)
}

/// The overlay and the seed of `domain`, made anew (no domain uses them
/// yet); answers their paths.
fn make_disks(
    place: Place<'_>,
    domain: &DomainRef,
    base: &libvirt::Volume,
    base_format: config::ImageFormat,
    spec: &ProxySpec,
) -> Result<(String, String)> {
    const GIB: u64 = 1 << 30;
    // Leftovers of an attempt that failed before defining its domain.
    image::delete_volume(place, &domain.overlay())?;
    image::delete_volume(place, &domain.seed())?;
    let capacity = spec.disk_gib.saturating_mul(GIB).max(base.capacity);
    let overlay = libvirt::create_volume(
        place.host,
        place.pool,
        &xml::volume(&domain.overlay(), capacity, "qcow2", Some((&base.path, base_format))),
    )?;
    let user_data =
        proxyfleet_sdk::cloud_init::user_data(&spec.user_data, spec.proxy_auth.as_ref())?;
    let user_data: &[u8] = if user_data.is_empty() { b"#cloud-config\n{}\n" } else { &user_data };
    let meta_data = format!("instance-id: {0}\nlocal-hostname: {0}\n", domain.name);
    let seed = proxyfleet_sdk::iso::nocloud_seed(user_data, meta_data.as_bytes(), None)?;
    let length = seed.len() as u64;
    let seed_volume = libvirt::create_volume(
        place.host,
        place.pool,
        &xml::volume(&domain.seed(), length, "raw", None),
    )?;
    let upload = libvirt::begin_upload(place.host, place.pool, &domain.seed(), length)?;
    for chunk in seed.chunks(64 * 1024) {
        upload.write(chunk)?;
    }
    libvirt::Upload::finish(upload)?;
    Ok((overlay.path, seed_volume.path))
}

fn get(ctx: &CallContext, provider_id: &str) -> Result<Instance> {
    let config = Config::parse(&ctx.config_json())?;
    let domain = DomainRef::parse(provider_id)?;
    let info = libvirt::get_domain(&domain.host, &domain.name)?;
    let mark = read_mark(&domain.host, &domain.name, &ctx.entry)?;
    instance_of(&config, &domain, &info, mark, Lookup::Strict)
}

fn delete(ctx: &CallContext, provider_id: &str) -> Result<()> {
    let config = Config::parse(&ctx.config_json())?;
    let domain = DomainRef::parse(provider_id)?;
    match libvirt::get_domain(&domain.host, &domain.name) {
        Ok(_) => {
            if read_mark(&domain.host, &domain.name, &ctx.entry)?.is_none() {
                return Err(ProviderError::Conflict(format!(
                    "domain `{}` on {} carries no mark of this entry; it is left alone",
                    domain.name, domain.host
                )));
            }
            match libvirt::destroy_domain(&domain.host, &domain.name) {
                Ok(()) | Err(LibvirtError::InvalidState(_) | LibvirtError::NotFound(_)) => {}
                Err(error) => return Err(error.into()),
            }
            match libvirt::undefine_domain(&domain.host, &domain.name) {
                Ok(()) | Err(LibvirtError::NotFound(_)) => {}
                Err(error) => return Err(error.into()),
            }
            log::info!("domain removed", host = domain.host, domain = domain.name);
        }
        Err(LibvirtError::NotFound(_)) => {}
        Err(error) => return Err(error.into()),
    }
    let place = Place { host: &domain.host, pool: pool_on(&config, &domain.host) };
    image::delete_volume(place, &domain.overlay())?;
    image::delete_volume(place, &domain.seed())
}

fn list(ctx: &CallContext) -> Result<Vec<Instance>> {
    let config = Config::parse(&ctx.config_json())?;
    let mut instances = Vec::new();
    // Any host failing fails the list: a partial one would read as
    // "these instances are gone".
    for host in &config.hosts {
        for info in libvirt::list_domains(&host.name)? {
            let Some(mark) = read_mark(&host.name, &info.name, &ctx.entry)? else { continue };
            let domain = DomainRef { host: host.name.clone(), name: info.name.clone() };
            instances.push(Instance {
                provider_id: domain.provider_id(),
                name: info.name.clone(),
                state: state_of(info.state),
                addresses: Vec::new(),
                port: None,
                created_at: Some(mark.created_at),
                mark: Some(mark),
            });
        }
    }
    Ok(instances)
}

/// Overlays and seeds in `pool` named like this entry's domains whose
/// domain does not exist: what a create cut off at its deadline leaves.
fn stray_volumes(
    config: &Config,
    host: &str,
    pool: &str,
) -> std::result::Result<Vec<String>, LibvirtError> {
    let domains: std::collections::BTreeSet<String> =
        libvirt::list_domains(host)?.into_iter().map(|info| info.name).collect();
    let prefix = format!("{}-", config.name_prefix);
    let mut stray = Vec::new();
    for volume in libvirt::list_volumes(host, pool)? {
        let owner = volume
            .name
            .strip_suffix("-seed.iso")
            .or_else(|| volume.name.strip_suffix(".qcow2"))
            .filter(|owner| {
                owner.strip_prefix(&prefix).is_some_and(|hash| {
                    !hash.is_empty() && hash.chars().all(|c| c.is_ascii_hexdigit())
                })
            });
        let Some(owner) = owner.filter(|owner| !domains.contains(*owner)) else { continue };
        // A create under way has made its disks and not yet its domain.
        let creating = Lease::is_held(&create_lease_key(host, owner))
            .map_err(|err| LibvirtError::Failed(err.message().to_owned()))?;
        if !creating {
            stray.push(volume.name);
        }
    }
    Ok(stray)
}

fn reason_of(error: &LibvirtError) -> HealthReason {
    match error {
        LibvirtError::NotGranted(_) | LibvirtError::Unauthorized(_) => HealthReason::Unauthorized,
        LibvirtError::Timeout(_) => HealthReason::Timeout,
        LibvirtError::Transient(_) => HealthReason::Unreachable,
        _ => HealthReason::Other,
    }
}

fn check(ctx: &CallContext) -> Health {
    let config = match Config::parse(&ctx.config_json()) {
        Ok(config) => config,
        Err(error) => return Health::unhealthy(HealthReason::Misconfigured, error.message()),
    };
    let mut problems = Vec::new();
    let mut warnings = Vec::new();
    for host in &config.hosts {
        let name = &host.name;
        if let Err(error) = libvirt::ping(name) {
            problems.push((reason_of(&error), format!("host {name}: {}", error.message())));
            continue;
        }
        let pool = config.pool_of(host);
        match libvirt::get_pool(name, pool) {
            Ok(info) if !info.active => {
                problems.push((
                    HealthReason::StorageNotFound,
                    format!(
                        "host {name}: storage pool `{pool}` is not active (`virsh pool-start {pool}`)"
                    ),
                ));
                continue;
            }
            Ok(_) => {}
            Err(LibvirtError::NotFound(message)) => {
                problems.push((
                    HealthReason::StorageNotFound,
                    format!("host {name}: storage pool `{pool}` does not exist ({message})"),
                ));
                continue;
            }
            Err(error) => {
                problems.push((reason_of(&error), format!("host {name}: {}", error.message())));
                continue;
            }
        }
        match stray_volumes(&config, name, pool) {
            Ok(stray) if !stray.is_empty() => warnings.push((
                HealthReason::Other,
                format!(
                    "host {name}: volumes named like this entry's with no domain of their name in \
                     pool `{pool}`: {}; a create that was cut off left them, and a retry for its \
                     Proxy replaces them; if the Proxy is gone, delete them by hand",
                    stray.join(", ")
                ),
            )),
            Ok(_) => {}
            Err(error) => {
                warnings.push((reason_of(&error), format!("host {name}: {}", error.message())))
            }
        }
        let place = Place { host: name, pool };
        for (key, image) in &config.images {
            let base = image::base_name(&ctx.entry, key, image);
            match libvirt::get_volume(name, pool, &base) {
                Ok(_) => match image::record(place, &base) {
                    Ok(Some(record)) if !record.published => warnings.push((
                        HealthReason::TemplateNotFound,
                        format!(
                            "host {name}: base image `{base}` in pool `{pool}` is being copied, \
                             or its copy was cut off and the next create redoes it"
                        ),
                    )),
                    Ok(Some(record)) if !record.sha256.eq_ignore_ascii_case(&image.sha256) => {
                        problems.push((
                            HealthReason::TemplateNotFound,
                            image::mismatch(place, &base, key, &record.sha256, &image.sha256)
                                .message()
                                .to_owned(),
                        ));
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => problems.push((
                        HealthReason::TemplateNotFound,
                        format!(
                            "host {name}: base image `{base}` in pool `{pool}` has no digest on \
                             record; creates with image `{key}` will refuse it"
                        ),
                    )),
                    Err(error) => warnings.push((HealthReason::Other, error.message().to_owned())),
                },
                Err(LibvirtError::NotFound(_)) => warnings.push((
                    HealthReason::TemplateNotFound,
                    format!(
                        "host {name}: base image `{base}` is not in pool `{pool}` yet; the first \
                         create with image `{key}` downloads it"
                    ),
                )),
                Err(error) => {
                    problems.push((reason_of(&error), format!("host {name}: {}", error.message())))
                }
            }
        }
    }
    let mut health = Health { healthy: problems.is_empty(), issues: Vec::new() };
    for (reason, message) in problems.into_iter().chain(warnings) {
        health = health.with_issue(reason, message);
    }
    health
}

impl Provider for Kvm {
    fn describe() -> PluginInfo {
        // Image hosts come from the config, so the grants name them; the
        // libvirt hosts are the grants' too.
        PluginInfo::new("kvm", env!("CARGO_PKG_VERSION"), config_schema(), Capabilities::default())
    }

    fn validate_config(config: &str) -> Result<()> {
        Config::parse(config).map(drop)
    }

    fn create(ctx: &CallContext, spec: &ProxySpec) -> Result<Instance> {
        create(ctx, spec)
    }

    fn get(ctx: &CallContext, provider_id: &str) -> Result<Instance> {
        get(ctx, provider_id)
    }

    fn delete(ctx: &CallContext, provider_id: &str) -> Result<()> {
        delete(ctx, provider_id)
    }

    fn list(ctx: &CallContext) -> Result<Vec<Instance>> {
        list(ctx)
    }

    fn check(ctx: &CallContext) -> Health {
        check(ctx)
    }
}

export_provider!(Kvm);

#[cfg(test)]
mod tests {
    use proxyfleet_sdk::Network;

    use super::*;

    fn spec(uid: &str, placement: &[(&str, &str)]) -> ProxySpec {
        ProxySpec {
            installation: "prod".into(),
            name: "p".into(),
            namespace: "ns".into(),
            uid: uid.into(),
            cores: 1,
            memory_mib: 512,
            disk_gib: 0,
            image: "d".into(),
            placement: placement.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect(),
            network: Network { vlan_tag: None },
            port: 8888,
            user_data: Vec::new(),
            labels: Vec::new(),
            proxy_auth: None,
        }
    }

    fn config() -> Config {
        Config::parse(
            r#"{"hosts":[{"name":"a"},{"name":"b","pool":"fast"},{"name":"c"}],"images":{"d":{"url":"https://x/d","sha256":"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"}}}"#,
        )
        .expect("valid")
    }

    #[test]
    fn provider_ids_round_trip_and_reject_paths() {
        let domain = DomainRef { host: "kvm1.lan".into(), name: "pf-abc".into() };
        assert_eq!(DomainRef::parse(&domain.provider_id()).expect("valid"), domain);
        assert_eq!(
            (domain.overlay().as_str(), domain.seed().as_str()),
            ("pf-abc.qcow2", "pf-abc-seed.iso")
        );
        for bad in ["pf-abc", "/pf-abc", "h/../x", "h/a/b"] {
            assert!(DomainRef::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_placement_or_the_uid_picks_the_host() {
        let config = config();
        assert_eq!(pick_host(&config, &spec("u1", &[("host", "B")])).expect("valid").name, "b");
        let err = pick_host(&config, &spec("u1", &[("host", "z")])).expect_err("an error");
        assert!(err.message().contains("placement.host"), "{err:?}");
        let first = pick_host(&config, &spec("u1", &[])).expect("valid").name.clone();
        assert_eq!(pick_host(&config, &spec("u1", &[])).expect("valid").name, first, "stable");
        let spread: std::collections::BTreeSet<String> = (0..64)
            .map(|i| {
                pick_host(&config, &spec(&format!("uid-{i}"), &[])).expect("valid").name.clone()
            })
            .collect();
        assert_eq!(spread.len(), 3, "UIDs spread over every host");
        assert_eq!(config.pool_of(config.host("b").expect("valid")), "fast");
    }

    #[test]
    fn domain_states_map_to_instance_states() {
        assert_eq!(state_of(DomainState::Running), InstanceState::Running);
        assert_eq!(state_of(DomainState::Shutoff), InstanceState::Stopped);
        assert_eq!(state_of(DomainState::Crashed), InstanceState::Failed);
        assert_eq!(state_of(DomainState::NoState), InstanceState::Provisioning);
    }
}
