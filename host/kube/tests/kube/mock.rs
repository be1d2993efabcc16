//! The mocked API server the request tests talk to: take the next
//! request, answer it, and check that none is left.

use http::{Method, Request, Response};
use kube::client::Body;

/// The server side of a mocked client.
pub type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;
/// Where the answer to one request goes.
pub type Respond = tower_test::mock::SendResponse<Response<Body>>;

/// A client and the server side it talks to.
pub fn pair() -> (kube::Client, Handle) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    (kube::Client::new(service, "default"), handle)
}

/// The next request: method, URI, body (JSON, or YAML as server-side
/// apply may send it; null when empty) and where its answer goes.
pub async fn next(handle: &mut Handle) -> (Method, String, serde_json::Value, Respond) {
    let (request, respond) = handle.next_request().await.expect("a request");
    let (method, uri) = (request.method().clone(), request.uri().to_string());
    let bytes = request.into_body().collect_bytes().await.unwrap();
    let body = if bytes.is_empty() {
        serde_json::Value::Null
    } else {
        serde_json::from_slice(&bytes).or_else(|_| yaml_serde::from_slice(&bytes)).unwrap()
    };
    (method, uri, body, respond)
}

/// Answers with `status` and `body`.
pub fn reply(respond: Respond, status: u16, body: &serde_json::Value) {
    respond.send_response(
        Response::builder()
            .status(status)
            .body(Body::from(serde_json::to_vec(body).unwrap()))
            .unwrap(),
    );
}

/// No further request came: none is pending, or the client is gone.
pub async fn no_more_requests(handle: &mut Handle) -> bool {
    let next =
        tokio::time::timeout(std::time::Duration::from_millis(50), handle.next_request()).await;
    matches!(next, Err(_) | Ok(None))
}
