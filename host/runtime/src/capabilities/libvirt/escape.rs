//! Text the host writes into the XML it hands libvirt (the owner element,
//! backing chains), escaped for element content and attribute values in
//! either quote style.

/// `text` with `&`, `<`, `>` and both quotes escaped.
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '\'' => out.push_str("&apos;"),
            '"' => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
    out
}
