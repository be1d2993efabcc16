//! Rolling an entry back to the revision it served before, on request.

use proxyfleet_core::revisions::RevisionSummary;
use proxyfleet_core::source::{ProviderSource, RollbackError};

/// Makes `entry` serve its previous revision again and logs it; the
/// revision now serving is returned.
pub fn rollback(
    source: &dyn ProviderSource,
    entry: &str,
) -> Result<RevisionSummary, RollbackError> {
    let active = source.rollback(entry)?;
    tracing::warn!(
        entry,
        version = %active.version,
        digest = %active.digest,
        "rolled back to the previous plugin revision"
    );
    Ok(active)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use proxyfleet_core::fake::FakeProvider;
    use proxyfleet_core::installation::InstallationId;
    use proxyfleet_core::source::{EntryState, StaticSource};

    use super::*;

    #[test]
    fn a_refused_rollback_says_which_entry_and_why() {
        let source = StaticSource::new(InstallationId::default())
            .with("lab", EntryState::Ready(Arc::new(FakeProvider::new("lab"))));
        assert_eq!(
            rollback(&source, "lab"),
            Err(RollbackError::NoPrevious { entry: "lab".into() })
        );
        let unknown = rollback(&source, "nope").unwrap_err();
        assert_eq!(unknown, RollbackError::UnknownEntry { entry: "nope".into() });
        assert_eq!(unknown.to_string(), "no provider entry named \"nope\"");
    }
}
