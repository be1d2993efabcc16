//! An entry's resource limits (`limits` in the providers file): what one
//! call and the whole entry may use of time, memory, HTTP and the store.
//! Each capability reads its own limits from here.

use std::time::Duration;

use serde::Deserialize;

use crate::error::ConfigError;

/// Largest memory cap an entry may ask for; the engine's pool is sized for it.
pub const MAX_MEMORY_MIB: u64 = 1024;
/// The largest `limits.httpResponseMiB` an entry may set (64 GiB).
pub const MAX_HTTP_RESPONSE_MIB: u64 = 64 * 1024;
/// The largest `limits.httpRequestMiB` an entry may set: a request body is
/// held in host memory until it is sent.
pub const MAX_HTTP_REQUEST_MIB: u64 = 1024;
/// The most `limits.httpInFlight` an entry may set.
pub const MAX_HTTP_IN_FLIGHT: usize = 1024;

/// Resource limits of an entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Wall-clock budget of one provider call.
    pub call_timeout: Duration,
    /// Linear memory a plugin instance may grow to, in bytes.
    pub memory_bytes: usize,
    /// Provider calls of this entry that may run at once.
    pub concurrency: usize,
    /// Of those, creates and deletes that may run at once: backends lock
    /// shared resources (a Proxmox storage, a quota) on these, and a storm
    /// of them only produces lock timeouts.
    pub mutations: usize,
    /// Largest HTTP response body the plugin may receive, in bytes.
    pub http_response_bytes: u64,
    /// Largest HTTP request body the plugin may send, in bytes. The host
    /// holds a body until it is sent, so this bounds host memory too.
    pub http_request_bytes: u64,
    /// Outgoing requests of the whole entry that may be open at once (sent
    /// and not yet read to the end); more wait for one to end.
    pub http_in_flight: usize,
    /// Of those, requests one call may have open at once; more fail at
    /// once with `connection-limit-reached`.
    pub http_in_flight_per_call: usize,
    /// Keys the entry's store may hold.
    pub kv_keys: usize,
    /// Largest value in the entry's store, in bytes.
    pub kv_value_bytes: usize,
    /// Keys and values of the entry's store together, in bytes.
    pub kv_total_bytes: u64,
    /// Store writes one call may make.
    pub kv_writes_per_call: u32,
    /// Budget to connect to an HTTP destination.
    pub http_connect_timeout: Duration,
    /// Budget from sending a request to its response headers.
    pub http_first_byte_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            call_timeout: Duration::from_secs(60),
            memory_bytes: 64 << 20,
            concurrency: 8,
            mutations: 2,
            http_response_bytes: 16 << 20,
            http_request_bytes: 8 << 20,
            http_in_flight: 32,
            http_in_flight_per_call: 4,
            kv_keys: 10_000,
            kv_value_bytes: 64 << 10,
            kv_total_bytes: 512 << 10,
            kv_writes_per_call: 100,
            http_connect_timeout: Duration::from_secs(10),
            http_first_byte_timeout: Duration::from_secs(30),
        }
    }
}

#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct RawLimits {
    timeout: Option<String>,
    #[serde(rename = "memoryMiB")]
    memory_mib: Option<u64>,
    concurrency: Option<usize>,
    mutations: Option<usize>,
    #[serde(rename = "httpResponseMiB")]
    http_response_mib: Option<u64>,
    #[serde(rename = "httpRequestMiB")]
    http_request_mib: Option<u64>,
    http_in_flight: Option<usize>,
    http_in_flight_per_call: Option<usize>,
    kv_keys: Option<usize>,
    #[serde(rename = "kvValueKiB")]
    kv_value_kib: Option<usize>,
    #[serde(rename = "kvTotalKiB")]
    kv_total_kib: Option<u64>,
    kv_writes_per_call: Option<u32>,
    http_connect_timeout: Option<String>,
    http_first_byte_timeout: Option<String>,
}

/// Checks each limit against its range, naming the field in `at` when one
/// is out of it, and fills in the defaults.
pub(crate) fn validate_limits(at: &str, raw: RawLimits) -> Result<Limits, ConfigError> {
    let defaults = Limits::default();
    let duration = |field: &str, text: Option<String>, default: Duration| match text {
        None => Ok(default),
        Some(text) => match humantime::parse_duration(&text) {
            Ok(d) if !d.is_zero() => Ok(d),
            _ => Err(ConfigError::invalid(
                at,
                format!("limits.{field}"),
                format!("{text:?} is not a positive duration such as \"30s\" or \"2m\""),
            )),
        },
    };
    // Every count is 1 to a maximum, fixed or another limit's value.
    let within = |field: &str, value: u64, max: u64, max_is: Option<&str>| {
        if (1..=max).contains(&value) {
            return Ok(value);
        }
        let max = max_is.map_or_else(|| max.to_string(), |other| format!("limits.{other} ({max})"));
        Err(ConfigError::invalid(
            at,
            format!("limits.{field}"),
            format!("{value} is out of range; use 1 to {max}"),
        ))
    };
    let count = |field: &str, value: Option<usize>, default: usize, max: usize| {
        within(field, value.unwrap_or(default) as u64, max as u64, None).map(|v| v as usize)
    };
    let memory_mib = within(
        "memoryMiB",
        raw.memory_mib.unwrap_or((defaults.memory_bytes >> 20) as u64),
        MAX_MEMORY_MIB,
        None,
    )?;
    let concurrency = count("concurrency", raw.concurrency, defaults.concurrency, 1024)?;
    let mutations = within(
        "mutations",
        raw.mutations.unwrap_or(defaults.mutations.min(concurrency)) as u64,
        concurrency as u64,
        Some("concurrency"),
    )? as usize;
    // Bodies reach the plugin as a stream, so the cap bounds what one
    // response may carry, not what the host holds: a plugin that streams a
    // disk image to a hypervisor needs the image's size.
    let http_response_mib = within(
        "httpResponseMiB",
        raw.http_response_mib.unwrap_or(defaults.http_response_bytes >> 20),
        MAX_HTTP_RESPONSE_MIB,
        None,
    )?;
    let http_request_mib = within(
        "httpRequestMiB",
        raw.http_request_mib.unwrap_or(defaults.http_request_bytes >> 20),
        MAX_HTTP_REQUEST_MIB,
        None,
    )?;
    let http_in_flight =
        count("httpInFlight", raw.http_in_flight, defaults.http_in_flight, MAX_HTTP_IN_FLIGHT)?;
    let http_in_flight_per_call = within(
        "httpInFlightPerCall",
        raw.http_in_flight_per_call.unwrap_or(defaults.http_in_flight_per_call.min(http_in_flight))
            as u64,
        http_in_flight as u64,
        Some("httpInFlight"),
    )? as usize;
    let kv_keys = count("kvKeys", raw.kv_keys, defaults.kv_keys, 100_000)?;
    let kv_value_kib = count(
        "kvValueKiB",
        raw.kv_value_kib,
        defaults.kv_value_bytes >> 10,
        proxyfleet_core::kv::MAX_VALUE_BYTES >> 10,
    )?;
    let kv_total_kib = within(
        "kvTotalKiB",
        raw.kv_total_kib.unwrap_or(defaults.kv_total_bytes >> 10),
        1 << 20,
        None,
    )?;
    let kv_writes_per_call = within(
        "kvWritesPerCall",
        raw.kv_writes_per_call.unwrap_or(defaults.kv_writes_per_call).into(),
        10_000,
        None,
    )?;
    Ok(Limits {
        call_timeout: duration("timeout", raw.timeout, defaults.call_timeout)?,
        memory_bytes: usize::try_from(memory_mib << 20).unwrap_or(usize::MAX),
        concurrency,
        mutations,
        http_response_bytes: http_response_mib << 20,
        http_request_bytes: http_request_mib << 20,
        http_in_flight,
        http_in_flight_per_call,
        kv_keys,
        kv_value_bytes: kv_value_kib << 10,
        kv_total_bytes: kv_total_kib << 10,
        kv_writes_per_call: u32::try_from(kv_writes_per_call).unwrap_or(u32::MAX),
        http_connect_timeout: duration(
            "httpConnectTimeout",
            raw.http_connect_timeout,
            defaults.http_connect_timeout,
        )?,
        http_first_byte_timeout: duration(
            "httpFirstByteTimeout",
            raw.http_first_byte_timeout,
            defaults.http_first_byte_timeout,
        )?,
    })
}
