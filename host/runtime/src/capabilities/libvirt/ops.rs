//! The typed operations plugins get on a granted host: storage pools and
//! volumes (with streaming upload), domains, their metadata, and interface
//! addresses from the guest agent or the host's lease and ARP tables.
//! Each is one budgeted call on the host's pooled connection.

use std::sync::{Arc, Mutex};

use proxyfleet_libvirt_wire::ErrorCode;
pub use proxyfleet_libvirt_wire::{AddressSource, DomainState};

use super::client::{Connect, Domain, StoragePool, StorageVol, Stream, VirtError};
use super::pool::{CallError, Clients, HostPool, Link};
use super::scope::Refresh;
use super::{LibvirtError, allow_list, owner, scope};

/// A storage pool's state and space.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolInfo {
    /// Pool name.
    pub name: String,
    /// Whether the pool is started.
    pub active: bool,
    /// Bytes in all.
    pub capacity: u64,
    /// Bytes allocated.
    pub allocation: u64,
    /// Bytes free.
    pub available: u64,
}

/// A storage volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Volume {
    /// Name within its pool.
    pub name: String,
    /// Path on the host, for disk definitions.
    pub path: String,
    /// Logical size in bytes.
    pub capacity: u64,
    /// Bytes allocated on the host.
    pub allocation: u64,
}

/// A domain's identity and state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainInfo {
    /// Name.
    pub name: String,
    /// UUID, lower-case with dashes.
    pub uuid: String,
    /// Run state.
    pub state: DomainState,
    /// Whether a definition outlives a stop.
    pub persistent: bool,
}

/// One address of one interface of a domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterfaceAddress {
    /// Interface name as the source reports it.
    pub interface: String,
    /// MAC address, when known.
    pub mac: Option<String>,
    /// The IP address.
    pub address: String,
    /// Prefix length.
    pub prefix: u8,
}

fn pool(conn: &Connect, name: &str) -> Result<StoragePool, VirtError> {
    StoragePool::lookup_by_name(conn, name)
}

/// What the calls of one entry on one host need to know in the blocking
/// closure: the host's name, the entry, the granted pools.
#[derive(Clone)]
struct Scope {
    host: String,
    entry: String,
    pools: Vec<String>,
    networks: Vec<String>,
    bridges: Vec<String>,
}

/// Held from the check of a definition's name and UUID to its define, so
/// two entries defining the same name at once cannot both pass the check
/// and the second take over the first's domain. Defines are rare and
/// bounded by their call budget; one lock for the process is enough.
static DEFINING: Mutex<()> = Mutex::new(());

impl Scope {
    /// Domain `name`, when it belongs to this entry; `NotFound` otherwise,
    /// whoever made it.
    fn domain(&self, clients: &Clients, name: &str) -> Result<Domain, CallError> {
        let dom = Domain::lookup_by_name(clients.domains(), name)?;
        if owner::owns(&dom, &self.entry)? {
            Ok(dom)
        } else {
            Err(CallError::Refused(self.not_ours(name)))
        }
    }

    fn not_ours(&self, name: &str) -> LibvirtError {
        LibvirtError::NotFound(format!(
            "no domain {name:?} of this entry on {}; domains other entries or anyone else \
             defined are not visible to it",
            self.host
        ))
    }

    /// Refuses a domain named `name` or with UUID `uuid` that exists and
    /// is not this entry's: a plugin may replace only its own definitions.
    fn claim(&self, clients: &Clients, name: &str, uuid: Option<&str>) -> Result<(), CallError> {
        let found = |lookup: Result<Domain, VirtError>| match lookup {
            Ok(dom) => Ok(Some(dom)),
            Err(err) if err.code == ErrorCode::NoDomain => Ok(None),
            Err(err) => Err(err),
        };
        let by_name = found(Domain::lookup_by_name(clients.domains(), name))?;
        let by_uuid = match uuid {
            Some(uuid) => found(Domain::lookup_by_uuid_string(clients.domains(), uuid))?,
            None => None,
        };
        for dom in by_name.iter().chain(&by_uuid) {
            if !owner::owns(dom, &self.entry)? {
                return Err(CallError::Refused(LibvirtError::Exists(format!(
                    "domain {:?} on {} exists and is not this entry's; choose another name \
                     and UUID",
                    dom.get_name()?,
                    self.host
                ))));
            }
        }
        Ok(())
    }

    fn pools(&self) -> scope::Pools<'_> {
        scope::Pools { host: &self.host, granted: &self.pools }
    }
}

/// Refuses the host's own metadata namespace (libvirt compares namespace
/// URIs as plain strings, as this does).
fn plugin_namespace(uri: &str) -> Result<(), LibvirtError> {
    if uri == owner::NAMESPACE {
        return Err(LibvirtError::Invalid(format!(
            "metadata namespace {uri} is the host's own; use a namespace of the plugin's"
        )));
    }
    Ok(())
}

fn volume_of(vol: &StorageVol) -> Result<Volume, VirtError> {
    let info = vol.get_info()?;
    Ok(Volume {
        name: vol.get_name()?,
        path: vol.get_path()?,
        capacity: info.capacity,
        allocation: info.allocation,
    })
}

fn domain_of(dom: &Domain) -> Result<DomainInfo, VirtError> {
    Ok(DomainInfo {
        name: dom.get_name()?,
        uuid: dom.get_uuid_string()?,
        state: dom.get_state()?,
        persistent: dom.is_persistent()?,
    })
}

impl HostPool {
    fn scope(&self) -> Scope {
        let grant = self.grant();
        Scope {
            host: grant.host.clone(),
            entry: self.entry().to_owned(),
            pools: grant.pools.clone(),
            networks: grant.networks.clone(),
            bridges: grant.bridges.clone(),
        }
    }

    /// The host's name as libvirt reports it: a cheap round trip that
    /// proves SSH, forwarding and libvirt all work.
    pub async fn ping(&self) -> Result<String, LibvirtError> {
        self.call("ping", |c| Ok(c.domains().get_hostname()?)).await
    }

    /// A storage pool's state and space.
    pub async fn pool_info(&self, name: &str) -> Result<PoolInfo, LibvirtError> {
        self.scope().pools().check(name)?;
        let name = name.to_owned();
        self.call("pool-info", move |c| {
            let pool = pool(c.storage(), &name)?;
            let info = pool.get_info()?;
            Ok(PoolInfo {
                name: pool.get_name()?,
                active: pool.is_active()?,
                capacity: info.capacity,
                allocation: info.allocation,
                available: info.available,
            })
        })
        .await
    }

    /// Every volume of a pool, refreshed first so files changed behind
    /// libvirt's back are seen.
    pub async fn list_volumes(&self, pool_name: &str) -> Result<Vec<Volume>, LibvirtError> {
        self.scope().pools().check(pool_name)?;
        let pool_name = pool_name.to_owned();
        self.call("volume-list", move |c| {
            let pool = pool(c.storage(), &pool_name)?;
            // Not every driver refreshes; a stale list is still a list.
            let _ = pool.refresh();
            Ok(pool.list_all_volumes()?.iter().map(volume_of).collect::<Result<_, _>>()?)
        })
        .await
    }

    /// One volume; `NotFound` when the pool has none of that name.
    pub async fn volume(&self, pool_name: &str, name: &str) -> Result<Volume, LibvirtError> {
        self.scope().pools().check(pool_name)?;
        let (pool_name, name) = (pool_name.to_owned(), name.to_owned());
        self.call("volume-lookup", move |c| {
            Ok(volume_of(&StorageVol::lookup_by_name(&pool(c.storage(), &pool_name)?, &name)?)?)
        })
        .await
    }

    /// Creates a volume from its XML definition; `Exists` when the name is
    /// taken. The XML passes the allow-list, and a backing volume must be
    /// in a granted pool.
    pub async fn create_volume(&self, pool_name: &str, xml: &str) -> Result<Volume, LibvirtError> {
        let scope = self.scope();
        scope.pools().check(pool_name)?;
        let checked = allow_list::check_volume(xml)?;
        let (pool_name, xml) = (pool_name.to_owned(), xml.to_owned());
        self.call("volume-create", move |c| {
            // Creating an overlay opens its backing chain on the host.
            if let Some(backing) = &checked.backing {
                scope
                    .pools()
                    .reader(c.storage(), Refresh::Required)
                    .chain("backingStore", backing)?;
            }
            Ok(volume_of(&StorageVol::create_xml(&pool(c.storage(), &pool_name)?, &xml)?)?)
        })
        .await
    }

    /// Creates a volume from its XML definition with the content of another
    /// volume of the same pool (how a verified upload is published under
    /// its final name).
    pub async fn clone_volume(
        &self,
        pool_name: &str,
        xml: &str,
        source: &str,
    ) -> Result<Volume, LibvirtError> {
        let scope = self.scope();
        scope.pools().check(pool_name)?;
        let checked = allow_list::check_volume(xml)?;
        let (pool_name, xml, source) = (pool_name.to_owned(), xml.to_owned(), source.to_owned());
        self.call("volume-clone", move |c| {
            let mut chains = scope.pools().reader(c.storage(), Refresh::Required);
            if let Some(backing) = &checked.backing {
                chains.chain("backingStore", backing)?;
            }
            let pool = pool(c.storage(), &pool_name)?;
            let source = StorageVol::lookup_by_name(&pool, &source)?;
            // A clone reads the source's whole chain as its header names it.
            let source_path = source.get_path()?;
            chains.chain("clone source", &source_path)?;
            let source = StorageVol::lookup_by_path(c.storage(), &source_path)?;
            Ok(volume_of(&StorageVol::create_xml_from(&pool, &xml, &source)?)?)
        })
        .await
    }

    /// Deletes a volume; `NotFound` when it is gone already.
    pub async fn delete_volume(&self, pool_name: &str, name: &str) -> Result<(), LibvirtError> {
        self.scope().pools().check(pool_name)?;
        let (pool_name, name) = (pool_name.to_owned(), name.to_owned());
        self.call("volume-delete", move |c| {
            Ok(StorageVol::lookup_by_name(&pool(c.storage(), &pool_name)?, &name)?.delete()?)
        })
        .await
    }

    /// Starts uploading `length` bytes into an existing volume. Send the
    /// bytes with [`Upload::write`] and end with [`Upload::finish`]; an
    /// upload dropped before it finished is aborted.
    pub async fn begin_upload(
        self: &Arc<Self>,
        pool_name: &str,
        name: &str,
        length: u64,
    ) -> Result<Upload, LibvirtError> {
        self.scope().pools().check(pool_name)?;
        let (pool_name, name) = (pool_name.to_owned(), name.to_owned());
        self.spanned("upload-begin", async {
            let deadline = self.deadline();
            let link = self.link_by(deadline).await?;
            let stream = self
                .run_on(&link, deadline, "upload-begin", move |c| {
                    let vol = StorageVol::lookup_by_name(&pool(c.storage(), &pool_name)?, &name)?;
                    let stream = Stream::new(c.storage())?;
                    vol.upload(&stream, 0, length)?;
                    Ok(stream)
                })
                .await?;
            Ok(Upload {
                host: Arc::clone(self),
                link,
                stream: Arc::new(Mutex::new(Some(stream))),
                remaining: length,
            })
        })
        .await
    }

    /// Defines a persistent domain from XML (replacing the definition of
    /// one of this entry's with the same name and UUID). The XML passes
    /// the allow-list, its disks and their backing chains are volumes of
    /// the granted pools, no other entry's or foreign domain has its name
    /// or UUID, and the host records the entry as its owner.
    pub async fn define_domain(&self, xml: &str) -> Result<DomainInfo, LibvirtError> {
        let scope = self.scope();
        let attachments =
            allow_list::Attachments { networks: &scope.networks, bridges: &scope.bridges };
        let checked = allow_list::check_domain(
            xml,
            owner::NAMESPACE,
            &owner::element(&scope.entry),
            attachments,
        )?;
        self.call("domain-define", move |c| {
            let mut reader = scope.pools().reader(c.storage(), Refresh::BestEffort);
            let mut chains = Vec::with_capacity(checked.disks.len());
            for disk in &checked.disks {
                chains.push(scope::backing_store(&reader.disk_chain(&disk.source)?));
            }
            let _defining = DEFINING.lock().unwrap_or_else(|p| p.into_inner());
            scope.claim(c, &checked.name, checked.uuid.as_deref())?;
            Ok(domain_of(&Domain::define_xml(c.domains(), &checked.assemble(&chains))?)?)
        })
        .await
    }

    /// Starts a defined domain; `InvalidState` when it runs already.
    pub async fn start_domain(&self, name: &str) -> Result<(), LibvirtError> {
        let (scope, name) = (self.scope(), name.to_owned());
        self.call("domain-start", move |c| Ok(scope.domain(c, &name)?.create()?)).await
    }

    /// Stops a domain at once; `InvalidState` when it is not running.
    pub async fn destroy_domain(&self, name: &str) -> Result<(), LibvirtError> {
        let (scope, name) = (self.scope(), name.to_owned());
        self.call("domain-destroy", move |c| Ok(scope.domain(c, &name)?.destroy()?)).await
    }

    /// Removes a domain's definition (and its NVRAM, if any).
    pub async fn undefine_domain(&self, name: &str) -> Result<(), LibvirtError> {
        let (scope, name) = (self.scope(), name.to_owned());
        self.call("domain-undefine", move |c| {
            let dom = scope.domain(c, &name)?;
            // Not every driver knows the NVRAM flag; plain undefine then.
            let undefined = dom.undefine(true).or_else(|err| match err.code {
                ErrorCode::InvalidArg | ErrorCode::NoSupport | ErrorCode::ArgumentUnsupported => {
                    dom.undefine(false)
                }
                _ => Err(err),
            });
            Ok(undefined?)
        })
        .await
    }

    /// One domain of this entry; `NotFound` when there is none of that
    /// name, or it is not this entry's.
    pub async fn domain(&self, name: &str) -> Result<DomainInfo, LibvirtError> {
        let (scope, name) = (self.scope(), name.to_owned());
        self.call("domain-lookup", move |c| Ok(domain_of(&scope.domain(c, &name)?)?)).await
    }

    /// Every domain of this entry, running or not.
    pub async fn list_domains(&self) -> Result<Vec<DomainInfo>, LibvirtError> {
        let scope = self.scope();
        self.call("domain-list", move |c| {
            let mut ours = Vec::new();
            for dom in c.domains().list_all_domains()? {
                // A domain undefined after the listing (by another entry,
                // or another call of this one) is gone, not an error: at
                // the ownership check or while its details are read.
                match owner::owns(&dom, &scope.entry)
                    .and_then(|owned| owned.then(|| domain_of(&dom)).transpose())
                {
                    Ok(Some(info)) => ours.push(info),
                    Ok(None) => {}
                    Err(err) if err.code == ErrorCode::NoDomain => {}
                    Err(err) => return Err(err.into()),
                }
            }
            Ok(ours)
        })
        .await
    }

    /// The metadata element under namespace `uri`; `NotFound` when the
    /// domain has none.
    pub async fn metadata(&self, name: &str, uri: &str) -> Result<String, LibvirtError> {
        plugin_namespace(uri)?;
        let (scope, name, uri) = (self.scope(), name.to_owned(), uri.to_owned());
        self.call("metadata-get", move |c| Ok(scope.domain(c, &name)?.get_metadata(&uri)?)).await
    }

    /// Sets (or with `xml` of `None` removes) the metadata element under
    /// namespace `uri` with prefix `key`, in the persistent definition and,
    /// while the domain runs, in the live one.
    pub async fn set_metadata(
        &self,
        name: &str,
        uri: &str,
        key: &str,
        xml: Option<&str>,
    ) -> Result<(), LibvirtError> {
        plugin_namespace(uri)?;
        let (scope, name, uri, key) =
            (self.scope(), name.to_owned(), uri.to_owned(), key.to_owned());
        let xml = xml.map(str::to_owned);
        self.call("metadata-set", move |c| {
            let dom = scope.domain(c, &name)?;
            let (config, live) = (dom.is_persistent()?, dom.is_active()?);
            Ok(dom.set_metadata(&uri, &key, xml.as_deref(), config, live)?)
        })
        .await
    }

    /// The domain's interface addresses as `source` knows them. An empty
    /// list is an answer ("none yet"); any failure, a dead connection
    /// included, is an error.
    pub async fn interface_addresses(
        &self,
        name: &str,
        source: AddressSource,
    ) -> Result<Vec<InterfaceAddress>, LibvirtError> {
        let (scope, name) = (self.scope(), name.to_owned());
        self.call("interface-addresses", move |c| {
            let interfaces = scope.domain(c, &name)?.interface_addresses(source)?;
            Ok(interfaces
                .into_iter()
                .flat_map(|iface| {
                    let (interface, mac) = (iface.name, iface.hwaddr);
                    iface.addrs.into_iter().map(move |addr| InterfaceAddress {
                        interface: interface.clone(),
                        mac: Some(mac.clone()).filter(|m| !m.is_empty()),
                        address: addr.addr,
                        prefix: u8::try_from(addr.prefix).unwrap_or(u8::MAX),
                    })
                })
                .collect())
        })
        .await
    }
}

/// An upload in progress into one volume, on the connection it began on.
/// Dropped unfinished, it is aborted; if that connection dies, every
/// further write fails `transient` and the volume holds a partial image
/// (which is why plugins upload under a temporary name).
pub struct Upload {
    host: Arc<HostPool>,
    link: Arc<Link>,
    stream: Arc<Mutex<Option<Stream>>>,
    remaining: u64,
}

impl std::fmt::Debug for Upload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upload")
            .field("host", &self.host.grant().host)
            .field("remaining", &self.remaining)
            .finish_non_exhaustive()
    }
}

impl Upload {
    /// Bytes still to send.
    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    /// Sends the next chunk; more than announced is refused.
    pub async fn write(&mut self, chunk: Vec<u8>) -> Result<(), LibvirtError> {
        let len = chunk.len() as u64;
        if len > self.remaining {
            return Err(LibvirtError::Invalid(format!(
                "chunk of {len} bytes exceeds the {} bytes left of the announced length",
                self.remaining
            )));
        }
        let stream = Arc::clone(&self.stream);
        let host = Arc::clone(&self.host);
        host.spanned("upload-write", async {
            let deadline = host.deadline();
            host.run_on(&self.link, deadline, "upload-write", move |_| {
                let guard = stream.lock().unwrap_or_else(|p| p.into_inner());
                let Some(stream) = guard.as_ref() else {
                    return Err(CallError::Refused(closed_stream()));
                };
                let mut sent = 0;
                while sent < chunk.len() {
                    sent += stream.send(&chunk[sent..])?;
                }
                Ok(())
            })
            .await
        })
        .await?;
        self.remaining -= len;
        Ok(())
    }

    /// Completes the upload; fails unless every announced byte was sent.
    pub async fn finish(self) -> Result<(), LibvirtError> {
        if self.remaining != 0 {
            return Err(LibvirtError::Invalid(format!(
                "upload ended {} bytes short of its announced length",
                self.remaining
            )));
        }
        let stream = Arc::clone(&self.stream);
        let host = Arc::clone(&self.host);
        host.spanned("upload-finish", async {
            let deadline = host.deadline();
            host.run_on(&self.link, deadline, "upload-finish", move |_| {
                let taken = stream.lock().unwrap_or_else(|p| p.into_inner()).take();
                match taken {
                    Some(stream) => Ok(stream.finish()?),
                    None => Err(CallError::Refused(closed_stream())),
                }
            })
            .await
        })
        .await
    }
}

impl Drop for Upload {
    fn drop(&mut self) {
        // Never wait for the stream's lock here, on an async thread: a
        // cancelled write may hold it while it sends on a blocking thread.
        let taken = match self.stream.try_lock() {
            Ok(mut stream) => Some(stream.take()),
            Err(std::sync::TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner().take()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        };
        if matches!(taken, Some(None)) || self.link.is_dead() {
            return;
        }
        // Aborting talks to the host: off the async threads, and bounded
        // like any call (an abort that hangs kills the connection).
        let (host, link, shared) =
            (Arc::clone(&self.host), Arc::clone(&self.link), Arc::clone(&self.stream));
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let deadline = host.deadline();
                let _ = host
                    .run_on(&link, deadline, "upload-abort", move |_| {
                        let stream = match taken {
                            Some(stream) => stream,
                            None => shared.lock().unwrap_or_else(|p| p.into_inner()).take(),
                        };
                        Ok(stream.map_or(Ok(()), |stream| stream.abort())?)
                    })
                    .await;
            });
        }
    }
}

fn closed_stream() -> LibvirtError {
    LibvirtError::Failed("the upload's stream was closed already".into())
}
