//! The operator's client of the API server: kube's default stack with the
//! requests waiting for an answer bounded.
//!
//! kube's client speaks HTTP/1.1 and opens a connection for every request
//! in flight, keeping it open afterwards. Every connection holds its own
//! buffers (hyper's read and write buffers, its dispatch channel, rustls'
//! record buffers: about 35 KiB), so a burst of passes (a health round
//! wakes every Proxy whose verdict changed) used to leave hundreds of
//! connections, and the memory they hold, behind. With the bound, requests
//! beyond it wait their turn in the client, and the connections stay about
//! as many as the bound plus the watches.
//!
//! A request holds its place until the API server's answer begins, not
//! until its body ends: a watch, whose answer is a body that never ends,
//! holds it only until the server accepts it.

use std::num::NonZeroUsize;

use tower::limit::ConcurrencyLimitLayer;

/// Requests waiting for an answer at once, at most, unless set.
pub const DEFAULT_IN_FLIGHT: NonZeroUsize = NonZeroUsize::new(32).expect("32 is not zero");

/// A client for `config` that has at most `in_flight` requests waiting for
/// the API server's answer at once.
///
/// # Errors
///
/// When `config` cannot make a client (its TLS settings or credentials).
pub fn bounded(config: kube::Config, in_flight: NonZeroUsize) -> Result<kube::Client, kube::Error> {
    Ok(kube::client::ClientBuilder::try_from(config)?
        .with_layer(&ConcurrencyLimitLayer::new(in_flight.get()))
        .build())
}
