//! `--otlp-endpoint`: the real binary exports its spans over OTLP/HTTP to a
//! collector, here a small recording server on loopback.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::sync::{Arc, Mutex};

use proxyfleet_tests::plugin;

/// A POST the collector received: its path, content type and body.
#[derive(Debug, Clone)]
struct Export {
    path: String,
    content_type: String,
    body: Vec<u8>,
}

/// An HTTP/1.1 server on 127.0.0.1 that answers every request with an
/// empty 200 and keeps what was posted.
fn collector() -> (String, Arc<Mutex<Vec<Export>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let kept = Arc::clone(&seen);
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let kept = Arc::clone(&kept);
            std::thread::spawn(move || serve(stream, &kept));
        }
    });
    (url, seen)
}

/// Serves the requests of one connection until the client closes it.
fn serve(stream: TcpStream, kept: &Mutex<Vec<Export>>) {
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let path = request_line.split_whitespace().nth(1).unwrap_or_default().to_owned();
        let (mut length, mut content_type) = (0usize, String::new());
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                match name.to_ascii_lowercase().as_str() {
                    "content-length" => length = value.trim().parse().unwrap_or(0),
                    "content-type" => value.trim().clone_into(&mut content_type),
                    _ => {}
                }
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        kept.lock().unwrap().push(Export { path, content_type, body });
        let answer =
            "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
        if writer.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

#[test]
fn provider_calls_are_exported_as_spans() {
    let (endpoint, exports) = collector();
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    std::fs::copy(plugin("static"), plugins.join("static.wasm")).unwrap();
    let providers = dir.path().join("providers.yaml");
    std::fs::write(
        &providers,
        "providers:\n  - name: office\n    plugin: static\n    config: { endpoints: ['192.0.2.1:3128'] }\n    proxyAddresses: ['192.0.2.0/24']\n",
    )
    .unwrap();

    let output = Command::new(env!("CARGO_BIN_EXE_proxyfleet"))
        .args(["--log-format", "text", "--otlp-endpoint", &endpoint])
        .args(["providers", "check", "--providers"])
        .arg(&providers)
        .arg("--plugin-dir")
        .arg(&plugins)
        .env_remove("RUST_LOG")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");

    // The exporter flushes when the binary exits, so everything is in.
    let exports = exports.lock().unwrap().clone();
    let traces: Vec<&Export> = exports.iter().filter(|e| e.path == "/v1/traces").collect();
    assert!(!traces.is_empty(), "no spans arrived at /v1/traces: {exports:?}\n{stderr}");
    for export in &traces {
        assert_eq!(export.content_type, "application/x-protobuf", "OTLP/HTTP with protobuf");
    }
    let body: Vec<u8> = traces.iter().flat_map(|e| e.body.iter().copied()).collect();
    let has = |needle: &str| body.windows(needle.len()).any(|w| w == needle.as_bytes());
    assert!(has("provider.call"), "no provider.call span was exported");
    assert!(has("proxyfleet"), "the service name is missing");
    for field in ["entry", "office", "operation", "check", "validate-config", "result"] {
        assert!(has(field), "{field} is missing from the exported spans");
    }
}
