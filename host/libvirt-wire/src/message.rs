//! The requests the operator sends its libvirt helper and the answers it
//! gets. Every request names the objects it acts on by [`Handle`]; objects
//! a call returns get new handles, which stay valid until released.

use serde::{Deserialize, Serialize};

/// An object the helper holds for the operator: a connection, domain,
/// storage pool, volume or stream. Valid until released, or until the
/// helper exits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Handle(pub u64);

/// One call, answered by the [`Reply`] with the same `id`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    /// Chosen by the operator; unique among the calls in flight.
    pub id: u64,
    /// What to do.
    pub op: Op,
}

/// The answer to the request with the same `id`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reply {
    /// The request's id.
    pub id: u64,
    /// What libvirt answered.
    pub outcome: Result<Value, WireError>,
}

/// Where a domain's interface addresses are read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AddressSource {
    /// The QEMU guest agent.
    Agent,
    /// The DHCP leases of libvirt's networks.
    Lease,
    /// The host's ARP table.
    Arp,
}

/// The libvirt calls the helper makes. Each names the libvirt function it
/// stands for; flags are spelled out as fields.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "call", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Op {
    /// `virConnectOpen`: a connection handle.
    Open { uri: String },
    /// Lets go of a handle: `virConnectClose` for a connection, the
    /// object's free otherwise (a stream not finished is aborted first).
    Release { handle: Handle },
    /// `virConnectIsAlive`.
    IsAlive { conn: Handle },
    /// `virConnectGetHostname`.
    Hostname { conn: Handle },
    /// `virConnectListAllDomains`: domain handles.
    ListDomains { conn: Handle },
    /// `virDomainLookupByName`.
    DomainByName { conn: Handle, name: String },
    /// `virDomainLookupByUUIDString`.
    DomainByUuid { conn: Handle, uuid: String },
    /// `virDomainDefineXML`.
    DefineDomain { conn: Handle, xml: String },
    /// `virDomainGetName`.
    DomainName { domain: Handle },
    /// `virDomainGetUUIDString`.
    DomainUuid { domain: Handle },
    /// `virDomainGetState`.
    DomainState { domain: Handle },
    /// `virDomainIsPersistent`.
    DomainPersistent { domain: Handle },
    /// `virDomainIsActive`.
    DomainActive { domain: Handle },
    /// `virDomainCreate`.
    StartDomain { domain: Handle },
    /// `virDomainDestroy`.
    DestroyDomain { domain: Handle },
    /// `virDomainUndefineFlags` with `VIR_DOMAIN_UNDEFINE_NVRAM` when
    /// `nvram`, `virDomainUndefine` otherwise.
    UndefineDomain { domain: Handle, nvram: bool },
    /// `virDomainGetMetadata` of the element under namespace `uri`.
    GetMetadata { domain: Handle, uri: String },
    /// `virDomainSetMetadata` of the element under namespace `uri`
    /// (removed when `xml` is `None`), in the persistent definition when
    /// `config`, in the running domain when `live`.
    SetMetadata {
        domain: Handle,
        uri: String,
        key: String,
        xml: Option<String>,
        config: bool,
        live: bool,
    },
    /// `virDomainInterfaceAddresses`.
    InterfaceAddresses { domain: Handle, source: AddressSource },
    /// `virStoragePoolLookupByName`.
    PoolByName { conn: Handle, name: String },
    /// `virStoragePoolLookupByVolume`.
    PoolByVolume { volume: Handle },
    /// `virStoragePoolGetName`.
    PoolName { pool: Handle },
    /// `virStoragePoolGetInfo`.
    PoolInfo { pool: Handle },
    /// `virStoragePoolIsActive`.
    PoolActive { pool: Handle },
    /// `virStoragePoolRefresh`.
    RefreshPool { pool: Handle },
    /// `virStoragePoolListAllVolumes`: volume handles.
    ListVolumes { pool: Handle },
    /// `virStorageVolLookupByName`.
    VolumeByName { pool: Handle, name: String },
    /// `virStorageVolLookupByPath`.
    VolumeByPath { conn: Handle, path: String },
    /// `virStorageVolGetName`.
    VolumeName { volume: Handle },
    /// `virStorageVolGetPath`.
    VolumePath { volume: Handle },
    /// `virStorageVolGetInfo`.
    VolumeInfo { volume: Handle },
    /// `virStorageVolGetXMLDesc`.
    VolumeXml { volume: Handle },
    /// `virStorageVolCreateXML`.
    CreateVolume { pool: Handle, xml: String },
    /// `virStorageVolCreateXMLFrom`.
    CloneVolume { pool: Handle, xml: String, source: Handle },
    /// `virStorageVolDelete`.
    DeleteVolume { volume: Handle },
    /// `virStreamNew`.
    NewStream { conn: Handle },
    /// `virStorageVolUpload` of `length` bytes from `offset` into `volume`
    /// through `stream`.
    Upload { volume: Handle, stream: Handle, offset: u64, length: u64 },
    /// `virStreamSend` of the frame's payload; answers how many bytes went.
    Send { stream: Handle },
    /// `virStreamFinish`; the handle stays until released.
    Finish { stream: Handle },
    /// `virStreamAbort`; the handle stays until released.
    Abort { stream: Handle },
}

/// A domain's run state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DomainState {
    /// No state, or one this side does not know.
    NoState,
    /// Running.
    Running,
    /// Blocked on a resource.
    Blocked,
    /// Paused by the user.
    Paused,
    /// Being shut down.
    Shutdown,
    /// Shut off.
    Shutoff,
    /// Crashed.
    Crashed,
    /// Suspended by guest power management.
    Suspended,
}

/// A storage pool's space, as `virStoragePoolGetInfo` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolInfo {
    /// Bytes in all.
    pub capacity: u64,
    /// Bytes allocated.
    pub allocation: u64,
    /// Bytes free.
    pub available: u64,
}

/// A volume's size, as `virStorageVolGetInfo` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeInfo {
    /// Logical size in bytes.
    pub capacity: u64,
    /// Bytes allocated on the host.
    pub allocation: u64,
}

/// One interface of a domain and its addresses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interface {
    /// Interface name as the source reports it.
    pub name: String,
    /// MAC address; empty when unknown.
    pub hwaddr: String,
    /// Its addresses.
    pub addrs: Vec<InterfaceAddr>,
}

/// One address of an interface.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InterfaceAddr {
    /// The IP address.
    pub addr: String,
    /// Prefix length.
    pub prefix: u64,
}

/// What a call answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "value", rename_all = "kebab-case")]
pub enum Value {
    /// Done; nothing to answer.
    Unit,
    /// A new object.
    Handle(Handle),
    /// New objects.
    Handles(Vec<Handle>),
    /// A name, path, UUID or XML text.
    Text(String),
    /// A yes or no.
    Bool(bool),
    /// A count (of bytes sent).
    Count(u64),
    /// A domain's state.
    State(DomainState),
    /// A pool's space.
    Pool(PoolInfo),
    /// A volume's size.
    Volume(VolumeInfo),
    /// A domain's interfaces.
    Interfaces(Vec<Interface>),
}

/// The libvirt error codes the operator tells apart (`virErrorNumber`);
/// every other one is `Other`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[allow(missing_docs, reason = "each is the virErrorNumber of the same name")]
pub enum ErrorCode {
    NoDomain,
    NoStoragePool,
    NoStorageVolume,
    NoDomainMetadata,
    NoNetwork,
    DomExist,
    StorageVolExist,
    OperationInvalid,
    XmlError,
    XmlDetail,
    XmlInvalidSchema,
    InvalidArg,
    ConfigUnsupported,
    NoSupport,
    OperationUnsupported,
    ArgumentUnsupported,
    AuthFailed,
    AuthCancelled,
    AuthUnavailable,
    AccessDenied,
    OperationDenied,
    SystemError,
    Rpc,
    NoConnect,
    InvalidConn,
    OperationTimeout,
    AgentUnresponsive,
    AgentCommandTimeout,
    ResourceBusy,
    /// Any other libvirt error.
    Other,
    /// Not libvirt's: the helper was asked about a handle it does not
    /// hold, or for something it cannot do.
    Helper,
    /// Not libvirt's and never sent: the operator's side reports a helper
    /// that could not start, or exited during the call.
    Unavailable,
}

/// A failed call: libvirt's error code and message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct WireError {
    /// What kind of failure.
    pub code: ErrorCode,
    /// libvirt's message.
    pub message: String,
}
