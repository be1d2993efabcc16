//! Who a plugin call is for: every log line and store access of the call
//! is scoped by it.

use std::sync::Arc;

use super::Redactor;
use super::kv::EntryKv;

/// Who a call is for; every log line and store access is scoped by it.
#[derive(Clone)]
pub(crate) struct CallScope {
    pub(crate) entry: Arc<str>,
    pub(crate) plugin: Arc<str>,
    pub(crate) operation: &'static str,
    pub(crate) proxy: Option<String>,
    pub(crate) kv: Arc<EntryKv>,
    pub(crate) redactor: Arc<Redactor>,
}
