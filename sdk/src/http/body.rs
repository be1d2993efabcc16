//! Response bodies as they arrive: read whole, capped, or streamed chunk
//! by chunk.

use std::fmt;

use wasip2::http::types::ErrorCode;

use super::classify::classify_transport;
use super::failure::{Failure, FailureKind};
use super::target::Target;
use super::transport::{Incoming, ReadError};
use super::{Method, READ_CHUNK};
use crate::ProviderError;

/// How much of an error answer's body [`Request::send_streaming`] reads
/// for the message.
pub(super) const ERROR_BODY_BYTES: usize = 4096;

/// A response whose body has not been read yet.
pub(super) struct OpenResponse {
    /// `None` once the body has been read or released.
    pub(super) body: Option<Incoming>,
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
        let Some(body) = &mut self.body else { return Ok(None) };
        match body.read(READ_CHUNK) {
            Ok(Some(chunk)) => Ok(Some(chunk)),
            Ok(None) => {
                self.finish();
                Ok(None)
            }
            Err(read_error) => {
                self.finish();
                let error = match read_error {
                    ReadError::Code(code) => {
                        classify_transport(&code, self.method, &self.url, &self.target)
                    }
                    ReadError::Io(description) => Failure::new(
                        FailureKind::Connection,
                        ProviderError::Transient(format!(
                            "{}: reading the response failed: {description}",
                            self.label,
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
        if let Some(mut body) = self.body.take() {
            body.finish();
        }
    }
}

impl Drop for OpenResponse {
    fn drop(&mut self) {
        self.finish();
    }
}

/// A response body read chunk by chunk, from [`Request::send_streaming`](super::Request::send_streaming).
///
/// ```
/// use proxyfleet_sdk::http::Request;
///
/// # use proxyfleet_sdk::native::doc_host::{answer, serve};
/// # serve(|_| answer(200, &[("content-type", "application/octet-stream"), ("content-length", "150000")], vec![7u8; 150_000]), || -> proxyfleet_sdk::Result<()> {
/// let mut download = Request::get("https://images.example/debian-12.raw").send_streaming()?;
/// let mut sizes = Vec::new();
/// while let Some(chunk) = download.next_chunk()? {
///     sizes.push(chunk.len());
/// }
/// assert_eq!(sizes, [65_536, 65_536, 18_928]);
/// # Ok(())
/// # }).expect("the example runs");
/// ```
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
    ///
    /// ```
    /// use proxyfleet_sdk::http::Request;
    ///
    /// # use proxyfleet_sdk::native::doc_host::{answer, serve};
    /// # serve(|_| answer(206, &[("content-range", "bytes 0-99/150000")], vec![0u8; 100]), || -> proxyfleet_sdk::Result<()> {
    /// let part = Request::get("https://images.example/debian-12.raw")
    ///     .header("range", "bytes=0-99")
    ///     .send_streaming()?;
    /// assert_eq!(part.status(), 206);
    /// # Ok(())
    /// # }).expect("the example runs");
    /// ```
    pub fn status(&self) -> u16 {
        self.open.status
    }

    /// The first value of header `name`, compared case-insensitively.
    ///
    /// ```
    /// use proxyfleet_sdk::http::Request;
    ///
    /// # use proxyfleet_sdk::native::doc_host::{answer, serve};
    /// # serve(|_| answer(200, &[("content-type", "application/octet-stream"), ("content-length", "150000")], vec![7u8; 150_000]), || -> proxyfleet_sdk::Result<()> {
    /// let download = Request::get("https://images.example/debian-12.raw").send_streaming()?;
    /// assert_eq!(download.header("Content-Type"), Some("application/octet-stream"));
    /// # Ok(())
    /// # }).expect("the example runs");
    /// ```
    pub fn header(&self, name: &str) -> Option<&str> {
        self.open
            .headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }

    /// The announced body length (`Content-Length`), when there is one.
    ///
    /// ```
    /// use proxyfleet_sdk::http::Request;
    ///
    /// # use proxyfleet_sdk::native::doc_host::{answer, serve};
    /// # serve(|_| answer(200, &[("content-type", "application/octet-stream"), ("content-length", "150000")], vec![7u8; 150_000]), || -> proxyfleet_sdk::Result<()> {
    /// let download = Request::get("https://images.example/debian-12.raw").send_streaming()?;
    /// // Size the upload before the first byte arrives.
    /// assert_eq!(download.content_length(), Some(150_000));
    /// # Ok(())
    /// # }).expect("the example runs");
    /// ```
    pub fn content_length(&self) -> Option<u64> {
        self.header("content-length").and_then(|value| value.trim().parse().ok())
    }

    /// The next chunk of the body (at most 64 KiB); `None` at its end. A
    /// connection lost part way is a [`Failure`] classified
    /// [`ProviderError::Transient`], and so is every read after it.
    ///
    /// ```
    /// use proxyfleet_sdk::http::Request;
    ///
    /// # use proxyfleet_sdk::native::doc_host::{answer, serve};
    /// # serve(|_| answer(200, &[], b"#cloud-config\n"), || -> proxyfleet_sdk::Result<()> {
    /// let mut download = Request::get("https://seeds.example/pf-1/user-data").send_streaming()?;
    /// let mut data = Vec::new();
    /// while let Some(chunk) = download.next_chunk()? {
    ///     data.extend_from_slice(&chunk);
    /// }
    /// assert_eq!(data, b"#cloud-config\n");
    /// assert_eq!(download.next_chunk()?, None, "still at the end");
    /// # Ok(())
    /// # }).expect("the example runs");
    /// ```
    pub fn next_chunk(&mut self) -> Result<Option<Vec<u8>>, Failure> {
        self.open.next_chunk()
    }
}
