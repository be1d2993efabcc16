//! The `{{name}}` provider: each Proxy is a libvirt domain on the entry's
//! hypervisor, named after the Proxy's UID so that a retried create finds
//! what an earlier attempt made, with the ownership mark in its metadata so
//! that `list` can tell ours from anyone else's. Its disk is a qcow2
//! overlay on a base volume of the pool; a NoCloud seed carries the
//! Proxy's user-data and proxy credential.

mod config;
mod domain;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use proxyfleet_sdk::libvirt::{self, AddressSource, DomainInfo, DomainState, LibvirtError};
use proxyfleet_sdk::{
    CallContext, Capabilities, Health, HealthReason, Instance, InstanceState, OwnershipMark,
    PluginInfo, Provider, ProviderError, ProxySpec, Result, cloud_init, derive_name,
    export_provider, iso, log, now_unix,
};

use crate::config::{Config, config_schema};

/// Longest domain name: short enough for the volume names built from it.
const NAME_MAX: usize = 40;

struct Plugin;

impl Provider for Plugin {
    fn describe() -> PluginInfo {
        // Hypervisors are granted per entry (grants.libvirt); no HTTP.
        PluginInfo::new(
            "{{name}}",
            env!("CARGO_PKG_VERSION"),
            config_schema(),
            Capabilities::default(),
        )
    }

    fn validate_config(config: &str) -> Result<()> {
        Config::parse(config).map(drop)
    }

    fn create(ctx: &CallContext, spec: &ProxySpec) -> Result<Instance> {
        let config = Config::parse(&ctx.config_json())?;
        // The spec is checked before the hypervisor is asked anything.
        let Some(base) = config.images.get(&spec.image) else {
            return Err(ProviderError::InvalidSpec(format!(
                "image: `{}` is not a key of the entry's config key `images`",
                spec.image
            )));
        };
        if let Some(tag) = spec.network.vlan_tag {
            return Err(ProviderError::InvalidSpec(format!(
                "network.vlanTag: {tag} cannot be served: the entry attaches proxies to the \
                 untagged libvirt network `{}`",
                config.network
            )));
        }
        if let Some((key, _)) = spec.placement.first() {
            return Err(ProviderError::InvalidSpec(format!(
                "placement.{key}: this provider places every proxy on the entry's one host; \
                 remove the key"
            )));
        }
        let name = derive_name(&config.name_prefix, &spec.uid, NAME_MAX);
        match libvirt::get_domain(&config.host, &name) {
            // An earlier attempt defined it before its answer was lost.
            Ok(_) => return adopt(ctx, &config, &name, spec),
            Err(LibvirtError::NotFound(_)) => {}
            Err(error) => return Err(error.into()),
        }
        let base = libvirt::get_volume(&config.host, &config.pool, base)?;
        let disks = make_disks(&config, &name, &base, spec)?;
        let mark = OwnershipMark::for_spec(spec, now_unix());
        let xml = domain::domain(
            &config,
            spec,
            &name,
            &ctx.entry,
            &mark,
            (&disks.0, &disks.1),
        );
        match libvirt::define_domain(&config.host, &xml) {
            Ok(_) => {}
            // Defined meanwhile by another attempt: ours if it carries our mark.
            Err(LibvirtError::Exists(_)) => return adopt(ctx, &config, &name, spec),
            Err(error) => return Err(error.into()),
        }
        log::info!("domain defined", domain = name);
        start(&config, &name)?;
        instance(
            &config,
            &libvirt::get_domain(&config.host, &name)?,
            Some(mark),
        )
    }

    fn get(ctx: &CallContext, provider_id: &str) -> Result<Instance> {
        let config = Config::parse(&ctx.config_json())?;
        let info = libvirt::get_domain(&config.host, provider_id)?;
        instance(&config, &info, read_mark(&config, provider_id, &ctx.entry)?)
    }

    fn delete(ctx: &CallContext, provider_id: &str) -> Result<()> {
        let config = Config::parse(&ctx.config_json())?;
        match libvirt::get_domain(&config.host, provider_id) {
            Ok(_) => {
                if read_mark(&config, provider_id, &ctx.entry)?.is_none() {
                    return Err(ProviderError::Conflict(format!(
                        "domain `{provider_id}` carries no mark of this entry; it is left alone"
                    )));
                }
                match libvirt::destroy_domain(&config.host, provider_id) {
                    Ok(()) | Err(LibvirtError::InvalidState(_) | LibvirtError::NotFound(_)) => {}
                    Err(error) => return Err(error.into()),
                }
                match libvirt::undefine_domain(&config.host, provider_id) {
                    Ok(()) | Err(LibvirtError::NotFound(_)) => {}
                    Err(error) => return Err(error.into()),
                }
                log::info!("domain removed", domain = provider_id);
            }
            Err(LibvirtError::NotFound(_)) => {}
            Err(error) => return Err(error.into()),
        }
        // Every attempt's disks: the domain's, and those of attempts that
        // lost (stopped before defining it, or beaten to it).
        let prefix = volume_prefix(provider_id);
        for volume in libvirt::list_volumes(&config.host, &config.pool)? {
            if volume.name.starts_with(&prefix) {
                delete_volume(&config, &volume.name, cleanup_deadline(ctx))?;
            }
        }
        Ok(())
    }

    fn list(ctx: &CallContext) -> Result<Vec<Instance>> {
        let config = Config::parse(&ctx.config_json())?;
        let mut instances = Vec::new();
        for info in libvirt::list_domains(&config.host)? {
            // Only domains with this entry's mark: the rest are not ours.
            if let Some(mark) = read_mark(&config, &info.name, &ctx.entry)? {
                instances.push(instance(&config, &info, Some(mark))?);
            }
        }
        Ok(instances)
    }

    fn check(ctx: &CallContext) -> Health {
        let config = match Config::parse(&ctx.config_json()) {
            Ok(config) => config,
            Err(error) => return Health::unhealthy(HealthReason::Misconfigured, error.to_string()),
        };
        if let Err(error) = libvirt::ping(&config.host) {
            return Health::unhealthy(reason_of(&error), error.message().to_owned());
        }
        let mut health = Health::healthy();
        for volume in config.images.values() {
            match libvirt::get_volume(&config.host, &config.pool, volume) {
                Ok(_) => {}
                Err(LibvirtError::NotFound(_)) => {
                    health = Health::unhealthy(
                        HealthReason::TemplateNotFound,
                        format!("base volume `{volume}` is not in pool `{}`", config.pool),
                    );
                }
                Err(error) => {
                    return Health::unhealthy(reason_of(&error), error.message().to_owned());
                }
            }
        }
        health
    }
}

export_provider!(Plugin);

fn reason_of(error: &LibvirtError) -> HealthReason {
    match error {
        LibvirtError::NotGranted(_) | LibvirtError::Unauthorized(_) => HealthReason::Unauthorized,
        LibvirtError::Timeout(_) => HealthReason::Timeout,
        LibvirtError::NotFound(_) => HealthReason::StorageNotFound,
        _ => HealthReason::Unreachable,
    }
}

/// What the names of domain `name`'s volumes start with.
fn volume_prefix(name: &str) -> String {
    format!("{name}-")
}

/// Until when a delete waits for a volume an interrupted attempt is still
/// making: half the time the call has left, so the rest of it fits.
fn cleanup_deadline(ctx: &CallContext) -> Instant {
    Instant::now() + ctx.deadline() / 2
}

/// Deletes `volume` if it exists. An interrupted attempt (a create the
/// host stopped at its deadline) may still be allocating it on the
/// hypervisor, which refuses the delete until it is done: that is waited
/// out until `deadline`, then reported as transient for the host to retry.
fn delete_volume(config: &Config, volume: &str, deadline: Instant) -> Result<()> {
    const POLL: Duration = Duration::from_millis(200);
    loop {
        match libvirt::delete_volume(&config.host, &config.pool, volume) {
            Ok(()) | Err(LibvirtError::NotFound(_)) => return Ok(()),
            Err(LibvirtError::InvalidState(message)) if Instant::now() + POLL < deadline => {
                log::debug!("volume busy; waiting", volume = volume, reason = message);
                std::thread::sleep(POLL);
            }
            Err(LibvirtError::InvalidState(message)) => {
                return Err(ProviderError::Transient(format!(
                    "volume `{volume}` is still being made by an earlier attempt ({message}); retry"
                )));
            }
            Err(error) => return Err(error.into()),
        }
    }
}

/// A new overlay and seed for domain `name`; answers their paths. Each
/// attempt names its own (`<name>-<attempt>.qcow2`, `-seed.iso`), so an
/// attempt never touches disks another one (stopped by the host, its
/// calls perhaps still running on the hypervisor) is making or has given
/// to the domain; `delete` removes every attempt's.
fn make_disks(
    config: &Config,
    name: &str,
    base: &libvirt::Volume,
    spec: &ProxySpec,
) -> Result<(String, String)> {
    const GIB: u64 = 1 << 30;
    let attempt = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |t| t.as_nanos());
    let prefix = volume_prefix(name);
    let (overlay_name, seed_name) = (
        format!("{prefix}{attempt:x}.qcow2"),
        format!("{prefix}{attempt:x}-seed.iso"),
    );
    let capacity = spec.disk_gib.saturating_mul(GIB).max(base.capacity);
    let overlay = libvirt::create_volume(
        &config.host,
        &config.pool,
        &domain::volume(&overlay_name, capacity, "qcow2", Some(&base.path)),
    )?;
    // The proxy's credential travels in the seed, where the proxy reads
    // it, and nowhere else.
    let user_data = cloud_init::user_data(&spec.user_data, spec.proxy_auth.as_ref())?;
    let user_data: &[u8] = if user_data.is_empty() {
        b"#cloud-config\n{}\n"
    } else {
        &user_data
    };
    let meta_data = format!("instance-id: {name}\nlocal-hostname: {name}\n");
    let seed = iso::nocloud_seed(user_data, meta_data.as_bytes(), None)?;
    let length = seed.len() as u64;
    let seed_volume = libvirt::create_volume(
        &config.host,
        &config.pool,
        &domain::volume(&seed_name, length, "raw", None),
    )?;
    let upload = libvirt::begin_upload(&config.host, &config.pool, &seed_name, length)?;
    for chunk in seed.chunks(64 * 1024) {
        upload.write(chunk)?;
    }
    libvirt::Upload::finish(upload)?;
    Ok((overlay.path, seed_volume.path))
}

/// The mark domain `name` carries for `entry`; `None` when it carries
/// none, or another entry's.
fn read_mark(config: &Config, name: &str, entry: &str) -> Result<Option<OwnershipMark>> {
    match libvirt::get_metadata(&config.host, name, domain::MARK_NAMESPACE) {
        Ok(element) => Ok(OwnershipMark::from_xml_attributes(&element)
            .filter(|(owner, _)| owner == entry)
            .map(|(_, mark)| mark)),
        Err(LibvirtError::NotFound(_)) => Ok(None),
        Err(error) => Err(error.into()),
    }
}

/// Adopts the existing domain `name` for `spec` when it is ours, making
/// sure it runs.
fn adopt(ctx: &CallContext, config: &Config, name: &str, spec: &ProxySpec) -> Result<Instance> {
    match read_mark(config, name, &ctx.entry)? {
        Some(mark) if mark.uid == spec.uid => {
            log::info!("adopting our domain", domain = name);
            start(config, name)?;
            instance(
                config,
                &libvirt::get_domain(&config.host, name)?,
                Some(mark),
            )
        }
        _ => Err(ProviderError::Conflict(format!(
            "domain `{name}` exists and is not this Proxy's; it is left alone"
        ))),
    }
}

/// Starts the domain unless it runs already (an earlier attempt started
/// it); drivers disagree on the error for starting a running domain, so
/// the state is asked first.
fn start(config: &Config, name: &str) -> Result<()> {
    let info = libvirt::get_domain(&config.host, name)?;
    if matches!(
        info.state,
        DomainState::Running | DomainState::Blocked | DomainState::Paused
    ) {
        return Ok(());
    }
    match libvirt::start_domain(&config.host, name) {
        Ok(()) | Err(LibvirtError::InvalidState(_)) => Ok(()),
        Err(error) => Err(error.into()),
    }
}

/// The contract's view of a domain: its addresses from the guest agent or
/// the network's DHCP leases, none while it boots.
fn instance(config: &Config, info: &DomainInfo, mark: Option<OwnershipMark>) -> Result<Instance> {
    let state = match info.state {
        DomainState::Running | DomainState::Blocked => InstanceState::Running,
        DomainState::Paused
        | DomainState::Suspended
        | DomainState::Shutdown
        | DomainState::Shutoff => InstanceState::Stopped,
        DomainState::Crashed => InstanceState::Failed,
        DomainState::NoState => InstanceState::Provisioning,
    };
    let mut addresses = Vec::new();
    if state == InstanceState::Running {
        for source in [AddressSource::Agent, AddressSource::Lease] {
            match libvirt::interface_addresses(&config.host, &info.name, source) {
                Ok(found) if !found.is_empty() => {
                    addresses = found.into_iter().map(|address| address.address).collect();
                    break;
                }
                // Not there yet, or not offered by this source: the next.
                Ok(_) | Err(_) => {}
            }
        }
    }
    Ok(Instance {
        provider_id: info.name.clone(),
        name: info.name.clone(),
        state,
        addresses,
        port: None,
        created_at: mark.as_ref().map(|mark| mark.created_at),
        mark,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_schema_says_what_validate_config_accepts() {
        proxyfleet_sdk_testkit::assert_config_schema::<Plugin>(&serde_json::json!({
            "host": "hypervisor.example",
            "images": { "debian-12": "debian-12-base.qcow2" }
        }));
    }

    #[test]
    fn a_spec_for_an_unknown_image_is_refused_before_libvirt_is_asked() {
        let kit = proxyfleet_sdk_testkit::TestKit::<Plugin>::new(&serde_json::json!({
            "host": "hypervisor.example",
            "images": { "debian-12": "debian-12-base.qcow2" }
        }))
        .expect("a valid config");
        let mut spec = proxyfleet_sdk_testkit::spec("web-1");
        spec.image = "alpine".into();
        assert!(
            matches!(kit.create(&spec), Err(ProviderError::InvalidSpec(m)) if m.starts_with("image"))
        );
    }

    #[test]
    fn a_vlan_or_a_placement_is_refused_naming_the_field() {
        let kit = proxyfleet_sdk_testkit::TestKit::<Plugin>::new(&serde_json::json!({
            "host": "hypervisor.example",
            "images": { "debian-12": "debian-12-base.qcow2" }
        }))
        .expect("a valid config");
        let mut tagged = proxyfleet_sdk_testkit::spec("web-1");
        tagged.network.vlan_tag = Some(42);
        assert!(
            matches!(kit.create(&tagged), Err(ProviderError::InvalidSpec(m)) if m.starts_with("network.vlanTag"))
        );
        let mut placed = proxyfleet_sdk_testkit::spec("web-1");
        placed.placement.push(("host".into(), "other".into()));
        assert!(
            matches!(kit.create(&placed), Err(ProviderError::InvalidSpec(m)) if m.starts_with("placement.host"))
        );
    }
}
