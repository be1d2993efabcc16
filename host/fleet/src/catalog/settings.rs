//! The catalog's timings and thresholds.

use std::time::Duration;

use super::Strategy;

/// Timings and thresholds of the catalog.
#[derive(Debug, Clone)]
pub struct FleetSettings {
    /// How long a reported proxy is kept from crawlers.
    pub quarantine: Duration,
    /// Reports after which a pool member is replaced.
    pub replace_after: u32,
    /// Strategy when a request names none.
    pub strategy: Strategy,
    /// Lease TTL when a request names none.
    pub lease_ttl: Duration,
    /// The longest lease TTL granted.
    pub max_lease_ttl: Duration,
}

impl Default for FleetSettings {
    fn default() -> Self {
        Self {
            quarantine: Duration::from_secs(600),
            replace_after: 3,
            strategy: Strategy::RoundRobin,
            lease_ttl: Duration::from_secs(300),
            max_lease_ttl: Duration::from_secs(86_400),
        }
    }
}
