//! What the API simulators (`tools/pve-sim`, `tools/gce-sim`) share: the
//! HTTPS server they answer on, the forward proxy a simulated running
//! machine starts, and the clock their timestamps come from.

pub mod https;
pub mod proxy;

/// Seconds since the Unix epoch (0 for a clock before it).
pub fn now_unix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}
