//! Publishing a component in the Wasm OCI layout, as wasm-pkg-tools does:
//! the config describes the component's world (read from the component by
//! `oci-wasm`), the only layer is the component.

use oci_client::RegistryOperation;
use oci_client::manifest::OciImageManifest;
use oci_wasm::{ToConfig as _, WasmConfig};
use reqwest_oci::header::HeaderValue;

use crate::access::Registries;
use crate::digest::sha256;
use crate::error::OciError;
use crate::layout::MANIFEST_MEDIA_TYPE;
use crate::reference::PluginReference;

/// What a push left in the registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pushed {
    /// The manifest's digest: `REF@DIGEST` pins exactly this build.
    pub manifest_digest: String,
    /// The component's digest, as `plugin inspect` and pins name it.
    pub layer_digest: String,
}

/// Pushes `component` (read from `path`, named in errors) to `reference`.
/// A reference with a digest is refused: a registry names a pushed
/// manifest by its content, so only a tag can be pushed to.
pub async fn push(
    registries: &Registries,
    reference: &PluginReference,
    path: &str,
    component: Vec<u8>,
) -> Result<Pushed, OciError> {
    let component_error = |err: anyhow::Error| OciError::Component {
        path: path.to_owned(),
        reason: format!("{err:#}"),
    };
    let layer_digest = sha256(&component);
    // oci-wasm reports with anyhow; its account is kept as text.
    let (config, layer) =
        WasmConfig::from_raw_component(component, None).map_err(component_error)?;
    let config = config.to_config().map_err(component_error)?;
    let mut manifest = OciImageManifest::build(std::slice::from_ref(&layer), &config, None);
    manifest.media_type = Some(MANIFEST_MEDIA_TYPE.to_owned());
    // Serialized here, so the digest printed is the one of the bytes pushed,
    // whatever else lands on the tag meanwhile.
    let manifest = serde_json::to_vec(&manifest).map_err(|err| OciError::Component {
        path: path.to_owned(),
        reason: format!("the manifest cannot be written: {err}"),
    })?;
    let access = registries.for_host(reference.registry());
    let client = access.client()?;
    let auth = access.auth()?;
    let target = reference.to_client();
    let registry_error = |err| OciError::from_client(reference, err);
    client.auth(&target, &auth, RegistryOperation::Push).await.map_err(registry_error)?;
    client
        .push_blob(&target, layer.data.clone(), &layer.sha256_digest())
        .await
        .map_err(registry_error)?;
    client
        .push_blob(&target, config.data.clone(), &config.sha256_digest())
        .await
        .map_err(registry_error)?;
    client
        .push_manifest_raw(&target, manifest.clone(), HeaderValue::from_static(MANIFEST_MEDIA_TYPE))
        .await
        .map_err(registry_error)?;
    Ok(Pushed { manifest_digest: sha256(&manifest), layer_digest })
}
