//! What one crawler may hold of the gateway at once: upstream connections
//! (requests in flight and open CONNECT tunnels) per API token, or per
//! client address on an open gateway.
//!
//! Each one holds a descriptor towards a proxy for as long as it lasts, so
//! without a bound one crawler holding idle tunnels took every descriptor
//! and every other crawler got 503s.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

/// Who a slot is counted against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum ClientKey {
    /// An API token, by a keyed hash: the table holds no copy of it.
    Token(u64),
    /// A client address, on a gateway without tokens.
    Peer(IpAddr),
}

/// The slots every client holds.
#[derive(Debug)]
pub(super) struct ClientSlots {
    max: usize,
    hasher: RandomState,
    held: Mutex<HashMap<ClientKey, usize>>,
}

impl ClientSlots {
    /// At most `max` slots per client.
    pub(super) fn new(max: usize) -> Self {
        Self { max, hasher: RandomState::new(), held: Mutex::default() }
    }

    /// The key of a client: its token, or else its address.
    pub(super) fn key(&self, token: Option<&[u8]>, peer: IpAddr) -> ClientKey {
        match token {
            Some(token) => ClientKey::Token(self.hasher.hash_one(token)),
            None => ClientKey::Peer(peer.to_canonical()),
        }
    }

    /// The most one client may hold.
    pub(super) fn max(&self) -> usize {
        self.max
    }

    /// A slot for `key`, or `None` when it holds [`ClientSlots::max`]
    /// already.
    pub(super) fn take(self: &Arc<Self>, key: ClientKey) -> Option<ClientSlot> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let count = held.entry(key).or_insert(0);
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(ClientSlot { slots: Arc::clone(self), key })
    }

    /// How many slots `key` holds.
    #[cfg(test)]
    pub(super) fn held(&self, key: ClientKey) -> usize {
        self.held.lock().unwrap_or_else(PoisonError::into_inner).get(&key).copied().unwrap_or(0)
    }
}

/// One slot, given back when dropped.
#[derive(Debug)]
pub(super) struct ClientSlot {
    slots: Arc<ClientSlots>,
    key: ClientKey,
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut held = self.slots.held.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = held.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_holds_at_most_max_and_gets_them_back() {
        let slots = Arc::new(ClientSlots::new(2));
        let peer: IpAddr = "127.0.0.1".parse().unwrap();
        let a = slots.key(Some(b"token-a"), peer);
        let b = slots.key(Some(b"token-b"), peer);
        assert_ne!(a, b);
        assert_eq!(
            a,
            slots.key(Some(b"token-a"), "10.0.0.1".parse().unwrap()),
            "by token, not by address"
        );
        let first = slots.take(a).expect("one");
        let _second = slots.take(a).expect("two");
        assert!(slots.take(a).is_none(), "a third is refused");
        assert!(slots.take(b).is_some(), "another token has its own");
        drop(first);
        assert_eq!(slots.held(a), 1);
        assert!(slots.take(a).is_some(), "a slot given back is taken again");
        let open = slots.key(None, "::ffff:127.0.0.1".parse().unwrap());
        assert_eq!(open, ClientKey::Peer(peer), "without a token, by address");
    }
}
