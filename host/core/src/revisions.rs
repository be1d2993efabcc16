//! What an entry's plugin revisions look like from outside: the one
//! serving, the one a rollback would bring back, the candidates refused and
//! why, and the pin the entry holds them to. Plain data, serializable as is
//! for the state API and the ClusterProxyProvider status.

use std::path::PathBuf;

use serde::Serialize;

/// One loaded revision of a plugin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RevisionSummary {
    /// The name the plugin's `describe` reports.
    pub plugin: String,
    /// The version it reports.
    pub version: String,
    /// sha256 of the component file, lower-case hex.
    pub digest: String,
    /// The contract version it was built against.
    pub contract_version: String,
    /// When the file was loaded, in seconds since the Unix epoch.
    pub loaded_at: u64,
    /// The file it was loaded from.
    pub source: PathBuf,
}

/// Which check a candidate failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RejectionKind {
    /// The file could not be read, compiled, linked or described, or it
    /// speaks another breaking version of the contract.
    Load,
    /// It is not the build the entry pins.
    Pin,
    /// It asks for capabilities the entry does not grant.
    Capabilities,
    /// It refused the entry's config.
    Config,
}

impl RejectionKind {
    /// The name it is serialized as, for log fields and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Load => "load",
            Self::Pin => "pin",
            Self::Capabilities => "capabilities",
            Self::Config => "config",
        }
    }
}

/// Restricts an entry to one build of its plugin: a file that is another
/// build is not activated for the entry, at load or on a swap.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Pin {
    /// The version the plugin's `describe` reports, compared exactly.
    Version(String),
    /// The sha256 of the component file, 64 lower-case hex digits.
    Digest(String),
}

impl Pin {
    /// Whether a build with this version and file digest satisfies the pin.
    pub fn admits(&self, version: &str, digest: &str) -> bool {
        match self {
            Self::Version(pinned) => pinned == version,
            Self::Digest(pinned) => pinned.eq_ignore_ascii_case(digest),
        }
    }
}

impl std::fmt::Display for Pin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Version(version) => write!(f, "version {version}"),
            Self::Digest(digest) => write!(f, "digest sha256:{digest}"),
        }
    }
}

/// What the last look at a reference's registry found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PullStatus {
    /// The reference.
    pub reference: String,
    /// The manifest digest the store holds for it.
    pub manifest_digest: Option<String>,
    /// When the registry last answered, in Unix seconds.
    pub checked_at: Option<u64>,
    /// Why the last look failed, if it did; the store keeps serving.
    pub error: Option<String>,
    /// Looks that failed in a row.
    pub failures: u32,
}

/// A candidate revision an entry did not activate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RejectedCandidate {
    /// The name its `describe` reports; `None` when it never got that far.
    pub plugin: Option<String>,
    /// The version it reports, likewise.
    pub version: Option<String>,
    /// sha256 of the file, lower-case hex.
    pub digest: String,
    /// The contract version it speaks, when known (also for a component
    /// refused for exporting another breaking version).
    pub contract_version: Option<String>,
    /// When it was loaded (or found unloadable), in seconds since the Unix
    /// epoch.
    pub loaded_at: u64,
    /// Which check it failed.
    pub kind: RejectionKind,
    /// Why, for people: names the file, the pin or the missing grant.
    pub reason: String,
}

/// The revisions of one provider entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EntryRevisions {
    /// The entry's name.
    pub entry: String,
    /// The plugin the entry names: a file without `.wasm`, or an `oci://`
    /// reference.
    pub plugin: String,
    /// The build the entry is pinned to, if any.
    pub pin: Option<Pin>,
    /// The revision serving calls; `None` while the entry is unavailable.
    pub active: Option<RevisionSummary>,
    /// When the active revision started serving this entry, in seconds
    /// since the Unix epoch.
    pub activated_at: Option<u64>,
    /// What a rollback would bring back.
    pub previous: Option<RevisionSummary>,
    /// The most recent refused candidates, oldest first.
    pub rejected: Vec<RejectedCandidate>,
    /// Why the entry serves nothing, when it does not.
    pub unavailable: Option<String>,
    /// Revisions activated since load, by swaps, file removals and
    /// rollbacks (the one bound at load not counted).
    pub swaps: u64,
    /// Candidates refused since load, including those no longer listed.
    pub rejections: u64,
    /// Why the entry's latest config edit was refused, while it serves the
    /// config before it; `None` once a config is taken.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config_refused: Option<String>,
    /// For an `oci://` plugin: what the last look at its registry found.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pull: Option<PullStatus>,
    /// What the entry grants its plugin, capability by capability.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub grants: Vec<GrantSummary>,
    /// The JSON Schema of the entry's config, as the serving build
    /// describes it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config_schema: Option<String>,
}

/// One capability an entry grants its plugin, for people: what it may
/// reach and how. Credentials are named by where they come from, never by
/// their value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GrantSummary {
    /// `http`, `tls`, `libvirt`, `kv`, `log` or `proxy addresses`.
    pub capability: String,
    /// What it grants.
    pub detail: String,
}
