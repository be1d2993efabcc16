//! Fetching a plugin build: the manifest, read within the distribution
//! spec's 4 MiB and checked against the layout and its digest; the config,
//! checked against the manifest; the component layer, streamed under the
//! size limit and checked against its digest.
//!
//! Nothing is trusted for being served: every blob is hashed as it
//! arrives, and the declared size is checked before the layer is read, so
//! an oversized artifact costs one manifest, and an oversized manifest no
//! more than its bound.

use std::time::Duration;

use futures::StreamExt as _;
use oci_client::manifest::{OciDescriptor, OciImageManifest};
use sha2::{Digest as _, Sha256};

use crate::access::Registries;
use crate::digest::sha256;
use crate::error::OciError;
use crate::layout::{MANIFEST_MEDIA_TYPE, MAX_CONFIG_BYTES, check_config, check_manifest};
use crate::reference::PluginReference;
use crate::session::Session;
use crate::signature::{self, KeyPolicy, Verified};

/// The default largest component layer accepted: well above the largest
/// plugin known (a componentize-py provider is about 18 MB).
pub const DEFAULT_MAX_BYTES: u64 = 128 << 20;

/// What a pull accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PullLimits {
    /// The largest component layer, in bytes.
    pub max_bytes: u64,
}

impl Default for PullLimits {
    fn default() -> Self {
        Self { max_bytes: DEFAULT_MAX_BYTES }
    }
}

/// A verified build.
#[derive(Clone, PartialEq, Eq)]
pub struct Pulled {
    /// The manifest's digest, `sha256:…`.
    pub manifest_digest: String,
    /// The manifest, as the registry served it: what ties the manifest's
    /// digest to the layer's in the store.
    pub manifest: Vec<u8>,
    /// The component layer's digest, `sha256:…`: the component's own
    /// sha256, as `plugin inspect` and pins name it.
    pub layer_digest: String,
    /// The component.
    pub bytes: Vec<u8>,
    /// What verified its signatures, when a policy applied.
    pub verified: Option<Verified>,
}

impl std::fmt::Debug for Pulled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pulled")
            .field("manifest_digest", &self.manifest_digest)
            .field("manifest", &self.manifest.len())
            .field("layer_digest", &self.layer_digest)
            .field("bytes", &self.bytes.len())
            .field("verified", &self.verified)
            .finish()
    }
}

/// How long resolving a tag may take in all.
const RESOLVE_DEADLINE: Duration = Duration::from_secs(60);
/// A pull's deadline: this, plus a second per MiB the limit allows, so a
/// registry that trickles cannot hold a pull (and a cold start) for hours.
const PULL_DEADLINE_BASE: Duration = Duration::from_secs(60);

/// The manifest digest `reference` names now: its own digest, or what its
/// tag points at in the registry.
pub async fn resolve(
    registries: &Registries,
    reference: &PluginReference,
) -> Result<String, OciError> {
    let tag = match (reference.digest(), reference.tag()) {
        (Some(digest), _) => return Ok(digest.to_owned()),
        (None, Some(tag)) => tag,
        (None, None) => unreachable!("a reference names a tag or a digest"),
    };
    let look = async { Session::open(registries, reference).await?.manifest_digest(tag).await };
    tokio::time::timeout(RESOLVE_DEADLINE, look).await.map_err(|_| OciError::TimedOut {
        reference: reference.to_string(),
        after: RESOLVE_DEADLINE,
    })?
}

/// Fetches and verifies the build `reference` names, at `manifest_digest`
/// when given (what [`resolve`] answered, so that a tag moving in between
/// cannot mix two builds). Its signatures must satisfy the policy of its
/// registry's item, if any, and each of `verify` (the entries' own),
/// checked before the component is read.
pub async fn pull(
    registries: &Registries,
    reference: &PluginReference,
    manifest_digest: Option<&str>,
    limits: PullLimits,
    verify: &[KeyPolicy],
) -> Result<Pulled, OciError> {
    let deadline = PULL_DEADLINE_BASE + Duration::from_secs(limits.max_bytes >> 20);
    let pulling = pull_now(registries, reference, manifest_digest, limits, verify);
    tokio::time::timeout(deadline, pulling)
        .await
        .map_err(|_| OciError::TimedOut { reference: reference.to_string(), after: deadline })?
}

/// The policies a build of `reference` must satisfy: its registry's, then
/// `also`.
pub fn policies(
    registries: &Registries,
    reference: &PluginReference,
    also: &[KeyPolicy],
) -> Vec<KeyPolicy> {
    let access = registries.for_host(reference.registry());
    access.verify().into_iter().chain(also).cloned().collect()
}

/// Checks the signatures of the manifest `manifest_digest` against
/// `policies` (none: nothing is asked of the registry).
pub async fn verify(
    registries: &Registries,
    reference: &PluginReference,
    manifest_digest: &str,
    policies: &[KeyPolicy],
) -> Result<Option<Verified>, OciError> {
    if policies.is_empty() {
        return Ok(None);
    }
    let session = Session::open(registries, reference).await?;
    verify_in(&session, reference, manifest_digest, policies).await.map(Some)
}

/// How many signature layers the signature artifact of `manifest_digest`
/// holds (none when there is none), checked by no key: what `plugin
/// inspect` shows without keys.
pub async fn signatures(
    registries: &Registries,
    reference: &PluginReference,
    manifest_digest: &str,
) -> Result<usize, OciError> {
    let session = Session::open(registries, reference).await?;
    let tag = signature::signature_tag(manifest_digest);
    match signature_manifest(&session, reference, &tag).await? {
        None => Ok(0),
        Some(manifest) => Ok(signature::signature_layers(reference, &manifest)?.len()),
    }
}

/// The signature manifest under `tag`, read within the manifest bound;
/// `None` when there is no such tag. Content refused as a build would be
/// (too large, not a manifest) is a signature refusal: it may be replaced
/// without the build's tag moving.
pub(crate) async fn signature_manifest(
    session: &Session<'_>,
    reference: &PluginReference,
    tag: &str,
) -> Result<Option<OciImageManifest>, OciError> {
    let refuse = |reason: String| OciError::Signature { reference: reference.to_string(), reason };
    let bytes = match session.manifest(tag, SIGNATURE_MANIFESTS).await {
        Err(OciError::NotFound { .. }) => return Ok(None),
        Err(err) if err.refuses_the_build() => return Err(refuse(err.to_string())),
        other => other?,
    };
    serde_json::from_slice(&bytes).map(Some).map_err(|err| {
        refuse(format!("the signature artifact {tag} is not an image manifest: {err}"))
    })
}

async fn verify_in(
    session: &Session<'_>,
    reference: &PluginReference,
    manifest_digest: &str,
    policies: &[KeyPolicy],
) -> Result<Verified, OciError> {
    let keyed = signature::read_policies(reference, policies)?;
    let tag = signature::signature_tag(manifest_digest);
    let refuse = |reason: String| OciError::Signature { reference: reference.to_string(), reason };
    let Some(manifest) = signature_manifest(session, reference, &tag).await? else {
        return Err(OciError::Unsigned {
            reference: reference.to_string(),
            manifest: manifest_digest.to_owned(),
            tag,
            policy: policies.first().map(|policy| policy.field().to_owned()).unwrap_or_default(),
        });
    };
    let layers = signature::signature_layers(reference, &manifest)?;
    let mut read = Vec::with_capacity(layers.len());
    for layer in layers {
        let what = "signature payload";
        let payload =
            read_blob(session, reference, layer.descriptor, what, signature::MAX_PAYLOAD_BYTES)
                .await
                .map_err(
                    |err| if err.refuses_the_build() { refuse(err.to_string()) } else { err },
                )?;
        read.push(layer.with(payload));
    }
    signature::check(reference, manifest_digest, &keyed, &read)
}

/// The manifest types a signature artifact may be: cosign writes OCI
/// manifests; older releases and some registries, Docker's.
const SIGNATURE_MANIFESTS: &[&str] =
    &[MANIFEST_MEDIA_TYPE, "application/vnd.docker.distribution.manifest.v2+json"];

async fn pull_now(
    registries: &Registries,
    reference: &PluginReference,
    manifest_digest: Option<&str>,
    limits: PullLimits,
    verify: &[KeyPolicy],
) -> Result<Pulled, OciError> {
    let session = Session::open(registries, reference).await?;
    let expected_manifest = manifest_digest.or(reference.digest());
    let target = match (expected_manifest, reference.tag()) {
        (Some(digest), _) => digest,
        (None, Some(tag)) => tag,
        (None, None) => unreachable!("a reference names a tag or a digest"),
    };
    let manifest = session.manifest(target, &[MANIFEST_MEDIA_TYPE]).await?;
    let actual = sha256(&manifest);
    if let Some(expected) = expected_manifest
        && actual != expected
    {
        return Err(OciError::Digest {
            reference: reference.to_string(),
            what: "manifest",
            expected: expected.to_owned(),
            actual,
        });
    }
    let layout = |source| OciError::Layout { reference: reference.to_string(), source };
    let checked = check_manifest(&manifest).map_err(layout)?;
    let policies = policies(registries, reference, verify);
    let verified = if policies.is_empty() {
        None
    } else {
        Some(verify_in(&session, reference, &actual, &policies).await?)
    };
    let declared = u64::try_from(checked.layer.size).unwrap_or(u64::MAX);
    if declared > limits.max_bytes {
        return Err(OciError::TooLarge {
            reference: reference.to_string(),
            size: declared,
            limit: limits.max_bytes,
        });
    }
    let config =
        read_blob(&session, reference, &checked.config, "config", MAX_CONFIG_BYTES).await?;
    check_config(&config, &checked.layer.digest).map_err(layout)?;
    let bytes =
        read_blob(&session, reference, &checked.layer, "component layer", limits.max_bytes).await?;
    Ok(Pulled {
        manifest_digest: actual,
        manifest,
        layer_digest: checked.layer.digest,
        bytes,
        verified,
    })
}

/// Streams one blob, refusing it once it outgrows `limit` or its declared
/// size, and checks what arrived against its digest.
pub(crate) async fn read_blob(
    session: &Session<'_>,
    reference: &PluginReference,
    descriptor: &OciDescriptor,
    what: &'static str,
    limit: u64,
) -> Result<Vec<u8>, OciError> {
    let declared = u64::try_from(descriptor.size).unwrap_or(0);
    let too_large = |size| OciError::TooLarge { reference: reference.to_string(), size, limit };
    let response = session.blob(&descriptor.digest).await?;
    if let Some(length) = response.content_length()
        && length > limit.min(declared)
    {
        return Err(if length > limit {
            too_large(length)
        } else {
            mismatch(reference, what, descriptor, format!("{length} bytes served"))
        });
    }
    let mut stream = response.bytes_stream();
    let mut bytes = Vec::with_capacity(usize::try_from(declared.min(limit)).unwrap_or(0));
    let mut hasher = Sha256::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|err| OciError::from_transport(reference, err))?;
        let size = bytes.len() as u64 + chunk.len() as u64;
        if size > limit {
            return Err(too_large(size));
        }
        if size > declared {
            return Err(mismatch(
                reference,
                what,
                descriptor,
                format!("more than {declared} bytes"),
            ));
        }
        hasher.update(&chunk);
        bytes.extend_from_slice(&chunk);
    }
    let actual = format!("sha256:{}", hex::encode(hasher.finalize()));
    if actual != descriptor.digest {
        return Err(mismatch(reference, what, descriptor, actual));
    }
    Ok(bytes)
}

fn mismatch(
    reference: &PluginReference,
    what: &'static str,
    descriptor: &OciDescriptor,
    actual: String,
) -> OciError {
    OciError::Digest {
        reference: reference.to_string(),
        what,
        expected: descriptor.digest.clone(),
        actual,
    }
}
