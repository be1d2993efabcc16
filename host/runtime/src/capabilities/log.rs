//! `proxyfleet:provider/log`: plugin logs into the host's `tracing`.

use std::fmt::Write as _;

use crate::bindings::log::{Host, Level};
use crate::state::PluginState;

/// Longest message kept from a plugin; a runaway plugin must not flood logs.
const MAX_MESSAGE_BYTES: usize = 8 * 1024;

impl Host for PluginState {
    async fn log(&mut self, level: Level, message: String, fields: Vec<(String, String)>) {
        let mut text = truncate(message);
        let mut extra = String::new();
        for (key, value) in &fields {
            let _ = write!(extra, "{key}={value:?} ");
        }
        let scope = &self.scope;
        let redacted = scope.redactor.redact(&text).into_owned();
        text = redacted;
        let extra = scope.redactor.redact(extra.trim_end()).into_owned();
        let (plugin, entry, operation, proxy) =
            (&*scope.plugin, &*scope.entry, scope.operation, scope.proxy.as_deref().unwrap_or(""));
        macro_rules! emit {
            ($level:ident) => {
                tracing::$level!(
                    target: "proxyfleet::plugin",
                    plugin, entry, operation, proxy, fields = %extra, "{text}"
                )
            };
        }
        match level {
            Level::Trace => emit!(trace),
            Level::Debug => emit!(debug),
            Level::Info => emit!(info),
            Level::Warn => emit!(warn),
            Level::Error => emit!(error),
        }
    }
}

fn truncate(mut message: String) -> String {
    if message.len() > MAX_MESSAGE_BYTES {
        let mut end = MAX_MESSAGE_BYTES;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push('…');
    }
    message
}
