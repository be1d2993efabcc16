use wasip2::http::types::ErrorCode;

use super::target::Scheme;
use super::*;

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
    let class = |code: ErrorCode| classify_transport(&code, Method::Get, url, &target);
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
