//! `proxyfleet:provider/log`: plugin logs into the host's `tracing`.
//!
//! A plugin's record is bounded as a whole (message, field names and
//! values together) and its control characters are escaped, so a runaway
//! plugin cannot flood the logs and a newline in a message or a field
//! cannot forge a log line of the host's in text output.
//!
//! The plugin's fields travel as one JSON object in the `plugin_fields`
//! field: text output shows it inline, and the operator's JSON output nests
//! it as an object (`fields.plugin_fields.<key>`), apart from the host's
//! own `plugin`, `entry`, `operation` and `proxy`, which a plugin cannot
//! forge.

use std::fmt::Write as _;

use wasmtime::component::HasData;

use super::CallScope;
use crate::bindings::log::{Host, Level};

/// The target plugin records are logged under.
pub const PLUGIN_LOG_TARGET: &str = "proxyfleet::plugin";
/// The field holding a record's plugin fields as a JSON object.
pub const PLUGIN_FIELDS: &str = "plugin_fields";

/// Most bytes of one record kept from a plugin: message and fields.
const MAX_RECORD_BYTES: usize = 8 * 1024;
/// Most fields kept from one record.
const MAX_FIELDS: usize = 32;
/// Longest field name kept.
const MAX_KEY_BYTES: usize = 64;

/// The log import as one call sees it: who the call is for.
pub(crate) struct LogView<'a> {
    pub(crate) scope: &'a CallScope,
}

/// The log import's share of a store's data, for the linker.
pub(crate) struct LogImport;

impl HasData for LogImport {
    type Data<'a> = LogView<'a>;
}

impl Host for LogView<'_> {
    async fn log(&mut self, level: Level, message: String, fields: Vec<(String, String)>) {
        let scope = self.scope;
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
                    target: PLUGIN_LOG_TARGET,
                    plugin, entry, operation, proxy, plugin_fields = %extra, "{text}"
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

/// The message and the fields (a JSON object of strings) as logged:
/// control characters escaped, the whole within [`MAX_RECORD_BYTES`], and
/// what did not fit counted under the key `…`.
fn render(message: &str, fields: &[(String, String)]) -> (String, String) {
    let mut budget = MAX_RECORD_BYTES;
    let text = escaped_within(message, &mut budget, Escape::Text);
    let mut members = Vec::new();
    let mut dropped = fields.len().saturating_sub(MAX_FIELDS);
    for (key, value) in fields.iter().take(MAX_FIELDS) {
        let mut key_budget = MAX_KEY_BYTES.min(budget);
        let key = escaped_within(key, &mut key_budget, Escape::Json);
        let mut value_budget = budget.saturating_sub(key.len() + 6);
        let value = escaped_within(value, &mut value_budget, Escape::Json);
        let member = format!("\"{key}\":\"{value}\"");
        if key.is_empty() || member.len() + 1 > budget {
            dropped += 1;
            continue;
        }
        budget -= member.len() + 1;
        members.push(member);
    }
    if dropped > 0 {
        members.push(format!("\"…\":\"{dropped} fields dropped\""));
    }
    (text, format!("{{{}}}", members.join(",")))
}

/// One line of text as logged: control characters escaped, cut to
/// `max_bytes` with `…`.
pub(crate) fn escaped_line(text: &str, max_bytes: usize) -> String {
    let mut budget = max_bytes;
    escaped_within(text, &mut budget, Escape::Text)
}

/// How [`escaped_within`] spells what it escapes.
#[derive(Debug, Clone, Copy)]
enum Escape {
    /// Rust's `escape_default` (`\n`, `\u{85}`): the message.
    Text,
    /// JSON's (`\n`, `\u0085`), so the result is the inside of a JSON
    /// string: field names and values.
    Json,
}

/// `text` with control characters (C0, DEL and C1, which JSON alone would
/// let through) and `"` and `\` (which would end or bend a quoted field)
/// escaped, cut to fit `budget` bytes with `…` when it does not; `budget`
/// is reduced by what was used.
fn escaped_within(text: &str, budget: &mut usize, escape: Escape) -> String {
    let mut out = String::new();
    for c in text.chars() {
        let start = out.len();
        match (escape, c) {
            (Escape::Text, c) if c.is_control() || c == '"' || c == '\\' => {
                out.extend(c.escape_default());
            }
            (Escape::Json, '"' | '\\') => {
                out.push('\\');
                out.push(c);
            }
            (Escape::Json, '\n') => out.push_str("\\n"),
            (Escape::Json, '\r') => out.push_str("\\r"),
            (Escape::Json, '\t') => out.push_str("\\t"),
            (Escape::Json, c) if c.is_control() => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            (_, c) => out.push(c),
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
        assert!(extra.starts_with("{\"note\":\"ok\\n2026"), "{extra:?}");
        assert!(extra.contains("\"k\\ney\":\"v\""), "{extra:?}");
    }

    /// Issue 43, item 11: DEL and C1 controls from a plugin's record
    /// reached the JSON log output raw. The record leaves here with every
    /// one of them escaped, in the message, field names and field values;
    /// the operator's JSON output keeps them escaped (its `plugin_fields`).
    #[test]
    fn del_and_c1_leave_a_record_only_as_escapes() {
        let (text, extra) = render(
            "a\u{7f}b\u{80}c\u{9f}",
            &fields(&[("k\u{85}", "v\u{7f}\u{9f}"), ("\u{80}", "\u{a0}")]),
        );
        assert_eq!(text, r"a\u{7f}b\u{80}c\u{9f}");
        assert_eq!(extra, "{\"k\\u0085\":\"v\\u007f\\u009f\",\"\\u0080\":\"\u{a0}\"}");
        for rendered in [&text, &extra] {
            let bytes = rendered.as_bytes();
            assert!(!bytes.contains(&0x7f), "{bytes:?}");
            assert!(!bytes.windows(2).any(|w| w[0] == 0xc2 && (0x80..=0x9f).contains(&w[1])));
        }
        // U+00A0 is no control: it stays as it is.
        assert!(extra.as_bytes().windows(2).any(|w| w == [0xc2, 0xa0]));
    }

    #[test]
    fn a_quote_cannot_end_a_field_early() {
        let (_, extra) = render("m", &fields(&[("a", "x\" b=\"y")]));
        assert_eq!(extra, "{\"a\":\"x\\\" b=\\\"y\"}");
    }

    #[test]
    fn fields_are_a_json_object_of_what_the_plugin_sent() {
        let sent = fields(&[("vmid", "101"), ("path", "C:\\x \"q\"\u{85}\u{7}"), ("", "nameless")]);
        let (_, extra) = render("m", &sent);
        assert!(!extra.contains('\u{85}'), "C1 controls are escaped: {extra:?}");
        let parsed: serde_json::Value = serde_json::from_str(&extra).expect("JSON");
        assert_eq!(
            parsed,
            serde_json::json!({
                "vmid": "101",
                "path": "C:\\x \"q\"\u{85}\u{7}",
                "…": "1 fields dropped",
            })
        );
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
        assert!(extra.ends_with("\"…\":\"8 fields dropped\"}"), "{extra}");
        serde_json::from_str::<serde_json::Value>(&extra).expect("still JSON");
    }

    #[test]
    fn cuts_on_character_boundaries() {
        let mut budget = 7;
        let cut = escaped_within("ééééééé", &mut budget, Escape::Json);
        assert_eq!(cut, "éé…");
        let mut budget = 100;
        assert_eq!(escaped_within("plain", &mut budget, Escape::Text), "plain");
        assert_eq!(budget, 95);
    }
}
