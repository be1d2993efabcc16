//! The transport off wasm: each request goes whole to the thread's
//! [`crate::native::Host`], which answers it whole; the body is then read
//! in chunks as a stream would be.

use std::collections::VecDeque;

use super::super::classify::classify_transport;
use super::super::failure::Failure;
use super::{Head, Outgoing, ReadError, Sent};
use crate::native::{self, ErrorCode, HttpRequest, HttpResponse};

/// A request the host has answered, its answer not looked at yet.
pub(in crate::http) struct Pending {
    answer: Result<HttpResponse, ErrorCode>,
}

/// Hands the request to the installed host.
pub(in crate::http) fn start(request: &Outgoing<'_>) -> Result<Pending, Failure> {
    let plain = HttpRequest {
        method: request.method,
        url: request.url.to_owned(),
        headers: request.headers.to_vec(),
        body: request.body.to_vec(),
        connect_timeout: request.connect_timeout,
        first_byte_timeout: request.first_byte_timeout,
        between_bytes_timeout: request.between_bytes_timeout,
    };
    Ok(Pending { answer: native::host(|host| host.http(&plain)) })
}

impl Pending {
    /// The answer's head, or its transport failure classified as the
    /// operator's would be.
    pub(in crate::http) fn open(self, request: &Sent<'_>) -> Result<Head<Incoming>, Failure> {
        let response = self.answer.map_err(|code| {
            classify_transport(&code, request.method, request.url, request.target)
        })?;
        let mut chunks = VecDeque::new();
        chunks.push_back(response.body);
        Ok(Head {
            status: response.status,
            headers: response.headers,
            body: Incoming { chunks },
            upload_error: None,
        })
    }
}

/// The rest of an answer's body.
pub(in crate::http) struct Incoming {
    chunks: VecDeque<Vec<u8>>,
}

impl Incoming {
    /// The next chunk, at most `max` bytes; `None` at the end.
    pub(in crate::http) fn read(&mut self, max: u64) -> Result<Option<Vec<u8>>, ReadError> {
        let Some(mut chunk) = self.chunks.pop_front() else { return Ok(None) };
        let max = usize::try_from(max).unwrap_or(usize::MAX);
        if chunk.len() > max {
            self.chunks.push_front(chunk.split_off(max));
        }
        if chunk.is_empty() && self.chunks.is_empty() {
            return Ok(None);
        }
        Ok(Some(chunk))
    }

    /// Drops what was not read.
    pub(in crate::http) fn finish(&mut self) {
        self.chunks.clear();
    }
}
