//! Several API `GET`s in flight at once, for `check`, which asks every node
//! the same questions: the requests go out together through the SDK's
//! [`send_all`], which the host holds to the entry's grants, address
//! policy, credential and limits as it does one request.

use std::time::Duration;

use proxyfleet_sdk::http::{Failure, Request, send_all};
use serde_json::Value;

use crate::pve;

/// Largest answer read; `check`'s answers are a few KiB.
const MAX_BODY: usize = 4 * 1024 * 1024;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(30);

/// `GET`s every path under `base` (`https://host:port/api2/json`) at once
/// and returns each answer's `data`, in the order of `paths`, each failure
/// classified as the client's are ([`pve::data_of`]).
pub fn get_all(base: &str, paths: &[String]) -> Vec<Result<Value, Failure>> {
    let requests = paths
        .iter()
        .map(|path| {
            Request::get(format!("{base}{path}"))
                .connect_timeout(CONNECT_TIMEOUT)
                .first_byte_timeout(FIRST_BYTE_TIMEOUT)
                .max_response_bytes(MAX_BODY)
        })
        .collect();
    send_all(requests).into_iter().map(pve::data_of).collect()
}
