//! OCI image archives: an image layout (`oci-layout`, `index.json`,
//! `blobs/sha256/…`) packed in one tar, as `ctr images import` and
//! `skopeo copy oci-archive:` read it. Layers are gzip-compressed with a
//! zero timestamp and the config carries no creation time, so the same
//! trees give the same digests.

use std::io::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

use super::tree::Tree;

pub const MANIFEST_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
pub const INDEX_TYPE: &str = "application/vnd.oci.image.index.v1+json";
pub const CONFIG_TYPE: &str = "application/vnd.oci.image.config.v1+json";
pub const LAYER_TYPE: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// What an image is made of.
#[derive(Debug)]
pub struct Image {
    /// The full reference it is imported as, e.g.
    /// `ghcr.io/proxyfleet/proxyfleet:0.1.0`.
    pub name: String,
    /// The config's `config` object: `User`, `Entrypoint`, `Env`, ….
    pub runtime: Value,
    pub layers: Vec<Tree>,
}

/// What was written.
#[derive(Debug, Clone)]
pub struct Written {
    /// The manifest's digest: the image's digest in a registry.
    pub digest: String,
    /// Compressed size of the layers, what a node pulls.
    pub layers_size: u64,
}

pub fn sha256(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(data)))
}

fn gzip(data: &[u8]) -> Result<Vec<u8>> {
    let mut encoder = flate2::GzBuilder::new()
        .mtime(0)
        .operating_system(255)
        .write(Vec::new(), flate2::Compression::new(9));
    encoder.write_all(data)?;
    Ok(encoder.finish()?)
}

fn descriptor(media_type: &str, data: &[u8]) -> Value {
    json!({ "mediaType": media_type, "digest": sha256(data), "size": data.len() })
}

/// The archive's bytes and what it holds.
pub fn archive(image: &Image) -> Result<(Vec<u8>, Written)> {
    let mut blobs: Vec<Vec<u8>> = Vec::new();
    let mut layer_descriptors = Vec::new();
    let mut diff_ids = Vec::new();
    let mut layers_size = 0;
    for tree in &image.layers {
        let tar = tree.tar()?;
        diff_ids.push(sha256(&tar));
        let compressed = gzip(&tar)?;
        layers_size += compressed.len() as u64;
        layer_descriptors.push(descriptor(LAYER_TYPE, &compressed));
        blobs.push(compressed);
    }
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64",
        "os": "linux",
        "config": image.runtime,
        "rootfs": { "type": "layers", "diff_ids": diff_ids },
        "history": image.layers.iter().map(|_| json!({ "created_by": "cargo xtask image" })).collect::<Vec<_>>(),
    }))?;
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": descriptor(CONFIG_TYPE, &config),
        "layers": layer_descriptors,
    }))?;
    let digest = sha256(&manifest);
    let tag = image.name.rsplit_once(':').map_or("latest", |(_, tag)| tag);
    let mut manifest_descriptor = descriptor(MANIFEST_TYPE, &manifest);
    manifest_descriptor["platform"] = json!({ "architecture": "amd64", "os": "linux" });
    manifest_descriptor["annotations"] = json!({
        "io.containerd.image.name": image.name,
        "org.opencontainers.image.ref.name": tag,
    });
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": INDEX_TYPE,
        "manifests": [manifest_descriptor],
    }))?;
    blobs.push(config);
    blobs.push(manifest);

    let mut layout = Tree::new();
    layout.file("/oci-layout", 0o644, br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec())?;
    layout.file("/index.json", 0o644, index)?;
    for blob in blobs {
        let name = sha256(&blob);
        let hex = name.trim_start_matches("sha256:");
        layout.file(&format!("/blobs/sha256/{hex}"), 0o644, blob)?;
    }
    Ok((layout.tar()?, Written { digest, layers_size }))
}

/// Writes the archive to `out`.
pub fn write(image: &Image, out: &Path) -> Result<Written> {
    let (bytes, written) = archive(image)?;
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(out, bytes).with_context(|| format!("writing {}", out.display()))?;
    Ok(written)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::io::Read as _;

    use super::*;

    fn image() -> Image {
        let mut tree = Tree::new();
        tree.file("/usr/bin/hello", 0o755, b"#!/bin/sh\necho hello\n".to_vec()).expect("file");
        Image {
            name: "example.invalid/hello:1.0".into(),
            runtime: json!({ "Entrypoint": ["/usr/bin/hello"], "User": "65532:65532" }),
            layers: vec![tree],
        }
    }

    fn files(archive: &[u8]) -> BTreeMap<String, Vec<u8>> {
        let mut files = BTreeMap::new();
        for entry in tar::Archive::new(archive).entries().expect("entries") {
            let mut entry = entry.expect("entry");
            if entry.header().entry_type().is_file() {
                let path = entry.path().expect("path").display().to_string();
                let mut data = Vec::new();
                entry.read_to_end(&mut data).expect("read");
                files.insert(path, data);
            }
        }
        files
    }

    #[test]
    fn the_same_image_gives_the_same_digest() {
        let (first, a) = archive(&image()).expect("archive");
        let (second, b) = archive(&image()).expect("archive");
        assert_eq!(a.digest, b.digest);
        assert_eq!(first, second);
    }

    /// The layout a registry client expects: every blob named by its own
    /// digest, the index naming the manifest, the manifest naming the
    /// config and the layer, the config naming the layer's uncompressed
    /// digest.
    #[test]
    fn every_digest_names_its_blob() {
        let (bytes, written) = archive(&image()).expect("archive");
        let files = files(&bytes);
        for (path, data) in &files {
            if let Some(hex) = path.strip_prefix("blobs/sha256/") {
                assert_eq!(sha256(data), format!("sha256:{hex}"), "{path}");
            }
        }
        let blob = |digest: &str| {
            files[&format!("blobs/sha256/{}", digest.trim_start_matches("sha256:"))].clone()
        };
        let index: Value = serde_json::from_slice(&files["index.json"]).expect("index");
        assert_eq!(index["manifests"][0]["digest"], written.digest.as_str());
        assert_eq!(
            index["manifests"][0]["annotations"]["io.containerd.image.name"],
            "example.invalid/hello:1.0"
        );
        let manifest: Value = serde_json::from_slice(&blob(&written.digest)).expect("manifest");
        assert_eq!(manifest["mediaType"], MANIFEST_TYPE);
        let config: Value =
            serde_json::from_slice(&blob(manifest["config"]["digest"].as_str().expect("digest")))
                .expect("config");
        let layer = blob(manifest["layers"][0]["digest"].as_str().expect("digest"));
        let mut tar = Vec::new();
        flate2::read::GzDecoder::new(layer.as_slice()).read_to_end(&mut tar).expect("gunzip");
        assert_eq!(config["rootfs"]["diff_ids"][0], sha256(&tar).as_str());
        assert_eq!(config["config"]["User"], "65532:65532");
        assert_eq!(files["oci-layout"], br#"{"imageLayoutVersion":"1.0.0"}"#);
    }
}
