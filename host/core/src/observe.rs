//! Watching provider calls from outside the runtime.
//!
//! The runtime reports every call it runs to a [`CallObserver`]; the
//! metrics crate implements it. The trait lives here so that neither the
//! runtime depends on the metrics crate nor the other way round.

use std::time::Duration;

use crate::ErrorClass;

/// Receives one report per provider call, when the call has ended.
///
/// Called on the task that ran the call, right after it: implementations
/// must be quick and must not block.
pub trait CallObserver: Send + Sync + std::fmt::Debug {
    /// One call of `operation` (`create`, `get`, `delete`, `list`, `check`,
    /// `validate-config`) on the provider entry `entry` ended after
    /// `elapsed`: `error` is `None` when it succeeded, otherwise the class
    /// it failed with. `fault` is true when the plugin itself failed: it
    /// trapped, ran out of time or hit its memory cap.
    fn provider_call(
        &self,
        entry: &str,
        operation: &str,
        elapsed: Duration,
        error: Option<ErrorClass>,
        fault: bool,
    );
}
