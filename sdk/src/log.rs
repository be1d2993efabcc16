//! Structured logging into the host's log pipeline. The host adds the
//! plugin, entry, operation and Proxy fields itself; add what only the
//! provider knows (VMID, node, backend task id).
//!
//! The macros take a message and `key = value` fields, where each value is
//! anything that implements `Display`:
//!
//! ```no_run
//! use proxyfleet_sdk::log;
//! let (vmid, node) = (4711, "pve-2");
//! log::info!("cloned template", vmid = vmid, node = node);
//! log::warn!("task still running");
//! ```
//!
//! The functions of the same names take the fields as a slice, for when
//! they are built at run time.

use std::fmt::Display;

use crate::bindings::proxyfleet::provider::log as wit;

pub use wit::Level;

/// Sends one record to the host. Fields are formatted with `Display`.
///
/// ```
/// use std::fmt::Display;
/// use proxyfleet_sdk::log::{self, Level};
///
/// # proxyfleet_sdk::native::doc_host::run(|| {
/// let (vmid, node) = (4711, "pve-2");
/// let fields: [(&str, &dyn Display); 2] = [("vmid", &vmid), ("node", &node)];
/// log::log(Level::Info, "cloned template", &fields);
/// # });
/// ```
pub fn log(level: Level, message: &str, fields: &[(&str, &dyn Display)]) {
    let fields: Vec<(String, String)> =
        fields.iter().map(|(key, value)| ((*key).to_owned(), value.to_string())).collect();
    #[cfg(target_arch = "wasm32")]
    wit::log(level, message, &fields);
    #[cfg(not(target_arch = "wasm32"))]
    crate::native::host(|host| host.log(level, message, &fields));
}

/// Logs at [`Level::Trace`].
///
/// ```
/// use proxyfleet_sdk::log;
///
/// # proxyfleet_sdk::native::doc_host::run(|| {
/// let upid = "UPID:pve1:0002D6C1:task";
/// log::trace("polling task", &[("upid", &upid)]);
/// # });
/// ```
pub fn trace(message: &str, fields: &[(&str, &dyn Display)]) {
    log(Level::Trace, message, fields);
}

/// Logs at [`Level::Debug`].
///
/// ```
/// use proxyfleet_sdk::log;
///
/// # proxyfleet_sdk::native::doc_host::run(|| {
/// let (vmid, node) = (4711, "pve-2");
/// log::debug("found the template", &[("vmid", &vmid), ("node", &node)]);
/// # });
/// ```
pub fn debug(message: &str, fields: &[(&str, &dyn Display)]) {
    log(Level::Debug, message, fields);
}

/// Logs at [`Level::Info`].
///
/// ```
/// use proxyfleet_sdk::log;
///
/// # proxyfleet_sdk::native::doc_host::run(|| {
/// let vmid = 4711;
/// log::info("started the VM", &[("vmid", &vmid)]);
/// # });
/// ```
pub fn info(message: &str, fields: &[(&str, &dyn Display)]) {
    log(Level::Info, message, fields);
}

/// Logs at [`Level::Warn`].
///
/// ```
/// use proxyfleet_sdk::log;
///
/// # proxyfleet_sdk::native::doc_host::run(|| {
/// let attempt = 3;
/// log::warn("VMID taken, trying the next", &[("attempt", &attempt)]);
/// # });
/// ```
pub fn warn(message: &str, fields: &[(&str, &dyn Display)]) {
    log(Level::Warn, message, fields);
}

/// Logs at [`Level::Error`].
///
/// ```
/// use proxyfleet_sdk::log;
///
/// # proxyfleet_sdk::native::doc_host::run(|| {
/// let status = 500;
/// log::error("the backend refused the delete", &[("status", &status)]);
/// # });
/// ```
pub fn error(message: &str, fields: &[(&str, &dyn Display)]) {
    log(Level::Error, message, fields);
}

/// Logs at a level given as an expression: `log!(level, "message", key = value, ...)`.
#[doc(hidden)]
#[macro_export]
macro_rules! __proxyfleet_log {
    ($level:expr, $message:expr $(, $key:ident = $value:expr)* $(,)?) => {
        $crate::log::log(
            $level,
            ::core::convert::AsRef::<str>::as_ref(&$message),
            &[$((::core::stringify!($key), &$value as &dyn ::core::fmt::Display)),*],
        )
    };
}

/// Logs at [`Level::Trace`]: `trace!("message", key = value, ...)`.
#[doc(hidden)]
#[macro_export]
macro_rules! __proxyfleet_trace {
    ($($args:tt)*) => { $crate::__proxyfleet_log!($crate::log::Level::Trace, $($args)*) };
}

/// Logs at [`Level::Debug`]: `debug!("message", key = value, ...)`.
#[doc(hidden)]
#[macro_export]
macro_rules! __proxyfleet_debug {
    ($($args:tt)*) => { $crate::__proxyfleet_log!($crate::log::Level::Debug, $($args)*) };
}

/// Logs at [`Level::Info`]: `info!("message", key = value, ...)`.
#[doc(hidden)]
#[macro_export]
macro_rules! __proxyfleet_info {
    ($($args:tt)*) => { $crate::__proxyfleet_log!($crate::log::Level::Info, $($args)*) };
}

/// Logs at [`Level::Warn`]: `warn!("message", key = value, ...)`.
#[doc(hidden)]
#[macro_export]
macro_rules! __proxyfleet_warn {
    ($($args:tt)*) => { $crate::__proxyfleet_log!($crate::log::Level::Warn, $($args)*) };
}

/// Logs at [`Level::Error`]: `error!("message", key = value, ...)`.
#[doc(hidden)]
#[macro_export]
macro_rules! __proxyfleet_error {
    ($($args:tt)*) => { $crate::__proxyfleet_log!($crate::log::Level::Error, $($args)*) };
}

#[doc(inline)]
pub use crate::{
    __proxyfleet_debug as debug, __proxyfleet_error as error, __proxyfleet_info as info,
    __proxyfleet_log as log, __proxyfleet_trace as trace, __proxyfleet_warn as warn,
};
