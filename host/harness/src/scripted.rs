//! Scripted HTTP answers for plugin tests.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use http::{Request, Response};
use proxyfleet_runtime::capabilities::http::{
    HttpError, HttpTransport, SendPolicy, WasiBody, full_body,
};

/// One scripted answer.
#[derive(Debug, Clone)]
pub struct ScriptedResponse {
    /// Status code.
    pub status: u16,
    /// Response headers.
    pub headers: Vec<(String, String)>,
    /// Response body.
    pub body: Bytes,
}

impl ScriptedResponse {
    /// A response with a body and no headers.
    pub fn new(status: u16, body: impl Into<Bytes>) -> Self {
        Self { status, headers: Vec::new(), body: body.into() }
    }

    /// A JSON response.
    pub fn json(status: u16, body: impl Into<Bytes>) -> Self {
        Self::new(status, body).header("content-type", "application/json")
    }

    /// Adds a header.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// The answer as a transport hands it to the runtime.
    pub(crate) fn into_response(self) -> Result<Response<WasiBody>, HttpError> {
        let mut builder = Response::builder().status(self.status);
        for (name, value) in &self.headers {
            builder = builder.header(name, value);
        }
        builder
            .body(full_body(self.body))
            .map_err(|err| HttpError::InternalError(Some(err.to_string())))
    }
}

/// A request the plugin sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedRequest {
    /// Method, upper case.
    pub method: String,
    /// Full URL.
    pub url: String,
    /// Headers as sent (after the host's injection).
    pub headers: Vec<(String, String)>,
    /// Body.
    pub body: Bytes,
}

/// A transport that answers from a script and records every request.
#[derive(Debug, Clone, Default)]
pub struct ScriptedHttp {
    inner: Arc<Mutex<Script>>,
}

#[derive(Debug, Default)]
struct Script {
    answers: BTreeMap<(String, String), VecDeque<ScriptedResponse>>,
    seen: Vec<RecordedRequest>,
}

impl ScriptedHttp {
    fn lock(&self) -> std::sync::MutexGuard<'_, Script> {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Queues an answer for `method url` (the URL as the plugin sends it,
    /// including the query).
    pub fn respond(&self, method: &str, url: &str, response: ScriptedResponse) {
        self.lock()
            .answers
            .entry((method.to_ascii_uppercase(), url.to_owned()))
            .or_default()
            .push_back(response);
    }

    /// Every request seen so far.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.lock().seen.clone()
    }
}

#[async_trait]
impl HttpTransport for ScriptedHttp {
    async fn send(
        &self,
        request: Request<Bytes>,
        _policy: &SendPolicy,
    ) -> Result<Response<WasiBody>, HttpError> {
        let (parts, body) = request.into_parts();
        let method = parts.method.as_str().to_owned();
        let url = parts.uri.to_string();
        let headers = parts
            .headers
            .iter()
            .map(|(k, v)| {
                (k.as_str().to_owned(), String::from_utf8_lossy(v.as_bytes()).into_owned())
            })
            .collect();
        let mut script = self.lock();
        script.seen.push(RecordedRequest {
            method: method.clone(),
            url: url.clone(),
            headers,
            body,
        });
        let answer = match script.answers.get_mut(&(method.clone(), url.clone())) {
            Some(queue) if queue.len() > 1 => queue.pop_front(),
            Some(queue) => queue.front().cloned(),
            None => None,
        };
        let answer = answer.unwrap_or_else(|| {
            ScriptedResponse::new(501, format!("no scripted response for {method} {url}"))
        });
        answer.into_response()
    }
}
