//! `GET /ui/live`: server-sent events that tell open pages the catalog
//! moved, so they fetch themselves again. A `change` event follows a
//! change within [`SPACING`] at most, and never comes more often; a
//! comment every [`KEEP_ALIVE`] keeps proxies in between from closing
//! the stream. Idle pages cost nothing else.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt as _;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use tokio::sync::watch;
use tokio::time::Instant;

use super::Body;
use crate::catalog::Fleet;

/// The least time between two change events.
const SPACING: Duration = Duration::from_secs(1);

/// How often an idle stream says it is alive.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

struct Stream {
    changes: watch::Receiver<u64>,
    last: Option<Instant>,
    started: bool,
}

/// The event stream.
pub(super) fn stream(fleet: &Fleet) -> Response<Body> {
    let state = Stream { changes: fleet.watch_changes(), last: None, started: false };
    let events = futures::stream::unfold(state, |mut state| async move {
        if !state.started {
            state.started = true;
            state.changes.mark_unchanged();
            // Tells the page the stream is up and how soon to retry.
            return Some((Bytes::from_static(b"retry: 2000\nevent: hello\ndata: 0\n\n"), state));
        }
        let event = tokio::select! {
            changed = state.changes.changed() => {
                if changed.is_err() {
                    return None;
                }
                if let Some(last) = state.last {
                    tokio::time::sleep_until(last + SPACING).await;
                }
                let version = *state.changes.borrow_and_update();
                state.last = Some(Instant::now());
                Bytes::from(format!("event: change\ndata: {version}\n\n"))
            }
            () = tokio::time::sleep(KEEP_ALIVE) => Bytes::from_static(b": alive\n\n"),
        };
        Some((event, state))
    });
    let body = StreamBody::new(events.map(|bytes| Ok::<_, Infallible>(Frame::data(bytes))));
    let mut response = Response::new(BodyExt::boxed(body));
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}
