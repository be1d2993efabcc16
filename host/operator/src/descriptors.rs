//! File descriptors: the operator raises its own soft limit to the hard
//! one at start, and the connection bounds of its listeners are checked
//! against it, so that a flood of clients on the gateway or the API can
//! never take the descriptors the health probes, the plugins and the
//! store need.

use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

/// Descriptors kept for everything but client connections: probes in
/// flight (up to three connections each), plugin calls and their HTTP,
/// libvirt's SSH, the store, the kube client, logs, and the metrics
/// endpoint's own bound ([`proxyfleet_metrics::MAX_CONNECTIONS`]).
pub const RESERVE: u64 = 512;

/// Raises the soft `RLIMIT_NOFILE` to the hard limit and answers the
/// soft limit now in force.
pub fn raise_limit() -> u64 {
    let limit = getrlimit(Resource::Nofile);
    if let Some(hard) = limit.maximum
        && limit.current != Some(hard)
    {
        let raised = Rlimit { current: Some(hard), maximum: Some(hard) };
        if let Err(err) = setrlimit(Resource::Nofile, raised) {
            tracing::warn!("cannot raise the open-file limit to {hard}: {err}");
        }
    }
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}

/// How the connection bounds of the listeners fit `limit` descriptors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// The discovery API's connections.
    pub api: usize,
    /// The gateway's client connections; each may hold one more towards a
    /// proxy.
    pub gateway: usize,
}

/// The bounds: the ones given, checked against `limit`; the defaults,
/// lowered to fit it. An explicit bound that does not fit is an error
/// naming the flags and the fix.
pub fn budget(
    limit: u64,
    api: Option<usize>,
    gateway: Option<usize>,
    gateway_on: bool,
) -> anyhow::Result<Budget> {
    const API_DEFAULT: usize = 256;
    const GATEWAY_DEFAULT: usize = 1024;
    let free = limit.saturating_sub(RESERVE);
    let per_gateway_connection = if gateway_on { 2 } else { 0 };
    let needs = |api: usize, gateway: usize| api as u64 + per_gateway_connection * gateway as u64;
    let fits = |api: usize, gateway: usize| needs(api, gateway) <= free;
    for (flag, value) in [("--api-max-connections", api), ("--gateway-max-connections", gateway)] {
        if value == Some(0) {
            anyhow::bail!("{flag}: 0 connections; give at least 1");
        }
    }
    match (api, gateway) {
        (Some(api), Some(gateway)) if !fits(api, gateway) => anyhow::bail!(
            "--api-max-connections {api} and --gateway-max-connections {gateway} need {} open \
             files with the {RESERVE} kept for probes and plugins, above this process's limit of \
             {limit}; lower them, or raise the limit (ulimit -n, LimitNOFILE=)",
            needs(api, gateway) + RESERVE
        ),
        (Some(api), Some(gateway)) => Ok(Budget { api, gateway }),
        (Some(api), None) => {
            let room = free.saturating_sub(api as u64) / per_gateway_connection.max(1);
            let gateway = GATEWAY_DEFAULT.min(usize::try_from(room).unwrap_or(usize::MAX));
            if gateway == 0 || !fits(api, gateway) {
                anyhow::bail!(
                    "--api-max-connections {api} leaves no open files for the gateway under this \
                     process's limit of {limit}; lower it, or raise the limit (ulimit -n)"
                );
            }
            Ok(Budget { api, gateway })
        }
        (api, gateway) => {
            // The gateway's bound given, or neither: the API gets its
            // default or what is left, at least 16.
            let gateway = gateway.unwrap_or_else(|| {
                let share = free.saturating_sub(API_DEFAULT as u64) / per_gateway_connection.max(1);
                GATEWAY_DEFAULT.min(usize::try_from(share).unwrap_or(usize::MAX)).max(16)
            });
            let room = free.saturating_sub(per_gateway_connection * gateway as u64);
            let api = api.unwrap_or(API_DEFAULT.min(usize::try_from(room).unwrap_or(usize::MAX)));
            if api < 16 || !fits(api, gateway) {
                anyhow::bail!(
                    "--gateway-max-connections {gateway} leaves too few open files for the API \
                     under this process's limit of {limit}; lower it, or raise the limit (ulimit -n)"
                );
            }
            Ok(Budget { api, gateway })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_fit_a_large_limit_as_they_are() {
        assert_eq!(budget(1 << 20, None, None, true).unwrap(), Budget { api: 256, gateway: 1024 });
    }

    /// Issue 43, item 2: under `nofile` 1024, 1,100 idle connections left
    /// the API and the gateway answering nobody. The defaults now shrink
    /// to leave the reserve.
    #[test]
    fn issue_43_item_2_defaults_shrink_under_a_small_limit_and_keep_the_reserve() {
        let fitted = budget(1024, None, None, true).unwrap();
        assert!(fitted.api as u64 + 2 * fitted.gateway as u64 + RESERVE <= 1024, "{fitted:?}");
        assert!(fitted.api >= 16 && fitted.gateway >= 16, "{fitted:?}");
        let without_gateway = budget(1024, None, None, false).unwrap();
        assert_eq!(without_gateway.api, 256);
    }

    #[test]
    fn explicit_bounds_over_the_limit_are_refused_by_name() {
        let err = budget(1024, Some(400), Some(400), true).unwrap_err().to_string();
        assert!(
            err.contains("--api-max-connections 400 and --gateway-max-connections 400"),
            "{err}"
        );
        assert!(err.contains("limit of 1024"), "{err}");
        let err = budget(1024, Some(0), None, true).unwrap_err().to_string();
        assert!(err.starts_with("--api-max-connections: 0"), "{err}");
        assert_eq!(
            budget(4096, Some(100), Some(200), true).unwrap(),
            Budget { api: 100, gateway: 200 }
        );
    }
}
