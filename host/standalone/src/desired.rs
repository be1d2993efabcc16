//! Desired Proxies and ProxyPools from manifest files: the same
//! `proxyfleet.io/v1alpha1` documents Kubernetes takes, so manifests move
//! between modes.
//!
//! A path is one YAML file or a folder of `*.yaml`/`*.yml` files (not
//! recursive), each holding one or more documents separated by `---`.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use proxyfleet_core::credential::ProxyCredential;
use proxyfleet_core::pool::{self, PoolSpec};
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

/// One ProxyPool from the manifests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredPool {
    /// Namespace (`default` when not given).
    pub namespace: String,
    /// Name; members are named `<name>-<suffix>`.
    pub name: String,
    /// Replicas, spread, recycling.
    pub spec: PoolSpec,
    /// What each member asks for; its provider is set per member.
    pub template: ProxyDesired,
}

/// Everything the manifests declare.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Desired {
    /// Proxies declared one by one.
    pub proxies: Vec<DesiredProxy>,
    /// Pools.
    pub pools: Vec<DesiredPool>,
    /// The files the manifests name (user-data, credentials), read with
    /// them: a change of one is a change of the manifests ([`Stamp`]).
    pub referenced: Vec<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawManifest {
    api_version: String,
    kind: String,
    metadata: RawMetadata,
    spec: yaml_serde::Value,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawPoolSpec {
    replicas: u32,
    template: RawTemplate,
    #[serde(default)]
    providers: Vec<RawWeightedProvider>,
    max_age: Option<String>,
    #[serde(default)]
    min_available: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTemplate {
    metadata: Option<RawTemplateMetadata>,
    spec: RawProxySpec,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTemplateMetadata {
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWeightedProvider {
    name: String,
    #[serde(default = "one")]
    weight: u32,
}

fn one() -> u32 {
    1
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
    provider: Option<String>,
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
    user_data_secret_ref: Option<yaml_serde::Value>,
    /// Standalone only: cloud-init user-data from a file, relative to the
    /// manifest's folder.
    user_data_file: Option<PathBuf>,
    /// Standalone only: the proxy's credential, `username:password` in a
    /// file relative to the manifest's folder.
    proxy_auth_file: Option<PathBuf>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawNetwork {
    vlan_tag: Option<u16>,
}

/// Reads every Proxy and ProxyPool at `path`. Any invalid document fails
/// the whole read, naming the file, the document and the field: acting on
/// half a set of manifests could delete the instances of the other half.
pub fn load(path: &Path) -> Result<Desired> {
    let files = files(path)?;
    let mut desired = Desired::default();
    // Every name declared so far: a second declaration is refused.
    let mut seen: HashSet<(&'static str, String, String)> = HashSet::new();
    for file in files {
        let text = std::fs::read_to_string(&file)
            .map_err(|source| Error::Read { path: file.clone(), source })?;
        let parsed = parse(&file, &text)?;
        let new = parsed
            .proxies
            .iter()
            .map(|p| ("Proxy", &p.namespace, &p.name))
            .chain(parsed.pools.iter().map(|p| ("ProxyPool", &p.namespace, &p.name)));
        for (kind, namespace, name) in new {
            if !seen.insert((kind, namespace.clone(), name.clone())) {
                return Err(Error::Manifest {
                    file,
                    message: format!(
                        "{kind} {namespace}/{name} is declared twice; names must be unique per namespace"
                    ),
                });
            }
        }
        desired.proxies.extend(parsed.proxies);
        desired.pools.extend(parsed.pools);
        desired.referenced.extend(parsed.referenced);
    }
    Ok(desired)
}

/// The manifest files at `path`, in the order they are read.
fn files(path: &Path) -> Result<Vec<PathBuf>> {
    let read_err = |source| Error::Read { path: path.to_owned(), source };
    if !path.is_dir() {
        return Ok(vec![path.to_owned()]);
    }
    let mut files = Vec::new();
    for entry in std::fs::read_dir(path).map_err(read_err)? {
        let file = entry.map_err(read_err)?.path();
        if file.is_file() && file.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            files.push(file);
        }
    }
    files.sort();
    Ok(files)
}

/// What the files at a manifest path look like from outside: each file's
/// name, inode, size and change times. Equal settled stamps mean the
/// manifests were not touched, so reading and parsing them again can be
/// skipped: a file replaced by a rename (as a ConfigMap volume updates)
/// has a new inode, and a write in place a new change time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp {
    files: Vec<(PathBuf, (u64, u64), [i64; 4])>,
    /// A file changed within [`Stamp::RECENT`] of the stamp: file times
    /// come from a coarse clock, so a second write in the same tick could
    /// leave them as they were. Such a stamp proves nothing.
    recent: bool,
}

impl Stamp {
    /// How old every file's change time must be for a stamp to count.
    pub const RECENT: Duration = Duration::from_secs(1);

    /// Stamps the manifests at `path` and the files they name
    /// (`referenced`, from the last [`load`]), with one `stat` a file. A
    /// named file that is missing is stamped as missing.
    pub fn of(path: &Path, referenced: &[PathBuf]) -> Result<Self> {
        let settled_before = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .saturating_sub(Self::RECENT)
            .as_secs_f64();
        let mut stamp = Self { files: Vec::new(), recent: false };
        for file in files(path)? {
            let meta = std::fs::metadata(&file)
                .map_err(|source| Error::Read { path: file.clone(), source })?;
            stamp.add(file, Some(&meta), settled_before);
        }
        for file in referenced {
            stamp.add(file.clone(), std::fs::metadata(file).ok().as_ref(), settled_before);
        }
        Ok(stamp)
    }

    /// Adds `file` as `meta` says it is (`None`: missing).
    fn add(&mut self, file: PathBuf, meta: Option<&std::fs::Metadata>, settled_before: f64) {
        use std::os::unix::fs::MetadataExt as _;
        let Some(meta) = meta else {
            self.files.push((file, (0, 0), [0; 4]));
            return;
        };
        let times = [meta.mtime(), meta.mtime_nsec(), meta.ctime(), meta.ctime_nsec()];
        // The change time moves with every write and every rename.
        let changed = meta.ctime() as f64 + meta.ctime_nsec() as f64 / 1e9;
        self.recent |= changed >= settled_before;
        self.files.push((file, (meta.ino(), meta.size()), times));
    }

    /// Whether the manifests are, with certainty, as they were at `earlier`.
    pub fn unchanged_since(&self, earlier: &Self) -> bool {
        !self.recent && !earlier.recent && self.files == earlier.files
    }
}

/// The manifests in `text`, as if read from `file` (which names them in
/// errors and anchors the files they name).
pub fn parse(file: &Path, text: &str) -> Result<Desired> {
    let mut desired = Desired::default();
    for (index, document) in yaml_serde::Deserializer::from_str(text).enumerate() {
        let fail = |message: String| Error::Manifest {
            file: file.to_owned(),
            message: format!("document {}: {message}", index + 1),
        };
        let value = yaml_serde::Value::deserialize(document).map_err(|e| fail(e.to_string()))?;
        if value.is_null() {
            continue;
        }
        let raw: RawManifest = yaml_serde::from_value(value).map_err(|e| fail(e.to_string()))?;
        match raw.kind.as_str() {
            "Proxy" => desired
                .proxies
                .push(validate_proxy(file, raw, &mut desired.referenced).map_err(fail)?),
            "ProxyPool" => {
                desired.pools.push(validate_pool(file, raw, &mut desired.referenced).map_err(fail)?)
            }
            other => {
                return Err(fail(format!(
                    "kind {other:?} is not supported; use Proxy or ProxyPool"
                )));
            }
        }
    }
    Ok(desired)
}

/// Namespace and name of a document, checked.
fn identity(raw: &RawManifest) -> Result<(String, String), String> {
    if raw.api_version != API_VERSION {
        return Err(format!(
            "apiVersion {:?} is not supported; use {API_VERSION}",
            raw.api_version
        ));
    }
    let name = raw.metadata.name.clone();
    if !is_dns_label(&name) {
        return Err(format!(
            "metadata.name: {name:?} is not a DNS-1123 label (lowercase letters, digits, '-')"
        ));
    }
    let namespace = raw.metadata.namespace.clone().unwrap_or_else(|| "default".to_owned());
    if !is_dns_label(&namespace) {
        return Err(format!("metadata.namespace: {namespace:?} is not a DNS-1123 label"));
    }
    Ok((namespace, name))
}

fn validate_proxy(
    file: &Path,
    raw: RawManifest,
    referenced: &mut Vec<PathBuf>,
) -> Result<DesiredProxy, String> {
    let (namespace, name) = identity(&raw)?;
    let spec: RawProxySpec =
        yaml_serde::from_value(raw.spec).map_err(|e| format!("{name}: spec: {e}"))?;
    let Some(provider) = spec.provider.clone() else {
        return Err(format!("{name}: spec.provider is required: name a provider entry"));
    };
    let labels = raw.metadata.labels;
    let desired = proxy_desired(file, &name, "spec", spec, labels, provider, referenced)?;
    Ok(DesiredProxy { namespace, name, desired })
}

fn validate_pool(
    file: &Path,
    raw: RawManifest,
    referenced: &mut Vec<PathBuf>,
) -> Result<DesiredPool, String> {
    let (namespace, name) = identity(&raw)?;
    let spec: RawPoolSpec =
        yaml_serde::from_value(raw.spec).map_err(|e| format!("{name}: spec: {e}"))?;
    if spec.replicas > 10_000 {
        return Err(format!(
            "{name}: spec.replicas: {} is out of range; use 0 to 10000",
            spec.replicas
        ));
    }
    let entries: Vec<(String, u32)> = if spec.providers.is_empty() {
        match &spec.template.spec.provider {
            Some(provider) => vec![(provider.clone(), 1)],
            None => {
                return Err(format!(
                    "{name}: name a provider in spec.template.spec.provider or list spec.providers"
                ));
            }
        }
    } else {
        if spec.template.spec.provider.is_some() {
            return Err(format!(
                "{name}: spec.template.spec.provider and spec.providers both name providers; keep one"
            ));
        }
        for (i, entry) in spec.providers.iter().enumerate() {
            if entry.weight == 0 || !is_dns_label(&entry.name) {
                return Err(format!(
                    "{name}: spec.providers[{i}]: needs a provider entry name and a weight of at least 1"
                ));
            }
        }
        spec.providers.iter().map(|p| (p.name.clone(), p.weight)).collect()
    };
    let max_age = spec
        .max_age
        .map(|text| {
            pool::parse_max_age(&text).ok_or_else(|| {
                format!("{name}: spec.maxAge: {text:?} is not a duration such as 24h or 90m")
            })
        })
        .transpose()?;
    if spec.min_available > spec.replicas {
        return Err(format!(
            "{name}: spec.minAvailable: {} is more than spec.replicas ({})",
            spec.min_available, spec.replicas
        ));
    }
    let labels = spec.template.metadata.map(|m| m.labels).unwrap_or_default();
    let first = entries[0].0.clone();
    let at = "spec.template.spec";
    let template = proxy_desired(file, &name, at, spec.template.spec, labels, first, referenced)?;
    Ok(DesiredPool {
        namespace,
        name,
        spec: PoolSpec {
            replicas: spec.replicas,
            entries,
            max_age,
            min_available: spec.min_available,
        },
        template,
    })
}

fn proxy_desired(
    file: &Path,
    name: &str,
    at: &str,
    spec: RawProxySpec,
    mut labels: BTreeMap<String, String>,
    provider: String,
    referenced: &mut Vec<PathBuf>,
) -> Result<ProxyDesired, String> {
    if spec.user_data_secret_ref.is_some() {
        return Err(format!(
            "{name}: {at}.userDataSecretRef names a Kubernetes Secret; standalone mode reads \
             user-data from a file: use {at}.userDataFile"
        ));
    }
    let folder = file.parent().unwrap_or(Path::new("."));
    // Named before they are read: a file that cannot be read yet is
    // watched for, too.
    referenced.extend(
        [&spec.user_data_file, &spec.proxy_auth_file]
            .into_iter()
            .flatten()
            .map(|relative| folder.join(relative)),
    );
    let user_data = match spec.user_data_file {
        None => Vec::new(),
        Some(relative) => {
            let path = folder.join(&relative);
            std::fs::read(&path).map_err(|err| {
                format!("{name}: {at}.userDataFile: cannot read {}: {err}", path.display())
            })?
        }
    };
    let proxy_auth =
        match spec.proxy_auth_file {
            None => None,
            Some(relative) => {
                let path = folder.join(&relative);
                let text = std::fs::read_to_string(&path).map_err(|err| {
                    format!("{name}: {at}.proxyAuthFile: cannot read {}: {err}", path.display())
                })?;
                // The error says what is wrong with the line, never the line.
                Some(ProxyCredential::parse(&text).map_err(|err| {
                    format!("{name}: {at}.proxyAuthFile: {}: {err}", path.display())
                })?)
            }
        };
    labels.extend(spec.labels);
    let desired = ProxyDesired {
        provider,
        cores: spec.cores.unwrap_or(1),
        memory_mib: spec.memory_mib.unwrap_or(512),
        disk_gib: spec.disk_gib.unwrap_or(8),
        image: spec.image,
        placement: spec.placement,
        vlan_tag: spec.network.and_then(|n| n.vlan_tag),
        port: spec.port.unwrap_or(DEFAULT_PORT),
        user_data,
        proxy_auth,
        labels,
        replace_token: None,
    };
    desired.validate().map_err(|err| {
        format!("{name}: {}", err.to_string().replacen("spec.", &format!("{at}."), 1))
    })?;
    Ok(desired)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn parse_one(yaml: &str) -> Result<Vec<DesiredProxy>> {
        parse(Path::new("proxies.yaml"), yaml).map(|d| d.proxies)
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
    fn a_credential_file_is_read_and_a_bad_one_is_refused_without_showing_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("auth"), "crawler:s3cret\n").unwrap();
        let doc = |file: &str| {
            format!(
                "apiVersion: proxyfleet.io/v1alpha1\nkind: Proxy\nmetadata: {{ name: a }}\n\
                 spec: {{ provider: local, proxyAuthFile: {file} }}\n"
            )
        };
        std::fs::write(dir.path().join("a.yaml"), doc("auth")).unwrap();
        let loaded = load(dir.path()).unwrap();
        let credential = loaded.proxies[0].desired.proxy_auth.as_ref().unwrap();
        assert_eq!((credential.username(), credential.password()), ("crawler", "s3cret"));
        std::fs::write(dir.path().join("auth"), "s3cret-without-user\n").unwrap();
        let err = load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("spec.proxyAuthFile") && err.contains("username:password"), "{err}");
        assert!(!err.contains("s3cret"), "the error shows the secret: {err}");
        std::fs::write(dir.path().join("a.yaml"), doc("missing")).unwrap();
        let err = load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("spec.proxyAuthFile: cannot read"), "{err}");
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
        assert_eq!(load(dir.path()).unwrap().proxies.len(), 1);
    }

    #[test]
    fn pools_spread_over_weighted_providers() {
        let desired = parse(
            Path::new("pools.yaml"),
            "apiVersion: proxyfleet.io/v1alpha1\nkind: ProxyPool\nmetadata: { name: crawl }\n\
             spec:\n  replicas: 3\n  maxAge: 24h\n  minAvailable: 2\n\
             \x20 providers: [ { name: pve, weight: 2 }, { name: gce } ]\n\
             \x20 template: { metadata: { labels: { pool: crawl } }, spec: { cores: 2 } }\n",
        )
        .unwrap();
        let pool = &desired.pools[0];
        assert_eq!(pool.spec.entries, [("pve".to_owned(), 2), ("gce".to_owned(), 1)]);
        assert_eq!(pool.spec.max_age, Some(Duration::from_secs(86_400)));
        assert_eq!(pool.template.cores, 2);
        assert_eq!(pool.template.labels["pool"], "crawl");
    }

    #[test]
    fn pool_errors_name_the_field() {
        let pool = |spec: &str| {
            parse(
                Path::new("pools.yaml"),
                &format!("apiVersion: proxyfleet.io/v1alpha1\nkind: ProxyPool\nmetadata: {{ name: p }}\nspec: {spec}\n"),
            )
            .unwrap_err()
            .to_string()
        };
        let err = pool("{ replicas: 1, template: { spec: {} } }");
        assert!(err.contains("spec.providers"), "{err}");
        let err = pool("{ replicas: 1, minAvailable: 2, template: { spec: { provider: a } } }");
        assert!(err.contains("spec.minAvailable"), "{err}");
        let err = pool("{ replicas: 1, maxAge: soon, template: { spec: { provider: a } } }");
        assert!(err.contains("spec.maxAge"), "{err}");
        let err = pool("{ replicas: 1, template: { spec: { provider: a, memoryMiB: 1 } } }");
        assert!(err.contains("spec.template.spec.memoryMiB"), "{err}");
    }
}
