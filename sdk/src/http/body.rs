//! Response bodies as they arrive: read whole, capped, or streamed chunk
//! by chunk; and request bodies written out.

use std::fmt;

use wasip2::http::types::{self as wasi, ErrorCode, IncomingBody, IncomingResponse, OutgoingBody};
use wasip2::io::streams::{InputStream, StreamError};

use super::classify::classify_transport;
use super::failure::{Failure, FailureKind};
use super::target::Target;
use super::{Method, READ_CHUNK, WRITE_CHUNK};
use crate::ProviderError;

/// How much of an error answer's body [`Request::send_streaming`] reads
/// for the message.
pub(super) const ERROR_BODY_BYTES: usize = 4096;

/// A response whose body has not been read yet. Field order is drop order:
/// the stream is a child of the body, the body of the response.
pub(super) struct OpenResponse {
    pub(super) stream: Option<InputStream>,
    pub(super) body: Option<IncomingBody>,
    pub(super) _response: IncomingResponse,
    pub(super) status: u16,
    pub(super) headers: Vec<(String, String)>,
    pub(super) method: Method,
    pub(super) url: String,
    pub(super) target: Target,
    /// `METHOD URL`, for error messages.
    pub(super) label: String,
    /// A failure sending the request body, reported once the status is known.
    pub(super) upload_error: Option<ErrorCode>,
    /// How reading the body failed: every later read fails the same way,
    /// so a body cut off never reads as one that ended.
    pub(super) failed: Option<Failure>,
}

impl OpenResponse {
    /// The next chunk of the body; `None` once it has all been read.
    pub(super) fn next_chunk(&mut self) -> Result<Option<Vec<u8>>, Failure> {
        if let Some(error) = &self.failed {
            return Err(error.clone());
        }
        let Some(stream) = &self.stream else { return Ok(None) };
        match stream.blocking_read(READ_CHUNK) {
            Ok(chunk) => Ok(Some(chunk)),
            Err(StreamError::Closed) => {
                self.finish();
                Ok(None)
            }
            Err(StreamError::LastOperationFailed(io_error)) => {
                self.finish();
                let error = match wasi::http_error_code(&io_error) {
                    Some(code) => classify_transport(&code, self.method, &self.url, &self.target),
                    None => Failure::new(
                        FailureKind::Connection,
                        ProviderError::Transient(format!(
                            "{}: reading the response failed: {}",
                            self.label,
                            io_error.to_debug_string()
                        )),
                    ),
                };
                self.failed = Some(error.clone());
                Err(error)
            }
        }
    }

    /// The first `limit` bytes of the body, or less when it ends or fails
    /// first: for the message of an error answer.
    pub(super) fn read_prefix(&mut self, limit: usize) -> Vec<u8> {
        let mut bytes = Vec::new();
        while bytes.len() < limit {
            match self.next_chunk() {
                Ok(Some(chunk)) => bytes.extend_from_slice(&chunk),
                Ok(None) | Err(_) => break,
            }
        }
        bytes.truncate(limit);
        bytes
    }

    /// The whole body, at most `limit` bytes.
    pub(super) fn read_all(&mut self, limit: usize) -> Result<Vec<u8>, Failure> {
        let mut bytes = Vec::new();
        while let Some(chunk) = self.next_chunk()? {
            if bytes.len() + chunk.len() > limit {
                self.finish();
                return Err(Failure::new(
                    FailureKind::TooLarge,
                    ProviderError::Permanent(format!(
                        "{}: response body too large (over {limit} bytes)",
                        self.label
                    )),
                ));
            }
            bytes.extend_from_slice(&chunk);
        }
        Ok(bytes)
    }

    /// A failed request upload, unless the status says more.
    pub(super) fn check_upload(&mut self) -> Result<(), Failure> {
        match self.upload_error.take().filter(|_| self.status < 400) {
            Some(code) => Err(classify_transport(&code, self.method, &self.url, &self.target)),
            None => Ok(()),
        }
    }

    /// Releases the body; trailers are not used.
    pub(super) fn finish(&mut self) {
        drop(self.stream.take());
        if let Some(body) = self.body.take() {
            drop(IncomingBody::finish(body));
        }
    }
}

impl Drop for OpenResponse {
    fn drop(&mut self) {
        self.finish();
    }
}

/// A response body read chunk by chunk, from [`Request::send_streaming`](super::Request::send_streaming).
pub struct BodyStream {
    pub(super) open: OpenResponse,
}

impl fmt::Debug for BodyStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BodyStream")
            .field("request", &self.open.label)
            .field("status", &self.open.status)
            .finish_non_exhaustive()
    }
}

impl BodyStream {
    /// The status code (below 400).
    pub fn status(&self) -> u16 {
        self.open.status
    }

    /// The first value of header `name`, compared case-insensitively.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.open
            .headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }

    /// The announced body length (`Content-Length`), when there is one.
    pub fn content_length(&self) -> Option<u64> {
        self.header("content-length").and_then(|value| value.trim().parse().ok())
    }

    /// The next chunk of the body (at most 64 KiB); `None` at its end. A
    /// connection lost part way is a [`Failure`] classified
    /// [`ProviderError::Transient`], and so is every read after it.
    pub fn next_chunk(&mut self) -> Result<Option<Vec<u8>>, Failure> {
        self.open.next_chunk()
    }
}

/// Streams `body` out and finishes the outgoing body. A failure is returned
/// but only reported after the response future, which carries the better
/// error code when the connection broke.
pub(super) fn write_body(
    outgoing_body: OutgoingBody,
    body: &[u8],
) -> std::result::Result<(), ErrorCode> {
    let stream_result = match outgoing_body.write() {
        Ok(stream) => {
            let mut result = Ok(());
            for chunk in body.chunks(WRITE_CHUNK) {
                if let Err(error) = stream.blocking_write_and_flush(chunk) {
                    result = Err(stream_error_code(error));
                    break;
                }
            }
            // The stream is a child of the body and must go first.
            drop(stream);
            result
        }
        Err(()) => {
            Err(ErrorCode::InternalError(Some("request body stream already taken".to_owned())))
        }
    };
    let finish_result = OutgoingBody::finish(outgoing_body, None);
    stream_result.and(finish_result)
}

pub(super) fn stream_error_code(error: StreamError) -> ErrorCode {
    match error {
        StreamError::LastOperationFailed(io_error) => wasi::http_error_code(&io_error)
            .unwrap_or_else(|| ErrorCode::InternalError(Some(io_error.to_debug_string()))),
        StreamError::Closed => ErrorCode::ConnectionTerminated,
    }
}
