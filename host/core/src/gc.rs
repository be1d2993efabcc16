//! Orphan collection: instances a provider entry holds that no live Proxy
//! of this installation owns.
//!
//! An instance is deleted only when it carries our ownership mark, the mark
//! names this installation and a UID that is not live, and it is older than
//! the minimum age (so an instance whose Proxy is being created right now is
//! never taken). An instance without a readable mark, or marked by another
//! installation sharing the backend, is never touched.

use std::collections::HashSet;
use std::time::Duration;

use crate::installation::InstallationId;
use crate::{Provider, ProviderError};

/// What one collection found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Instances `list` returned.
    pub found: usize,
    /// Orphans deleted (or, in a dry run, that would have been).
    pub deleted: Vec<String>,
    /// Instances without our mark, left alone.
    pub skipped_foreign: usize,
    /// Instances marked by another installation, left alone.
    pub skipped_other_installation: usize,
    /// Orphans younger than the minimum age, left for a later round.
    pub skipped_young: usize,
    /// Orphans whose delete failed, with why.
    pub failed: Vec<(String, ProviderError)>,
}

/// Collects the orphans of one provider entry. `live_uids` are the UIDs of
/// every Proxy of `installation`, including those being deleted; `now` is
/// Unix seconds. With `dry_run` nothing is deleted and `deleted` lists what
/// would have been.
pub async fn collect_orphans(
    provider: &dyn Provider,
    installation: &InstallationId,
    live_uids: &HashSet<String>,
    min_age: Duration,
    now: u64,
    dry_run: bool,
) -> Result<GcReport, ProviderError> {
    let instances = provider.list().await?;
    let mut report = GcReport { found: instances.len(), ..GcReport::default() };
    for instance in instances {
        let Some(mark) = &instance.mark else {
            report.skipped_foreign += 1;
            continue;
        };
        if mark.installation != installation.as_str() {
            report.skipped_other_installation += 1;
            continue;
        }
        if live_uids.contains(&mark.uid) {
            continue;
        }
        let created_at = instance.created_at.unwrap_or(mark.created_at);
        if now.saturating_sub(created_at) < min_age.as_secs() {
            report.skipped_young += 1;
            continue;
        }
        if dry_run {
            report.deleted.push(instance.provider_id);
            continue;
        }
        match provider.delete(&instance.provider_id).await {
            Ok(()) => report.deleted.push(instance.provider_id),
            Err(err) => report.failed.push((instance.provider_id, err)),
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::{FakeProvider, Op};
    use crate::{Instance, InstanceState, OwnershipMark};

    fn instance(id: &str, uid: Option<&str>, created_at: u64) -> Instance {
        Instance {
            provider_id: id.into(),
            name: id.into(),
            state: InstanceState::Running,
            addresses: vec![],
            port: None,
            created_at: Some(created_at),
            mark: uid.map(|uid| OwnershipMark {
                installation: crate::fake::INSTALLATION.into(),
                uid: uid.into(),
                namespace: "default".into(),
                name: id.into(),
                created_at,
            }),
        }
    }

    fn backend() -> FakeProvider {
        let fake = FakeProvider::new("lab");
        fake.insert(instance("live", Some("uid-live"), 0));
        fake.insert(instance("orphan", Some("uid-gone"), 0));
        fake.insert(instance("young-orphan", Some("uid-new"), 990));
        fake.insert(instance("unmarked", None, 0));
        fake
    }

    fn ours() -> InstallationId {
        InstallationId::parse("test", crate::fake::INSTALLATION).unwrap()
    }

    fn live() -> HashSet<String> {
        HashSet::from(["uid-live".to_owned()])
    }

    #[tokio::test]
    async fn only_old_marked_instances_of_dead_proxies_are_deleted() {
        let fake = backend();
        let report = collect_orphans(&fake, &ours(), &live(), Duration::from_secs(60), 1000, false)
            .await
            .unwrap();
        assert_eq!(report.deleted, ["orphan"]);
        assert_eq!(report.skipped_young, 1);
        let left: Vec<_> = fake.instances().into_keys().collect();
        assert_eq!(left, ["live", "unmarked", "young-orphan"]);
    }

    #[tokio::test]
    async fn a_dry_run_reports_and_deletes_nothing() {
        let fake = backend();
        let report = collect_orphans(&fake, &ours(), &live(), Duration::from_secs(60), 1000, true)
            .await
            .unwrap();
        assert_eq!(report.deleted, ["orphan"]);
        assert_eq!(fake.instances().len(), 4);
        assert!(!fake.calls().iter().any(|(op, _)| *op == Op::Delete));
    }

    #[tokio::test]
    async fn an_instance_without_a_mark_is_never_deleted() {
        // Plugins must list only marked instances; one that lists others
        // anyway must still not get them deleted.
        let fake = FakeProvider::new("lab").lists_unmarked();
        fake.insert(instance("unmarked", None, 0));
        let report = collect_orphans(&fake, &ours(), &HashSet::new(), Duration::ZERO, 1000, false)
            .await
            .unwrap();
        assert!(report.deleted.is_empty());
        assert_eq!(report.skipped_foreign, 1);
        assert_eq!(fake.instances().len(), 1);
    }

    #[tokio::test]
    async fn a_failed_delete_is_reported_and_the_rest_continue() {
        let fake = backend();
        fake.insert(instance("orphan-2", Some("uid-gone-2"), 0));
        fake.fail_next(Op::Delete, ProviderError::transient("locked"));
        let report = collect_orphans(&fake, &ours(), &live(), Duration::from_secs(60), 1000, false)
            .await
            .unwrap();
        assert_eq!(report.failed.len(), 1);
        assert_eq!(report.deleted.len(), 1);
    }

    /// Two installations on one backend collected each other's instances:
    /// the mark named no installation, so every marked instance whose UID
    /// was not live here counted as an orphan here.
    #[tokio::test]
    async fn regression_another_installations_instances_are_never_collected() {
        let fake = backend();
        let mut theirs = instance("theirs", Some("uid-theirs"), 0);
        theirs.mark.as_mut().unwrap().installation = "other-installation".into();
        fake.insert(theirs);
        let mut unnamed = instance("before-installations", Some("uid-old"), 0);
        unnamed.mark.as_mut().unwrap().installation = String::new();
        fake.insert(unnamed);
        let report =
            collect_orphans(&fake, &ours(), &live(), Duration::ZERO, 1000, false).await.unwrap();
        assert_eq!(report.deleted, ["orphan", "young-orphan"]);
        assert_eq!(report.skipped_other_installation, 2);
        assert!(fake.instances().contains_key("theirs"));
        assert!(fake.instances().contains_key("before-installations"));
    }
}
