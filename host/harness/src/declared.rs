//! A backend declared in a file, answering a plugin's HTTP requests in
//! place of a real API: collections of JSON resources that keep what is
//! created in them, and fixed exchanges. `proxyfleet plugin test
//! --backend FILE` runs the conformance suite against one, so a plugin
//! for a REST API can be held to the contract before any real server is
//! at hand.
//!
//! ```yaml
//! resources:
//!   - path: /v1/instances       # the collection
//!     key: name                 # the field of a created resource that names it
//!     fill:                     # fields the backend sets on what is created
//!       state: running
//!       address: 192.0.2.10
//! exchanges:
//!   - method: GET
//!     path: /v1/health
//!     status: 200
//!     body: { status: ok }
//! ```
//!
//! A collection at `P` answers `GET P` with `{"items": [...]}` (ordered by
//! key), `POST P` by creating the JSON object sent (`201`, or `409` when
//! its key is taken), `GET P/{key}` with the resource, `PATCH P/{key}` by
//! merging the object sent into it, and `DELETE P/{key}` with `204`; an
//! unknown key is `404`. Exchanges answer their method and path as
//! declared. Paths are compared without the query and the authority; any
//! other request gets a `501` naming it.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use http::{Request, Response};
use proxyfleet_runtime::capabilities::http::{HttpError, HttpTransport, SendPolicy, WasiBody};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::scripted::ScriptedResponse;

/// Why a backend file was refused.
#[derive(Debug, thiserror::Error)]
pub enum DeclaredError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a backend declaration.
    #[error("{0}")]
    Invalid(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    resources: Vec<RawResource>,
    #[serde(default)]
    exchanges: Vec<RawExchange>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawResource {
    path: String,
    key: String,
    #[serde(default)]
    fill: Map<String, Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawExchange {
    method: String,
    path: String,
    #[serde(default = "ok")]
    status: u16,
    #[serde(default)]
    body: Option<Value>,
}

fn ok() -> u16 {
    200
}

/// One collection of resources.
#[derive(Debug)]
struct Collection {
    path: String,
    key: String,
    fill: Map<String, Value>,
    members: BTreeMap<String, Value>,
}

/// One fixed answer.
#[derive(Debug)]
struct Exchange {
    method: String,
    path: String,
    status: u16,
    body: Option<Value>,
}

/// A backend declared in a file; see the module docs for the format.
#[derive(Debug, Clone)]
pub struct DeclaredBackend {
    state: Arc<Mutex<State>>,
}

#[derive(Debug)]
struct State {
    collections: Vec<Collection>,
    exchanges: Vec<Exchange>,
}

impl DeclaredBackend {
    /// Reads and checks the declaration in `path`.
    ///
    /// # Errors
    /// An unreadable file, or one [`DeclaredBackend::parse`] refuses.
    pub fn load(path: &Path) -> Result<Self, DeclaredError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| DeclaredError::Read { path: path.display().to_string(), source })?;
        Self::parse(&text)
            .map_err(|err| DeclaredError::Invalid(format!("{}: {err}", path.display())))
    }

    /// Checks a declaration (YAML or JSON); errors name the field.
    ///
    /// # Errors
    /// Unknown keys, a path that does not start with `/` or holds a query,
    /// an empty key field or a `fill` that sets it, an unknown method, or a
    /// status outside 200-599.
    pub fn parse(text: &str) -> Result<Self, DeclaredError> {
        let raw: RawFile = yaml_serde::from_str(text)
            .map_err(|err| DeclaredError::Invalid(format!("not a backend declaration: {err}")))?;
        let invalid =
            |field: String, what: &str| DeclaredError::Invalid(format!("{field}: {what}"));
        let check_path = |field: String, path: &str| {
            if !path.starts_with('/') || path.contains(['?', '#']) {
                Err(invalid(field, "give a path that starts with `/`, without a query"))
            } else {
                Ok(path.trim_end_matches('/').to_owned())
            }
        };
        let mut collections = Vec::new();
        for (index, resource) in raw.resources.into_iter().enumerate() {
            let path = check_path(format!("resources[{index}].path"), &resource.path)?;
            if resource.key.is_empty() {
                return Err(invalid(
                    format!("resources[{index}].key"),
                    "name the field that names a resource, e.g. `name`",
                ));
            }
            if resource.fill.contains_key(&resource.key) {
                return Err(invalid(
                    format!("resources[{index}].fill"),
                    "must not set the key field: it names the resource the request made",
                ));
            }
            collections.push(Collection {
                path,
                key: resource.key,
                fill: resource.fill,
                members: BTreeMap::new(),
            });
        }
        let mut exchanges = Vec::new();
        for (index, exchange) in raw.exchanges.into_iter().enumerate() {
            let method = exchange.method.to_ascii_uppercase();
            if !["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
                .contains(&method.as_str())
            {
                return Err(invalid(
                    format!("exchanges[{index}].method"),
                    "give an HTTP method such as GET or POST",
                ));
            }
            // A final answer: 1xx are interim and never end an exchange.
            if !(200..=599).contains(&exchange.status) {
                return Err(invalid(format!("exchanges[{index}].status"), "give 200 to 599"));
            }
            exchanges.push(Exchange {
                method,
                path: check_path(format!("exchanges[{index}].path"), &exchange.path)?,
                status: exchange.status,
                body: exchange.body,
            });
        }
        Ok(Self { state: Arc::new(Mutex::new(State { collections, exchanges })) })
    }

    /// The resources in the collection at `path` now, ordered by key.
    pub fn members(&self, path: &str) -> Vec<Value> {
        let state = self.lock();
        let path = path.trim_end_matches('/');
        state
            .collections
            .iter()
            .find(|collection| collection.path == path)
            .map(|collection| collection.members.values().cloned().collect())
            .unwrap_or_default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The answer to `method path` with `body`: status and JSON body.
    fn answer(&self, method: &str, path: &str, body: &[u8]) -> (u16, Option<Value>) {
        let path = path.trim_end_matches('/');
        let mut state = self.lock();
        if let Some(exchange) = state
            .exchanges
            .iter()
            .find(|exchange| exchange.method == method && exchange.path == path)
        {
            return (exchange.status, exchange.body.clone());
        }
        // A collection itself before any collection's member: `/v1` and
        // `/v1/instances` may both be declared.
        if let Some(collection) =
            state.collections.iter_mut().find(|collection| collection.path == path)
        {
            return collection.on_collection(method, body);
        }
        for collection in &mut state.collections {
            if let Some(key) = path
                .strip_prefix(collection.path.as_str())
                .and_then(|rest| rest.strip_prefix('/'))
                .filter(|key| !key.is_empty() && !key.contains('/'))
            {
                return collection.on_member(method, &percent_decode(key), body);
            }
        }
        (501, Some(error(&format!("the declared backend answers no {method} {path}"))))
    }
}

impl Collection {
    fn on_collection(&mut self, method: &str, body: &[u8]) -> (u16, Option<Value>) {
        match method {
            "GET" => (200, Some(json!({ "items": self.members.values().collect::<Vec<_>>() }))),
            "POST" => {
                let Some(Value::Object(mut resource)) = serde_json::from_slice(body).ok() else {
                    return (400, Some(error("the body is not a JSON object")));
                };
                let Some(key) = resource.get(&self.key).and_then(Value::as_str).map(str::to_owned)
                else {
                    return (400, Some(error(&format!("the body has no string `{}`", self.key))));
                };
                if self.members.contains_key(&key) {
                    return (409, Some(error(&format!("{key} already exists"))));
                }
                resource.extend(self.fill.clone());
                let resource = Value::Object(resource);
                self.members.insert(key, resource.clone());
                (201, Some(resource))
            }
            _ => (405, Some(error(&format!("{method} is not allowed on a collection")))),
        }
    }

    fn on_member(&mut self, method: &str, key: &str, body: &[u8]) -> (u16, Option<Value>) {
        let not_found = || (404, Some(error(&format!("{key} not found"))));
        match method {
            "GET" => self.members.get(key).map_or_else(not_found, |r| (200, Some(r.clone()))),
            "DELETE" => self.members.remove(key).map_or_else(not_found, |_| (204, None)),
            "PATCH" => {
                let Some(Value::Object(changes)) = serde_json::from_slice(body).ok() else {
                    return (400, Some(error("the body is not a JSON object")));
                };
                let Some(Value::Object(resource)) = self.members.get_mut(key) else {
                    return not_found();
                };
                // The key names the resource; a patch cannot rename it.
                resource.extend(changes.into_iter().filter(|(field, _)| *field != self.key));
                (200, Some(Value::Object(resource.clone())))
            }
            _ => (405, Some(error(&format!("{method} is not allowed on a resource")))),
        }
    }
}

fn error(message: &str) -> Value {
    json!({ "error": message })
}

/// `%XX` escapes decoded; anything malformed is kept as written.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let escaped = (bytes[index] == b'%')
            .then(|| text.get(index + 1..index + 3))
            .flatten()
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escaped {
            Some(byte) => {
                out.push(byte);
                index += 3;
            }
            None => {
                out.push(bytes[index]);
                index += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[async_trait]
impl HttpTransport for DeclaredBackend {
    async fn send(
        &self,
        request: Request<Bytes>,
        _policy: &SendPolicy,
    ) -> Result<Response<WasiBody>, HttpError> {
        let (parts, body) = request.into_parts();
        let (status, answer) = self.answer(parts.method.as_str(), parts.uri.path(), &body);
        match answer {
            Some(value) => ScriptedResponse::json(status, value.to_string()),
            None => ScriptedResponse::new(status, Bytes::new()),
        }
        .into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "
resources:
  - path: /v1/instances/
    key: name
    fill: { state: running }
exchanges:
  - { method: get, path: /v1/health, body: { ok: true } }
";

    #[test]
    fn a_collection_keeps_what_is_created_in_it() {
        let backend = DeclaredBackend::parse(FILE).expect("valid");
        let created = backend.answer("POST", "/v1/instances", br#"{"name":"a","port":1}"#);
        assert_eq!(created, (201, Some(json!({"name": "a", "port": 1, "state": "running"}))));
        assert_eq!(backend.answer("POST", "/v1/instances", br#"{"name":"a"}"#).0, 409);
        assert_eq!(backend.answer("GET", "/v1/instances/a", b"").0, 200);
        let patched = backend.answer("PATCH", "/v1/instances/a", br#"{"port":2,"name":"b"}"#);
        assert_eq!(patched.1.expect("the resource")["port"], 2);
        let listed = backend.answer("GET", "/v1/instances", b"");
        assert_eq!(listed.1.expect("a list")["items"][0]["name"], "a", "not renamed");
        assert_eq!(backend.answer("DELETE", "/v1/instances/a", b""), (204, None));
        assert_eq!(backend.answer("DELETE", "/v1/instances/a", b"").0, 404);
        assert_eq!(backend.answer("GET", "/v1/instances/a", b"").0, 404);
        assert!(backend.members("/v1/instances").is_empty());
    }

    #[test]
    fn exchanges_answer_as_declared_and_nothing_else_answers() {
        let backend = DeclaredBackend::parse(FILE).expect("valid");
        assert_eq!(backend.answer("GET", "/v1/health", b""), (200, Some(json!({"ok": true}))));
        let (status, body) = backend.answer("GET", "/v2/else", b"");
        assert_eq!(status, 501);
        assert!(body.expect("an error")["error"].as_str().expect("text").contains("GET /v2/else"));
    }

    /// A collection nested in another is reached, not read as a member.
    #[test]
    fn a_nested_collection_is_not_a_member_of_its_parent() {
        let backend = DeclaredBackend::parse(
            "resources: [{path: /v1, key: id}, {path: /v1/instances, key: name}]",
        )
        .expect("valid");
        backend.answer("POST", "/v1/instances", br#"{"name":"a"}"#);
        assert_eq!(backend.members("/v1/instances").len(), 1);
        assert!(backend.members("/v1").is_empty());
        assert_eq!(backend.answer("GET", "/v1/instances", b"").0, 200);
    }

    #[test]
    fn keys_are_percent_decoded() {
        let backend = DeclaredBackend::parse(FILE).expect("valid");
        backend.answer("POST", "/v1/instances", br#"{"name":"a b"}"#);
        assert_eq!(backend.answer("GET", "/v1/instances/a%20b", b"").0, 200);
    }

    #[test]
    fn errors_name_the_field() {
        let message = |text: &str| DeclaredBackend::parse(text).expect_err("refused").to_string();
        assert!(message("resources: [{path: v1, key: name}]").starts_with("resources[0].path"));
        assert!(message("resources: [{path: /v1, key: ''}]").starts_with("resources[0].key"));
        assert!(
            message("exchanges: [{method: FETCH, path: /}]").starts_with("exchanges[0].method")
        );
        assert!(
            message("exchanges: [{method: GET, path: /, status: 700}]")
                .starts_with("exchanges[0].status")
        );
        assert!(message("resource: []").contains("unknown field `resource`"));
        let interim = message("exchanges: [{method: GET, path: /, status: 101}]");
        assert!(interim.starts_with("exchanges[0].status"), "{interim}");
        let renaming = message("resources: [{path: /v1, key: name, fill: {name: x}}]");
        assert!(renaming.starts_with("resources[0].fill"), "{renaming}");
    }
}
