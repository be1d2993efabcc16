//! Which of two states of one object is the later, by `resourceVersion`.
//!
//! The API conventions call resource versions opaque, but a watch can
//! deliver a state older than one a request of this process has already
//! been answered with, and a reader must not go back in time. As
//! client-go's mutation cache does, versions are read as integers (what
//! every etcd-backed API server hands out); where either is not one, the
//! caller decides.

/// Whether the state at `candidate` is later than the one at `held`;
/// `None` when either version is missing or not an integer.
pub(crate) fn later(candidate: Option<&str>, held: Option<&str>) -> Option<bool> {
    let number = |version: Option<&str>| version?.parse::<u64>().ok();
    Some(number(candidate)? > number(held)?)
}

#[cfg(test)]
mod tests {
    use super::later;

    #[test]
    fn compares_as_integers_not_as_text() {
        assert_eq!(later(Some("10"), Some("9")), Some(true));
        assert_eq!(later(Some("9"), Some("10")), Some(false));
        assert_eq!(later(Some("9"), Some("9")), Some(false));
        assert_eq!(later(Some("opaque"), Some("9")), None);
        assert_eq!(later(None, Some("9")), None);
    }
}
