//! Loopback ports for servers that a test starts in another process.
//!
//! Such a port cannot be held open until the server binds it, so it is
//! picked, released and handed over. A port from the kernel's ephemeral
//! range may meanwhile go to any `bind(…:0)` or outgoing connection, such
//! as another operator's metrics listener; the server then fails to bind,
//! or, worse, the test talks to the wrong server. So ports come from below
//! that range, where the kernel never picks one on its own, and each is
//! handed out once per test process.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};

/// The ports handed out: above the fixed ports of the dev control plane
/// and the node (16443 to 26459, `deploy/dev`), below Linux's default
/// ephemeral range (32768 on).
const FIRST: u32 = 27_000;
const END: u32 = 32_700;

/// The next candidate, as an offset into `FIRST..END`. Test processes that
/// run at once start at offsets spread by their pid.
static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);

/// A loopback port nothing listens on now and that this process has not
/// handed out before.
///
/// # Panics
/// When every port of the range is taken.
pub fn free_port() -> u16 {
    let span = END - FIRST;
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(97) % span,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    for _ in 0..span {
        let offset = NEXT.fetch_add(1, Ordering::SeqCst) % span;
        let port = u16::try_from(FIRST + offset).expect("the range fits in u16");
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {FIRST}..{END}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_outside_the_ephemeral_range_and_never_repeat() {
        let ports: Vec<u16> = (0..50).map(|_| free_port()).collect();
        let mut unique = ports.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ports.len(), "{ports:?}");
        assert!(ports.iter().all(|p| (FIRST..END).contains(&u32::from(*p))), "{ports:?}");
    }
}
