//! Desired Proxies from manifest files: the same `proxyfleet.io/v1alpha1`
//! `Proxy` documents Kubernetes takes, so manifests move between modes.
//!
//! A path is one YAML file or a folder of `*.yaml`/`*.yml` files (not
//! recursive), each holding one or more documents separated by `---`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use proxyfleet_core::proxy::{DEFAULT_PORT, ProxyDesired, is_dns_label};
use serde::Deserialize;

use crate::error::{Error, Result};

/// The API version manifests must declare.
pub const API_VERSION: &str = "proxyfleet.io/v1alpha1";

/// One Proxy from the manifests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredProxy {
    /// Namespace (`default` when not given).
    pub namespace: String,
    /// Name.
    pub name: String,
    /// What it asks for.
    pub desired: ProxyDesired,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawManifest {
    api_version: String,
    kind: String,
    metadata: RawMetadata,
    spec: RawProxySpec,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMetadata {
    name: String,
    namespace: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    /// Accepted so Kubernetes manifests load unchanged; nothing reads them.
    #[serde(default, rename = "annotations")]
    _annotations: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawProxySpec {
    provider: String,
    cores: Option<u32>,
    #[serde(rename = "memoryMiB")]
    memory_mib: Option<u64>,
    #[serde(rename = "diskGiB")]
    disk_gib: Option<u64>,
    #[serde(default)]
    image: String,
    #[serde(default)]
    placement: BTreeMap<String, String>,
    network: Option<RawNetwork>,
    port: Option<u16>,
    user_data_secret_ref: Option<serde_yaml::Value>,
    /// Standalone only: cloud-init user-data from a file, relative to the
    /// manifest's folder.
    user_data_file: Option<PathBuf>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawNetwork {
    vlan_tag: Option<u16>,
}

/// Reads every Proxy at `path`. Any invalid document fails the whole read,
/// naming the file, the document and the field: acting on half a set of
/// manifests could delete the instances of the other half.
pub fn load(path: &Path) -> Result<Vec<DesiredProxy>> {
    let read_err = |source| Error::Read { path: path.to_owned(), source };
    let files = if path.is_dir() {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(path).map_err(read_err)? {
            let file = entry.map_err(read_err)?.path();
            if file.is_file() && file.extension().is_some_and(|e| e == "yaml" || e == "yml") {
                files.push(file);
            }
        }
        files.sort();
        files
    } else {
        vec![path.to_owned()]
    };
    let mut proxies: Vec<DesiredProxy> = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file)
            .map_err(|source| Error::Read { path: file.clone(), source })?;
        for proxy in parse(&file, &text)? {
            if proxies.iter().any(|p| p.namespace == proxy.namespace && p.name == proxy.name) {
                return Err(Error::Manifest {
                    file,
                    message: format!(
                        "Proxy {}/{} is declared twice; names must be unique per namespace",
                        proxy.namespace, proxy.name
                    ),
                });
            }
            proxies.push(proxy);
        }
    }
    Ok(proxies)
}

fn parse(file: &Path, text: &str) -> Result<Vec<DesiredProxy>> {
    let mut proxies = Vec::new();
    for (index, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let fail = |message: String| Error::Manifest {
            file: file.to_owned(),
            message: format!("document {}: {message}", index + 1),
        };
        let value = serde_yaml::Value::deserialize(document).map_err(|e| fail(e.to_string()))?;
        if value.is_null() {
            continue;
        }
        let raw: RawManifest = serde_yaml::from_value(value).map_err(|e| fail(e.to_string()))?;
        proxies.push(validate(file, raw).map_err(fail)?);
    }
    Ok(proxies)
}

fn validate(file: &Path, raw: RawManifest) -> Result<DesiredProxy, String> {
    if raw.api_version != API_VERSION {
        return Err(format!(
            "apiVersion {:?} is not supported; use {API_VERSION}",
            raw.api_version
        ));
    }
    if raw.kind != "Proxy" {
        return Err(format!("kind {:?} is not supported here; use Proxy", raw.kind));
    }
    let name = raw.metadata.name;
    if !is_dns_label(&name) {
        return Err(format!(
            "metadata.name: {name:?} is not a DNS-1123 label (lowercase letters, digits, '-')"
        ));
    }
    let namespace = raw.metadata.namespace.unwrap_or_else(|| "default".to_owned());
    if !is_dns_label(&namespace) {
        return Err(format!("metadata.namespace: {namespace:?} is not a DNS-1123 label"));
    }
    let spec = raw.spec;
    if spec.user_data_secret_ref.is_some() {
        return Err(format!(
            "{name}: spec.userDataSecretRef names a Kubernetes Secret; standalone mode reads \
             user-data from a file: use spec.userDataFile"
        ));
    }
    let user_data = match spec.user_data_file {
        None => Vec::new(),
        Some(relative) => {
            let path = file.parent().unwrap_or(Path::new(".")).join(&relative);
            std::fs::read(&path).map_err(|err| {
                format!("{name}: spec.userDataFile: cannot read {}: {err}", path.display())
            })?
        }
    };
    let mut labels = raw.metadata.labels;
    labels.extend(spec.labels);
    let desired = ProxyDesired {
        provider: spec.provider,
        cores: spec.cores.unwrap_or(1),
        memory_mib: spec.memory_mib.unwrap_or(512),
        disk_gib: spec.disk_gib.unwrap_or(8),
        image: spec.image,
        placement: spec.placement,
        vlan_tag: spec.network.and_then(|n| n.vlan_tag),
        port: spec.port.unwrap_or(DEFAULT_PORT),
        user_data,
        labels,
    };
    desired.validate().map_err(|err| format!("{name}: {err}"))?;
    Ok(DesiredProxy { namespace, name, desired })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_one(yaml: &str) -> Result<Vec<DesiredProxy>> {
        parse(Path::new("proxies.yaml"), yaml)
    }

    #[test]
    fn several_documents_with_defaults() {
        let proxies = parse_one(
            "apiVersion: proxyfleet.io/v1alpha1\nkind: Proxy\nmetadata: { name: a }\nspec: { provider: local }\n---\n\
             apiVersion: proxyfleet.io/v1alpha1\nkind: Proxy\nmetadata: { name: b, namespace: crawl }\n\
             spec: { provider: local, cores: 2, memoryMiB: 1024, network: { vlanTag: 20 }, labels: { tier: a } }\n",
        )
        .unwrap();
        assert_eq!(proxies.len(), 2);
        assert_eq!((proxies[0].namespace.as_str(), proxies[0].desired.port), ("default", 3128));
        assert_eq!(proxies[1].desired.vlan_tag, Some(20));
        assert_eq!(proxies[1].desired.labels["tier"], "a");
    }

    #[test]
    fn errors_name_the_file_document_and_field() {
        let err = parse_one(
            "apiVersion: proxyfleet.io/v1alpha1\nkind: Proxy\nmetadata: { name: a }\nspec: { provider: local }\n---\n\
             apiVersion: proxyfleet.io/v1alpha1\nkind: Proxy\nmetadata: { name: b }\nspec: { provider: local, memoryMiB: 1 }\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("proxies.yaml")
                && err.contains("document 2")
                && err.contains("spec.memoryMiB"),
            "{err}"
        );
        let err = parse_one(
            "apiVersion: proxyfleet.io/v1alpha1\nkind: Proxy\nmetadata: { name: a }\nspec: { provider: local, memory: 1 }\n",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("unknown field `memory`"), "{err}");
    }

    #[test]
    fn a_secret_reference_is_refused_with_the_standalone_alternative() {
        let err = parse_one(
            "apiVersion: proxyfleet.io/v1alpha1\nkind: Proxy\nmetadata: { name: a }\n\
             spec: { provider: local, userDataSecretRef: { name: s } }\n",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("userDataFile"), "{err}");
    }

    #[test]
    fn duplicates_across_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let doc = "apiVersion: proxyfleet.io/v1alpha1\nkind: Proxy\nmetadata: { name: a }\nspec: { provider: local }\n";
        std::fs::write(dir.path().join("1.yaml"), doc).unwrap();
        std::fs::write(dir.path().join("2.yml"), doc).unwrap();
        std::fs::write(dir.path().join("notes.txt"), "ignored").unwrap();
        let err = load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("declared twice"), "{err}");
        std::fs::remove_file(dir.path().join("2.yml")).unwrap();
        assert_eq!(load(dir.path()).unwrap().len(), 1);
    }
}
