//! Compute Engine's naming rules for the IDs and labels the plugin writes
//! or accepts in its config.

/// A resource ID: lowercase letters, digits and `-`, starting with a
/// letter (project IDs, zones, network tags, machine types).
pub fn is_resource_id(text: &str) -> bool {
    text.starts_with(|c: char| c.is_ascii_lowercase())
        && text.len() <= 63
        && text.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !text.ends_with('-')
}

/// Label keys: up to 63 of `[a-z0-9_-]`, starting with a letter.
pub fn is_label_key(key: &str) -> bool {
    key.len() <= 63
        && key.starts_with(|c: char| c.is_ascii_lowercase())
        && key.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

/// Label values: up to 63 of `[a-z0-9_-]`.
pub fn is_label_value(value: &str) -> bool {
    value.len() <= 63
        && value
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}
