//! JSON log lines with a plugin's fields nested as an object.
//!
//! A plugin's log record carries its fields as one JSON object in the
//! `plugin_fields` field (see the runtime's log capability); `tracing`
//! only knows field names fixed at compile time, so the JSON formatter
//! would write that object as a string. This formatter writes those lines
//! with the object in place (`"plugin_fields":{"vmid":"101"}`), so log
//! pipelines can query a plugin's fields like the host's. Every other line
//! is written by the JSON formatter unchanged.

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
        Self(Format::default().json())
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
        if event.metadata().target() != PLUGIN_LOG_TARGET {
            return self.0.format_event(ctx, writer, event);
        }
        let mut line = String::new();
        self.0.format_event(ctx, Writer::new(&mut line), event)?;
        match nest(&line) {
            Some(nested) => writeln!(writer, "{nested}"),
            None => writer.write_str(&line),
        }
    }
}

/// `line` (one JSON object) with `fields.plugin_fields` parsed in place;
/// `None` when there is nothing to nest.
fn nest(line: &str) -> Option<String> {
    let mut value: serde_json::Value = serde_json::from_str(line.trim_end()).ok()?;
    let slot = value.get_mut("fields")?.get_mut(PLUGIN_FIELDS)?;
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
        let line = r#"{"timestamp":"t","level":"INFO","fields":{"message":"m","entry":"pve","plugin_fields":"{\"vmid\":\"101\",\"node\":\"a\\nb\"}"},"target":"proxyfleet::plugin"}"#;
        let nested: serde_json::Value = serde_json::from_str(&nest(line).unwrap()).unwrap();
        assert_eq!(nested["fields"]["plugin_fields"]["vmid"], "101");
        assert_eq!(nested["fields"]["plugin_fields"]["node"], "a\nb");
        assert_eq!(nested["fields"]["entry"], "pve");
        assert_eq!(nested["level"], "INFO");
    }

    #[test]
    fn lines_without_an_object_are_left_alone() {
        assert_eq!(nest(r#"{"fields":{"message":"m"}}"#), None);
        assert_eq!(nest(r#"{"fields":{"plugin_fields":"not json"}}"#), None);
        assert_eq!(nest("not a line"), None);
    }
}
