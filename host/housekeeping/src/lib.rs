//! Housekeeping, written once for both modes: checking every provider
//! entry and collecting the orphans of every serving one.
//!
//! Each runs over a [`ProviderSource`](proxyfleet_core::source::ProviderSource)
//! and records its own metrics, so standalone and Kubernetes mode check,
//! time out, log and count alike. What differs stays in the modes: where
//! the live Proxies are read from, and where the results are published
//! (the state API, ProxyProvider objects).

mod checks;
mod orphans;

pub use checks::{Availability, EntryCheck, MAX_CHECK_TIME, check_entries, check_timeout};
pub use orphans::{GcSettings, collect_garbage};
