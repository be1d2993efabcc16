//! What the API simulators (`tools/pve-sim`, `tools/gce-sim`) share: the
//! HTTPS server they answer on and the forward proxy a simulated running
//! machine starts.

pub mod https;
pub mod proxy;
