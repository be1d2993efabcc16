//! `proxyfleet:provider/config`: the entry's config as a call reads it.
//!
//! The host holds an entry's config, and the lookup table that the
//! plugin's `validate-config` answered for it, once for each revision that
//! serves the entry. A call copies into its instance only what it asks
//! for: the whole JSON, or one value of the table. What a call costs thus
//! follows what it reads, not the size of the entry's config.

use std::collections::HashMap;
use std::sync::Arc;

use wasmtime::component::HasData;

use crate::bindings::config::Host;

/// What a table may hold beyond four times its config's size.
const TABLE_SLACK_BYTES: usize = 64 << 10;

/// Longest part of a key quoted in an error.
const QUOTED_KEY_CHARS: usize = 64;

/// The lookup table a revision answered for an entry's config.
#[derive(Debug, Default)]
pub struct ConfigTable {
    values: HashMap<Box<str>, Box<str>>,
}

/// Why a table answered by `validate-config` is not kept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TableError {
    /// Keys and values together exceed what the config's size allows.
    #[error(
        "validate-config answered a lookup table of {bytes} bytes; the host keeps at most \
         {limit} for this config (four times its size plus 64 KiB)"
    )]
    TooLarge {
        /// Bytes of the keys and values answered.
        bytes: usize,
        /// What the host keeps for this config.
        limit: usize,
    },
    /// A key answered twice: one of the two values would be lost.
    #[error("validate-config answered the key {key:?} twice; keys of the lookup table are unique")]
    Repeated {
        /// The key, cut to its first 64 characters.
        key: String,
    },
}

impl ConfigTable {
    /// The table `validate-config` answered for a config of `config_len`
    /// bytes, held to the size the contract allows.
    pub(crate) fn from_answer(
        pairs: Vec<(String, String)>,
        config_len: usize,
    ) -> Result<Self, TableError> {
        let limit = config_len.saturating_mul(4).saturating_add(TABLE_SLACK_BYTES);
        let bytes = pairs.iter().map(|(key, value)| key.len() + value.len()).sum();
        if bytes > limit {
            return Err(TableError::TooLarge { bytes, limit });
        }
        let mut values = HashMap::with_capacity(pairs.len());
        for (key, value) in pairs {
            if values.contains_key(key.as_str()) {
                let key = key.chars().take(QUOTED_KEY_CHARS).collect();
                return Err(TableError::Repeated { key });
            }
            values.insert(key.into_boxed_str(), value.into_boxed_str());
        }
        Ok(Self { values })
    }

    /// The value under `key`.
    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.values.get(key).map(AsRef::as_ref)
    }

    /// How many keys the table holds.
    pub(crate) fn len(&self) -> usize {
        self.values.len()
    }
}

/// The config one call reads: the entry's JSON and the table of the
/// revision the call runs on (empty while the revision validates it).
#[derive(Debug, Clone)]
pub(crate) struct CallConfig {
    pub(crate) json: Arc<str>,
    pub(crate) table: Arc<ConfigTable>,
}

impl Default for CallConfig {
    /// No config: what a plugin sees while it is described.
    fn default() -> Self {
        Self { json: Arc::from("{}"), table: Arc::default() }
    }
}

/// The config import as one call sees it.
pub(crate) struct ConfigView<'a> {
    pub(crate) config: &'a CallConfig,
}

/// The config import's share of a store's data, for the linker.
pub(crate) struct ConfigImport;

impl HasData for ConfigImport {
    type Data<'a> = ConfigView<'a>;
}

impl Host for ConfigView<'_> {
    async fn json(&mut self) -> String {
        self.config.json.to_string()
    }

    async fn lookup(&mut self, key: String) -> Option<String> {
        self.config.table.get(&key).map(str::to_owned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(key, value)| ((*key).to_owned(), (*value).to_owned())).collect()
    }

    #[test]
    fn a_table_answers_its_keys_and_nothing_else() {
        let table = ConfigTable::from_answer(pairs(&[("at/0", "a:1"), ("id/a:1", "")]), 10)
            .expect("within the limit");
        assert_eq!(table.get("at/0"), Some("a:1"));
        assert_eq!(table.get("id/a:1"), Some(""));
        assert_eq!(table.get("at/1"), None);
        assert_eq!(table.len(), 2);
    }

    #[test]
    fn a_table_beyond_four_times_its_config_and_the_slack_is_refused() {
        let config_len = 1000;
        let limit = 4 * config_len + TABLE_SLACK_BYTES;
        let fits = vec![("k".to_owned(), "v".repeat(limit - 1))];
        assert!(ConfigTable::from_answer(fits, config_len).is_ok());
        let over = vec![("k".to_owned(), "v".repeat(limit))];
        assert_eq!(
            ConfigTable::from_answer(over, config_len).map(|_| ()),
            Err(TableError::TooLarge { bytes: limit + 1, limit })
        );
    }

    #[test]
    fn a_key_answered_twice_is_refused_and_named() {
        let error = ConfigTable::from_answer(pairs(&[("n", "1"), ("n", "2")]), 10)
            .expect_err("one of the values would be lost");
        assert_eq!(error, TableError::Repeated { key: "n".to_owned() });
        assert!(error.to_string().contains("\"n\""), "{error}");
    }
}
