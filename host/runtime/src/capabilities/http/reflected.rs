//! The credential the host injected, taken out of the answer before the
//! plugin reads it.
//!
//! A backend that reflects requests (an echo endpoint, an error that
//! quotes the request's headers) hands the injected credential to the
//! plugin, which could return it hex-encoded, reversed or in any other
//! form: the host redacts exact copies of secrets in what plugins return,
//! but cannot recognise every encoding. So the secret is removed at the
//! source: in every answer to a request that carried a credential, each
//! occurrence of a form of it the host knows ([`InjectedSecret`]: the
//! header value, the secret put into it, the token after its scheme, and a
//! Basic credential's decoded `user:password` and password) is overwritten
//! in header values (a header whose name holds one is dropped), trailers
//! and the body, before the plugin sees a byte of them.
//!
//! The body streams through ([`RedactedBody`]): each chunk is released but
//! for its last `longest form - 1` bytes, held until the next chunk shows
//! whether they begin an occurrence, so an occurrence split across chunks
//! is caught while the host holds one chunk and a few bytes more. A
//! replacement has the length of what it replaces, so `Content-Length`
//! stays true. Bodies of requests without a credential are not touched.
//!
//! Compression would hide the bytes from this: a request that carries a
//! credential asks for `identity` (the plugin's `Accept-Encoding` and `TE`
//! are replaced), and an answer that is encoded anyway is refused
//! ([`refuse_encoded`]).
//!
//! What this cannot catch: a backend that transforms what it reflects
//! (escapes, re-encodes, truncates or serves part of it through a range).
//! Hence grants must not name endpoints that reflect requests
//! (docs/providers-config.md, "Credentials").

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use base64::Engine as _;
use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, Response};
use http_body::{Body, Frame};
use http_body_util::BodyExt as _;

use super::{HttpError, WasiBody};
use crate::capabilities::redact::REDACTED;

/// Shorter forms are not looked for: they would match ordinary text (the
/// entry's [`Redactor`](crate::capabilities::Redactor) draws the same line).
const MIN_FORM_BYTES: usize = 4;

/// The forms of one credential the host put into a request, longest first.
/// Its `Debug` shows how many there are, never what they are.
#[derive(Clone)]
pub(crate) struct InjectedSecret {
    forms: Vec<Vec<u8>>,
    /// Whether a form starts with the byte: what the scan stops at.
    starts: [bool; 256],
    longest: usize,
    /// Whether every occurrence is long enough to read `[redacted]`.
    marked: bool,
}

impl std::fmt::Debug for InjectedSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InjectedSecret").field("forms", &self.forms.len()).finish()
    }
}

impl InjectedSecret {
    /// The forms of a header value the host injected and of the `secret`
    /// it built the value from, if any: both, the token after an
    /// authorization scheme (`Bearer <token>`), and for `Basic` the
    /// decoded `user:password` and the password. None when no form is long
    /// enough to look for.
    pub(crate) fn of_header(value: &[u8], secret: Option<&[u8]>) -> Option<Self> {
        let mut forms = vec![value.to_vec()];
        forms.extend(secret.map(<[u8]>::to_vec));
        if let Some(space) = value.iter().position(|&b| b == b' ') {
            let (scheme, token) = (&value[..space], value[space..].trim_ascii_start());
            forms.push(token.to_vec());
            let pair = scheme
                .eq_ignore_ascii_case(b"basic")
                .then(|| base64::engine::general_purpose::STANDARD.decode(token).ok())
                .flatten();
            if let Some(pair) = pair
                && let Some(colon) = pair.iter().position(|&b| b == b':')
            {
                forms.push(pair[colon + 1..].to_vec());
                forms.push(pair);
            }
        }
        forms.retain(|form| form.len() >= MIN_FORM_BYTES);
        forms.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        forms.dedup();
        let longest = forms.first()?.len();
        let marked = forms.last().is_some_and(|shortest| shortest.len() >= REDACTED.len());
        let mut starts = [false; 256];
        for form in &forms {
            starts[usize::from(form[0])] = true;
        }
        Some(Self { forms, starts, longest, marked })
    }

    /// Where forms occur in `bytes`: sorted, overlapping ones merged (ones
    /// that merely touch are not, so that the result does not depend on
    /// where a stream was cut). `seed` bytes at the start belong to an
    /// occurrence found before: the first range starts with them.
    fn occurrences(&self, bytes: &[u8], seed: usize) -> Vec<(usize, usize)> {
        let mut found: Vec<(usize, usize)> = Vec::new();
        if seed > 0 {
            found.push((0, seed));
        }
        for (at, &byte) in bytes.iter().enumerate() {
            if !self.starts[usize::from(byte)] {
                continue;
            }
            // Longest first: the first match is the longest at `at`.
            let Some(form) = self.forms.iter().find(|form| bytes[at..].starts_with(form)) else {
                continue;
            };
            let end = at + form.len();
            match found.last_mut() {
                Some(last) if at < last.1 => last.1 = last.1.max(end),
                _ => found.push((at, end)),
            }
        }
        found
    }

    /// Overwrites every occurrence in `bytes`; whether there was one.
    fn redact_in_place(&self, bytes: &mut [u8]) -> bool {
        let found = self.occurrences(bytes, 0);
        for &(start, end) in &found {
            overwrite(&mut bytes[start..end], 0, self.marked);
        }
        !found.is_empty()
    }

    /// Whether a header name (lower case) holds a form, in any case.
    fn in_name(&self, name: &HeaderName) -> bool {
        let name = name.as_str().as_bytes();
        self.forms.iter().any(|form| {
            form.len() <= name.len()
                && name.windows(form.len()).any(|w| w.eq_ignore_ascii_case(form))
        })
    }

    /// Overwrites the forms in header values and drops a header whose
    /// name holds one.
    pub(crate) fn redact_headers(&self, headers: &mut HeaderMap) {
        let named: Vec<HeaderName> =
            headers.keys().filter(|name| self.in_name(name)).cloned().collect();
        for name in named {
            headers.remove(name);
        }
        for value in headers.values_mut() {
            let mut bytes = value.as_bytes().to_vec();
            if self.redact_in_place(&mut bytes) {
                // The replacement is printable ASCII where header bytes
                // were, so the value stays valid.
                let mut redacted =
                    HeaderValue::from_bytes(&bytes).unwrap_or(HeaderValue::from_static(""));
                redacted.set_sensitive(true);
                *value = redacted;
            }
        }
    }
}

/// Overwrites `bytes`, which are an occurrence from its byte `lead` on,
/// with as many bytes: `[redacted]***` when `marked`, `***` otherwise.
/// Lengths stay true, and since each byte depends only on its place in
/// the occurrence, so does the result on where a stream cut it.
fn overwrite(bytes: &mut [u8], lead: usize, marked: bool) {
    for (i, byte) in bytes.iter_mut().enumerate() {
        *byte = match REDACTED.as_bytes().get(lead + i) {
            Some(&marker) if marked => marker,
            _ => b'*',
        };
    }
}

/// Redaction of a body that arrives in chunks.
#[derive(Debug)]
pub(crate) struct StreamRedactor {
    secret: InjectedSecret,
    /// Bytes not released yet, as they arrived: the end of the last chunk.
    held: BytesMut,
    /// How many of the held bytes belong to an occurrence that began in
    /// bytes released before; they are overwritten when released.
    carried: usize,
    /// Where in that occurrence the held bytes start.
    carried_lead: usize,
}

impl StreamRedactor {
    pub(crate) fn new(secret: InjectedSecret) -> Self {
        Self { secret, held: BytesMut::new(), carried: 0, carried_lead: 0 }
    }

    /// Takes the next chunk; answers what can be released now, redacted.
    /// All but the last `longest - 1` bytes are: an occurrence beginning
    /// before those is whole within what was seen.
    pub(crate) fn push(&mut self, chunk: &[u8]) -> Bytes {
        self.held.extend_from_slice(chunk);
        let cut = self.held.len().saturating_sub(self.secret.longest - 1);
        let found = self.secret.occurrences(&self.held, self.carried);
        let (mut carried, mut carried_lead) = (0, 0);
        for (i, &(start, end)) in found.iter().enumerate() {
            let lead = if i == 0 && self.carried > 0 { self.carried_lead } else { 0 };
            if start >= cut {
                // Nothing of it goes out yet; it is found again next time.
                if i == 0 && self.carried > 0 {
                    (carried, carried_lead) = (self.carried - cut, lead + cut);
                }
                break;
            }
            overwrite(&mut self.held[start..end.min(cut)], lead, self.secret.marked);
            if end > cut {
                (carried, carried_lead) = (end - cut, lead + cut - start);
            }
        }
        // Held bytes stay as they arrived, so an occurrence beginning among
        // them is found again once it is whole.
        (self.carried, self.carried_lead) = (carried, carried_lead);
        self.held.split_to(cut).freeze()
    }

    /// The body ended: the held bytes, redacted.
    pub(crate) fn finish(&mut self) -> Bytes {
        let mut rest = std::mem::take(&mut self.held);
        for (i, &(start, end)) in self.secret.occurrences(&rest, self.carried).iter().enumerate() {
            let lead = if i == 0 && self.carried > 0 { self.carried_lead } else { 0 };
            overwrite(&mut rest[start..end], lead, self.secret.marked);
        }
        (self.carried, self.carried_lead) = (0, 0);
        rest.freeze()
    }
}

/// A response body with an injected credential's forms overwritten, in
/// its data and its trailers.
#[derive(Debug)]
pub(crate) struct RedactedBody {
    inner: WasiBody,
    redactor: StreamRedactor,
    /// Trailers that wait for the held bytes to go out first.
    trailers: Option<HeaderMap>,
    done: bool,
}

impl Body for RedactedBody {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
        let this = self.get_mut();
        if let Some(trailers) = this.trailers.take() {
            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
        }
        if this.done {
            return Poll::Ready(None);
        }
        loop {
            let frame = match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => frame,
                // What is held may be the start of an occurrence: dropped.
                Some(Err(err)) => {
                    this.done = true;
                    this.redactor.held.clear();
                    return Poll::Ready(Some(Err(err)));
                }
                None => {
                    this.done = true;
                    let rest = this.redactor.finish();
                    return Poll::Ready((!rest.is_empty()).then(|| Ok(Frame::data(rest))));
                }
            };
            let frame = match frame.into_data() {
                Ok(data) => {
                    let released = this.redactor.push(&data);
                    if released.is_empty() {
                        continue;
                    }
                    return Poll::Ready(Some(Ok(Frame::data(released))));
                }
                Err(frame) => frame,
            };
            let Ok(mut trailers) = frame.into_trailers() else { continue };
            this.redactor.secret.redact_headers(&mut trailers);
            this.done = true;
            let rest = this.redactor.finish();
            if rest.is_empty() {
                return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
            }
            this.trailers = Some(trailers);
            return Poll::Ready(Some(Ok(Frame::data(rest))));
        }
    }
}

/// Asks for an answer the host can read: no content or transfer coding
/// but `identity` (and `chunked`, which the transport undoes).
pub(crate) fn ask_identity(headers: &mut HeaderMap) {
    headers.insert(http::header::ACCEPT_ENCODING, HeaderValue::from_static("identity"));
    headers.remove(http::header::TE);
}

/// `response` with `secret`'s forms overwritten in its headers, trailers
/// and body; refused when it is encoded, since its bytes could then not
/// be read for them.
pub(crate) fn redact_response(
    response: Response<WasiBody>,
    secret: InjectedSecret,
) -> Result<Response<WasiBody>, HttpError> {
    let (mut parts, body) = response.into_parts();
    secret.redact_headers(&mut parts.headers);
    refuse_encoded(&parts.headers)?;
    let body = RedactedBody {
        inner: body,
        redactor: StreamRedactor::new(secret),
        trailers: None,
        done: false,
    };
    Ok(Response::from_parts(parts, body.boxed_unsync()))
}

/// Refuses headers that declare a content coding, or a transfer coding
/// besides `chunked`, other than `identity`.
fn refuse_encoded(headers: &HeaderMap) -> Result<(), HttpError> {
    let codings = |name| {
        headers
            .get_all(name)
            .iter()
            .flat_map(|value| value.as_bytes().split(|&b| b == b','))
            .map(<[u8]>::trim_ascii)
            .filter(|coding| !coding.is_empty() && !coding.eq_ignore_ascii_case(b"identity"))
            .map(|coding| String::from_utf8_lossy(coding).into_owned())
            .collect::<Vec<_>>()
    };
    let content = codings(http::header::CONTENT_ENCODING);
    let transfer: Vec<String> = codings(http::header::TRANSFER_ENCODING)
        .into_iter()
        .filter(|coding| !coding.eq_ignore_ascii_case("chunked"))
        .collect();
    match content.into_iter().chain(transfer).next() {
        None => Ok(()),
        Some(coding) => {
            tracing::warn!(
                "refused: the answer is encoded ({coding}) although the host asked for identity; \
                 the host must read an answer to a request that carried a credential, to take \
                 the credential out of it"
            );
            Err(HttpError::HttpResponseContentCoding(Some(coding)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bearer() -> InjectedSecret {
        InjectedSecret::of_header(b"Bearer s3cret-token-1", Some(b"s3cret-token-1")).unwrap()
    }

    /// Runs `chunks` through a redactor; what the plugin reads.
    fn streamed(secret: &InjectedSecret, chunks: &[&[u8]]) -> Vec<u8> {
        let mut redactor = StreamRedactor::new(secret.clone());
        let mut out = Vec::new();
        for chunk in chunks {
            out.extend_from_slice(&redactor.push(chunk));
        }
        out.extend_from_slice(&redactor.finish());
        out
    }

    fn contains(haystack: &[u8], needle: &[u8]) -> bool {
        haystack.windows(needle.len()).any(|w| w == needle)
    }

    #[test]
    fn the_forms_of_a_basic_credential_are_all_known() {
        // `svc:pass-w0rd-77` as a secret file would hold it for
        // `valueTemplate: "Basic {secret}"`.
        let secret = InjectedSecret::of_header(
            b"Basic c3ZjOnBhc3MtdzByZC03Nw==",
            Some(b"c3ZjOnBhc3MtdzByZC03Nw=="),
        )
        .unwrap();
        let text = b"auth=Basic c3ZjOnBhc3MtdzByZC03Nw== as svc:pass-w0rd-77, pw pass-w0rd-77.";
        let out = streamed(&secret, &[text]);
        assert_eq!(out.len(), text.len(), "lengths stay");
        for hidden in [&b"c3ZjOnBhc3M"[..], b"pass-w0rd-77", b"svc:"] {
            assert!(!contains(&out, hidden), "{}", String::from_utf8_lossy(&out));
        }
        assert!(out.starts_with(b"auth=[redacted]"), "{}", String::from_utf8_lossy(&out));
    }

    /// Issue 43, item 12: a backend echoing request headers handed the
    /// injected credential to the plugin, which returned it encoded. The
    /// body streams in chunks, so an occurrence split between two of them
    /// must be caught too: every split point of the secret is tried.
    #[test]
    fn an_occurrence_split_across_chunks_is_redacted() {
        let secret = bearer();
        let body =
            b"{\"echo\":{\"authorization\":\"Bearer s3cret-token-1\"},\"t\":\"s3cret-token-1\"}";
        let whole = streamed(&secret, &[body]);
        assert!(!contains(&whole, b"s3cret") && contains(&whole, b"[redacted]"));
        assert_eq!(whole.len(), body.len());
        for split in 1..body.len() {
            let (a, b) = body.split_at(split);
            assert_eq!(streamed(&secret, &[a, b]), whole, "split at {split}");
        }
        // One byte at a time: the worst case for what is held.
        let bytes: Vec<&[u8]> = body.chunks(1).collect();
        assert_eq!(streamed(&secret, &bytes), whole);
    }

    #[test]
    fn occurrences_at_either_end_of_the_body_are_redacted() {
        let secret = bearer();
        for body in [&b"s3cret-token-1"[..], b"s3cret-token-1 and more", b"more and s3cret-token-1"]
        {
            let out = streamed(&secret, &[body]);
            assert!(!contains(&out, b"s3cret"), "{}", String::from_utf8_lossy(&out));
            assert_eq!(out.len(), body.len());
            let (a, b) = body.split_at(body.len() / 2);
            assert_eq!(streamed(&secret, &[a, b, b""]), out);
        }
    }

    #[test]
    fn overlapping_and_repeated_occurrences_are_all_redacted() {
        let secret = InjectedSecret::of_header(b"abcdabcd", Some(b"dabc")).unwrap();
        let body = b"xxabcdabcdabcdabcyy dabcdabc";
        let out = streamed(&secret, &[&body[..7], &body[7..15], &body[15..]]);
        // A form shorter than `[redacted]` makes every occurrence stars.
        assert_eq!(out, b"xx***************yy ********", "{}", String::from_utf8_lossy(&out));
        assert_eq!(streamed(&secret, &[body]), out);
    }

    #[test]
    fn a_body_without_the_secret_is_released_unchanged_and_held_back_only_briefly() {
        let secret = bearer();
        let mut redactor = StreamRedactor::new(secret.clone());
        let chunk = vec![b'x'; 64 << 10];
        let mut released = 0;
        for _ in 0..16 {
            let out = redactor.push(&chunk);
            assert!(out.iter().all(|&b| b == b'x'));
            released += out.len();
            assert!(redactor.held.len() < secret.longest, "held {}", redactor.held.len());
        }
        released += redactor.finish().len();
        assert_eq!(released, 16 * chunk.len());
    }

    #[test]
    fn short_forms_are_not_looked_for() {
        assert!(InjectedSecret::of_header(b"abc", Some(b"abc")).is_none());
        let secret = InjectedSecret::of_header(b"Key abc", Some(b"abc")).unwrap();
        assert_eq!(streamed(&secret, &[b"abc Key abc"]), b"abc *******");
    }

    #[test]
    fn header_values_and_names_holding_a_form_are_redacted() {
        let secret = bearer();
        let mut headers = HeaderMap::new();
        headers.insert("x-echo-authorization", HeaderValue::from_static("Bearer s3cret-token-1"));
        headers.insert("x-s3cret-token-1", HeaderValue::from_static("1"));
        headers.insert("content-length", HeaderValue::from_static("42"));
        secret.redact_headers(&mut headers);
        assert_eq!(headers["x-echo-authorization"], "[redacted]***********");
        assert_eq!(headers["content-length"], "42");
        assert_eq!(headers.len(), 2, "the header named by the secret is gone: {headers:?}");
    }

    #[test]
    fn encoded_answers_are_refused_and_identity_is_asked_for() {
        let mut request = HeaderMap::new();
        request.insert(http::header::ACCEPT_ENCODING, HeaderValue::from_static("gzip, br"));
        request.insert(http::header::TE, HeaderValue::from_static("gzip"));
        ask_identity(&mut request);
        assert_eq!(request[http::header::ACCEPT_ENCODING], "identity");
        assert!(request.get(http::header::TE).is_none());

        let with = |name, value| {
            let mut headers = HeaderMap::new();
            headers.insert(name, HeaderValue::from_static(value));
            refuse_encoded(&headers)
        };
        assert!(with(http::header::CONTENT_ENCODING, "identity").is_ok());
        assert!(with(http::header::TRANSFER_ENCODING, "chunked").is_ok());
        assert!(matches!(
            with(http::header::CONTENT_ENCODING, "gzip"),
            Err(HttpError::HttpResponseContentCoding(Some(coding))) if coding == "gzip"
        ));
        assert!(with(http::header::TRANSFER_ENCODING, "gzip, chunked").is_err());
    }

    #[tokio::test]
    async fn trailers_are_redacted_and_follow_the_held_bytes() {
        let secret = bearer();
        let mut trailers = HeaderMap::new();
        trailers.insert("x-echo", HeaderValue::from_static("s3cret-token-1"));
        let frames = vec![
            Ok::<_, HttpError>(Frame::data(Bytes::from_static(b"tail s3cret-tok"))),
            Ok(Frame::data(Bytes::from_static(b"en-1"))),
            Ok(Frame::trailers(trailers)),
        ];
        let inner = http_body_util::StreamBody::new(futures::stream::iter(frames)).boxed_unsync();
        let body = RedactedBody {
            inner,
            redactor: StreamRedactor::new(secret),
            trailers: None,
            done: false,
        };
        let collected = body.collect().await.unwrap();
        let trailers = collected.trailers().cloned().expect("trailers");
        assert_eq!(trailers["x-echo"], "[redacted]****");
        assert_eq!(collected.to_bytes(), Bytes::from_static(b"tail [redacted]****"));
    }

    #[test]
    fn debug_never_shows_a_form() {
        assert_eq!(format!("{:?}", bearer()), "InjectedSecret { forms: 2 }");
    }
}
