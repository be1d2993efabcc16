//! Housekeeping, written once for both modes: checking every provider
//! entry, collecting the orphans of every serving one, and rolling an
//! entry back on request.
//!
//! Each runs over a [`ProviderSource`](proxyfleet_core::source::ProviderSource)
//! and records its own metrics, so standalone and Kubernetes mode check,
//! time out, log and count alike. What differs stays in the modes: where
//! the live Proxies are read from, and where the results are published
//! (the state API, ClusterProxyProvider objects).

mod checks;
mod orphans;
mod rollback;

pub use checks::{Availability, EntryCheck, MAX_CHECK_TIME, check_entries, check_timeout};
pub use orphans::{GcSettings, collect_garbage};
pub use rollback::rollback;
