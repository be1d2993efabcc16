//! Each request as the libvirt call it names, on the objects it names.

use proxyfleet_libvirt_wire::{
    AddressSource, DomainState, ErrorCode, Handle, Interface, InterfaceAddr, Op, PoolInfo, Value,
    VolumeInfo, WireError,
};
use virt::connect::Connect;
use virt::domain::Domain;
use virt::error::ErrorNumber;
use virt::storage_pool::StoragePool;
use virt::storage_vol::StorageVol;
use virt::stream::Stream;

use crate::objects::{ConnRef, Object, Objects};

/// Runs `op`; `payload` is what a `send` sends.
pub(crate) fn run(objects: &Objects, op: Op, payload: &[u8]) -> Result<Value, WireError> {
    let hold = |object| Ok(Value::Handle(objects.hold(object)));
    let text = |text: Result<String, virt::error::Error>| Ok(Value::Text(text.map_err(wire)?));
    let flag = |yes: Result<bool, virt::error::Error>| Ok(Value::Bool(yes.map_err(wire)?));
    let done = |done: Result<(), virt::error::Error>| done.map(|()| Value::Unit).map_err(wire);
    match op {
        Op::Open { uri } => {
            hold(Object::Connect(ConnRef(Connect::open(Some(&uri)).map_err(wire)?)))
        }
        Op::Release { handle } => {
            match objects.take(handle) {
                // Whatever an unfinished upload sent is thrown away.
                Some(Object::Stream(stream)) => {
                    let taken = stream.lock().unwrap_or_else(|p| p.into_inner()).take();
                    if let Some(stream) = taken {
                        let _ = stream.abort();
                    }
                }
                // Closed or freed as it drops.
                Some(object) => drop(object),
                None => {}
            }
            Ok(Value::Unit)
        }
        Op::IsAlive { conn } => flag(objects.connect(conn)?.0.is_alive()),
        Op::Hostname { conn } => text(objects.connect(conn)?.0.get_hostname()),
        Op::ListDomains { conn } => {
            let domains = objects.connect(conn)?.0.list_all_domains(0).map_err(wire)?;
            Ok(Value::Handles(
                domains.into_iter().map(|d| objects.hold(Object::Domain(d))).collect(),
            ))
        }
        Op::DomainByName { conn, name } => hold(Object::Domain(
            Domain::lookup_by_name(&objects.connect(conn)?.0, &name).map_err(wire)?,
        )),
        Op::DomainByUuid { conn, uuid } => hold(Object::Domain(
            Domain::lookup_by_uuid_string(&objects.connect(conn)?.0, &uuid).map_err(wire)?,
        )),
        Op::DefineDomain { conn, xml } => {
            hold(Object::Domain(Domain::define_xml(&objects.connect(conn)?.0, &xml).map_err(wire)?))
        }
        Op::DomainName { domain } => text(objects.domain(domain)?.get_name()),
        Op::DomainUuid { domain } => text(objects.domain(domain)?.get_uuid_string()),
        Op::DomainState { domain } => {
            let (state, _reason) = objects.domain(domain)?.get_state().map_err(wire)?;
            Ok(Value::State(state_of(state)))
        }
        Op::DomainPersistent { domain } => flag(objects.domain(domain)?.is_persistent()),
        Op::DomainActive { domain } => flag(objects.domain(domain)?.is_active()),
        Op::StartDomain { domain } => done(objects.domain(domain)?.create().map(drop)),
        Op::DestroyDomain { domain } => done(objects.domain(domain)?.destroy()),
        Op::UndefineDomain { domain, nvram } => {
            let domain = objects.domain(domain)?;
            done(if nvram {
                domain.undefine_flags(virt::sys::VIR_DOMAIN_UNDEFINE_NVRAM)
            } else {
                domain.undefine()
            })
        }
        Op::GetMetadata { domain, uri } => text(objects.domain(domain)?.get_metadata(
            virt::sys::VIR_DOMAIN_METADATA_ELEMENT as i32,
            Some(&uri),
            0,
        )),
        Op::SetMetadata { domain, uri, key, xml, config, live } => {
            let mut flags = 0;
            if config {
                flags |= virt::sys::VIR_DOMAIN_AFFECT_CONFIG;
            }
            if live {
                flags |= virt::sys::VIR_DOMAIN_AFFECT_LIVE;
            }
            let set = objects.domain(domain)?.set_metadata(
                virt::sys::VIR_DOMAIN_METADATA_ELEMENT as i32,
                xml.as_deref(),
                Some(&key),
                Some(&uri),
                flags,
            );
            done(set.map(drop))
        }
        Op::InterfaceAddresses { domain, source } => {
            let source = match source {
                AddressSource::Agent => virt::sys::VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT,
                AddressSource::Lease => virt::sys::VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_LEASE,
                AddressSource::Arp => virt::sys::VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_ARP,
            };
            let interfaces =
                objects.domain(domain)?.interface_addresses(source, 0).map_err(wire)?;
            Ok(Value::Interfaces(
                interfaces
                    .into_iter()
                    .map(|iface| Interface {
                        name: iface.name,
                        hwaddr: iface.hwaddr,
                        addrs: iface
                            .addrs
                            .into_iter()
                            .map(|a| InterfaceAddr { addr: a.addr, prefix: a.prefix })
                            .collect(),
                    })
                    .collect(),
            ))
        }
        Op::PoolByName { conn, name } => hold(Object::Pool(
            StoragePool::lookup_by_name(&objects.connect(conn)?.0, &name).map_err(wire)?,
        )),
        Op::PoolByVolume { volume } => hold(Object::Pool(
            StoragePool::lookup_by_volume(&objects.volume(volume)?).map_err(wire)?,
        )),
        Op::PoolName { pool } => text(objects.pool(pool)?.get_name()),
        Op::PoolInfo { pool } => {
            let info = objects.pool(pool)?.get_info().map_err(wire)?;
            Ok(Value::Pool(PoolInfo {
                capacity: info.capacity,
                allocation: info.allocation,
                available: info.available,
            }))
        }
        Op::PoolActive { pool } => flag(objects.pool(pool)?.is_active()),
        Op::RefreshPool { pool } => done(objects.pool(pool)?.refresh(0).map(drop)),
        Op::ListVolumes { pool } => {
            let volumes = objects.pool(pool)?.list_all_volumes(0).map_err(wire)?;
            Ok(Value::Handles(
                volumes.into_iter().map(|v| objects.hold(Object::Volume(v))).collect(),
            ))
        }
        Op::VolumeByName { pool, name } => hold(Object::Volume(
            StorageVol::lookup_by_name(&objects.pool(pool)?, &name).map_err(wire)?,
        )),
        Op::VolumeByPath { conn, path } => hold(Object::Volume(
            StorageVol::lookup_by_path(&objects.connect(conn)?.0, &path).map_err(wire)?,
        )),
        Op::VolumeName { volume } => text(objects.volume(volume)?.get_name()),
        Op::VolumePath { volume } => text(objects.volume(volume)?.get_path()),
        Op::VolumeInfo { volume } => {
            let info = objects.volume(volume)?.get_info().map_err(wire)?;
            Ok(Value::Volume(VolumeInfo { capacity: info.capacity, allocation: info.allocation }))
        }
        Op::VolumeXml { volume } => text(objects.volume(volume)?.get_xml_desc(0)),
        Op::CreateVolume { pool, xml } => hold(Object::Volume(
            StorageVol::create_xml(&objects.pool(pool)?, &xml, 0).map_err(wire)?,
        )),
        Op::CloneVolume { pool, xml, source } => {
            let (pool, source) = (objects.pool(pool)?, objects.volume(source)?);
            hold(Object::Volume(
                StorageVol::create_xml_from(&pool, &xml, &source, 0).map_err(wire)?,
            ))
        }
        Op::DeleteVolume { volume } => done(objects.volume(volume)?.delete(0)),
        Op::NewStream { conn } => {
            let stream = Stream::new(&objects.connect(conn)?.0, 0).map_err(wire)?;
            hold(Object::Stream(std::sync::Arc::new(std::sync::Mutex::new(Some(stream)))))
        }
        Op::Upload { volume, stream: handle, offset, length } => {
            let (volume, stream) = (objects.volume(volume)?, objects.stream(handle)?);
            let stream = stream.lock().unwrap_or_else(|p| p.into_inner());
            let stream = stream.as_ref().ok_or_else(|| ended(handle))?;
            done(volume.upload(stream, offset, length, 0))
        }
        Op::Send { stream: handle } => {
            let stream = objects.stream(handle)?;
            let stream = stream.lock().unwrap_or_else(|p| p.into_inner());
            let stream = stream.as_ref().ok_or_else(|| ended(handle))?;
            let mut sent = 0;
            while sent < payload.len() {
                sent += stream.send(&payload[sent..]).map_err(wire)?;
            }
            Ok(Value::Count(sent as u64))
        }
        Op::Finish { stream } => done(end(objects, stream, Stream::finish)?),
        Op::Abort { stream } => done(end(objects, stream, Stream::abort)?),
    }
}

/// Ends the upload on stream `handle` with `how` (finish or abort); the
/// handle's release frees what is left.
fn end(
    objects: &Objects,
    handle: Handle,
    how: fn(Stream) -> Result<(), virt::error::Error>,
) -> Result<Result<(), virt::error::Error>, WireError> {
    let taken = objects.stream(handle)?.lock().unwrap_or_else(|p| p.into_inner()).take();
    Ok(how(taken.ok_or_else(|| ended(handle))?))
}

fn ended(handle: Handle) -> WireError {
    WireError {
        code: ErrorCode::Helper,
        message: format!("stream {} has finished or aborted already", handle.0),
    }
}

fn state_of(state: virt::sys::virDomainState) -> DomainState {
    match state {
        virt::sys::VIR_DOMAIN_RUNNING => DomainState::Running,
        virt::sys::VIR_DOMAIN_BLOCKED => DomainState::Blocked,
        virt::sys::VIR_DOMAIN_PAUSED => DomainState::Paused,
        virt::sys::VIR_DOMAIN_SHUTDOWN => DomainState::Shutdown,
        virt::sys::VIR_DOMAIN_SHUTOFF => DomainState::Shutoff,
        virt::sys::VIR_DOMAIN_CRASHED => DomainState::Crashed,
        virt::sys::VIR_DOMAIN_PMSUSPENDED => DomainState::Suspended,
        _ => DomainState::NoState,
    }
}

/// libvirt's error as an answer.
fn wire(err: virt::error::Error) -> WireError {
    WireError { code: code_of(err.code()), message: err.message().to_owned() }
}

fn code_of(number: ErrorNumber) -> ErrorCode {
    match number {
        ErrorNumber::NoDomain => ErrorCode::NoDomain,
        ErrorNumber::NoStoragePool => ErrorCode::NoStoragePool,
        ErrorNumber::NoStorageVolume => ErrorCode::NoStorageVolume,
        ErrorNumber::NoDomainMetadata => ErrorCode::NoDomainMetadata,
        ErrorNumber::NoNetwork => ErrorCode::NoNetwork,
        ErrorNumber::DomExist => ErrorCode::DomExist,
        ErrorNumber::StorageVolExist => ErrorCode::StorageVolExist,
        ErrorNumber::OperationInvalid => ErrorCode::OperationInvalid,
        ErrorNumber::XmlError => ErrorCode::XmlError,
        ErrorNumber::XmlDetail => ErrorCode::XmlDetail,
        ErrorNumber::XmlInvalidSchema => ErrorCode::XmlInvalidSchema,
        ErrorNumber::InvalidArg => ErrorCode::InvalidArg,
        ErrorNumber::ConfigUnsupported => ErrorCode::ConfigUnsupported,
        ErrorNumber::NoSupport => ErrorCode::NoSupport,
        ErrorNumber::OperationUnsupported => ErrorCode::OperationUnsupported,
        ErrorNumber::ArgumentUnsupported => ErrorCode::ArgumentUnsupported,
        ErrorNumber::AuthFailed => ErrorCode::AuthFailed,
        ErrorNumber::AuthCancelled => ErrorCode::AuthCancelled,
        ErrorNumber::AuthUnavailable => ErrorCode::AuthUnavailable,
        ErrorNumber::AccessDenied => ErrorCode::AccessDenied,
        ErrorNumber::OperationDenied => ErrorCode::OperationDenied,
        ErrorNumber::SystemError => ErrorCode::SystemError,
        ErrorNumber::Rpc => ErrorCode::Rpc,
        ErrorNumber::NoConnect => ErrorCode::NoConnect,
        ErrorNumber::InvalidConn => ErrorCode::InvalidConn,
        ErrorNumber::OperationTimeout => ErrorCode::OperationTimeout,
        ErrorNumber::AgentUnresponsive => ErrorCode::AgentUnresponsive,
        ErrorNumber::AgentCommandTimeout => ErrorCode::AgentCommandTimeout,
        ErrorNumber::ResourceBusy => ErrorCode::ResourceBusy,
        _ => ErrorCode::Other,
    }
}
