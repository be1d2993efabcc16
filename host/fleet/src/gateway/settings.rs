//! What the gateway's flags set.

use std::time::Duration;

use http::StatusCode;

use super::target::TargetPolicy;
use crate::server::ConnectionLimits;

/// The gateway's settings.
#[derive(Debug, Clone)]
pub struct GatewaySettings {
    /// Other proxies a request may be sent to after its proxy could not be
    /// reached.
    pub retries: u32,
    /// Budget for connecting to an upstream proxy (and for its answer to
    /// CONNECT).
    pub connect_timeout: Duration,
    /// Budget for an upstream's answer head to a forwarded request: a proxy
    /// that accepts and then stalls is reported, and the request goes
    /// elsewhere when that is harmless.
    pub response_timeout: Duration,
    /// Answers that mean the target site turned the proxy away: the proxy
    /// is banned for that site.
    pub ban_statuses: Vec<StatusCode>,
    /// How long a sticky session holds its proxy, from its first request.
    pub session_ttl: Duration,
    /// How long a CONNECT tunnel may carry no byte either way before the
    /// gateway closes it, freeing both connections.
    pub tunnel_idle_timeout: Duration,
    /// The health engine's thresholds, for the failures the gateway
    /// reports.
    pub healthy_after: u32,
    /// See [`GatewaySettings::healthy_after`].
    pub unhealthy_after: u32,
    /// Where crawlers may send requests.
    pub targets: TargetPolicy,
    /// The client connections the listener holds at most, and how long
    /// one may take to send a request head.
    pub connections: ConnectionLimits,
    /// Requests in flight and tunnels open at once per API token (per
    /// client address on an open gateway): each holds a connection to a
    /// proxy.
    pub max_per_client: usize,
}

impl Default for GatewaySettings {
    fn default() -> Self {
        Self {
            retries: 2,
            connect_timeout: Duration::from_secs(5),
            response_timeout: Duration::from_secs(60),
            ban_statuses: vec![StatusCode::FORBIDDEN, StatusCode::TOO_MANY_REQUESTS],
            session_ttl: Duration::from_secs(600),
            tunnel_idle_timeout: Duration::from_secs(300),
            healthy_after: 2,
            unhealthy_after: 3,
            targets: TargetPolicy::default(),
            connections: ConnectionLimits::default(),
            max_per_client: 256,
        }
    }
}
