//! `proxyfleet:provider/log`: plugin logs into the host's `tracing`.
//!
//! A plugin's record is bounded as a whole (message, field names and
//! values together) and its control characters are escaped, so a runaway
//! plugin cannot flood the logs and a newline in a message or a field
//! cannot forge a log line of the host's in text output.

use std::fmt::Write as _;

use crate::bindings::log::{Host, Level};
use crate::state::PluginState;

/// Most bytes of one record kept from a plugin: message and fields.
const MAX_RECORD_BYTES: usize = 8 * 1024;
/// Most fields kept from one record.
const MAX_FIELDS: usize = 32;
/// Longest field name kept.
const MAX_KEY_BYTES: usize = 64;

impl Host for PluginState {
    async fn log(&mut self, level: Level, message: String, fields: Vec<(String, String)>) {
        let scope = &self.scope;
        // Redacted before anything is cut, so a cut never leaves part of a
        // secret the redactor would no longer recognise.
        let message = scope.redactor.redact(&message).into_owned();
        let fields: Vec<(String, String)> = fields
            .into_iter()
            .map(|(key, value)| {
                (
                    scope.redactor.redact(&key).into_owned(),
                    scope.redactor.redact(&value).into_owned(),
                )
            })
            .collect();
        let (text, extra) = render(&message, &fields);
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

/// The message and the fields (`key="value" …`) as logged: control
/// characters escaped, the whole within [`MAX_RECORD_BYTES`], and what did
/// not fit said at the end.
fn render(message: &str, fields: &[(String, String)]) -> (String, String) {
    let mut budget = MAX_RECORD_BYTES;
    let text = escaped_within(message, &mut budget);
    let mut extra = String::new();
    let mut dropped = fields.len().saturating_sub(MAX_FIELDS);
    for (key, value) in fields.iter().take(MAX_FIELDS) {
        let mut key_budget = MAX_KEY_BYTES.min(budget);
        let key = escaped_within(key, &mut key_budget);
        let mut value_budget = budget.saturating_sub(key.len() + 4);
        let value = escaped_within(value, &mut value_budget);
        let entry = format!("{key}=\"{value}\" ");
        if key.is_empty() || entry.len() > budget {
            dropped += 1;
            continue;
        }
        budget -= entry.len();
        extra.push_str(&entry);
    }
    if dropped > 0 {
        let _ = write!(extra, "…{dropped} fields dropped");
    }
    (text, extra.trim_end().to_owned())
}

/// `text` with control characters (and `"` and `\`, which would end or
/// bend a quoted field) escaped, cut to fit `budget` bytes with `…` when
/// it does not; `budget` is reduced by what was used.
fn escaped_within(text: &str, budget: &mut usize) -> String {
    let mut out = String::new();
    for c in text.chars() {
        let start = out.len();
        if c.is_control() || c == '"' || c == '\\' {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
        // Room for the ellipsis if the text has to be cut after this.
        if out.len() + '…'.len_utf8() > *budget {
            out.truncate(start);
            out.push('…');
            break;
        }
    }
    *budget = budget.saturating_sub(out.len());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(key, value)| ((*key).to_owned(), (*value).to_owned())).collect()
    }

    /// The attack: a field (or the message) carrying a newline and a whole
    /// fake host line showed up as that line in text output.
    #[test]
    fn newlines_in_a_message_or_a_field_cannot_forge_a_log_line() {
        let forged = "ok\n2026-01-01T00:00:00Z  INFO registry: activated entry=prod";
        let (text, extra) = render(forged, &fields(&[("note", forged), ("k\ney", "v")]));
        for rendered in [&text, &extra] {
            assert!(!rendered.contains('\n'), "{rendered:?}");
            assert!(rendered.contains("\\n2026-01-01"), "{rendered:?}");
        }
        assert!(extra.starts_with("note=\"ok\\n2026"), "{extra:?}");
        assert!(extra.contains("k\\ney=\"v\""), "{extra:?}");
    }

    #[test]
    fn a_quote_cannot_end_a_field_early() {
        let (_, extra) = render("m", &fields(&[("a", "x\" b=\"y")]));
        assert_eq!(extra, "a=\"x\\\" b=\\\"y\"");
    }

    /// The attack: one record of 8.4 MB (a small message, a huge field).
    #[test]
    fn an_8_mb_record_is_capped_as_a_whole() {
        let huge = "x".repeat(8_400_000);
        let many: Vec<(String, String)> =
            (0..1000).map(|i| (format!("f{i}"), "y".repeat(100))).collect();
        for (message, fields) in [
            (huge.as_str(), Vec::new()),
            ("small", vec![("big".to_owned(), huge.clone())]),
            ("small", many),
        ] {
            let (text, extra) = render(message, &fields);
            assert!(
                text.len() + extra.len() <= MAX_RECORD_BYTES + 64,
                "{}",
                text.len() + extra.len()
            );
        }
        let (_, extra) = render(
            "small",
            &(0..40).map(|i| (format!("f{i}"), "v".to_owned())).collect::<Vec<_>>(),
        );
        assert!(extra.ends_with("…8 fields dropped"), "{extra}");
    }

    #[test]
    fn cuts_on_character_boundaries() {
        let mut budget = 7;
        let cut = escaped_within("ééééééé", &mut budget);
        assert_eq!(cut, "éé…");
        let mut budget = 100;
        assert_eq!(escaped_within("plain", &mut budget), "plain");
        assert_eq!(budget, 95);
    }
}
