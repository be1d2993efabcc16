//! JSON log lines with a plugin's fields nested as an object.
//!
//! Lines are flat, as log pipelines expect: the message and the event's
//! fields sit at the top level beside `timestamp`, `level` and `target`
//! (`{"level":"INFO","message":"…","entry":"pve",…}`), not under
//! `fields`.
//!
//! A plugin's log record carries its fields as one JSON object in the
//! `plugin_fields` field (see the runtime's log capability); `tracing`
//! only knows field names fixed at compile time, so the JSON formatter
//! would write that object as a string. This formatter writes those lines
//! with the object in place (`"plugin_fields":{"vmid":"101"}`), so log
//! pipelines can query a plugin's fields like the host's. Every other line
//! is written by the JSON formatter as it is.
//!
//! JSON itself escapes only C0 controls, so DEL and the C1 controls
//! (U+0080 to U+009F, which some terminals and log viewers act on) would
//! reach the output raw: from a plugin's fields once they are nested (the
//! runtime hands them over escaped, and parsing them undoes that), and
//! from any text a plugin returned that a host line quotes. Every line
//! leaves with those characters as `\u` escapes, which JSON readers decode
//! back to the same text.

use std::borrow::Cow;
use std::fmt;

use proxyfleet_runtime::capabilities::log::{PLUGIN_FIELDS, PLUGIN_LOG_TARGET};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::{Format, Json, JsonFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent};
use tracing_subscriber::registry::LookupSpan;

/// The JSON event format, with plugin fields nested.
#[derive(Debug)]
pub struct NestPluginFields(Format<Json>);

impl Default for NestPluginFields {
    fn default() -> Self {
        Self(Format::default().json().flatten_event(true))
    }
}

impl<S> FormatEvent<S, JsonFields> for NestPluginFields
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, JsonFields>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut line = String::new();
        self.0.format_event(ctx, Writer::new(&mut line), event)?;
        if event.metadata().target() == PLUGIN_LOG_TARGET
            && let Some(nested) = nest(&line)
        {
            return writeln!(writer, "{}", escape_del_and_c1(&nested));
        }
        writer.write_str(&escape_del_and_c1(&line))
    }
}

/// `line` with DEL and the C1 controls written as JSON's `\u` escapes. In
/// a JSON text they can only stand inside strings, where the escape means
/// the same character.
fn escape_del_and_c1(line: &str) -> Cow<'_, str> {
    let raw = |c: char| matches!(c, '\u{7f}'..='\u{9f}');
    if !line.contains(raw) {
        return Cow::Borrowed(line);
    }
    let mut escaped = String::with_capacity(line.len() + 16);
    for c in line.chars() {
        if raw(c) {
            escaped.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            escaped.push(c);
        }
    }
    Cow::Owned(escaped)
}

/// `line` (one flat JSON object) with `plugin_fields` parsed in place;
/// `None` when there is nothing to nest.
fn nest(line: &str) -> Option<String> {
    let mut value: serde_json::Value = serde_json::from_str(line.trim_end()).ok()?;
    let slot = value.get_mut(PLUGIN_FIELDS)?;
    let object: serde_json::Value = serde_json::from_str(slot.as_str()?).ok()?;
    if !object.is_object() {
        return None;
    }
    *slot = object;
    Some(value.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plugin_object_is_nested_and_the_rest_kept() {
        let line = r#"{"timestamp":"t","level":"INFO","message":"m","entry":"pve","plugin_fields":"{\"vmid\":\"101\",\"node\":\"a\\nb\"}","target":"proxyfleet::plugin"}"#;
        let nested: serde_json::Value = serde_json::from_str(&nest(line).unwrap()).unwrap();
        assert_eq!(nested["plugin_fields"]["vmid"], "101");
        assert_eq!(nested["plugin_fields"]["node"], "a\nb");
        assert_eq!(nested["entry"], "pve");
        assert_eq!(nested["level"], "INFO");
    }

    /// Issue 43, item 11: C1 controls and DEL from a plugin's log fields
    /// reached the JSON output raw: the runtime escapes them, and nesting
    /// the fields parsed the escapes back into the characters.
    #[test]
    fn del_and_c1_leave_a_nested_line_only_as_escapes() {
        // As the JSON formatter writes a plugin record whose field name
        // holds U+0085 and whose value holds DEL and U+009F, and whose
        // message the runtime escaped.
        let line = r#"{"message":"a\\u{7f}b","plugin_fields":"{\"k\\u0085\":\"v\\u007f\\u009f\"}","target":"proxyfleet::plugin"}"#;
        let nested = nest(line).unwrap();
        assert!(nested.contains('\u{85}'), "nesting alone decodes them: {nested:?}");
        let written = escape_del_and_c1(&nested);
        assert_eq!(
            written,
            r#"{"message":"a\\u{7f}b","plugin_fields":{"k\u0085":"v\u007f\u009f"},"target":"proxyfleet::plugin"}"#
        );
        let bytes = written.as_bytes();
        assert!(!bytes.contains(&0x7f), "{bytes:?}");
        assert!(!bytes.windows(2).any(|w| w[0] == 0xc2 && (0x80..=0x9f).contains(&w[1])));
        let parsed: serde_json::Value = serde_json::from_str(&written).unwrap();
        assert_eq!(parsed["plugin_fields"]["k\u{85}"], "v\u{7f}\u{9f}");
    }

    /// The formatter as the operator installs it: a plugin record and a host
    /// line quoting text a plugin returned, both written with escapes only.
    #[test]
    fn issue_43_item_11_every_json_line_carries_del_and_c1_as_escapes() {
        #[derive(Clone, Default)]
        struct Buffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Buffer {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .json()
            .event_format(NestPluginFields::default())
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(
                target: PLUGIN_LOG_TARGET,
                plugin_fields = r#"{"k\u0085":"v\u007f"}"#,
                "from a plugin"
            );
            tracing::warn!(id = "pve1/\u{9f}101\u{7f}", "a host line");
        });
        let output = buffer.0.lock().unwrap().clone();
        assert!(!output.contains(&0x7f), "{}", String::from_utf8_lossy(&output));
        assert!(
            !output.windows(2).any(|w| w[0] == 0xc2 && (0x80..=0x9f).contains(&w[1])),
            "{}",
            String::from_utf8_lossy(&output)
        );
        let text = String::from_utf8(output).unwrap();
        assert!(text.contains(r#""plugin_fields":{"k\u0085":"v\u007f"}"#), "{text}");
        assert!(text.contains(r#""id":"pve1/\u009f101\u007f""#), "{text}");
        assert_eq!(text.lines().count(), 2, "{text}");
    }

    #[test]
    fn lines_without_an_object_are_left_alone() {
        assert_eq!(nest(r#"{"message":"m"}"#), None);
        assert_eq!(nest(r#"{"plugin_fields":"not json"}"#), None);
        assert_eq!(nest("not a line"), None);
    }
}
