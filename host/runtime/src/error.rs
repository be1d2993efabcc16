//! Errors of the runtime: config, loading, and how call failures become
//! provider error classes.

use std::path::{Path, PathBuf};

/// A providers file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read providers file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The YAML is malformed or has unknown keys.
    #[error("{}{message}", file.as_ref().map(|f| format!("{}: ", f.display())).unwrap_or_default())]
    Syntax {
        /// The file, when known.
        file: Option<PathBuf>,
        /// What serde said, with line and column.
        message: String,
    },
    /// A value is wrong.
    #[error("{}{at}: {key}: {message}", file.as_ref().map(|f| format!("{}: ", f.display())).unwrap_or_default())]
    Invalid {
        /// The file, when known.
        file: Option<PathBuf>,
        /// Which entry.
        at: String,
        /// Which key inside it.
        key: String,
        /// What is wrong and how to fix it.
        message: String,
    },
}

impl ConfigError {
    pub(crate) fn invalid(
        at: impl Into<String>,
        key: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self::Invalid { file: None, at: at.into(), key: key.into(), message: message.into() }
    }

    pub(crate) fn in_file(self, path: &Path) -> Self {
        match self {
            Self::Syntax { message, .. } => Self::Syntax { file: Some(path.to_owned()), message },
            Self::Invalid { at, key, message, .. } => {
                Self::Invalid { file: Some(path.to_owned()), at, key, message }
            }
            other => other,
        }
    }
}

/// A plugin that cannot be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read.
    #[error("cannot read plugin {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a valid component for this engine.
    #[error("{path} is not a usable WebAssembly component: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What the engine said.
        message: String,
    },
    /// The component speaks another breaking version of the contract.
    #[error(
        "{path} exports {found}; this host speaks proxyfleet:provider@{host_version} \
         (compatible: {compatible}). Rebuild the plugin against the matching SDK"
    )]
    IncompatibleContract {
        /// The file.
        path: PathBuf,
        /// What the component exports.
        found: String,
        /// The host's contract version.
        host_version: &'static str,
        /// Which versions the host accepts.
        compatible: &'static str,
    },
    /// The component declares that it needs a newer host.
    #[error(
        "{path} needs proxyfleet {needs} or newer (its proxyfleet-min-host-version section), \
         and this host is {host}: upgrade the operator, or use a build made for this release"
    )]
    NeedsNewerHost {
        /// The file.
        path: PathBuf,
        /// The version it declares.
        needs: String,
        /// This host's version.
        host: &'static str,
    },
    /// The component imports something the host does not offer.
    #[error("{path} cannot be linked: {message}")]
    Link {
        /// The file.
        path: PathBuf,
        /// What is missing.
        message: String,
    },
    /// `describe` failed or returned nonsense.
    #[error("{path}: describe failed: {message}")]
    Describe {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// An `oci://` build is not in the plugin cache and could not be pulled.
    #[error("no build of it in the plugin cache, and pulling failed: {source}")]
    Pull {
        /// Why the pull failed.
        #[source]
        source: proxyfleet_oci::OciError,
    },
}

/// A runtime that could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The engine refused its configuration.
    #[error("cannot create the WebAssembly engine: {0}")]
    Engine(String),
    /// The precompiled cache directory cannot be used.
    #[error("cannot use cache directory {path}: {source}")]
    Cache {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The precompiled cache's key cannot be used.
    #[error("cache key {path}: {reason}")]
    CacheKey {
        /// The key file.
        path: PathBuf,
        /// Why, and the fix.
        reason: String,
    },
    /// The plugin directory cannot be read.
    #[error("cannot read plugin directory {path}: {source}")]
    PluginDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The store of builds pulled from registries cannot be used.
    #[error("cannot use the store of pulled plugins: {0}")]
    PluginStore(#[source] proxyfleet_oci::OciError),
    /// The providers file is wrong.
    #[error(transparent)]
    Config(#[from] ConfigError),
}
