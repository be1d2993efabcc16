//! Errors of the fleet services.

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A setting is out of range or malformed; names the setting.
    #[error("{setting}: {message}")]
    Setting {
        /// The flag or key, as the user wrote it.
        setting: String,
        /// What is wrong and what is allowed.
        message: String,
    },
    /// Reading a token file failed.
    #[error("cannot read the API token file {path}: {source}")]
    TokenFile {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
}

impl Error {
    pub(crate) fn setting(setting: &str, message: impl Into<String>) -> Self {
        Self::Setting { setting: setting.to_owned(), message: message.into() }
    }
}

/// Result of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
