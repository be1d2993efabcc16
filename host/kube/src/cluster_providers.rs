//! ClusterProxyProviders: provider entries declared as resources.
//!
//! Every replica follows them ([`follow`]) and serves each as an entry of
//! its own registry (a [`ResourceEntries`]): applied, edited and deleted
//! without a restart, and a new leader serves the same entries. The leader
//! ([`run`]) keeps each one's finalizer and status: `ConfigValid`,
//! `PluginLoaded` and `Ready` with `observedGeneration`, and the serving
//! build; its provider checks ([`publish_check`]) add `Checked`, under a
//! field manager of their own. A provider that Proxies still name is not
//! deleted: its finalizer holds it, and its `InUse` condition lists them,
//! until they are gone.
//!
//! A spec is validated by the runtime as an entry of the providers file is
//! (unknown keys refused, every error naming the key); an edit that does
//! not validate, or that the plugin refuses, leaves the entry serving the
//! spec it had, and the conditions say why.
//!
//! The providers file's entries show here too, as the ClusterProxyProviders
//! [`crate::file_providers`] applies: the same passes write their status
//! from what the file's entry comes to; they get no finalizer, since the
//! file, not the object, serves the entry.
//!
//! A provider labelled [`INSTALLATION_LABEL`] with another installation's
//! ID is that installation's alone: this one neither serves it nor writes
//! its finalizer, status or checks ([`belongs_to_another`]).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Resource as _, ResourceExt as _};
use proxyfleet_core::entry_resources::{Applied, ResourceEntries};
use proxyfleet_core::liveness::Heartbeat;
use proxyfleet_core::revisions::EntryRevisions;

use crate::convert::rfc3339;
use crate::crd::{
    CONDITION_MESSAGE_MAX, ClusterProxyProvider, ClusterProxyProviderStatus, Condition,
    ConditionStatus, INSTALLATION_LABEL, MANAGER, PluginRevisionRef, Proxy, RejectedRevision,
};
use crate::file_providers::{is_file_view, shown_by_another};

/// The finalizer that keeps a provider while Proxies name it.
pub const PROVIDER_FINALIZER: &str = "proxyfleet.io/provider-in-use";

/// The field manager of the `Checked` condition: its own, so that the
/// provider passes and the checks each apply only their conditions.
pub const CHECKS_MANAGER: &str = "proxyfleet-checks";

/// How often the leader looks at each provider again without a change of
/// the object: a plugin swap or a refused build shows in the status then.
const RESYNC: Duration = Duration::from_secs(30);

/// How soon a view that lags its file entry is looked at again.
const RESYNC_VIEW: Duration = Duration::from_secs(5);

/// How often a provider held by its Proxies is looked at again.
const HELD_RESYNC: Duration = Duration::from_secs(5);

/// Why a provider pass could not finish.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Kubernetes API failed.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

/// The spec as the providers file writes an entry, without its name:
/// `allowedNamespaces` is the gate's ([`crate::namespace_gate`]), not the
/// entry's.
pub fn entry_spec(provider: &ClusterProxyProvider) -> serde_json::Value {
    // Plain data with string keys: serializing cannot fail.
    let mut spec = serde_json::to_value(&provider.spec).unwrap_or_default();
    if let Some(fields) = spec.as_object_mut() {
        fields.remove("allowedNamespaces");
    }
    spec
}

/// Whether `provider` is another installation's: labelled
/// [`INSTALLATION_LABEL`] with another ID, or another installation's view
/// of its providers file. This installation neither serves it nor writes
/// its finalizer, status or checks.
pub fn belongs_to_another(provider: &ClusterProxyProvider, installation: &str) -> bool {
    shown_by_another(provider, installation)
        || provider.labels().get(INSTALLATION_LABEL).is_some_and(|owner| owner != installation)
}

/// Serves every ClusterProxyProvider of this installation as an entry of
/// `entries`, following changes until the watch ends (it retries on its
/// own). Entries whose resource went (or was given to another
/// installation) while the watch was down are removed when it lists again.
pub async fn follow(client: kube::Client, entries: Arc<dyn ResourceEntries>) {
    let api: Api<ClusterProxyProvider> = Api::all(client);
    let own = entries.installation().as_str().to_owned();
    let mut events = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
    let mut listed = BTreeSet::new();
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Init) => listed.clear(),
            // A view of a providers file declares nothing: the file serves
            // its entry.
            Ok(watcher::Event::InitApply(provider)) => {
                if !is_file_view(&provider) && !belongs_to_another(&provider, &own) {
                    listed.insert(provider.name_any());
                    apply(entries.as_ref(), &provider).await;
                }
            }
            Ok(watcher::Event::InitDone) => {
                for name in entries.resource_names() {
                    if !listed.contains(&name) {
                        entries.remove(&name).await;
                    }
                }
            }
            Ok(watcher::Event::Apply(provider)) if is_file_view(&provider) => {}
            // Given to another installation: no longer served here (a no-op
            // unless this one declared it).
            Ok(watcher::Event::Apply(provider)) if belongs_to_another(&provider, &own) => {
                entries.remove(&provider.name_any()).await;
            }
            Ok(watcher::Event::Apply(provider)) => apply(entries.as_ref(), &provider).await,
            Ok(watcher::Event::Delete(provider)) => {
                if !is_file_view(&provider) {
                    entries.remove(&provider.name_any()).await;
                }
            }
            Err(err) => tracing::warn!("ClusterProxyProvider watch: {err}"),
        }
    }
}

async fn apply(entries: &dyn ResourceEntries, provider: &ClusterProxyProvider) {
    let name = provider.name_any();
    let applied = entries.apply(&name, &entry_spec(provider)).await;
    tracing::debug!(provider = %name, ?applied, "ClusterProxyProvider applied");
}

/// What the leader's provider passes use.
#[derive(Clone)]
pub struct ProviderContext {
    client: kube::Client,
    entries: Arc<dyn ResourceEntries>,
    /// Where Proxies naming a provider are looked for: one namespace, or
    /// every one when `None`.
    proxies_namespace: Option<String>,
    heartbeat: Option<Arc<Heartbeat>>,
}

impl std::fmt::Debug for ProviderContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderContext")
            .field("proxies_namespace", &self.proxies_namespace)
            .finish_non_exhaustive()
    }
}

impl ProviderContext {
    /// A context applying to `entries`, looking for the Proxies that name
    /// a provider in `proxies_namespace` (every namespace when `None`).
    pub fn new(
        client: kube::Client,
        entries: Arc<dyn ResourceEntries>,
        proxies_namespace: Option<String>,
        heartbeat: Option<Arc<Heartbeat>>,
    ) -> Self {
        Self { client, entries, proxies_namespace, heartbeat }
    }
}

/// Runs the leader's provider controller until `shutdown`.
pub async fn run(
    context: ProviderContext,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let api: Api<ClusterProxyProvider> = Api::all(context.client.clone());
    Controller::new(api, watcher::Config::default())
        .graceful_shutdown_on(shutdown)
        .run(
            |provider, context| async move {
                let pass = context.heartbeat.as_ref().map(|heartbeat| heartbeat.pass());
                let result = reconcile(&provider, &context).await;
                drop(pass);
                result
            },
            |provider, err, _| {
                tracing::warn!(provider = %provider.name_any(), "{err}; retrying in 15s");
                Action::requeue(Duration::from_secs(15))
            },
            Arc::new(context),
        )
        .for_each(|result| async move {
            if let Err(err) = result {
                tracing::debug!("provider pass: {err}");
            }
        })
        .await;
}

/// One pass over one provider: its finalizer, its entry, its status.
pub async fn reconcile(
    provider: &ClusterProxyProvider,
    context: &ProviderContext,
) -> Result<Action, Error> {
    let name = provider.name_any();
    if belongs_to_another(provider, context.entries.installation().as_str()) {
        return Ok(Action::await_change());
    }
    let api: Api<ClusterProxyProvider> = Api::all(context.client.clone());
    let has_finalizer = provider.finalizers().iter().any(|f| f == PROVIDER_FINALIZER);
    if provider.meta().deletion_timestamp.is_some() {
        if !has_finalizer {
            return Ok(Action::await_change());
        }
        // A provider that never served (its name is a file entry's) or
        // that shows a file entry holds no Proxy of its own.
        let served = !is_file_view(provider) && context.entries.resource_names().contains(&name);
        let users = if served { proxies_naming(context, &name).await? } else { Vec::new() };
        if users.is_empty() {
            let rest: Vec<String> = provider
                .finalizers()
                .iter()
                .filter(|f| *f != PROVIDER_FINALIZER)
                .cloned()
                .collect();
            set_finalizers(&api, provider, rest).await?;
            tracing::info!(provider = %name, "no Proxy names it any more: deleted");
            return Ok(Action::await_change());
        }
        let in_use = in_use_condition(provider, &users);
        write_status(&api, provider, vec![in_use], None).await?;
        return Ok(Action::requeue(HELD_RESYNC));
    }
    // A view holds nothing (the file serves its entry), so it gets no
    // finalizer: deleting it never waits, also once no operator runs.
    if !has_finalizer && !is_file_view(provider) {
        let mut list = provider.finalizers().to_vec();
        list.push(PROVIDER_FINALIZER.to_owned());
        set_finalizers(&api, provider, list).await?;
        // The watch brings the object back with it, and the next pass
        // applies it.
        return Ok(Action::await_change());
    }
    // The view of an entry that left the file: the views' next pass
    // deletes it; applied, it would be taken for a resource's entry.
    if is_file_view(provider)
        && !context.entries.file_entries().iter().any(|(entry, _)| *entry == name)
    {
        return Ok(Action::await_change());
    }
    let applied = context.entries.apply(&name, &entry_spec(provider)).await;
    if is_file_view(provider) && applied == Applied::NameTaken {
        // The file's entry changed and the views' next pass brings this
        // one in line: not another provider's name.
        return Ok(Action::requeue(RESYNC_VIEW));
    }
    let revisions = context.entries.revisions_of(&name);
    let serving = revisions.as_ref().is_some_and(|r| r.active.is_some());
    let conditions = conditions(provider, &applied, serving);
    write_status(&api, provider, conditions, revisions.as_ref()).await?;
    Ok(Action::requeue(RESYNC))
}

/// Publishes a check of entry `name` as the `Checked` condition of its
/// ClusterProxyProvider: `True/Passed`, or `False` with the first finding's
/// reason and every finding in the message. An entry without one (not
/// shown yet, or gone) is left be, and so is an object of its name that
/// does not declare or show it (another installation's view; a resource
/// refused because the file has the name).
pub async fn publish_check(
    client: &kube::Client,
    entries: &dyn ResourceEntries,
    name: &str,
    health: &proxyfleet_core::Health,
) -> Result<(), kube::Error> {
    let api: Api<ClusterProxyProvider> = Api::all(client.clone());
    let Some(provider) = api.get_opt(name).await? else { return Ok(()) };
    let declares_it = if is_file_view(&provider) {
        !shown_by_another(&provider, entries.installation().as_str())
    } else {
        entries.resource_names().iter().any(|resource| resource == name)
    };
    if !declares_it {
        return Ok(());
    }
    let (reason, message) = match health.issues.first() {
        None if health.healthy => ("Passed".to_owned(), "the last check passed".to_owned()),
        None => ("Failed".to_owned(), "the last check failed".to_owned()),
        Some(first) => (
            format!("{:?}", first.reason),
            health
                .issues
                .iter()
                .map(|issue| format!("{:?}: {}", issue.reason, issue.message))
                .collect::<Vec<_>>()
                .join("; "),
        ),
    };
    let checked = condition(&provider, "Checked", health.healthy, &reason, message);
    if provider.status.as_ref().is_some_and(|s| s.conditions.contains(&checked)) {
        return Ok(());
    }
    let patch = serde_json::json!({
        "apiVersion": "proxyfleet.io/v1alpha1",
        "kind": "ClusterProxyProvider",
        "status": { "conditions": [checked] },
    });
    api.patch_status(name, &PatchParams::apply(CHECKS_MANAGER).force(), &Patch::Apply(&patch))
        .await?;
    Ok(())
}

/// `namespace/name` of every Proxy that names `provider`, in name order.
async fn proxies_naming(context: &ProviderContext, provider: &str) -> Result<Vec<String>, Error> {
    let api: Api<Proxy> = match &context.proxies_namespace {
        Some(namespace) => Api::namespaced(context.client.clone(), namespace),
        None => Api::all(context.client.clone()),
    };
    let mut users: Vec<String> = api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|proxy| proxy.spec.provider == provider)
        .map(|proxy| format!("{}/{}", proxy.namespace().unwrap_or_default(), proxy.name_any()))
        .collect();
    users.sort();
    Ok(users)
}

async fn set_finalizers(
    api: &Api<ClusterProxyProvider>,
    provider: &ClusterProxyProvider,
    list: Vec<String>,
) -> Result<(), Error> {
    // The resourceVersion is a precondition: a concurrent change fails
    // this patch (409) and the pass runs again.
    let patch = serde_json::json!({
        "metadata": { "resourceVersion": provider.resource_version(), "finalizers": list }
    });
    api.patch(&provider.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await?;
    Ok(())
}

/// The conditions of a provider whose spec came to `applied`; `serving`:
/// whether a build serves the entry (this spec or the one before).
fn conditions(provider: &ClusterProxyProvider, applied: &Applied, serving: bool) -> Vec<Condition> {
    let plugin = &provider.spec.plugin;
    let (valid, loaded, ready) = match applied {
        Applied::Serving => (
            (true, "Valid", "the spec validates and the plugin accepts its config".to_owned()),
            (true, "Loaded", format!("plugin {plugin:?} serves the entry")),
            (true, "Serving", "serves this generation's spec".to_owned()),
        ),
        Applied::Invalid { message } => (
            (false, "InvalidSpec", message.clone()),
            loaded_before(serving),
            not_ready(serving, "InvalidSpec", message),
        ),
        Applied::Refused { reason, kept_serving } => (
            (false, "Refused", reason.clone()),
            if *kept_serving {
                loaded_before(true)
            } else {
                (false, "Unavailable", reason.clone())
            },
            not_ready(*kept_serving, "Refused", reason),
        ),
        Applied::NameTaken => {
            let why = format!(
                "the providers file has an entry named {:?}; rename this resource or the entry",
                provider.name_any()
            );
            (
                (false, "NameTaken", why.clone()),
                (false, "NameTaken", why.clone()),
                (false, "NameTaken", why),
            )
        }
    };
    [("ConfigValid", valid), ("PluginLoaded", loaded), ("Ready", ready)]
        .into_iter()
        .map(|(type_, (holds, reason, message))| condition(provider, type_, holds, reason, message))
        .collect()
}

fn loaded_before(serving: bool) -> (bool, &'static str, String) {
    if serving {
        (true, "Loaded", "the entry serves its previous spec".to_owned())
    } else {
        (false, "Unavailable", "no spec of this provider was served yet".to_owned())
    }
}

fn not_ready(kept_serving: bool, reason: &'static str, why: &str) -> (bool, &'static str, String) {
    if kept_serving {
        (false, reason, format!("serves its previous spec; this generation's is refused: {why}"))
    } else {
        (false, reason, why.to_owned())
    }
}

fn in_use_condition(provider: &ClusterProxyProvider, users: &[String]) -> Condition {
    const LISTED: usize = 10;
    let mut named = users.iter().take(LISTED).cloned().collect::<Vec<_>>().join(", ");
    if users.len() > LISTED {
        named.push_str(&format!(" and {} more", users.len() - LISTED));
    }
    let message =
        format!("deletion waits until no Proxy names this provider; {} do: {named}", users.len());
    condition(provider, "InUse", true, "ProxiesRemain", message)
}

/// A condition at the provider's generation; its transition time is kept
/// from the status when its status did not change.
fn condition(
    provider: &ClusterProxyProvider,
    type_: &str,
    holds: bool,
    reason: &str,
    message: String,
) -> Condition {
    let status = if holds { ConditionStatus::True } else { ConditionStatus::False };
    let now = proxyfleet_core::clock::unix_now();
    let last_transition_time = provider
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_ && c.status == status))
        .map_or_else(|| rfc3339(now), |c| c.last_transition_time.clone());
    let message: String = message.chars().take(CONDITION_MESSAGE_MAX).collect();
    Condition {
        type_: type_.to_owned(),
        status,
        observed_generation: provider.meta().generation,
        last_transition_time,
        reason: reason.to_owned(),
        message: Some(message),
    }
}

/// Writes `conditions` and what the entry's revisions say, by
/// server-side apply, unless the status says all of it already.
async fn write_status(
    api: &Api<ClusterProxyProvider>,
    provider: &ClusterProxyProvider,
    conditions: Vec<Condition>,
    revisions: Option<&EntryRevisions>,
) -> Result<(), Error> {
    let status = next_status(provider, conditions, revisions);
    let mut written = provider.status.clone().unwrap_or_default();
    written.conditions.retain(|c| c.type_ != "Checked");
    written.conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
    if written == status {
        return Ok(());
    }
    let patch = serde_json::json!({
        "apiVersion": "proxyfleet.io/v1alpha1",
        "kind": "ClusterProxyProvider",
        "status": status,
    });
    api.patch_status(
        &provider.name_any(),
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await?;
    Ok(())
}

/// The status the passes apply: their own conditions, sorted by type (not
/// `Checked`, the checks' under another field manager; one of theirs left
/// out, `InUse` once deletion is no longer held, goes), and the serving,
/// previous and refused builds from `revisions` (kept from the status when
/// there are none, as while a deletion is held).
fn next_status(
    provider: &ClusterProxyProvider,
    conditions: Vec<Condition>,
    revisions: Option<&EntryRevisions>,
) -> ClusterProxyProviderStatus {
    let previous = provider.status.clone().unwrap_or_default();
    let mut own: Vec<Condition> = previous
        .conditions
        .iter()
        .filter(|c| !matches!(c.type_.as_str(), "Checked" | "InUse"))
        .filter(|c| !conditions.iter().any(|n| n.type_ == c.type_))
        .cloned()
        .collect();
    own.extend(conditions);
    own.sort_by(|a, b| a.type_.cmp(&b.type_));
    let mut status = ClusterProxyProviderStatus {
        observed_generation: provider.meta().generation.unwrap_or_default(),
        conditions: own,
        ..previous
    };
    if let Some(revisions) = revisions {
        if let Some(active) = &revisions.active {
            status.plugin = Some(active.plugin.clone());
            status.version = Some(active.version.clone());
            status.digest = Some(active.digest.clone());
        }
        status.activated_at = revisions.activated_at.map(rfc3339);
        status.previous = revisions.previous.as_ref().map(|previous| PluginRevisionRef {
            version: previous.version.clone(),
            digest: previous.digest.clone(),
        });
        status.rejected = revisions
            .rejected
            .iter()
            .map(|candidate| RejectedRevision {
                version: candidate.version.clone(),
                digest: candidate.digest.clone(),
                kind: candidate.kind.as_str().to_owned(),
                reason: candidate.reason.clone(),
            })
            .collect();
    }
    status
}

#[cfg(test)]
mod tests {
    use super::*;

    fn provider() -> ClusterProxyProvider {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "proxyfleet.io/v1alpha1",
            "kind": "ClusterProxyProvider",
            "metadata": { "name": "office", "generation": 3 },
            "spec": { "plugin": "static" },
        }))
        .unwrap()
    }

    fn shown(conditions: &[Condition]) -> Vec<String> {
        conditions.iter().map(|c| format!("{}={:?}/{}", c.type_, c.status, c.reason)).collect()
    }

    #[test]
    fn a_refused_edit_says_the_previous_spec_still_serves() {
        let refused =
            Applied::Refused { reason: "endpoints[1] repeats".into(), kept_serving: true };
        let refusing = conditions(&provider(), &refused, true);
        assert_eq!(
            shown(&refusing),
            ["ConfigValid=False/Refused", "PluginLoaded=True/Loaded", "Ready=False/Refused"]
        );
        let ready = refusing[2].message.as_deref().unwrap();
        assert!(ready.contains("serves its previous spec") && ready.contains("endpoints[1]"));
        assert!(refusing.iter().all(|c| c.observed_generation == Some(3)));
    }

    #[test]
    fn a_provider_that_never_served_is_unavailable_with_the_reason() {
        let refused =
            Applied::Refused { reason: "plugin \"nosuch\" not found".into(), kept_serving: false };
        let unavailable = conditions(&provider(), &refused, false);
        assert_eq!(
            shown(&unavailable),
            ["ConfigValid=False/Refused", "PluginLoaded=False/Unavailable", "Ready=False/Refused"]
        );
        assert!(unavailable[1].message.as_deref().unwrap().contains("nosuch"));
        let taken = conditions(&provider(), &Applied::NameTaken, false);
        assert!(taken.iter().all(|c| c.reason == "NameTaken"));
        assert!(taken[2].message.as_deref().unwrap().contains("\"office\""));
    }

    #[test]
    fn a_transition_time_is_kept_while_the_status_holds() {
        let mut before = provider();
        let serving = conditions(&before, &Applied::Serving, true);
        let mut kept = serving.clone();
        for condition in &mut kept {
            condition.last_transition_time = "2026-01-01T00:00:00Z".into();
        }
        before.status = Some(ClusterProxyProviderStatus { conditions: kept, ..Default::default() });
        let again = conditions(&before, &Applied::Serving, true);
        assert!(again.iter().all(|c| c.last_transition_time == "2026-01-01T00:00:00Z"));
        let refused = Applied::Invalid { message: "limits: unknown field `colour`".into() };
        let changed = conditions(&before, &refused, true);
        assert_ne!(changed[0].last_transition_time, "2026-01-01T00:00:00Z");
        assert_eq!(changed[1].last_transition_time, "2026-01-01T00:00:00Z", "still loaded");
    }

    #[test]
    fn the_status_carries_the_builds_and_only_the_passes_conditions() {
        use proxyfleet_core::revisions::{RejectedCandidate, RejectionKind, RevisionSummary};
        let summary = |version: &str, digest: &str| RevisionSummary {
            plugin: "static".into(),
            version: version.into(),
            digest: digest.into(),
            contract_version: "0.5.0".into(),
            loaded_at: 1,
            source: "static.wasm".into(),
        };
        let revisions = EntryRevisions {
            entry: "office".into(),
            plugin: "static".into(),
            pin: None,
            active: Some(summary("2.0.0", "bb")),
            activated_at: Some(1_700_000_000),
            previous: Some(summary("1.0.0", "aa")),
            rejected: vec![RejectedCandidate {
                plugin: Some("static".into()),
                version: Some("3.0.0".into()),
                digest: "cc".into(),
                contract_version: Some("0.5.0".into()),
                loaded_at: 2,
                kind: RejectionKind::Capabilities,
                reason: "asks for http".into(),
            }],
            unavailable: None,
            swaps: 1,
            rejections: 1,
            config_refused: None,
            pull: None,
            grants: Vec::new(),
            config_schema: None,
        };
        let mut before = provider();
        let held = in_use_condition(&before, &["crawl/a".to_owned()]);
        let checked = condition(&before, "Checked", true, "Passed", "ok".into());
        before.status = Some(ClusterProxyProviderStatus {
            conditions: vec![held, checked],
            ..Default::default()
        });
        let status =
            next_status(&before, conditions(&before, &Applied::Serving, true), Some(&revisions));
        assert_eq!(
            status.conditions.iter().map(|c| c.type_.as_str()).collect::<Vec<_>>(),
            ["ConfigValid", "PluginLoaded", "Ready"],
            "InUse goes once not held; Checked is the checks' to write"
        );
        assert_eq!(
            (status.version.as_deref(), status.digest.as_deref()),
            (Some("2.0.0"), Some("bb"))
        );
        assert_eq!(status.previous.as_ref().map(|p| p.digest.as_str()), Some("aa"));
        assert_eq!(status.activated_at.as_deref(), Some("2023-11-14T22:13:20Z"));
        assert_eq!(status.rejected[0].kind, "capabilities");
        assert_eq!(status.observed_generation, 3);
    }
}
