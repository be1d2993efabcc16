//! The backend's API: every call the provider makes to it. Change these
//! to your backend's calls; the provider in `lib.rs` needs only what they
//! return.
//!
//! The API as written: `POST /v1/instances` creates an instance from a
//! JSON object (`409` when its name is taken), `GET /v1/instances/{name}`
//! and `DELETE /v1/instances/{name}` read and delete one (`404` when there
//! is none), `GET /v1/instances` lists them as `{"items": [...]}`, and
//! `GET /v1/health` answers `200` while the API serves. An instance is a
//! JSON object with at least `name`, `state`, `address` and `labels`.

use proxyfleet_sdk::http::{Failure, FailureKind, Request, encode_component};
use proxyfleet_sdk::{ProviderError, Result};
use serde_json::Value;

use crate::config::Config;

/// What a create came to.
pub enum Created {
    /// The instance, as the API answered.
    Instance(Value),
    /// The name is taken: an earlier attempt (or someone else) made it.
    Taken,
}

/// A client of the API at the entry's endpoint.
pub struct Api<'a> {
    config: &'a Config,
}

impl<'a> Api<'a> {
    pub fn new(config: &'a Config) -> Self {
        Self { config }
    }

    fn url(&self, path: &str) -> String {
        format!("{}/v1/{path}", self.config.base())
    }

    /// The instance `name`; `None` when the API has none.
    pub fn find(&self, name: &str) -> Result<Option<Value>> {
        let url = self.url(&format!("instances/{}", encode_component(name)));
        match Request::get(url).send() {
            Ok(response) => response.json().map(Some),
            Err(failure) if failure.kind() == FailureKind::Status(404) => Ok(None),
            Err(failure) => Err(failure.into()),
        }
    }

    /// Creates an instance from `body`.
    pub fn create(&self, body: &Value) -> Result<Created> {
        match Request::post(self.url("instances")).json(body).send() {
            Ok(response) => response.json().map(Created::Instance),
            Err(failure) if failure.kind() == FailureKind::Status(409) => Ok(Created::Taken),
            Err(failure) => Err(failure.into()),
        }
    }

    /// Deletes the instance `name`; one that is gone already counts.
    pub fn delete(&self, name: &str) -> Result<()> {
        let url = self.url(&format!("instances/{}", encode_component(name)));
        match Request::delete(url).send() {
            Ok(_) => Ok(()),
            Err(failure) if failure.kind() == FailureKind::Status(404) => Ok(()),
            Err(failure) => Err(failure.into()),
        }
    }

    /// Every instance the API has.
    pub fn list(&self) -> Result<Vec<Value>> {
        let listed: Value = Request::get(self.url("instances")).send()?.json()?;
        match listed.get("items") {
            Some(Value::Array(items)) => Ok(items.clone()),
            _ => Err(ProviderError::Permanent(
                "GET /v1/instances: the answer has no `items` list".to_owned(),
            )),
        }
    }

    /// Whether the API serves.
    pub fn health(&self) -> std::result::Result<(), Failure> {
        Request::get(self.url("health")).send().map(drop)
    }
}
