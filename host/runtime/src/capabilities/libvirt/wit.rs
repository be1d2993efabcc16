//! The `proxyfleet:provider/libvirt` imports: the plugin's calls mapped to
//! the entry's host pools. Host names the entry does not grant are refused
//! before anything is dialled.
//!
//! An upload lives in the call's resource table as the host's [`Upload`];
//! the plugin holds the contract's opaque `upload` handle with the same
//! index, and the table checks the type on every use.

use wasmtime::component::{HasData, Resource, ResourceTable};

use super::{
    AddressSource, DomainInfo, DomainState, EntryLibvirt, LibvirtError, PoolInfo, Upload, Volume,
};
use crate::bindings::libvirt as wit;

/// The libvirt import as one call sees it: the entry's hosts, and the
/// call's resource table for uploads.
pub(crate) struct LibvirtView<'a> {
    pub(crate) hosts: &'a EntryLibvirt,
    pub(crate) table: &'a mut ResourceTable,
}

/// The libvirt import's share of a store's data, for the linker.
pub(crate) struct LibvirtImport;

impl HasData for LibvirtImport {
    type Data<'a> = LibvirtView<'a>;
}

/// The table's entry behind a plugin's handle, owned or borrowed as the
/// handle is.
fn host_side(handle: &Resource<wit::Upload>) -> Resource<Upload> {
    if handle.owned() {
        Resource::new_own(handle.rep())
    } else {
        Resource::new_borrow(handle.rep())
    }
}

type Answer<T> = Result<T, wit::LibvirtError>;

fn err_to_wit(err: LibvirtError) -> wit::LibvirtError {
    match err {
        LibvirtError::NotGranted(m) => wit::LibvirtError::NotGranted(m),
        LibvirtError::Unauthorized(m) => wit::LibvirtError::Unauthorized(m),
        LibvirtError::Transient(m) => wit::LibvirtError::Transient(m),
        LibvirtError::Timeout(m) => wit::LibvirtError::Timeout(m),
        LibvirtError::NotFound(m) => wit::LibvirtError::NotFound(m),
        LibvirtError::Exists(m) => wit::LibvirtError::Exists(m),
        LibvirtError::InvalidState(m) => wit::LibvirtError::InvalidState(m),
        LibvirtError::Invalid(m) => wit::LibvirtError::Invalid(m),
        LibvirtError::Unsupported(m) => wit::LibvirtError::Unsupported(m),
        LibvirtError::Failed(m) => wit::LibvirtError::Failed(m),
    }
}

/// The plugin's resource table is full, or a handle is not an upload.
fn table_error(err: wasmtime::component::ResourceTableError) -> wit::LibvirtError {
    wit::LibvirtError::Failed(format!("upload handle: {err}"))
}

fn volume_to_wit(v: Volume) -> wit::Volume {
    wit::Volume { name: v.name, path: v.path, capacity: v.capacity, allocation: v.allocation }
}

fn domain_to_wit(d: DomainInfo) -> wit::DomainInfo {
    wit::DomainInfo {
        name: d.name,
        uuid: d.uuid,
        state: match d.state {
            DomainState::NoState => wit::DomainState::NoState,
            DomainState::Running => wit::DomainState::Running,
            DomainState::Blocked => wit::DomainState::Blocked,
            DomainState::Paused => wit::DomainState::Paused,
            DomainState::Shutdown => wit::DomainState::Shutdown,
            DomainState::Shutoff => wit::DomainState::Shutoff,
            DomainState::Crashed => wit::DomainState::Crashed,
            DomainState::Suspended => wit::DomainState::Suspended,
        },
        persistent: d.persistent,
    }
}

fn pool_to_wit(p: PoolInfo) -> wit::PoolInfo {
    wit::PoolInfo {
        name: p.name,
        active: p.active,
        capacity: p.capacity,
        allocation: p.allocation,
        available: p.available,
    }
}

impl LibvirtView<'_> {
    fn libvirt_host(&self, host: &str) -> Answer<std::sync::Arc<super::HostPool>> {
        self.hosts.host(host).cloned().map_err(err_to_wit)
    }
}

impl wit::Host for LibvirtView<'_> {
    async fn hosts(&mut self) -> Vec<String> {
        self.hosts.hosts()
    }

    async fn ping(&mut self, host: String) -> Answer<String> {
        self.libvirt_host(&host)?.ping().await.map_err(err_to_wit)
    }

    async fn get_pool(&mut self, host: String, pool: String) -> Answer<wit::PoolInfo> {
        self.libvirt_host(&host)?.pool_info(&pool).await.map(pool_to_wit).map_err(err_to_wit)
    }

    async fn list_volumes(&mut self, host: String, pool: String) -> Answer<Vec<wit::Volume>> {
        let volumes = self.libvirt_host(&host)?.list_volumes(&pool).await.map_err(err_to_wit)?;
        Ok(volumes.into_iter().map(volume_to_wit).collect())
    }

    async fn get_volume(
        &mut self,
        host: String,
        pool: String,
        name: String,
    ) -> Answer<wit::Volume> {
        self.libvirt_host(&host)?.volume(&pool, &name).await.map(volume_to_wit).map_err(err_to_wit)
    }

    async fn create_volume(
        &mut self,
        host: String,
        pool: String,
        xml: String,
    ) -> Answer<wit::Volume> {
        let host = self.libvirt_host(&host)?;
        host.create_volume(&pool, &xml).await.map(volume_to_wit).map_err(err_to_wit)
    }

    async fn clone_volume(
        &mut self,
        host: String,
        pool: String,
        xml: String,
        source: String,
    ) -> Answer<wit::Volume> {
        let host = self.libvirt_host(&host)?;
        host.clone_volume(&pool, &xml, &source).await.map(volume_to_wit).map_err(err_to_wit)
    }

    async fn delete_volume(&mut self, host: String, pool: String, name: String) -> Answer<()> {
        self.libvirt_host(&host)?.delete_volume(&pool, &name).await.map_err(err_to_wit)
    }

    async fn begin_upload(
        &mut self,
        host: String,
        pool: String,
        name: String,
        length: u64,
    ) -> Answer<Resource<wit::Upload>> {
        let host = self.libvirt_host(&host)?;
        let upload = host.begin_upload(&pool, &name, length).await.map_err(err_to_wit)?;
        let held = self.table.push(upload).map_err(table_error)?;
        Ok(Resource::new_own(held.rep()))
    }

    async fn define_domain(&mut self, host: String, xml: String) -> Answer<wit::DomainInfo> {
        let host = self.libvirt_host(&host)?;
        host.define_domain(&xml).await.map(domain_to_wit).map_err(err_to_wit)
    }

    async fn start_domain(&mut self, host: String, name: String) -> Answer<()> {
        self.libvirt_host(&host)?.start_domain(&name).await.map_err(err_to_wit)
    }

    async fn destroy_domain(&mut self, host: String, name: String) -> Answer<()> {
        self.libvirt_host(&host)?.destroy_domain(&name).await.map_err(err_to_wit)
    }

    async fn undefine_domain(&mut self, host: String, name: String) -> Answer<()> {
        self.libvirt_host(&host)?.undefine_domain(&name).await.map_err(err_to_wit)
    }

    async fn get_domain(&mut self, host: String, name: String) -> Answer<wit::DomainInfo> {
        self.libvirt_host(&host)?.domain(&name).await.map(domain_to_wit).map_err(err_to_wit)
    }

    async fn list_domains(&mut self, host: String) -> Answer<Vec<wit::DomainInfo>> {
        let domains = self.libvirt_host(&host)?.list_domains().await.map_err(err_to_wit)?;
        Ok(domains.into_iter().map(domain_to_wit).collect())
    }

    async fn get_metadata(&mut self, host: String, domain: String, uri: String) -> Answer<String> {
        self.libvirt_host(&host)?.metadata(&domain, &uri).await.map_err(err_to_wit)
    }

    async fn set_metadata(
        &mut self,
        host: String,
        domain: String,
        uri: String,
        key: String,
        xml: Option<String>,
    ) -> Answer<()> {
        let host = self.libvirt_host(&host)?;
        host.set_metadata(&domain, &uri, &key, xml.as_deref()).await.map_err(err_to_wit)
    }

    async fn interface_addresses(
        &mut self,
        host: String,
        domain: String,
        source: wit::AddressSource,
    ) -> Answer<Vec<wit::InterfaceAddress>> {
        let source = match source {
            wit::AddressSource::Agent => AddressSource::Agent,
            wit::AddressSource::Lease => AddressSource::Lease,
            wit::AddressSource::Arp => AddressSource::Arp,
        };
        let host = self.libvirt_host(&host)?;
        let addresses = host.interface_addresses(&domain, source).await.map_err(err_to_wit)?;
        Ok(addresses
            .into_iter()
            .map(|a| wit::InterfaceAddress {
                device: a.interface,
                mac: a.mac,
                address: a.address,
                prefix: a.prefix,
            })
            .collect())
    }
}

impl wit::HostUpload for LibvirtView<'_> {
    async fn write(&mut self, upload: Resource<wit::Upload>, chunk: Vec<u8>) -> Answer<()> {
        let upload = self.table.get_mut(&host_side(&upload)).map_err(table_error)?;
        upload.write(chunk).await.map_err(err_to_wit)
    }

    async fn finish(&mut self, upload: Resource<wit::Upload>) -> Answer<()> {
        let upload = self.table.delete(host_side(&upload)).map_err(table_error)?;
        upload.finish().await.map_err(err_to_wit)
    }

    async fn drop(&mut self, upload: Resource<wit::Upload>) -> wasmtime::Result<()> {
        // Dropping an unfinished upload aborts it (see `Upload`'s Drop).
        self.table.delete(host_side(&upload))?;
        Ok(())
    }
}
