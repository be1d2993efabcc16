//! A frame is a message and, for the bytes of an upload, a payload, each
//! behind its length: `u32` big-endian message length, the message as
//! JSON, `u32` big-endian payload length, the payload. JSON keeps the
//! messages readable in a trace; the payload keeps image bytes out of it.

use std::io::{Read, Write};

use serde::Serialize;
use serde::de::DeserializeOwned;

/// The largest message or payload a frame may carry (64 MiB): a longer
/// length is a broken stream, not a message.
pub const MAX_PAYLOAD: usize = 64 << 20;

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The pipe failed or ended.
    #[error("libvirt helper pipe: {0}")]
    Io(#[from] std::io::Error),
    /// The message did not parse (or serialise).
    #[error("libvirt helper message: {0}")]
    Message(#[from] serde_json::Error),
    /// A length over [`MAX_PAYLOAD`].
    #[error("libvirt helper frame of {0} bytes is over the {MAX_PAYLOAD}-byte limit")]
    TooLong(usize),
}

/// Writes `message` and `payload` as one frame, then flushes.
pub fn write_frame<T: Serialize>(
    out: &mut impl Write,
    message: &T,
    payload: &[u8],
) -> Result<(), FrameError> {
    let text = serde_json::to_vec(message)?;
    for part in [&text[..], payload] {
        let len = u32::try_from(part.len())
            .ok()
            .filter(|&len| len as usize <= MAX_PAYLOAD)
            .ok_or(FrameError::TooLong(part.len()))?;
        out.write_all(&len.to_be_bytes())?;
        out.write_all(part)?;
    }
    out.flush()?;
    Ok(())
}

/// Reads one frame; `Ok(None)` at a clean end of the stream (before a
/// frame's first byte).
pub fn read_frame<T: DeserializeOwned>(
    input: &mut impl Read,
) -> Result<Option<(T, Vec<u8>)>, FrameError> {
    let mut len = [0u8; 4];
    match input.read_exact(&mut len) {
        Ok(()) => {}
        Err(err) if err.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(err) => return Err(err.into()),
    }
    let text = read_part(input, len)?;
    input.read_exact(&mut len)?;
    let payload = read_part(input, len)?;
    Ok(Some((serde_json::from_slice(&text)?, payload)))
}

fn read_part(input: &mut impl Read, len: [u8; 4]) -> Result<Vec<u8>, FrameError> {
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_PAYLOAD {
        return Err(FrameError::TooLong(len));
    }
    let mut part = vec![0; len];
    input.read_exact(&mut part)?;
    Ok(part)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Handle, Op, Reply, Request, Value};

    #[test]
    fn a_request_and_its_payload_read_back_as_written() {
        let mut pipe = Vec::new();
        let send = Request { id: 7, op: Op::Send { stream: Handle(3) } };
        write_frame(&mut pipe, &send, b"\0image bytes\xff").unwrap();
        let reply = Reply { id: 7, outcome: Ok(Value::Count(13)) };
        write_frame(&mut pipe, &reply, &[]).unwrap();
        let mut input = &pipe[..];
        let (read, payload): (Request, _) = read_frame(&mut input).unwrap().unwrap();
        assert_eq!((read, payload.as_slice()), (send, &b"\0image bytes\xff"[..]));
        let (read, payload): (Reply, _) = read_frame(&mut input).unwrap().unwrap();
        assert_eq!((read, payload.len()), (reply, 0));
        assert!(read_frame::<Request>(&mut input).unwrap().is_none());
    }

    #[test]
    fn a_frame_cut_short_or_too_long_is_an_error_not_a_message() {
        let mut pipe = Vec::new();
        write_frame(
            &mut pipe,
            &Request { id: 1, op: Op::Open { uri: "test:///default".into() } },
            &[],
        )
        .unwrap();
        pipe.truncate(pipe.len() - 3);
        assert!(matches!(read_frame::<Request>(&mut &pipe[..]), Err(FrameError::Io(_))));
        let huge = (MAX_PAYLOAD as u32 + 1).to_be_bytes();
        assert!(matches!(read_frame::<Request>(&mut &huge[..]), Err(FrameError::TooLong(_))));
    }

    #[test]
    fn unknown_fields_are_refused() {
        let text = br#"{"id":1,"op":{"call":"open","uri":"x","extra":1}}"#;
        let mut frame = (text.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(text);
        frame.extend_from_slice(&0u32.to_be_bytes());
        assert!(matches!(read_frame::<Request>(&mut &frame[..]), Err(FrameError::Message(_))));
    }
}
