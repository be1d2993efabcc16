//! Signing a published build as `cosign sign --key` does: the simple
//! signing payload naming the build's manifest digest, signed with the
//! key, added as a layer to the signature manifest under the tag
//! `sha256-<hex>.sig` (made when there is none; the signatures already
//! there are kept, so a second key adds its signature beside the first).

use std::collections::BTreeMap;

use oci_client::RegistryOperation;
use oci_client::manifest::{OciDescriptor, OciImageManifest};
use reqwest_oci::header::HeaderValue;

use crate::access::Registries;
use crate::cosign_key::PrivateKey;
use crate::digest::sha256;
use crate::error::OciError;
use crate::layout::MANIFEST_MEDIA_TYPE;
use crate::pull::signature_manifest;
use crate::reference::PluginReference;
use crate::session::Session;
use crate::signature::{
    Payload, SIGNATURE_ANNOTATION, SIMPLE_SIGNING_MEDIA_TYPE, signature_layers, signature_tag,
};

/// What a signing left in the registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signed {
    /// The manifest signed.
    pub manifest_digest: String,
    /// The tag the signature is under.
    pub tag: String,
    /// The fingerprint of the key that signed.
    pub key: String,
    /// How many signatures the artifact holds now.
    pub signatures: usize,
    /// False when this key's signature of this manifest was there already
    /// (nothing was pushed).
    pub added: bool,
}

/// The media type of the signature manifest's config.
const CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.image.config.v1+json";

/// Signs the build `reference` names (a tag is resolved to its manifest
/// first) with `key`.
pub async fn sign(
    registries: &Registries,
    reference: &PluginReference,
    key: &PrivateKey,
) -> Result<Signed, OciError> {
    let manifest_digest = crate::pull::resolve(registries, reference).await?;
    let tag = signature_tag(&manifest_digest);
    let payload = Payload::new(reference, &manifest_digest).to_bytes();
    let signature =
        base64::Engine::encode(&base64::engine::general_purpose::STANDARD, key.sign(&payload));
    let fingerprint = key.public().fingerprint();
    let session = Session::open(registries, reference).await?;
    let existing = signature_manifest(&session, reference, &tag).await?.unwrap_or_default();
    // Checked as a verifier would check it, so signing never extends an
    // artifact that no verifier would accept. The payload names only the
    // manifest, so the same key signs it the same way every time: a second
    // run adds nothing.
    let public = key.public();
    let already = signature_layers(reference, &existing)?.iter().any(|layer| {
        layer.descriptor.digest == sha256(&payload) && layer.verifies(&payload, &public)
    });
    let mut layers = existing.layers;
    if already {
        return Ok(Signed {
            manifest_digest,
            tag,
            key: fingerprint,
            signatures: layers.len(),
            added: false,
        });
    }
    layers.push(OciDescriptor {
        media_type: SIMPLE_SIGNING_MEDIA_TYPE.to_owned(),
        digest: sha256(&payload),
        size: i64::try_from(payload.len()).unwrap_or(i64::MAX),
        annotations: Some(BTreeMap::from([(SIGNATURE_ANNOTATION.to_owned(), signature)])),
        ..OciDescriptor::default()
    });
    let config = config(&layers);
    let manifest = OciImageManifest {
        media_type: Some(MANIFEST_MEDIA_TYPE.to_owned()),
        config: OciDescriptor {
            media_type: CONFIG_MEDIA_TYPE.to_owned(),
            digest: sha256(&config),
            size: i64::try_from(config.len()).unwrap_or(i64::MAX),
            ..OciDescriptor::default()
        },
        layers,
        ..OciImageManifest::default()
    };
    let manifest_bytes = serde_json::to_vec(&manifest).map_err(|err| OciError::Signature {
        reference: reference.to_string(),
        reason: format!("the signature manifest cannot be written: {err}"),
    })?;
    let access = registries.for_host(reference.registry());
    let client = access.client()?;
    let auth = access.auth()?;
    let target = oci_client::Reference::with_tag(
        reference.to_client().registry().to_owned(),
        reference.repository().to_owned(),
        tag.clone(),
    );
    let registry_error = |err| OciError::from_client(reference, err);
    client.auth(&target, &auth, RegistryOperation::Push).await.map_err(registry_error)?;
    client.push_blob(&target, payload.clone(), &sha256(&payload)).await.map_err(registry_error)?;
    client.push_blob(&target, config.clone(), &sha256(&config)).await.map_err(registry_error)?;
    client
        .push_manifest_raw(&target, manifest_bytes, HeaderValue::from_static(MANIFEST_MEDIA_TYPE))
        .await
        .map_err(registry_error)?;
    Ok(Signed {
        manifest_digest,
        tag,
        key: fingerprint,
        signatures: manifest.layers.len(),
        added: true,
    })
}

/// The config cosign writes beside its signature layers: an empty image
/// whose layers are the payloads.
fn config(layers: &[OciDescriptor]) -> Vec<u8> {
    let diff_ids: Vec<&str> = layers.iter().map(|layer| layer.digest.as_str()).collect();
    serde_json::to_vec(&serde_json::json!({
        "architecture": "",
        "created": "0001-01-01T00:00:00Z",
        "history": [{ "created": "0001-01-01T00:00:00Z" }],
        "os": "",
        "rootfs": { "type": "layers", "diff_ids": diff_ids },
        "config": {},
    }))
    .unwrap_or_default()
}
