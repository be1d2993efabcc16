use wasip2::http::types::{self as wasi, ErrorCode};

use super::classify::classify_transport;
use super::target::Scheme;
use super::*;
use crate::HealthReason;

fn target(url: &str) -> Target {
    Target::parse(url).unwrap_or_else(|error| panic!("{url}: {error}"))
}

#[test]
fn parses_urls() {
    let plain = target("https://pve.example:8006/api2/json/nodes?type=vm#frag");
    assert_eq!(plain.scheme, Scheme::Https);
    assert_eq!(plain.authority, "pve.example:8006");
    assert_eq!(plain.origin(), "https://pve.example:8006");
    assert_eq!(plain.path_with_query, "/api2/json/nodes?type=vm");

    let bare = target("HTTP://Example.COM");
    assert_eq!(bare.origin(), "http://example.com:80");
    assert_eq!(bare.path_with_query, "/");

    let query_only = target("https://example.com?a=1");
    assert_eq!(query_only.authority, "example.com");
    assert_eq!(query_only.path_with_query, "/?a=1");

    let v6 = target("http://[2001:db8::1]:8080/x");
    assert_eq!(v6.origin(), "http://[2001:db8::1]:8080");
    assert_eq!(v6.authority, "[2001:db8::1]:8080");
    assert_eq!(target("https://[::1]/").port, 443);
}

#[test]
fn rejects_bad_urls() {
    for url in [
        "example.com/x",
        "ftp://example.com/",
        "https:///path",
        "https://host:99999/",
        "https://host:port/",
        "http://[::1/",
        "http://[::1]x/",
        "https://user:secret@example.com/",
    ] {
        assert!(Target::parse(url).is_err(), "{url} parsed");
    }
    let error = Target::parse("https://user:secret@example.com/").expect_err("refused");
    assert!(!error.contains("secret"), "{error}");
}

#[test]
fn redacts_userinfo() {
    assert_eq!(redact_userinfo("https://u:p@h/x@y"), "https://h/x@y");
    assert_eq!(redact_userinfo("https://h/x@y"), "https://h/x@y");
    assert_eq!(redact_userinfo("nonsense"), "nonsense");
}

#[test]
fn classifies_statuses() {
    let url = "https://api.example/v1/vms/7";
    let class = |status| classify_status(Method::Get, url, status, b"");
    assert_eq!(class(200), None);
    assert_eq!(class(204), None);
    assert_eq!(class(302), None);
    assert!(matches!(class(401), Some(ProviderError::Unauthorized(_))));
    assert!(matches!(class(403), Some(ProviderError::Unauthorized(_))));
    assert!(matches!(class(404), Some(ProviderError::NotFound(_))));
    assert!(matches!(class(409), Some(ProviderError::Conflict(_))));
    assert!(matches!(class(423), Some(ProviderError::Conflict(_))));
    assert!(matches!(class(429), Some(ProviderError::Transient(_))));
    assert!(matches!(class(500), Some(ProviderError::Transient(_))));
    assert!(matches!(class(503), Some(ProviderError::Transient(_))));
    assert!(matches!(class(400), Some(ProviderError::Permanent(_))));
    assert!(matches!(class(422), Some(ProviderError::Permanent(_))));
    assert_eq!(
        class(404).map(|error| error.message().to_owned()),
        Some("GET https://api.example/v1/vms/7: HTTP 404".to_owned())
    );
}

#[test]
fn status_messages_carry_a_short_excerpt() {
    let body = format!("{{\"errors\":\n  {{\"vmid\": \"{}\"}}}}", "x".repeat(500));
    let error =
        classify_status(Method::Post, "https://h/p", 400, body.as_bytes()).expect("an error");
    let message = error.message();
    assert!(
        message.starts_with("POST https://h/p: HTTP 400: {\"errors\": {\"vmid\": \"xxx"),
        "{message}"
    );
    assert!(message.ends_with('…'), "{message}");
    assert!(message.chars().count() < 260, "{message}");
}

#[test]
fn excerpt_collapses_whitespace() {
    assert_eq!(excerpt(b"  a\n\tb  c "), "a b c");
    assert_eq!(excerpt(b""), "");
    assert_eq!(excerpt(&[0xff, b'a']), "\u{fffd}a");
}

#[test]
fn classifies_transport_errors() {
    let url = "https://api.example:8443/v1";
    let target = target(url);
    let class = |code: ErrorCode| classify_transport(&code, Method::Get, url, &target).into_error();
    assert_eq!(
        class(ErrorCode::HttpRequestDenied),
        ProviderError::Unauthorized(
            "denied by the host: the entry's grants do not allow https://api.example:8443"
                .to_owned()
        )
    );
    for code in [
        ErrorCode::DnsTimeout,
        ErrorCode::DnsError(wasi::DnsErrorPayload {
            rcode: Some("NXDOMAIN".into()),
            info_code: None,
        }),
        ErrorCode::ConnectionRefused,
        ErrorCode::ConnectionTerminated,
        ErrorCode::ConnectionTimeout,
        ErrorCode::ConnectionReadTimeout,
        ErrorCode::HttpResponseTimeout,
        ErrorCode::DestinationUnavailable,
    ] {
        assert!(matches!(class(code), ProviderError::Transient(_)));
    }
    for code in [
        ErrorCode::HttpResponseBodySize(Some(1024)),
        ErrorCode::HttpRequestBodySize(None),
        ErrorCode::TlsCertificateError,
        ErrorCode::HttpRequestUriInvalid,
    ] {
        assert!(matches!(class(code), ProviderError::Permanent(_)));
    }
    let message = class(ErrorCode::ConnectionRefused).message().to_owned();
    assert_eq!(message, "GET https://api.example:8443/v1: connection refused");
}

#[test]
fn transport_failures_keep_their_kind_and_give_the_health_reason() {
    let url = "https://api.example:8443/v1";
    let target = target(url);
    let failure = |code: ErrorCode| classify_transport(&code, Method::Get, url, &target);
    for (code, kind, reason) in [
        (ErrorCode::HttpRequestDenied, FailureKind::Denied, HealthReason::Unauthorized),
        (ErrorCode::DnsTimeout, FailureKind::Timeout, HealthReason::Timeout),
        (ErrorCode::ConnectionTimeout, FailureKind::Timeout, HealthReason::Timeout),
        (ErrorCode::ConnectionReadTimeout, FailureKind::Timeout, HealthReason::Timeout),
        (ErrorCode::HttpResponseTimeout, FailureKind::Timeout, HealthReason::Timeout),
        (ErrorCode::TlsCertificateError, FailureKind::Tls, HealthReason::CertificateInvalid),
        (ErrorCode::TlsProtocolError, FailureKind::Tls, HealthReason::CertificateInvalid),
        (ErrorCode::ConnectionRefused, FailureKind::Connection, HealthReason::Unreachable),
        (
            ErrorCode::DnsError(wasi::DnsErrorPayload { rcode: None, info_code: None }),
            FailureKind::Dns,
            HealthReason::Unreachable,
        ),
        (ErrorCode::HttpResponseBodySize(None), FailureKind::TooLarge, HealthReason::Unreachable),
        (ErrorCode::InternalError(Some("x".into())), FailureKind::Other, HealthReason::Unreachable),
    ] {
        let failure = failure(code);
        assert_eq!((failure.kind(), failure.health_reason()), (kind, reason), "{failure}");
    }
}

fn answer(status: u16, headers: &[(&str, &str)]) -> Response {
    Response {
        status,
        headers: headers.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
        body: Vec::new(),
        request: "GET https://api.example/v1".to_owned(),
    }
}

#[test]
fn an_answer_the_host_made_itself_is_told_by_its_header_not_its_text() {
    let refused = answer(503, &[(HOST_REFUSAL_HEADER, "credential-unavailable")]);
    let failure =
        Failure::of_answer(&refused, ProviderError::Transient("any wording at all".into()));
    assert_eq!(failure.kind(), FailureKind::Host(HostRefusal::CredentialUnavailable));
    assert_eq!(failure.health_reason(), HealthReason::CredentialsUnavailable);

    // The backend's own 401 is the backend's, whatever its body says.
    let backend = answer(401, &[]);
    let failure = Failure::of_answer(
        &backend,
        ProviderError::Unauthorized("the host could not get an access token".into()),
    );
    assert_eq!(failure.kind(), FailureKind::Status(401));
    assert_eq!(failure.health_reason(), HealthReason::Unauthorized);

    let unknown = answer(503, &[(HOST_REFUSAL_HEADER, "from-a-newer-host")]);
    let failure = Failure::of_answer(&unknown, ProviderError::Transient("x".into()));
    assert_eq!(failure.kind(), FailureKind::Status(503));
}

#[test]
fn an_answer_keeps_its_retry_after_in_seconds() {
    let busy = answer(429, &[("Retry-After", " 7 ")]);
    let failure = Failure::of_answer(&busy, ProviderError::Transient("busy".into()));
    assert_eq!(failure.retry_after(), Some(std::time::Duration::from_secs(7)));
    let dated = answer(503, &[("retry-after", "Wed, 21 Oct 2015 07:28:00 GMT")]);
    assert_eq!(
        Failure::of_answer(&dated, ProviderError::Transient("x".into())).retry_after(),
        None
    );
    let reworded = Failure::of_answer(&busy, ProviderError::Transient("busy".into()))
        .map_error(|_| ProviderError::QuotaExceeded("over quota".into()));
    assert_eq!(reworded.retry_after(), Some(std::time::Duration::from_secs(7)));
    assert_eq!(reworded.kind(), FailureKind::Status(429));
}

#[test]
fn debug_leaves_header_values_out() {
    let request = Request::get("https://h/")
        .header("authorization", "Bearer s3cret")
        .json(&serde_json::json!({"a": 1}));
    let debug = format!("{request:?}");
    assert!(debug.contains("authorization"), "{debug}");
    assert!(debug.contains("content-type"), "{debug}");
    assert!(!debug.contains("s3cret"), "{debug}");
}

#[test]
fn json_body_replaces_the_content_type() {
    let request = Request::post("https://h/").header("Content-Type", "text/plain").json(&[1, 2]);
    assert_eq!(request.body, b"[1,2]");
    let content_types: Vec<_> = request
        .headers
        .iter()
        .filter(|(name, _)| name.eq_ignore_ascii_case("content-type"))
        .collect();
    assert_eq!(content_types.len(), 1);
    assert_eq!(content_types[0].1, b"application/json");
}

#[test]
fn response_helpers() {
    let response = Response {
        status: 200,
        headers: vec![("Content-Type".into(), "application/json".into())],
        body: br#"{"data": 5}"#.to_vec(),
        request: "GET https://h/".into(),
    };
    assert_eq!(response.header("content-type"), Some("application/json"));
    assert_eq!(response.header("etag"), None);
    let value: serde_json::Value = response.json().expect("JSON");
    assert_eq!(value["data"], 5);
    let error = response.json::<Vec<u8>>().expect_err("not a list");
    assert!(matches!(error, ProviderError::Permanent(_)));
    assert!(error.message().starts_with("GET https://h/: unexpected response body (HTTP 200)"));
}
