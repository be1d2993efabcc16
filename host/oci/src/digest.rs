//! sha256 digests as OCI names content: `sha256:` and 64 lower-case hex
//! digits.

use sha2::{Digest as _, Sha256};

/// `sha256:` and the hex digest of `bytes`.
pub(crate) fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// `sha256:` and 64 lower-case hex digits.
pub(crate) fn is_sha256(digest: &str) -> bool {
    digest.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}
