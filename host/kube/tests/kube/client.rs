//! The client's bound on requests in flight, against an HTTP server on
//! loopback that holds every answer until the test lets it go.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use proxyfleet_kube::client::bounded;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};

/// What the server saw.
struct Seen {
    /// Requests it holds now.
    held: AtomicUsize,
    /// The most it held at once.
    most: AtomicUsize,
    /// Requests that arrived (watches not counted).
    arrived: watch::Sender<usize>,
    /// One permit answers one held request.
    answers: Semaphore,
}

/// An API server stand-in on loopback, and a client for it with at most
/// `in_flight` requests waiting at once: a request is held until the test
/// adds an answer; a watch (`watch=true`) is answered at once with a body
/// that never ends.
async fn server(in_flight: usize) -> (Arc<Seen>, kube::Client) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind loopback");
    let url: http::Uri =
        format!("http://{}", listener.local_addr().expect("address")).parse().expect("server URL");
    let seen = Arc::new(Seen {
        held: AtomicUsize::new(0),
        most: AtomicUsize::new(0),
        arrived: watch::channel(0).0,
        answers: Semaphore::new(0),
    });
    tokio::spawn({
        let seen = Arc::clone(&seen);
        async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, Arc::clone(&seen)));
            }
        }
    });
    let in_flight = NonZeroUsize::new(in_flight).expect("a bound above zero");
    let client = bounded(kube::Config::new(url), in_flight).expect("a client for the server");
    (seen, client)
}

/// One connection: requests one after another, as HTTP/1.1 keeps them.
async fn serve(stream: TcpStream, seen: Arc<Seen>) {
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    loop {
        let mut request_line = String::new();
        if read.read_line(&mut request_line).await.unwrap_or(0) == 0 {
            return;
        }
        // The rest of the head; these requests carry no body.
        loop {
            let mut line = String::new();
            if read.read_line(&mut line).await.unwrap_or(0) == 0 {
                return;
            }
            if line == "\r\n" {
                break;
            }
        }
        if request_line.contains("watch=true") {
            let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n";
            let _ = write.write_all(head.as_bytes()).await;
            // The body never ends: the connection is this watch's.
            std::future::pending::<()>().await;
        }
        let now = seen.held.fetch_add(1, Ordering::SeqCst) + 1;
        seen.most.fetch_max(now, Ordering::SeqCst);
        seen.arrived.send_modify(|arrived| *arrived += 1);
        seen.answers.acquire().await.expect("the semaphore stays open").forget();
        // Let go before answering: the client may send the next request as
        // soon as it reads the answer.
        seen.held.fetch_sub(1, Ordering::SeqCst);
        let body = r#"{"kind":"Status","apiVersion":"v1","status":"Success"}"#;
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        if write.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
    }
}

fn get(path: &str) -> http::Request<Vec<u8>> {
    http::Request::get(path).body(Vec::new()).expect("a request")
}

#[tokio::test]
async fn at_most_the_bound_of_requests_wait_for_an_answer_at_once() {
    let (seen, client) = server(2).await;
    let requests: Vec<_> = (0..6)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                client
                    .request_text(get(&format!("/api/v1/namespaces/default/configmaps/cm-{i}")))
                    .await
            })
        })
        .collect();
    let mut arrived = seen.arrived.subscribe();
    arrived.wait_for(|arrived| *arrived >= 2).await.expect("the server runs");
    // Time for a client without the bound to send the other four.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(seen.held.load(Ordering::SeqCst), 2, "requests waiting for an answer");
    seen.answers.add_permits(6);
    for request in requests {
        request.await.expect("the request task").expect("an answer");
    }
    assert_eq!(*seen.arrived.borrow(), 6);
    assert_eq!(seen.most.load(Ordering::SeqCst), 2, "the most in flight at once");
}

#[tokio::test]
async fn a_watch_holds_no_place_once_the_server_answers() {
    let (seen, client) = server(1).await;
    let watch = tokio::time::timeout(
        Duration::from_secs(30),
        client.request_stream(get("/api/v1/namespaces/default/configmaps?watch=true")),
    )
    .await
    .expect("the watch begins")
    .expect("the watch is accepted");
    seen.answers.add_permits(1);
    let answer = tokio::time::timeout(
        Duration::from_secs(30),
        client.request_text(get("/api/v1/namespaces/default/configmaps/cm")),
    )
    .await
    .expect("a request beside an open watch is not held back by it");
    answer.expect("an answer");
    drop(watch);
}
