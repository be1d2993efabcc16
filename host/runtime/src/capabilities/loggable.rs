//! The path and query of a plugin's request as the host logs it: with the
//! values of credential-like query parameters and every secret the entry's
//! [`Redactor`] knows replaced, so an operator can follow a create call by
//! call without the log holding what the request carried.

use super::Redactor;
use super::redact::REDACTED;

/// The `tracing` target of the per-request lines. Trace exporters leave it
/// out (`proxyfleet` binary's telemetry): they record a span's events, and
/// a path, even redacted, is for the operator's own logs only.
pub const REQUEST_LOG_TARGET: &str = "proxyfleet::request";

/// Query parameter names whose values are never logged (compared in lower
/// case, as parts of the name: `access_token`, `X-Amz-Signature`, …).
const SECRET_NAMES: [&str; 9] =
    ["token", "secret", "password", "passwd", "key", "signature", "sig", "auth", "credential"];

/// `uri`'s path and query for a log line.
pub(crate) fn path_and_query(uri: &http::Uri, redactor: &Redactor) -> String {
    let mut out = uri.path().to_owned();
    if let Some(query) = uri.query() {
        out.push('?');
        for (index, pair) in query.split('&').enumerate() {
            if index > 0 {
                out.push('&');
            }
            match pair.split_once('=') {
                Some((name, _)) if is_secret_name(&decoded(name)) => {
                    out.push_str(name);
                    out.push('=');
                    out.push_str(REDACTED);
                }
                _ => out.push_str(pair),
            }
        }
    }
    // Secrets are looked for in the decoded text too: a plugin may have
    // percent-encoded one into the URL.
    let decoded = decoded(&out);
    if redactor.holds_secret(&decoded) {
        return redactor.redact(&decoded).into_owned();
    }
    redactor.redact(&out).into_owned()
}

/// `text` with its percent-escapes decoded.
fn decoded(text: &str) -> String {
    percent_encoding::percent_decode_str(text).decode_utf8_lossy().into_owned()
}

fn is_secret_name(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    SECRET_NAMES.iter().any(|secret| name.contains(secret))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credential_like_parameters_and_known_secrets_are_replaced() {
        let redactor = Redactor::default();
        redactor.remember("s3cr3t-token-value");
        let uri: http::Uri = "https://pve:8006/api2/json/nodes/pve1/qemu/101/config?access_token=abc&X-Amz-Signature=def&type=vm&note=s3cr3t-token-value"
            .parse()
            .unwrap();
        assert_eq!(
            path_and_query(&uri, &redactor),
            "/api2/json/nodes/pve1/qemu/101/config?access_token=[redacted]&X-Amz-Signature=[redacted]&type=vm&note=[redacted]"
        );
        let encoded: http::Uri =
            "https://h/p?access%5Ftoken=abc&q=s3cr3t%2Dtoken%2Dvalue".parse().unwrap();
        assert_eq!(path_and_query(&encoded, &redactor), "/p?access_token=[redacted]&q=[redacted]");
        let plain: http::Uri = "https://h/compute/v1/projects/p/zones/z/instances".parse().unwrap();
        assert_eq!(path_and_query(&plain, &redactor), "/compute/v1/projects/p/zones/z/instances");
    }
}
