//! Leases in the entry's key-value store: the right to do one thing (an
//! upload of a base, a create of a domain) that two calls must not do at
//! once. A lease lasts as long as the call that took it may run, so one
//! left by a call that died expires on its own and the next call takes it
//! over.

use proxyfleet_sdk::kv::{self, CasOutcome};
use proxyfleet_sdk::{CallContext, ProviderError, Result, log, now_unix};
use serde::{Deserialize, Serialize};

/// A lease held by this call.
#[derive(Debug)]
pub struct Lease {
    key: String,
    version: u64,
}

#[derive(Serialize, Deserialize)]
struct LeaseValue {
    /// Seconds since the Unix epoch.
    until: u64,
}

/// Until when a stored lease runs; an unreadable one has run out.
fn held_until(value: &[u8]) -> u64 {
    serde_json::from_slice::<LeaseValue>(value).map_or(0, |lease| lease.until)
}

impl Lease {
    /// Takes the lease at `key` until this call's deadline; `busy()` when
    /// another live call holds it.
    pub fn take(
        ctx: &CallContext,
        key: String,
        busy: impl FnOnce() -> ProviderError,
    ) -> Result<Self> {
        let now = now_unix();
        let until = now + ctx.deadline().as_secs() + 1;
        let value = serde_json::to_vec(&LeaseValue { until })
            .map_err(|err| ProviderError::Permanent(format!("encoding a lease: {err}")))?;
        let current = kv::get(&key)?;
        if current.as_ref().is_some_and(|entry| held_until(&entry.value) > now) {
            return Err(busy());
        }
        match kv::compare_and_swap(&key, current.map(|entry| entry.version), Some(&value))? {
            CasOutcome::Applied(version) => Ok(Self { key, version }),
            CasOutcome::Conflict(_) => Err(busy()),
        }
    }

    /// Whether a live call holds the lease at `key`.
    pub fn is_held(key: &str) -> Result<bool> {
        let now = now_unix();
        Ok(kv::get(key)?.is_some_and(|entry| held_until(&entry.value) > now))
    }

    /// Gives the lease back. Failing to is harmless: it expires.
    pub fn release(self) {
        if let Err(error) = kv::compare_and_swap(&self.key, Some(self.version), None) {
            log::warn!("could not release a lease", key = self.key, error = error);
        }
    }
}
