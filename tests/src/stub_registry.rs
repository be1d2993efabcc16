//! A registry stand-in on loopback, for what a real registry will not serve:
//! answers of any size with or without a `Content-Length`, redirects to
//! anywhere, token challenges naming any realm. Plain HTTP/1.1, one request
//! per connection, written by hand so that every body byte it gets out is
//! counted where it leaves: a byte counts once the kernel took it, so the
//! count is what the client read plus what sat in the socket buffers (the
//! stub's send buffer is kept small; the client's receive buffer is the
//! kernel's to size).
//!
//! Paths answer as [`StubRegistry::answer`] says; `/v2/` answers `200`
//! unless told otherwise, anything else `404`. `HEAD` answers as `GET`
//! without the body.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpSocket, TcpStream};

/// How a path answers.
#[derive(Debug, Clone)]
pub enum Answer {
    /// `200` with this body and its length.
    Body(Vec<u8>),
    /// `200` with `size` bytes of filler, in a `Content-Length` body when
    /// `declared`, chunked otherwise.
    Filler {
        /// How many bytes the body has.
        size: u64,
        /// Whether the length is declared.
        declared: bool,
    },
    /// `307` to this location.
    Redirect(String),
    /// `401` with this `WWW-Authenticate` challenge.
    Challenge(String),
}

/// What the stub saw and sent.
#[derive(Debug, Default)]
struct State {
    answers: HashMap<String, Answer>,
    /// `METHOD PATH` of every request, in order.
    requests: Vec<String>,
    /// Body bytes sent per path, and whether that answer has ended.
    sent: HashMap<String, (u64, bool)>,
}

/// A running stub; stops when dropped.
#[derive(Debug)]
pub struct StubRegistry {
    /// `127.0.0.1:PORT`, as references name it.
    pub host: String,
    /// The port.
    pub port: u16,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

/// The filler's pieces: as a registry writes a large body.
const PIECE: usize = 64 << 10;
/// The send buffer of every answer (the kernel doubles it).
const SEND_BUFFER: u32 = 32 << 10;

impl StubRegistry {
    /// Starts a stub on a loopback port of the kernel's choosing.
    ///
    /// # Panics
    /// When no loopback port can be bound.
    pub async fn start() -> Self {
        let socket = TcpSocket::new_v4().expect("a socket");
        // Small, so that what the kernel takes ahead of the client's reads
        // adds little to the count (accepted sockets inherit it).
        socket.set_send_buffer_size(SEND_BUFFER).expect("a send buffer size");
        socket.bind(([127, 0, 0, 1], 0).into()).expect("bind a loopback port");
        let listener = socket.listen(64).expect("listen");
        let port = listener.local_addr().expect("bound").port();
        let state = Arc::new(Mutex::new(State::default()));
        let serving = Arc::clone(&state);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, Arc::clone(&serving)));
            }
        });
        Self { host: format!("127.0.0.1:{port}"), port, state, task }
    }

    /// Makes `path` answer `answer`.
    pub fn answer(&self, path: &str, answer: Answer) {
        self.lock().answers.insert(path.to_owned(), answer);
    }

    /// `METHOD PATH` of every request so far.
    pub fn requests(&self) -> Vec<String> {
        self.lock().requests.clone()
    }

    /// The body bytes sent for `path` once its last answer has ended (sent
    /// whole, or cut off by the client), waiting up to 10 s for that.
    ///
    /// # Panics
    /// When `path` was never answered, or its answer does not end.
    pub async fn body_sent(&self, path: &str) -> u64 {
        for _ in 0..200 {
            if let Some((sent, true)) = self.lock().sent.get(path).copied() {
                return sent;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the answer to {path} did not end: {:?}", self.lock().sent.get(path));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for StubRegistry {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(mut stream: TcpStream, state: Arc<Mutex<State>>) {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
        if head.len() > 64 << 10 {
            return;
        }
    }
    let head = String::from_utf8_lossy(&head);
    let mut words = head.lines().next().unwrap_or_default().split(' ');
    let method = words.next().unwrap_or_default().to_owned();
    let target = words.next().unwrap_or_default();
    let path = target.split('?').next().unwrap_or_default().to_owned();
    let answer = {
        let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
        state.requests.push(format!("{method} {path}"));
        state.sent.insert(path.clone(), (0, false));
        state.answers.get(&path).cloned()
    };
    let with_body = method != "HEAD";
    let count = |n: u64, ended: bool| {
        let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = state.sent.entry(path.clone()).or_default();
        entry.0 += n;
        entry.1 |= ended;
    };
    let _ = match answer {
        Some(Answer::Body(body)) => {
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/vnd.oci.image.manifest.v1+json\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let written = write(&mut stream, head.as_bytes(), with_body.then_some(&body[..])).await;
            count(if with_body && written.is_ok() { body.len() as u64 } else { 0 }, true);
            written
        }
        Some(Answer::Filler { size, declared }) => {
            let framing = if declared {
                format!("Content-Length: {size}")
            } else {
                "Transfer-Encoding: chunked".to_owned()
            };
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/vnd.oci.image.manifest.v1+json\r\n\
                 {framing}\r\nConnection: close\r\n\r\n"
            );
            let mut written = stream.write_all(head.as_bytes()).await;
            let piece = vec![b' '; PIECE];
            let mut left = if with_body { size } else { 0 };
            while written.is_ok() && left > 0 {
                let n = left.min(PIECE as u64) as usize;
                written = if declared {
                    stream.write_all(&piece[..n]).await
                } else {
                    let mut framed = format!("{n:x}\r\n").into_bytes();
                    framed.extend_from_slice(&piece[..n]);
                    framed.extend_from_slice(b"\r\n");
                    stream.write_all(&framed).await
                };
                if written.is_ok() {
                    count(n as u64, false);
                    left -= n as u64;
                }
            }
            if written.is_ok() && !declared && with_body {
                written = stream.write_all(b"0\r\n\r\n").await;
            }
            count(0, true);
            written
        }
        Some(Answer::Redirect(location)) => {
            let head = format!(
                "HTTP/1.1 307 Temporary Redirect\r\nLocation: {location}\r\n\
                 Content-Length: 0\r\nConnection: close\r\n\r\n"
            );
            let written = write(&mut stream, head.as_bytes(), None).await;
            count(0, true);
            written
        }
        Some(Answer::Challenge(challenge)) => {
            let head = format!(
                "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: {challenge}\r\n\
                 Content-Length: 0\r\nConnection: close\r\n\r\n"
            );
            let written = write(&mut stream, head.as_bytes(), None).await;
            count(0, true);
            written
        }
        None if path == "/v2/" => {
            let written = write(
                &mut stream,
                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n",
                with_body.then_some(b"{}"),
            )
            .await;
            count(0, true);
            written
        }
        None => {
            let body = br#"{"errors":[{"code":"NOT_FOUND","message":"not here"}]}"#;
            let head = format!(
                "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let written = write(&mut stream, head.as_bytes(), with_body.then_some(body)).await;
            count(0, true);
            written
        }
    };
    let _ = stream.shutdown().await;
}

async fn write(stream: &mut TcpStream, head: &[u8], body: Option<&[u8]>) -> std::io::Result<()> {
    stream.write_all(head).await?;
    if let Some(body) = body {
        stream.write_all(body).await?;
    }
    Ok(())
}
