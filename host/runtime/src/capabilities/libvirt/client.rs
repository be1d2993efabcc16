//! libvirt's objects as the capability uses them: each method is one call
//! to the helper (see `helper`), named as virt names the libvirt function
//! it stands for. Methods block; call them on blocking threads.

use std::sync::Arc;

use proxyfleet_libvirt_wire::{
    AddressSource, DomainState, ErrorCode, Handle, Interface, Op, PoolInfo, Value, VolumeInfo,
    WireError,
};

use super::helper::{LibvirtHelper, Process};

/// A failed libvirt call: libvirt's code and message.
pub(crate) type VirtError = WireError;

/// An object the helper holds, released when dropped.
#[derive(Debug)]
struct Object {
    process: Arc<Process>,
    handle: Handle,
}

impl Drop for Object {
    fn drop(&mut self) {
        self.process.release(self.handle);
    }
}

impl Object {
    fn call(&self, op: impl FnOnce(Handle) -> Op) -> Result<Value, VirtError> {
        self.process.call(op(self.handle), &[])
    }

    /// A call answering a new object of the same helper.
    fn object(&self, op: impl FnOnce(Handle) -> Op) -> Result<Object, VirtError> {
        let value = self.call(op)?;
        Ok(Object { process: Arc::clone(&self.process), handle: expect_handle(value)? })
    }

    fn objects(&self, op: impl FnOnce(Handle) -> Op) -> Result<Vec<Object>, VirtError> {
        match self.call(op)? {
            Value::Handles(handles) => Ok(handles
                .into_iter()
                .map(|handle| Object { process: Arc::clone(&self.process), handle })
                .collect()),
            other => Err(unexpected(&other)),
        }
    }

    fn text(&self, op: impl FnOnce(Handle) -> Op) -> Result<String, VirtError> {
        match self.call(op)? {
            Value::Text(text) => Ok(text),
            other => Err(unexpected(&other)),
        }
    }

    fn flag(&self, op: impl FnOnce(Handle) -> Op) -> Result<bool, VirtError> {
        match self.call(op)? {
            Value::Bool(yes) => Ok(yes),
            other => Err(unexpected(&other)),
        }
    }

    fn unit(&self, op: impl FnOnce(Handle) -> Op) -> Result<(), VirtError> {
        match self.call(op)? {
            Value::Unit => Ok(()),
            other => Err(unexpected(&other)),
        }
    }
}

fn expect_handle(value: Value) -> Result<Handle, VirtError> {
    match value {
        Value::Handle(handle) => Ok(handle),
        other => Err(unexpected(&other)),
    }
}

fn unexpected(value: &Value) -> VirtError {
    WireError {
        code: ErrorCode::Helper,
        message: format!("the libvirt helper answered {value:?}, which this call does not expect"),
    }
}

/// A connection to a libvirt driver. Clones share it; the last one to go
/// closes it.
#[derive(Debug, Clone)]
pub(crate) struct Connect(Arc<Object>);

impl Connect {
    /// `virConnectOpen`, in the helper (started if need be).
    pub(crate) fn open(helper: &LibvirtHelper, uri: &str) -> Result<Self, VirtError> {
        let process = helper.process()?;
        let handle = expect_handle(process.call(Op::Open { uri: uri.to_owned() }, &[])?)?;
        Ok(Self(Arc::new(Object { process, handle })))
    }

    pub(crate) fn is_alive(&self) -> Result<bool, VirtError> {
        self.0.flag(|conn| Op::IsAlive { conn })
    }

    pub(crate) fn get_hostname(&self) -> Result<String, VirtError> {
        self.0.text(|conn| Op::Hostname { conn })
    }

    pub(crate) fn list_all_domains(&self) -> Result<Vec<Domain>, VirtError> {
        Ok(self.0.objects(|conn| Op::ListDomains { conn })?.into_iter().map(Domain).collect())
    }
}

/// A domain.
#[derive(Debug)]
pub(crate) struct Domain(Object);

impl Domain {
    pub(crate) fn lookup_by_name(conn: &Connect, name: &str) -> Result<Self, VirtError> {
        conn.0.object(|conn| Op::DomainByName { conn, name: name.to_owned() }).map(Self)
    }

    pub(crate) fn lookup_by_uuid_string(conn: &Connect, uuid: &str) -> Result<Self, VirtError> {
        conn.0.object(|conn| Op::DomainByUuid { conn, uuid: uuid.to_owned() }).map(Self)
    }

    pub(crate) fn define_xml(conn: &Connect, xml: &str) -> Result<Self, VirtError> {
        conn.0.object(|conn| Op::DefineDomain { conn, xml: xml.to_owned() }).map(Self)
    }

    pub(crate) fn get_name(&self) -> Result<String, VirtError> {
        self.0.text(|domain| Op::DomainName { domain })
    }

    pub(crate) fn get_uuid_string(&self) -> Result<String, VirtError> {
        self.0.text(|domain| Op::DomainUuid { domain })
    }

    pub(crate) fn get_state(&self) -> Result<DomainState, VirtError> {
        match self.0.call(|domain| Op::DomainState { domain })? {
            Value::State(state) => Ok(state),
            other => Err(unexpected(&other)),
        }
    }

    pub(crate) fn is_persistent(&self) -> Result<bool, VirtError> {
        self.0.flag(|domain| Op::DomainPersistent { domain })
    }

    pub(crate) fn is_active(&self) -> Result<bool, VirtError> {
        self.0.flag(|domain| Op::DomainActive { domain })
    }

    pub(crate) fn create(&self) -> Result<(), VirtError> {
        self.0.unit(|domain| Op::StartDomain { domain })
    }

    pub(crate) fn destroy(&self) -> Result<(), VirtError> {
        self.0.unit(|domain| Op::DestroyDomain { domain })
    }

    /// Removes the definition, and its NVRAM when `nvram`.
    pub(crate) fn undefine(&self, nvram: bool) -> Result<(), VirtError> {
        self.0.unit(|domain| Op::UndefineDomain { domain, nvram })
    }

    /// The metadata element under namespace `uri`.
    pub(crate) fn get_metadata(&self, uri: &str) -> Result<String, VirtError> {
        self.0.text(|domain| Op::GetMetadata { domain, uri: uri.to_owned() })
    }

    /// Sets (or with `xml` of `None` removes) the metadata element under
    /// `uri`, in the definition when `config`, in the running domain when
    /// `live`.
    pub(crate) fn set_metadata(
        &self,
        uri: &str,
        key: &str,
        xml: Option<&str>,
        config: bool,
        live: bool,
    ) -> Result<(), VirtError> {
        self.0.unit(|domain| Op::SetMetadata {
            domain,
            uri: uri.to_owned(),
            key: key.to_owned(),
            xml: xml.map(str::to_owned),
            config,
            live,
        })
    }

    pub(crate) fn interface_addresses(
        &self,
        source: AddressSource,
    ) -> Result<Vec<Interface>, VirtError> {
        match self.0.call(|domain| Op::InterfaceAddresses { domain, source })? {
            Value::Interfaces(interfaces) => Ok(interfaces),
            other => Err(unexpected(&other)),
        }
    }
}

/// A storage pool.
#[derive(Debug)]
pub(crate) struct StoragePool(Object);

impl StoragePool {
    pub(crate) fn lookup_by_name(conn: &Connect, name: &str) -> Result<Self, VirtError> {
        conn.0.object(|conn| Op::PoolByName { conn, name: name.to_owned() }).map(Self)
    }

    pub(crate) fn lookup_by_volume(vol: &StorageVol) -> Result<Self, VirtError> {
        vol.0.object(|volume| Op::PoolByVolume { volume }).map(Self)
    }

    pub(crate) fn get_name(&self) -> Result<String, VirtError> {
        self.0.text(|pool| Op::PoolName { pool })
    }

    pub(crate) fn get_info(&self) -> Result<PoolInfo, VirtError> {
        match self.0.call(|pool| Op::PoolInfo { pool })? {
            Value::Pool(info) => Ok(info),
            other => Err(unexpected(&other)),
        }
    }

    pub(crate) fn is_active(&self) -> Result<bool, VirtError> {
        self.0.flag(|pool| Op::PoolActive { pool })
    }

    pub(crate) fn refresh(&self) -> Result<(), VirtError> {
        self.0.unit(|pool| Op::RefreshPool { pool })
    }

    pub(crate) fn list_all_volumes(&self) -> Result<Vec<StorageVol>, VirtError> {
        Ok(self.0.objects(|pool| Op::ListVolumes { pool })?.into_iter().map(StorageVol).collect())
    }
}

/// A storage volume.
#[derive(Debug)]
pub(crate) struct StorageVol(Object);

impl StorageVol {
    pub(crate) fn lookup_by_name(pool: &StoragePool, name: &str) -> Result<Self, VirtError> {
        pool.0.object(|pool| Op::VolumeByName { pool, name: name.to_owned() }).map(Self)
    }

    pub(crate) fn lookup_by_path(conn: &Connect, path: &str) -> Result<Self, VirtError> {
        conn.0.object(|conn| Op::VolumeByPath { conn, path: path.to_owned() }).map(Self)
    }

    pub(crate) fn create_xml(pool: &StoragePool, xml: &str) -> Result<Self, VirtError> {
        pool.0.object(|pool| Op::CreateVolume { pool, xml: xml.to_owned() }).map(Self)
    }

    pub(crate) fn create_xml_from(
        pool: &StoragePool,
        xml: &str,
        source: &StorageVol,
    ) -> Result<Self, VirtError> {
        let source = source.0.handle;
        pool.0.object(|pool| Op::CloneVolume { pool, xml: xml.to_owned(), source }).map(Self)
    }

    pub(crate) fn get_name(&self) -> Result<String, VirtError> {
        self.0.text(|volume| Op::VolumeName { volume })
    }

    pub(crate) fn get_path(&self) -> Result<String, VirtError> {
        self.0.text(|volume| Op::VolumePath { volume })
    }

    pub(crate) fn get_info(&self) -> Result<VolumeInfo, VirtError> {
        match self.0.call(|volume| Op::VolumeInfo { volume })? {
            Value::Volume(info) => Ok(info),
            other => Err(unexpected(&other)),
        }
    }

    pub(crate) fn get_xml_desc(&self) -> Result<String, VirtError> {
        self.0.text(|volume| Op::VolumeXml { volume })
    }

    pub(crate) fn delete(&self) -> Result<(), VirtError> {
        self.0.unit(|volume| Op::DeleteVolume { volume })
    }

    /// Starts uploading `length` bytes from `offset` through `stream`.
    pub(crate) fn upload(
        &self,
        stream: &Stream,
        offset: u64,
        length: u64,
    ) -> Result<(), VirtError> {
        let stream = stream.0.handle;
        self.0.unit(|volume| Op::Upload { volume, stream, offset, length })
    }
}

/// A stream carrying an upload.
#[derive(Debug)]
pub(crate) struct Stream(Object);

impl Stream {
    pub(crate) fn new(conn: &Connect) -> Result<Self, VirtError> {
        conn.0.object(|conn| Op::NewStream { conn }).map(Self)
    }

    /// Sends all of `data`; how many bytes went.
    pub(crate) fn send(&self, data: &[u8]) -> Result<usize, VirtError> {
        match self.0.process.call(Op::Send { stream: self.0.handle }, data)? {
            Value::Count(sent) => Ok(usize::try_from(sent).unwrap_or(usize::MAX)),
            other => Err(unexpected(&other)),
        }
    }

    pub(crate) fn finish(self) -> Result<(), VirtError> {
        self.0.unit(|stream| Op::Finish { stream })
    }

    pub(crate) fn abort(self) -> Result<(), VirtError> {
        self.0.unit(|stream| Op::Abort { stream })
    }
}
