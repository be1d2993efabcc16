//! The transport on wasm: requests go out through the host's
//! `wasi:http/outgoing-handler`, and answers come back as its streams.

use std::time::Duration;

use wasip2::http::outgoing_handler;
use wasip2::http::types::{
    self as wasi, ErrorCode, Fields, IncomingBody, IncomingResponse, OutgoingBody, OutgoingRequest,
    RequestOptions,
};
use wasip2::io::streams::{InputStream, StreamError};

use super::super::Method;
use super::super::classify::classify_transport;
use super::super::failure::{Failure, FailureKind};
use super::super::target::Scheme;
use super::{Head, Outgoing, ReadError, Sent};
use crate::ProviderError;

/// A request on its way: sent, its answer not awaited yet.
pub(in crate::http) struct Pending {
    future_response: wasi::FutureIncomingResponse,
    write_result: Result<(), ErrorCode>,
}

/// Hands the request to the host and streams its body out.
pub(in crate::http) fn start(request: &Outgoing<'_>) -> Result<Pending, Failure> {
    let fail = |what: &str| refused(request.label, what);
    let headers = Fields::new();
    for (name, value) in request.headers {
        headers.append(name, value).map_err(|error| {
            // The value is left out on purpose: it may be a credential.
            fail(&format!("header `{name}` refused by the host ({error:?})"))
        })?;
    }
    let outgoing = OutgoingRequest::new(headers);
    outgoing
        .set_method(&as_wasi(request.method))
        .map_err(|()| fail("method refused by the host"))?;
    outgoing
        .set_scheme(Some(&match request.target.scheme {
            Scheme::Http => wasi::Scheme::Http,
            Scheme::Https => wasi::Scheme::Https,
        }))
        .map_err(|()| fail("scheme refused by the host"))?;
    outgoing
        .set_authority(Some(&request.target.authority))
        .map_err(|()| fail("authority refused by the host"))?;
    outgoing
        .set_path_with_query(Some(&request.target.path_with_query))
        .map_err(|()| fail("path refused by the host"))?;

    let options = RequestOptions::new();
    // An error only means the host does not support that timeout; its
    // own limits and the call deadline then apply.
    let nanos = |timeout: Duration| u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
    let _ = options.set_connect_timeout(Some(nanos(request.connect_timeout)));
    let _ = options.set_first_byte_timeout(Some(nanos(request.first_byte_timeout)));
    let _ = options.set_between_bytes_timeout(Some(nanos(request.between_bytes_timeout)));

    let outgoing_body = outgoing.body().map_err(|()| fail("request body already taken"))?;
    let future_response = outgoing_handler::handle(outgoing, Some(options))
        .map_err(|code| classify_transport(&code, request.method, request.url, request.target))?;

    // Written after `handle`, so that a body larger than the host's
    // buffer streams out instead of blocking before the request starts.
    let write_result = write_body(outgoing_body, request.body);
    Ok(Pending { future_response, write_result })
}

impl Pending {
    /// Waits for the response head.
    pub(in crate::http) fn open(self, request: &Sent<'_>) -> Result<Head<Incoming>, Failure> {
        let fail = |what: &str| refused(request.label, what);
        let future_response = self.future_response;
        future_response.subscribe().block();
        let response = match future_response.get() {
            Some(Ok(Ok(response))) => response,
            // A broken upload usually shows here with the better code.
            Some(Ok(Err(code))) => {
                return Err(classify_transport(&code, request.method, request.url, request.target));
            }
            Some(Err(())) => return Err(fail("response already taken")),
            None => {
                return Err(Failure::new(
                    FailureKind::Connection,
                    ProviderError::Transient(format!("{}: no response", request.label)),
                ));
            }
        };
        let status = response.status();
        let headers = response
            .headers()
            .entries()
            .into_iter()
            .map(|(name, value)| (name, String::from_utf8_lossy(&value).into_owned()))
            .collect();
        let incoming_body = response.consume().map_err(|()| fail("response body already taken"))?;
        let stream = incoming_body.stream().map_err(|()| fail("body stream already taken"))?;
        Ok(Head {
            status,
            headers,
            body: Incoming { stream: Some(stream), body: Some(incoming_body), _response: response },
            upload_error: self.write_result.err(),
        })
    }
}

/// A response body being read. Field order is drop order: the stream is a
/// child of the body, the body of the response.
pub(in crate::http) struct Incoming {
    stream: Option<InputStream>,
    body: Option<IncomingBody>,
    _response: IncomingResponse,
}

impl Incoming {
    /// The next chunk, at most `max` bytes; `None` at the end.
    pub(in crate::http) fn read(&mut self, max: u64) -> Result<Option<Vec<u8>>, ReadError> {
        let Some(stream) = &self.stream else { return Ok(None) };
        match stream.blocking_read(max) {
            Ok(chunk) => Ok(Some(chunk)),
            Err(StreamError::Closed) => Ok(None),
            Err(StreamError::LastOperationFailed(io_error)) => {
                Err(match wasi::http_error_code(&io_error) {
                    Some(code) => ReadError::Code(code),
                    None => ReadError::Io(io_error.to_debug_string()),
                })
            }
        }
    }

    /// Releases the body; trailers are not used.
    pub(in crate::http) fn finish(&mut self) {
        drop(self.stream.take());
        if let Some(body) = self.body.take() {
            drop(IncomingBody::finish(body));
        }
    }
}

/// `blocking-write-and-flush` accepts at most 4096 bytes per call.
const WRITE_CHUNK: usize = 4096;

/// A request the host would not take as written: `label` is `METHOD URL`.
fn refused(label: &str, what: &str) -> Failure {
    Failure::new(FailureKind::Request, ProviderError::Permanent(format!("{label}: {what}")))
}

fn as_wasi(method: Method) -> wasi::Method {
    match method {
        Method::Get => wasi::Method::Get,
        Method::Head => wasi::Method::Head,
        Method::Post => wasi::Method::Post,
        Method::Put => wasi::Method::Put,
        Method::Patch => wasi::Method::Patch,
        Method::Delete => wasi::Method::Delete,
        Method::Options => wasi::Method::Options,
    }
}

/// Streams `body` out and finishes the outgoing body. A failure is returned
/// but only reported after the response future, which carries the better
/// error code when the connection broke.
fn write_body(outgoing_body: OutgoingBody, body: &[u8]) -> Result<(), ErrorCode> {
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

fn stream_error_code(error: StreamError) -> ErrorCode {
    match error {
        StreamError::LastOperationFailed(io_error) => wasi::http_error_code(&io_error)
            .unwrap_or_else(|| ErrorCode::InternalError(Some(io_error.to_debug_string()))),
        StreamError::Closed => ErrorCode::ConnectionTerminated,
    }
}
