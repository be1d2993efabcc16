//! Plugins that entries name by `oci://` reference: the builds pulled into
//! the store beside the precompiled cache, as the registry reads them, and
//! one poll of one reference.
//!
//! To [`crate::Registry`] a reference is a plugin file named by its text:
//! its content is whatever the store holds for it, read and hashed like a
//! file, and offered to the entries through the same admission. A poll
//! moves the store; the registry's next rescan sees the new build. So a
//! pulled build is treated exactly like a file dropped into the directory,
//! and a registry that is down changes nothing the store already holds.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};
use std::time::SystemTime;

pub use proxyfleet_core::revisions::PullStatus;
use proxyfleet_oci::{KeyPolicy, OciError, PluginReference, PullLimits, Registries, Store};

use crate::config::ProvidersConfig;
use crate::engine::Runtime;
use crate::error::RuntimeError;
use crate::plugin::PluginFile;
use crate::revisions::unix_seconds;

/// A poll that failed.
#[derive(Debug, thiserror::Error)]
pub enum PollError {
    /// The registry could not be asked, or the store could not be used;
    /// the next look may succeed.
    #[error(transparent)]
    Registry(#[from] OciError),
    /// The registry answered with a build that is refused (its layout, its
    /// size, its digests, its signatures); it is not pulled again until
    /// the tag moves, except one refused for its signatures, which is
    /// checked again on every poll.
    #[error("{source}")]
    Refused {
        /// The manifest the reference named.
        manifest_digest: String,
        /// Why the build is refused.
        source: OciError,
    },
}

impl PollError {
    /// The underlying error.
    pub fn into_source(self) -> OciError {
        match self {
            Self::Registry(source) | Self::Refused { source, .. } => source,
        }
    }
}

/// The `oci://` plugins of a registry.
pub(crate) struct OciPlugins {
    store: Store,
    registries: Registries,
    limits: PullLimits,
    references: Vec<PluginReference>,
    status: Mutex<BTreeMap<String, PullStatus>>,
    /// The manifest each reference named when its build was refused.
    refused: Mutex<BTreeMap<String, String>>,
    /// Per reference, the `verify` policies of the entries naming it.
    verify: BTreeMap<String, Vec<KeyPolicy>>,
    /// Per reference, the manifest and reason of the last refusal for its
    /// signatures: checked again on every poll (a signature may be pushed
    /// later, a key file fixed), reported once.
    unverified: Mutex<BTreeMap<String, (String, String)>>,
    /// Holds the store when no cache directory was given; removed on drop.
    _scratch: Option<tempfile::TempDir>,
}

impl std::fmt::Debug for OciPlugins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OciPlugins")
            .field("store", &self.store.dir())
            .field("references", &self.references)
            .finish_non_exhaustive()
    }
}

impl OciPlugins {
    /// The `oci://` plugins `config` names; `None` when it names none.
    pub(crate) fn new(
        runtime: &Runtime,
        config: &ProvidersConfig,
    ) -> Result<Option<Self>, RuntimeError> {
        let mut references: Vec<PluginReference> =
            config.entries.iter().filter_map(|entry| entry.oci.clone()).collect();
        references.sort();
        references.dedup();
        if references.is_empty() {
            return Ok(None);
        }
        let (store, scratch) = match &runtime.inner.oci_store_dir {
            Some(dir) => (Store::open(dir).map_err(RuntimeError::PluginStore)?, None),
            None => {
                let scratch = tempfile::Builder::new()
                    .prefix("proxyfleet-oci-")
                    .tempdir()
                    .map_err(|source| RuntimeError::Cache { path: std::env::temp_dir(), source })?;
                tracing::warn!(
                    "no plugin cache directory: builds pulled from registries are kept in {} \
                     only while this process runs, and a restart needs the registries",
                    scratch.path().display()
                );
                let store = Store::open(scratch.path()).map_err(RuntimeError::PluginStore)?;
                (store, Some(scratch))
            }
        };
        let mut verify: BTreeMap<String, Vec<KeyPolicy>> = BTreeMap::new();
        for entry in &config.entries {
            if let (Some(reference), Some(policy)) = (&entry.oci, &entry.verify) {
                verify.entry(reference.to_string()).or_default().push(policy.clone());
            }
        }
        let status = references
            .iter()
            .map(|reference| {
                let status =
                    PullStatus { reference: reference.to_string(), ..PullStatus::default() };
                (reference.to_string(), status)
            })
            .collect();
        Ok(Some(Self {
            store,
            registries: config.registries.clone(),
            limits: runtime.inner.pull_limits,
            references,
            status: Mutex::new(status),
            refused: Mutex::default(),
            verify,
            unverified: Mutex::default(),
            _scratch: scratch,
        }))
    }

    /// Every reference, once each.
    pub(crate) fn references(&self) -> &[PluginReference] {
        &self.references
    }

    /// A reader of what the store holds for every reference, to move to a
    /// blocking thread.
    pub(crate) fn stored(&self) -> StoredBuilds {
        let policies = self
            .references
            .iter()
            .map(|reference| (reference.to_string(), self.policies(reference)))
            .filter(|(_, policies)| !policies.is_empty())
            .collect();
        StoredBuilds { store: self.store.clone(), references: self.references.clone(), policies }
    }

    /// Every signature policy a build of `reference` must satisfy: its
    /// registry's, then its entries'.
    fn policies(&self, reference: &PluginReference) -> Vec<KeyPolicy> {
        let entries = self.verify.get(reference.as_str()).map_or(&[][..], Vec::as_slice);
        proxyfleet_oci::policies(&self.registries, reference, entries)
    }

    /// Pulls `reference` into the store now, for an entry whose cache is
    /// cold, and answers the build.
    pub(crate) async fn pull_cold(
        &self,
        reference: &PluginReference,
    ) -> Result<PluginFile, PollError> {
        self.poll(reference).await?;
        let store = self.store.clone();
        let only = reference.clone();
        let read = self.blocking(move || read_stored(&store, &only)).await;
        match read {
            Ok(Some(file)) => Ok(file),
            Ok(None) => Err(PollError::Registry(OciError::Store {
                path: self.store.dir().to_owned(),
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!("{reference} was pulled but its record is gone"),
                ),
            })),
            Err(source) => Err(PollError::Registry(source)),
        }
    }

    /// Runs store I/O off the async threads.
    async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> Result<T, OciError> + Send + 'static,
    ) -> Result<T, OciError> {
        tokio::task::spawn_blocking(work).await.unwrap_or_else(|err| {
            Err(OciError::Store {
                path: self.store.dir().to_owned(),
                source: std::io::Error::other(err.to_string()),
            })
        })
    }

    /// Asks the registry what `reference` names now and pulls it into the
    /// store if the store does not hold that build; true when the store
    /// moved. A digest reference already held is not asked about again,
    /// and a build refused once is not pulled again until the tag moves.
    pub(crate) async fn poll(&self, reference: &PluginReference) -> Result<bool, PollError> {
        let outcome = self.poll_once(reference).await;
        let mut status = self.status.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = status.entry(reference.to_string()).or_default();
        match &outcome {
            Ok((_, manifest_digest)) => {
                entry.manifest_digest =
                    Some(manifest_digest.clone()).filter(|digest| !digest.is_empty());
                entry.checked_at = Some(unix_seconds(SystemTime::now()));
                entry.error = None;
                entry.failures = 0;
            }
            // The registry answered; the build is what failed, and it is
            // listed among the refused candidates.
            Err(PollError::Refused { .. }) => {
                entry.checked_at = Some(unix_seconds(SystemTime::now()));
            }
            Err(PollError::Registry(err)) => {
                entry.error = Some(err.to_string());
                entry.failures = entry.failures.saturating_add(1);
            }
        }
        outcome.map(|(moved, _)| moved)
    }

    async fn poll_once(&self, reference: &PluginReference) -> Result<(bool, String), PollError> {
        let current = {
            let store = self.store.clone();
            let reference = reference.clone();
            let policies = self.policies(&reference);
            self.blocking(move || {
                // A record whose build is gone (removed as damaged), or
                // whose signatures do not satisfy the policies as they are
                // now, is not held: the build is pulled (and checked) again.
                Ok(store.current(&reference)?.filter(|stored| {
                    store.holds(&stored.layer_digest) && signed(&reference, &policies, stored)
                }))
            })
            .await?
        };
        if let Some(current) = &current
            && !reference.follows_tag()
        {
            return Ok((false, current.manifest_digest.clone()));
        }
        let manifest_digest = proxyfleet_oci::resolve(&self.registries, reference).await?;
        if current.as_ref().is_some_and(|current| current.manifest_digest == manifest_digest) {
            return Ok((false, manifest_digest));
        }
        let refused_before = self
            .refused
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(reference.as_str())
            .is_some_and(|refused| *refused == manifest_digest);
        if refused_before {
            // Nothing new: the status keeps naming what the store holds.
            let held = current.map(|current| current.manifest_digest).unwrap_or_default();
            return Ok((false, held));
        }
        let policies = self.verify.get(reference.as_str()).map_or(&[][..], Vec::as_slice);
        let pulled = match proxyfleet_oci::pull(
            &self.registries,
            reference,
            Some(&manifest_digest),
            self.limits,
            policies,
        )
        .await
        {
            Ok(pulled) => pulled,
            Err(source) if source.is_signature_refusal() => {
                let seen = (manifest_digest.clone(), source.to_string());
                let mut unverified = self.unverified.lock().unwrap_or_else(PoisonError::into_inner);
                if unverified.get(reference.as_str()) == Some(&seen) {
                    // Refused for the same reason before: listed once.
                    let held = current.map(|current| current.manifest_digest).unwrap_or_default();
                    return Ok((false, held));
                }
                unverified.insert(reference.to_string(), seen);
                return Err(PollError::Refused { manifest_digest, source });
            }
            Err(source) if source.refuses_the_build() => {
                self.refused
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(reference.to_string(), manifest_digest.clone());
                return Err(PollError::Refused { manifest_digest, source });
            }
            Err(source) => return Err(PollError::Registry(source)),
        };
        let signed_by: Vec<&str> = pulled
            .verified
            .iter()
            .flat_map(|verified| verified.by.iter().map(|(_, key)| key.as_str()))
            .collect();
        tracing::info!(
            plugin = %reference,
            manifest = %pulled.manifest_digest,
            digest = %hex_of(&pulled.layer_digest),
            bytes = pulled.bytes.len(),
            signed_by = ?signed_by,
            "pulled a plugin build"
        );
        let store = self.store.clone();
        let reference = reference.clone();
        let now = unix_seconds(SystemTime::now());
        let refused_key = reference.to_string();
        self.blocking(move || store.put(&reference, &pulled, now)).await?;
        // The tag moved on to a build that passed: a later move back to the
        // refused one is a move like any other.
        self.refused.lock().unwrap_or_else(PoisonError::into_inner).remove(&refused_key);
        self.unverified.lock().unwrap_or_else(PoisonError::into_inner).remove(&refused_key);
        Ok((true, manifest_digest))
    }

    /// Keeps the builds of `reference` whose components (hex digests)
    /// `serving` names in the store through later pulls, and lets go of
    /// its other kept builds; see [`Store::keep`].
    pub(crate) async fn keep(
        &self,
        reference: &PluginReference,
        serving: Vec<String>,
    ) -> Result<(), OciError> {
        let store = self.store.clone();
        let reference = reference.clone();
        let layers = serving.iter().map(|hex| format!("sha256:{hex}")).collect::<Vec<_>>();
        self.blocking(move || store.keep(&reference, &layers).map(drop)).await
    }

    /// Names, in each reference's pull status, the manifest the store
    /// holds for it, before any look at the registry has answered.
    pub(crate) fn set_stored_manifests(&self, manifests: &BTreeMap<String, String>) {
        let mut status = self.status.lock().unwrap_or_else(PoisonError::into_inner);
        for (reference, manifest) in manifests {
            if let Some(entry) = status.get_mut(reference)
                && entry.manifest_digest.is_none()
            {
                entry.manifest_digest = Some(manifest.clone());
            }
        }
    }

    /// The pull status of `reference`.
    pub(crate) fn status(&self, reference: &str) -> Option<PullStatus> {
        self.status.lock().unwrap_or_else(PoisonError::into_inner).get(reference).cloned()
    }
}

/// What the store holds for a set of references.
pub(crate) struct StoredBuilds {
    store: Store,
    references: Vec<PluginReference>,
    /// Per reference that has any, the signature policies its builds
    /// must satisfy.
    policies: BTreeMap<String, Vec<KeyPolicy>>,
}

/// True when the signatures kept with `stored` satisfy `policies` (read
/// now: a key removed from a policy no longer admits what it signed).
/// Blocking: reads the key files.
fn signed(
    reference: &PluginReference,
    policies: &[KeyPolicy],
    stored: &proxyfleet_oci::StoredRef,
) -> bool {
    policies.is_empty()
        || proxyfleet_oci::verify_kept(
            reference,
            &stored.manifest_digest,
            policies,
            &stored.signatures,
        )
        .is_ok()
}

impl StoredBuilds {
    /// True when `stored` may serve for `reference` under its policies;
    /// a build that may not is left to the next poll, which checks the
    /// registry's signatures. Blocking.
    fn admits(&self, reference: &PluginReference, stored: &proxyfleet_oci::StoredRef) -> bool {
        let policies = self.policies.get(reference.as_str()).map_or(&[][..], Vec::as_slice);
        signed(reference, policies, stored)
    }

    /// [`StoredBuilds::admits`] at start, saying why a build does not
    /// serve (once a start; the rescans every few seconds say nothing).
    fn admits_at_start(
        &self,
        reference: &PluginReference,
        stored: &proxyfleet_oci::StoredRef,
    ) -> bool {
        let admitted = self.admits(reference, stored);
        if !admitted {
            tracing::warn!(
                plugin = %reference,
                manifest = %stored.manifest_digest,
                "the stored build's signatures do not satisfy the signature policies now \
                 (a policy or key changed since its pull): it does not serve until the \
                 registry's signatures are checked again"
            );
        }
        admitted
    }

    /// The build of every reference whose digest differs from `known` (the
    /// digest each name was last read with), read and checked; a reference
    /// never pulled, or whose build cannot be read, is absent. Blocking.
    pub(crate) fn read_changed(
        &self,
        known: &BTreeMap<String, String>,
    ) -> BTreeMap<String, PluginFile> {
        let mut files = BTreeMap::new();
        for reference in &self.references {
            let name = reference.to_string();
            let known = known.get(&name).map(String::as_str);
            let stored = match self.store.current(reference) {
                Ok(Some(stored)) => stored,
                Ok(None) => continue,
                Err(err) => {
                    tracing::warn!(plugin = %name, "{err}");
                    continue;
                }
            };
            if known == Some(hex_of(&stored.layer_digest)) || !self.admits(reference, &stored) {
                continue;
            }
            match read_stored(&self.store, reference) {
                Ok(Some(file)) => {
                    files.insert(name, file);
                }
                // Not held, or not with its digests (the store warned and
                // removed what it found): the next poll pulls it again.
                Ok(None) => {}
                Err(err) => tracing::warn!(plugin = %name, "{err}"),
            }
        }
        files
    }
}

/// What the store held at start, besides each reference's current build.
#[derive(Default)]
pub(crate) struct AtStart {
    /// Per reference whose entries served another build than its current
    /// one: that build, to load first (the current one is offered after
    /// it, as a build pulled while running would be).
    pub(crate) serving: BTreeMap<String, PluginFile>,
    /// Per reference, the manifest of its current build.
    pub(crate) manifests: BTreeMap<String, String>,
}

impl StoredBuilds {
    /// What [`AtStart`] holds, read and checked. Blocking.
    pub(crate) fn at_start(&self) -> AtStart {
        let mut start = AtStart::default();
        for reference in &self.references {
            let name = reference.to_string();
            let current = match self.store.current(reference) {
                Ok(current) => current.filter(|current| self.admits_at_start(reference, current)),
                Err(err) => {
                    tracing::warn!(plugin = %name, "{err}");
                    continue;
                }
            };
            let kept = match self.store.kept(reference) {
                Ok(kept) => kept,
                Err(err) => {
                    tracing::warn!(plugin = %name, "{err}");
                    Vec::new()
                }
            };
            let kept: Vec<_> =
                kept.into_iter().filter(|kept| self.admits_at_start(reference, kept)).collect();
            if let Some(current) = &current {
                start.manifests.insert(name.clone(), current.manifest_digest.clone());
                if kept.iter().any(|kept| kept.layer_digest == current.layer_digest) {
                    continue;
                }
            }
            // Of several kept builds (entries that served different ones),
            // the one pulled last; entries that refuse it fail as they would
            // have at their last start.
            let Some(serving) = kept.iter().max_by_key(|kept| kept.pulled_at) else { continue };
            match read_build(&self.store, reference, serving) {
                Ok(Some(file)) => {
                    start.serving.insert(name, file);
                }
                Ok(None) => {}
                Err(err) => tracing::warn!(plugin = %name, "{err}"),
            }
        }
        start
    }
}

/// The build the store holds for `reference`, its record and component
/// checked against their digests. Blocking.
fn read_stored(store: &Store, reference: &PluginReference) -> Result<Option<PluginFile>, OciError> {
    let Some(stored) = store.current(reference)? else { return Ok(None) };
    read_build(store, reference, &stored)
}

/// The component `stored` names, checked against its digest, as the file
/// of `reference`; `None` when it is not held with its digest (the store
/// removed what it found), and the next poll pulls it again. Blocking.
fn read_build(
    store: &Store,
    reference: &PluginReference,
    stored: &proxyfleet_oci::StoredRef,
) -> Result<Option<PluginFile>, OciError> {
    let Some(bytes) = store.read(&stored.layer_digest)? else { return Ok(None) };
    let digest = hex_of(&stored.layer_digest).to_owned();
    Ok(Some(PluginFile { path: PathBuf::from(reference.as_str()), bytes, digest }))
}

/// The hex of a `sha256:` digest, as revisions and pins name builds.
fn hex_of(digest: &str) -> &str {
    digest.strip_prefix("sha256:").unwrap_or(digest)
}
