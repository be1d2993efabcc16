//! The Wasm OCI artifact layout (CNCF TAG Runtime's wasm working group, as
//! wasm-pkg-tools, Spin and wasmCloud publish): an OCI image manifest whose
//! config has media type `application/vnd.wasm.config.v0+json` and whose
//! only layer is the component, `application/wasm`.
//!
//! Checks are on what the manifest declares, before any layer is read. The
//! config's contents are checked only where they can contradict the
//! manifest (`layerDigests`, `architecture`): other publishers write an
//! empty object there, and the component itself is what admission reads.

use oci_client::manifest::{OciDescriptor, OciImageManifest};
use thiserror::Error;

/// The manifest media type.
pub const MANIFEST_MEDIA_TYPE: &str = oci_wasm::WASM_MANIFEST_MEDIA_TYPE;
/// The config media type.
pub const CONFIG_MEDIA_TYPE: &str = oci_wasm::WASM_MANIFEST_CONFIG_MEDIA_TYPE;
/// The component layer's media type.
pub const LAYER_MEDIA_TYPE: &str = oci_wasm::WASM_LAYER_MEDIA_TYPE;
/// The largest config blob read; the layout's configs are a few KiB.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;
/// The largest manifest read, the bound the distribution spec sets for
/// registries (4 MiB); a Wasm component's manifest is under 1 KiB.
pub const MAX_MANIFEST_BYTES: u64 = 4 << 20;

/// An artifact that is not a component in the Wasm OCI layout.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum LayoutError {
    /// Not parseable as an image manifest.
    #[error("the manifest is not an OCI image manifest: {0}")]
    Manifest(String),
    /// Another kind of manifest (an index, a Docker manifest, …).
    #[error(
        "the manifest has media type {found:?}; a Wasm component is published as an image \
         manifest ({MANIFEST_MEDIA_TYPE})"
    )]
    ManifestMediaType {
        /// What it declared.
        found: String,
    },
    /// The config is not the wasm config.
    #[error(
        "the config has media type {found:?}, not {CONFIG_MEDIA_TYPE}: this is not a Wasm \
         component artifact (a container image?)"
    )]
    ConfigMediaType {
        /// What it declared.
        found: String,
    },
    /// Not exactly one layer.
    #[error(
        "the manifest has {count} layers; a Wasm component artifact has exactly one, \
         of type {LAYER_MEDIA_TYPE}"
    )]
    LayerCount {
        /// How many it has.
        count: usize,
    },
    /// The layer is something else.
    #[error("the layer has media type {found:?}, not {LAYER_MEDIA_TYPE}")]
    LayerMediaType {
        /// What it declared.
        found: String,
    },
    /// A descriptor's digest is not sha256.
    #[error("the {what}'s digest {digest:?} is not a sha256 digest")]
    DigestAlgorithm {
        /// `config` or `layer`.
        what: &'static str,
        /// As declared.
        digest: String,
    },
    /// A descriptor names other places to fetch its blob from, which the
    /// registry client would follow to any host, over any scheme.
    #[error(
        "the {what} lists urls to fetch it from elsewhere; a plugin is pulled only from the \
         registry its reference names"
    )]
    ForeignUrls {
        /// `config` or `layer`.
        what: &'static str,
    },
    /// The config is larger than any config of this layout.
    #[error(
        "the config declares {size} bytes; a Wasm config is read only up to {MAX_CONFIG_BYTES}"
    )]
    ConfigSize {
        /// As declared.
        size: i64,
    },
    /// The config is not a JSON object.
    #[error("the config is not a JSON object: {0}")]
    Config(String),
    /// The config's `layerDigests` contradicts the manifest.
    #[error("the config's layerDigests {found:?} do not name the manifest's layer {layer}")]
    LayerDigests {
        /// As the config lists them.
        found: Vec<String>,
        /// The manifest's layer.
        layer: String,
    },
    /// The config's `architecture` is not `wasm`.
    #[error("the config's architecture is {found:?}, not \"wasm\"")]
    Architecture {
        /// As the config says.
        found: String,
    },
}

/// A manifest that passed [`check_manifest`]: its config and its one layer.
#[derive(Debug, Clone)]
pub struct CheckedManifest {
    /// The config descriptor.
    pub config: OciDescriptor,
    /// The component layer's descriptor.
    pub layer: OciDescriptor,
}

/// Checks a manifest's declarations against the layout.
pub fn check_manifest(bytes: &[u8]) -> Result<CheckedManifest, LayoutError> {
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|err| LayoutError::Manifest(err.to_string()))?;
    // The field is optional in the image spec; when present it decides.
    if let Some(found) = value.get("mediaType").and_then(serde_json::Value::as_str)
        && found != MANIFEST_MEDIA_TYPE
    {
        return Err(LayoutError::ManifestMediaType { found: found.to_owned() });
    }
    if value.get("manifests").is_some() {
        return Err(LayoutError::ManifestMediaType {
            found: "an index (it lists manifests)".to_owned(),
        });
    }
    let manifest: OciImageManifest =
        serde_json::from_value(value).map_err(|err| LayoutError::Manifest(err.to_string()))?;
    if manifest.config.media_type != CONFIG_MEDIA_TYPE {
        return Err(LayoutError::ConfigMediaType { found: manifest.config.media_type });
    }
    let [layer] = <[OciDescriptor; 1]>::try_from(manifest.layers)
        .map_err(|layers| LayoutError::LayerCount { count: layers.len() })?;
    if layer.media_type != LAYER_MEDIA_TYPE {
        return Err(LayoutError::LayerMediaType { found: layer.media_type });
    }
    for (what, descriptor) in [("config", &manifest.config), ("layer", &layer)] {
        if !crate::digest::is_sha256(&descriptor.digest) {
            return Err(LayoutError::DigestAlgorithm { what, digest: descriptor.digest.clone() });
        }
        if descriptor.urls.as_ref().is_some_and(|urls| !urls.is_empty()) {
            return Err(LayoutError::ForeignUrls { what });
        }
    }
    if manifest.config.size < 0 || manifest.config.size.unsigned_abs() > MAX_CONFIG_BYTES {
        return Err(LayoutError::ConfigSize { size: manifest.config.size });
    }
    Ok(CheckedManifest { config: manifest.config, layer })
}

/// Checks a config blob against the manifest's layer.
pub fn check_config(bytes: &[u8], layer_digest: &str) -> Result<(), LayoutError> {
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|err| LayoutError::Config(err.to_string()))?;
    let object = value.as_object().ok_or_else(|| LayoutError::Config("not an object".into()))?;
    if let Some(digests) = object.get("layerDigests") {
        let found: Vec<String> = serde_json::from_value(digests.clone())
            .map_err(|err| LayoutError::Config(format!("layerDigests: {err}")))?;
        if found != [layer_digest] {
            return Err(LayoutError::LayerDigests { found, layer: layer_digest.to_owned() });
        }
    }
    if let Some(architecture) = object.get("architecture") {
        let found = architecture.as_str().unwrap_or_default();
        if found != oci_wasm::WASM_ARCHITECTURE {
            return Err(LayoutError::Architecture { found: architecture.to_string() });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAYER: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
    const CONFIG: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

    fn manifest(config_type: &str, layers: &[(&str, &str)]) -> Vec<u8> {
        let layers: Vec<_> = layers
            .iter()
            .map(|(media_type, digest)| {
                serde_json::json!({ "mediaType": media_type, "digest": digest, "size": 10 })
            })
            .collect();
        serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": MANIFEST_MEDIA_TYPE,
            "config": { "mediaType": config_type, "digest": CONFIG, "size": 2 },
            "layers": layers,
        }))
        .unwrap()
    }

    #[test]
    fn a_wasm_manifest_passes_and_names_its_layer() {
        let checked =
            check_manifest(&manifest(CONFIG_MEDIA_TYPE, &[(LAYER_MEDIA_TYPE, LAYER)])).unwrap();
        assert_eq!(checked.layer.digest, LAYER);
        assert_eq!(checked.config.digest, CONFIG);
    }

    #[test]
    fn other_artifacts_are_refused_naming_what_they_are() {
        let image = manifest(
            "application/vnd.oci.image.config.v1+json",
            &[("application/vnd.oci.image.layer.v1.tar+gzip", LAYER)],
        );
        let err = check_manifest(&image).unwrap_err();
        assert!(err.to_string().contains("application/vnd.oci.image.config.v1+json"), "{err}");
        let two =
            manifest(CONFIG_MEDIA_TYPE, &[(LAYER_MEDIA_TYPE, LAYER), (LAYER_MEDIA_TYPE, LAYER)]);
        assert_eq!(check_manifest(&two).unwrap_err(), LayoutError::LayerCount { count: 2 });
        let tar = manifest(CONFIG_MEDIA_TYPE, &[("application/vnd.oci.image.layer.v1.tar", LAYER)]);
        assert!(matches!(check_manifest(&tar).unwrap_err(), LayoutError::LayerMediaType { .. }));
        let index = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[]}"#;
        let err = check_manifest(index).unwrap_err();
        assert!(err.to_string().contains("image.index"), "{err}");
        let mut elsewhere: serde_json::Value =
            serde_json::from_slice(&manifest(CONFIG_MEDIA_TYPE, &[(LAYER_MEDIA_TYPE, LAYER)]))
                .unwrap();
        elsewhere["layers"][0]["urls"] = serde_json::json!(["http://10.0.0.1/blob"]);
        assert_eq!(
            check_manifest(&serde_json::to_vec(&elsewhere).unwrap()).unwrap_err(),
            LayoutError::ForeignUrls { what: "layer" }
        );
        let sha512 = manifest(CONFIG_MEDIA_TYPE, &[(LAYER_MEDIA_TYPE, "sha512:00")]);
        assert!(matches!(
            check_manifest(&sha512).unwrap_err(),
            LayoutError::DigestAlgorithm { what: "layer", .. }
        ));
    }

    #[test]
    fn configs_may_be_empty_but_not_contradict_the_manifest() {
        check_config(b"{}", LAYER).unwrap();
        let full = serde_json::json!({
            "created": "2026-01-01T00:00:00Z", "architecture": "wasm", "os": "wasip2",
            "layerDigests": [LAYER], "component": { "exports": [], "imports": [] },
        });
        check_config(&serde_json::to_vec(&full).unwrap(), LAYER).unwrap();
        let other = serde_json::json!({ "layerDigests": [CONFIG] });
        assert!(matches!(
            check_config(&serde_json::to_vec(&other).unwrap(), LAYER),
            Err(LayoutError::LayerDigests { .. })
        ));
        let amd64 = serde_json::json!({ "architecture": "amd64" });
        assert!(matches!(
            check_config(&serde_json::to_vec(&amd64).unwrap(), LAYER),
            Err(LayoutError::Architecture { .. })
        ));
        assert!(matches!(check_config(b"[]", LAYER), Err(LayoutError::Config(_))));
    }
}
