//! What the operator and `proxyfleet-libvirt`, its libvirt helper, say to
//! each other.
//!
//! libvirt's C client (and the 50-odd shared libraries it pulls in) lives
//! in the helper process only, which the operator starts the first time an
//! entry with a libvirt grant connects to a host. The operator never links
//! it: an operator without kvm entries does not carry it, and a crash in C
//! code ends the helper, not the operator.
//!
//! The helper is a thin remote for the libvirt calls the capability makes:
//! each [`Request`] is one libvirt call on objects the helper holds for the
//! operator ([`Handle`]s), answered by one [`Reply`] with the same id. The
//! policy (grants, allow-lists, ownership) stays in the operator.
//!
//! - `message`: requests, answers and errors;
//! - `frame`: how a message (and the bytes of an upload) is put on a pipe.

mod frame;
mod message;

pub use frame::{FrameError, MAX_PAYLOAD, read_frame, write_frame};
pub use message::{
    AddressSource, DomainState, ErrorCode, Handle, Interface, InterfaceAddr, Op, PoolInfo, Reply,
    Request, Value, VolumeInfo, WireError,
};
