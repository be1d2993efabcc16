//! The libvirt objects the helper holds for the operator, by handle.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use proxyfleet_libvirt_wire::{ErrorCode, Handle, WireError};
use virt::connect::Connect;
use virt::domain::Domain;
use virt::storage_pool::StoragePool;
use virt::storage_vol::StorageVol;
use virt::stream::Stream;

/// One held object. A call takes its own reference (libvirt counts them:
/// cloning one takes another) and lets go of the table's lock before it
/// calls libvirt, so a release while it runs does not pull the object
/// from under it.
#[derive(Clone)]
pub(crate) enum Object {
    Connect(ConnRef),
    Domain(Domain),
    Pool(StoragePool),
    Volume(StorageVol),
    /// Taken out when the upload finishes or aborts.
    Stream(Arc<Mutex<Option<Stream>>>),
}

/// One reference to a connection, closed when dropped (virt leaves that to
/// the caller): the last one says goodbye to the daemon.
pub(crate) struct ConnRef(pub(crate) Connect);

impl Clone for ConnRef {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl Drop for ConnRef {
    fn drop(&mut self) {
        // On a dead transport the goodbye fails at once; nobody to tell.
        let _ = self.0.close();
    }
}

/// The table of held objects.
#[derive(Default)]
pub(crate) struct Objects {
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    next: u64,
    held: HashMap<Handle, Object>,
}

impl Objects {
    /// Holds `object`; its new handle.
    pub(crate) fn hold(&self, object: Object) -> Handle {
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        table.next += 1;
        let handle = Handle(table.next);
        table.held.insert(handle, object);
        handle
    }

    /// Lets go of `handle`; the object, for a last call, if it was held.
    pub(crate) fn take(&self, handle: Handle) -> Option<Object> {
        self.table.lock().unwrap_or_else(|p| p.into_inner()).held.remove(&handle)
    }

    fn get(&self, handle: Handle) -> Result<Object, WireError> {
        let table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        table.held.get(&handle).cloned().ok_or_else(|| unknown(handle, "object"))
    }

    pub(crate) fn connect(&self, handle: Handle) -> Result<ConnRef, WireError> {
        match self.get(handle)? {
            Object::Connect(conn) => Ok(conn),
            _ => Err(unknown(handle, "connection")),
        }
    }

    pub(crate) fn domain(&self, handle: Handle) -> Result<Domain, WireError> {
        match self.get(handle)? {
            Object::Domain(domain) => Ok(domain),
            _ => Err(unknown(handle, "domain")),
        }
    }

    pub(crate) fn pool(&self, handle: Handle) -> Result<StoragePool, WireError> {
        match self.get(handle)? {
            Object::Pool(pool) => Ok(pool),
            _ => Err(unknown(handle, "storage pool")),
        }
    }

    pub(crate) fn volume(&self, handle: Handle) -> Result<StorageVol, WireError> {
        match self.get(handle)? {
            Object::Volume(volume) => Ok(volume),
            _ => Err(unknown(handle, "volume")),
        }
    }

    pub(crate) fn stream(&self, handle: Handle) -> Result<Arc<Mutex<Option<Stream>>>, WireError> {
        match self.get(handle)? {
            Object::Stream(stream) => Ok(stream),
            _ => Err(unknown(handle, "stream")),
        }
    }
}

fn unknown(handle: Handle, what: &str) -> WireError {
    WireError {
        code: ErrorCode::Helper,
        message: format!("the libvirt helper holds no {what} with handle {}", handle.0),
    }
}
