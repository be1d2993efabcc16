//! The HTTPS front: TLS, token authentication, parameter parsing (query
//! string, form, JSON and multipart bodies), routing, and rendering answers
//! the way PVE's JSON formatter does.

use std::collections::BTreeMap;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use proxyfleet_sim_support::https::DropConnection;
use serde_json::{Value, json};

use crate::state::{ApiError, ApiResult, Shared};

const PREFIX: &str = "/api2/json";

pub(crate) async fn handle(
    shared: &Shared,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, DropConnection> {
    let faults = shared.faults();
    if !faults.latency.is_zero() {
        tokio::time::sleep(faults.latency).await;
    }
    let method = request.method().as_str().to_owned();
    let path = request.uri().path().to_owned();
    let query = request.uri().query().unwrap_or("").to_owned();
    let server_error = shared.record_request(format!("{method} {path}"));
    let in_body = shared.options.message_in_body();

    if let Err(error) = authenticate(shared, &request) {
        return Ok(render(Err(error), in_body));
    }
    let content_type = request
        .headers()
        .get("content-type")
        .and_then(|value| value.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let is_upload = path.ends_with("/upload");
    if is_upload && faults.drop_upload {
        // Read a little of the body, as a proxy or server that dies
        // mid-transfer would, then go away without answering.
        let mut body = request.into_body();
        let _ = body.frame().await;
        return Err(DropConnection);
    }
    let Ok(body) = request.into_body().collect().await else {
        return Err(DropConnection);
    };
    let body = body.to_bytes();
    if server_error {
        return Ok(render(
            Err(ApiError::internal("proxy handler failed: internal error")),
            in_body,
        ));
    }

    let Some(route) = path.strip_prefix(PREFIX) else {
        return Ok(render(
            Err(ApiError {
                status: 501,
                message: format!("Method '{method} {path}' not implemented"),
                errors: None,
                from_proxy: false,
            }),
            in_body,
        ));
    };
    let mut params = parse_form(&query);
    let mut upload = None;
    if content_type.starts_with("application/x-www-form-urlencoded") {
        params.extend(parse_form(&String::from_utf8_lossy(&body)));
    } else if content_type.starts_with("application/json") && !body.is_empty() {
        match serde_json::from_slice::<Value>(&body) {
            Ok(Value::Object(object)) => {
                for (key, value) in object {
                    let text = match value {
                        Value::String(text) => text,
                        other => other.to_string(),
                    };
                    params.insert(key, text);
                }
            }
            _ => return Ok(render(Err(ApiError::internal("malformed JSON body")), in_body)),
        }
    } else if content_type.starts_with("multipart/form-data") {
        match parse_multipart(&content_type, &body) {
            Some((fields, file)) => {
                params.extend(fields);
                upload = file;
            }
            None => {
                return Ok(render(Err(ApiError::internal("malformed multipart body")), in_body));
            }
        }
    }
    Ok(render(route_request(shared, &method, route, &params, upload), in_body))
}

fn authenticate(shared: &Shared, request: &Request<Incoming>) -> Result<(), ApiError> {
    let Some(header) = request.headers().get("authorization") else {
        return Err(ApiError::unauthorized("No ticket"));
    };
    let value = header.to_str().unwrap_or("");
    let Some(token) = value.strip_prefix("PVEAPIToken=") else {
        return Err(ApiError::unauthorized("No ticket"));
    };
    if token == shared.options.token {
        Ok(())
    } else {
        Err(ApiError::unauthorized("invalid token value!"))
    }
}

/// Renders an answer as PVE's JSON formatter does. The error text always
/// goes in the status line's reason phrase; the body carries it too only
/// where the version does (`message_in_body`), and never for an error the
/// proxying node raised itself.
fn render(result: ApiResult, message_in_body: bool) -> Response<Full<Bytes>> {
    let (status, body, reason) = match result {
        Ok(data) => (200, json!({ "data": data }), None),
        Err(error) => {
            let mut body = json!({ "data": null });
            if message_in_body && !error.from_proxy {
                body["message"] = Value::String(format!("{}\n", error.message));
            }
            if let Some(errors) = error.errors {
                body["errors"] = Value::Object(errors);
            }
            (error.status, body, Some(error.message))
        }
    };
    let mut response = Response::builder()
        .status(status)
        .header("content-type", "application/json;charset=UTF-8")
        .header("cache-control", "max-age=0")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("a valid response");
    // PVE puts the message in the status line as well.
    if let Some(reason) = reason {
        let reason: String =
            reason.chars().filter(|c| c.is_ascii() && !c.is_ascii_control()).collect();
        if let Ok(phrase) = hyper::ext::ReasonPhrase::try_from(reason) {
            response.extensions_mut().insert(phrase);
        }
    }
    response
}

fn vmid_of(text: &str) -> Result<u32, ApiError> {
    text.parse().map_err(|_| ApiError::parameter("vmid", "type check ('integer') failed"))
}

fn route_request(
    shared: &Shared,
    method: &str,
    route: &str,
    params: &BTreeMap<String, String>,
    upload: Option<Vec<u8>>,
) -> ApiResult {
    let segments: Vec<String> = route.trim_matches('/').split('/').map(percent_decode).collect();
    let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
    // The node asked proxies every `/nodes/{node}/…` call to that node; an
    // offline one answers as pveproxy does when it cannot reach it.
    let node_known = |node: &str| {
        if !shared.has_node(node) {
            Err(ApiError::internal(format!("no such cluster node '{node}'")))
        } else if shared.is_offline(node) {
            Err(ApiError::unreachable("No route to host"))
        } else {
            Ok(())
        }
    };
    let param = |key: &str| params.get(key).map(String::as_str);
    match (method, segments.as_slice()) {
        ("GET", ["version"]) => {
            let release = shared
                .options
                .version
                .rsplit_once('.')
                .map_or(shared.options.version.as_str(), |(release, _)| release);
            Ok(
                json!({"version": shared.options.version, "release": release, "repoid": "a1b2c3d4e5f60718"}),
            )
        }
        ("GET", ["nodes"]) => Ok(Value::Array(
            shared
                .options
                .nodes
                .iter()
                .map(|node| json!({"node": node, "status": shared.node_status(node), "type": "node"}))
                .collect(),
        )),
        ("GET", ["nodes", node, "status"]) => {
            node_known(node)?;
            Ok(
                json!({"uptime": 86_400, "pveversion": format!("pve-manager/{}/a1b2c3d4e5f60718", shared.options.version),
                      "cpu": 0.02, "memory": {"total": 64u64 << 30, "used": 8u64 << 30, "free": 56u64 << 30}}),
            )
        }
        ("GET", ["cluster", "resources"]) => shared.resources(param("type")),
        ("GET", ["cluster", "nextid"]) => shared.nextid(param("vmid")),
        ("GET", ["nodes", node, "tasks", upid, "status"]) => {
            node_known(node)?;
            shared.task_status(node, upid)
        }
        ("GET", ["nodes", node, "qemu", vmid, "config"]) => {
            node_known(node)?;
            shared.get_config(node, vmid_of(vmid)?)
        }
        ("PUT", ["nodes", node, "qemu", vmid, "config"]) => {
            node_known(node)?;
            shared.put_config(node, vmid_of(vmid)?, params)
        }
        ("PUT", ["nodes", node, "qemu", vmid, "resize"]) => {
            node_known(node)?;
            shared.resize(node, vmid_of(vmid)?, params)
        }
        ("POST", ["nodes", node, "qemu", vmid, "clone"]) => {
            node_known(node)?;
            shared.clone_vm(node, vmid_of(vmid)?, params)
        }
        ("GET", ["nodes", node, "qemu", vmid, "status", "current"]) => {
            node_known(node)?;
            shared.current_status(node, vmid_of(vmid)?)
        }
        ("POST", ["nodes", node, "qemu", vmid, "status", "start"]) => {
            node_known(node)?;
            shared.start(node, vmid_of(vmid)?)
        }
        ("POST", ["nodes", node, "qemu", vmid, "status", "stop"]) => {
            node_known(node)?;
            shared.stop(node, vmid_of(vmid)?)
        }
        ("DELETE", ["nodes", node, "qemu", vmid]) => {
            node_known(node)?;
            shared.destroy(node, vmid_of(vmid)?)
        }
        ("GET", ["nodes", node, "qemu", vmid, "agent", "network-get-interfaces"]) => {
            node_known(node)?;
            shared.agent_interfaces(node, vmid_of(vmid)?)
        }
        ("GET", ["nodes", node, "storage", storage, "status"]) => {
            node_known(node)?;
            shared.storage_status(node, storage)
        }
        ("GET", ["nodes", node, "storage", storage, "content"]) => {
            node_known(node)?;
            shared.storage_content(node, storage, param("content"))
        }
        ("POST", ["nodes", node, "storage", storage, "upload"]) => {
            node_known(node)?;
            let content = param("content").ok_or_else(|| {
                ApiError::parameter("content", "property is missing and it is not optional")
            })?;
            let filename = param("filename").ok_or_else(|| {
                ApiError::parameter("filename", "property is missing and it is not optional")
            })?;
            let data = upload.ok_or_else(|| ApiError::parameter("filename", "no file uploaded"))?;
            shared.upload(node, storage, content, filename, data)
        }
        ("DELETE", ["nodes", node, "storage", storage, "content", volume]) => {
            node_known(node)?;
            shared.delete_volume(node, storage, volume)
        }
        _ => Err(ApiError {
            status: 501,
            message: format!("Method '{method} {PREFIX}{route}' not implemented"),
            errors: None,
            from_proxy: false,
        }),
    }
}

fn parse_form(text: &str) -> BTreeMap<String, String> {
    text.split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(&key.replace('+', " ")), percent_decode(&value.replace('+', " ")))
        })
        .collect()
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%'
            && index + 2 < bytes.len()
            && let Ok(hex) = std::str::from_utf8(&bytes[index + 1..index + 3])
            && let Ok(byte) = u8::from_str_radix(hex, 16)
        {
            out.push(byte);
            index += 3;
        } else {
            out.push(bytes[index]);
            index += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Text fields by name, and the uploaded file's content.
type Multipart = (BTreeMap<String, String>, Option<Vec<u8>>);

/// The text fields and the content of the part named `filename` (PVE's
/// upload takes the file in a part of that name, with the file's name as
/// the part's `filename`, which also becomes the `filename` parameter).
fn parse_multipart(content_type: &str, body: &[u8]) -> Option<Multipart> {
    let boundary =
        content_type.split(';').find_map(|part| part.trim().strip_prefix("boundary="))?;
    let boundary = boundary.trim_matches('"');
    let delimiter = format!("--{boundary}");
    let mut fields = BTreeMap::new();
    let mut file = None;
    let mut rest = body;
    loop {
        let start = find(rest, delimiter.as_bytes())? + delimiter.len();
        rest = &rest[start..];
        if rest.starts_with(b"--") {
            return Some((fields, file));
        }
        rest = rest.strip_prefix(b"\r\n")?;
        let head_end = find(rest, b"\r\n\r\n")?;
        let head = String::from_utf8_lossy(&rest[..head_end]).into_owned();
        rest = &rest[head_end + 4..];
        let end = find(rest, format!("\r\n{delimiter}").as_bytes())?;
        let content = &rest[..end];
        rest = &rest[end + 2..];
        let disposition = head
            .lines()
            .find(|line| line.to_ascii_lowercase().starts_with("content-disposition"))?;
        let attribute = |name: &str| {
            disposition.split(';').find_map(|part| {
                part.trim()
                    .strip_prefix(&format!("{name}="))
                    .map(|value| value.trim_matches('"').to_owned())
            })
        };
        let name = attribute("name")?;
        match attribute("filename") {
            Some(filename) => {
                fields.entry("filename".to_owned()).or_insert(filename);
                file = Some(content.to_vec());
            }
            None => {
                fields.insert(name, String::from_utf8_lossy(content).into_owned());
            }
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|window| window == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multipart_fields_and_file_are_split() {
        let body = b"--XyZ\r\nContent-Disposition: form-data; name=\"content\"\r\n\r\niso\r\n\
--XyZ\r\nContent-Disposition: form-data; name=\"filename\"; filename=\"seed.iso\"\r\n\
Content-Type: application/octet-stream\r\n\r\nAB\r\nCD\r\n--XyZ--\r\n";
        let (fields, file) =
            parse_multipart("multipart/form-data; boundary=XyZ", body).expect("parses");
        assert_eq!(fields.get("content").map(String::as_str), Some("iso"));
        assert_eq!(fields.get("filename").map(String::as_str), Some("seed.iso"));
        assert_eq!(file.as_deref(), Some(&b"AB\r\nCD"[..]));
    }

    #[test]
    fn form_values_are_decoded() {
        let form = parse_form("newid=101&description=a%20b%0Ac+d&full=1");
        assert_eq!(form.get("description").map(String::as_str), Some("a b\nc d"));
        assert_eq!(percent_decode("UPID%3Apve1%3A"), "UPID:pve1:");
    }
}
