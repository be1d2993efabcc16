//! The host the SDK's own doc examples run under. It exists for those
//! examples only and is not part of the API: plugin authors test with
//! `proxyfleet-sdk-testkit`.
//!
//! It keeps an in-memory store (compare-and-swap on versions), answers
//! requests with the example's closure and discards logs.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt;
use std::rc::Rc;

use super::{ErrorCode, Host, HttpRequest, HttpResponse};
use crate::bindings::proxyfleet::provider::kv::{CasOutcome, KvEntry};
use crate::bindings::proxyfleet::provider::log::Level;
use crate::kv_error::KvError;

/// What answers a request.
type Answer = Box<dyn Fn(&HttpRequest) -> Result<HttpResponse, ErrorCode>>;

/// A host with an in-memory store whose requests a closure answers.
pub struct DocHost {
    store: RefCell<BTreeMap<String, KvEntry>>,
    http: Answer,
    config: String,
    table: BTreeMap<String, String>,
}

impl DocHost {
    /// An empty store and config; `http` answers every request.
    pub fn new(http: impl Fn(&HttpRequest) -> Result<HttpResponse, ErrorCode> + 'static) -> Self {
        Self {
            store: RefCell::default(),
            http: Box::new(http),
            config: "{}".to_owned(),
            table: BTreeMap::new(),
        }
    }
}

impl fmt::Debug for DocHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DocHost").field("keys", &self.store.borrow().len()).finish_non_exhaustive()
    }
}

impl Host for DocHost {
    fn kv_get(&self, key: &str) -> Result<Option<KvEntry>, KvError> {
        Ok(self.store.borrow().get(key).cloned())
    }

    fn kv_compare_and_swap(
        &self,
        key: &str,
        expected: Option<u64>,
        value: Option<&[u8]>,
    ) -> Result<CasOutcome, KvError> {
        let mut store = self.store.borrow_mut();
        let current = store.get(key).cloned();
        if current.as_ref().map(|entry| entry.version) != expected {
            return Ok(CasOutcome::Conflict(current));
        }
        let Some(value) = value else {
            store.remove(key);
            return Ok(CasOutcome::Applied(0));
        };
        let version = expected.map_or(1, |version| version + 1);
        let entry = KvEntry { key: key.to_owned(), value: value.to_vec(), version };
        store.insert(key.to_owned(), entry);
        Ok(CasOutcome::Applied(version))
    }

    fn kv_list(&self, prefix: &str) -> Result<Vec<KvEntry>, KvError> {
        let store = self.store.borrow();
        Ok(store.values().filter(|entry| entry.key.starts_with(prefix)).cloned().collect())
    }

    fn http(&self, request: &HttpRequest) -> Result<HttpResponse, ErrorCode> {
        (self.http)(request)
    }

    fn log(&self, _: Level, _: &str, _: &[(String, String)]) {}

    fn config_json(&self) -> String {
        self.config.clone()
    }

    fn config_lookup(&self, key: &str) -> Option<String> {
        self.table.get(key).cloned()
    }
}

/// Runs `call` with a fresh [`DocHost`] for an entry whose config is
/// `json` and whose lookup table is `table`.
pub fn configured<R>(json: &str, table: &[(&str, &str)], call: impl FnOnce() -> R) -> R {
    let mut host = DocHost::new(|_| Err(ErrorCode::HttpRequestDenied));
    host.config = json.to_owned();
    host.table =
        table.iter().map(|(key, value)| ((*key).to_owned(), (*value).to_owned())).collect();
    super::with_host(Rc::new(host), call)
}

/// Runs `call` with a fresh [`DocHost`] that refuses every request.
pub fn run<R>(call: impl FnOnce() -> R) -> R {
    serve(|_| Err(ErrorCode::HttpRequestDenied), call)
}

/// Runs `call` with a fresh [`DocHost`] whose requests `http` answers.
pub fn serve<R>(
    http: impl Fn(&HttpRequest) -> Result<HttpResponse, ErrorCode> + 'static,
    call: impl FnOnce() -> R,
) -> R {
    super::with_host(Rc::new(DocHost::new(http)), call)
}

/// The answer `status` with `headers` and `body`, for a closure given to
/// [`serve`] or [`DocHost::new`].
pub fn answer(
    status: u16,
    headers: &[(&str, &str)],
    body: impl Into<Vec<u8>>,
) -> Result<HttpResponse, ErrorCode> {
    let headers = headers.iter().map(|(name, value)| ((*name).to_owned(), (*value).to_owned()));
    Ok(HttpResponse { status, headers: headers.collect(), body: body.into() })
}
