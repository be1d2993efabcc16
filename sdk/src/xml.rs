//! Text for the XML handed to libvirt (domains, volumes, metadata):
//! escaping on the way out, and the few attribute reads a plugin needs on
//! what libvirt hands back, which it writes in its own style (either quote,
//! its own namespace prefixes).
//!
//! ```
//! use proxyfleet_sdk::xml::escape;
//! let name = "web & co";
//! let xml = format!("<domain><name>{}</name></domain>", escape(name));
//! assert_eq!(xml, "<domain><name>web &amp; co</name></domain>");
//! ```

/// Escapes text for an attribute value (in either quote) or element
/// content.
///
/// ```
/// assert_eq!(proxyfleet_sdk::xml::escape(r#"<a b='c' d="e">"#), "&lt;a b=&apos;c&apos; d=&quot;e&quot;&gt;");
/// ```
pub fn escape(text: &str) -> String {
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

/// The value of attribute `name` on the first element of `xml`, unescaped;
/// `None` when the element has no such attribute (or an entity this does
/// not know).
///
/// ```
/// use proxyfleet_sdk::xml::attribute;
/// let element = "<owner xmlns='urn:x' namespace='crawl' name='a&amp;b'/>";
/// assert_eq!(attribute(element, "name").as_deref(), Some("a&b"));
/// assert_eq!(attribute(element, "uid"), None);
/// ```
pub fn attribute(xml: &str, name: &str) -> Option<String> {
    if name.is_empty() {
        return None;
    }
    let head = &xml[..xml.find('>')?];
    let mut search = 0;
    while let Some(found) = head[search..].find(name) {
        let at = search + found;
        search = at + name.len();
        // Whole attribute names only: `name` is also the tail of `namespace`.
        let preceded = head[..at].ends_with(char::is_whitespace);
        let Some(rest) = head[search..].trim_start().strip_prefix('=') else { continue };
        if !preceded {
            continue;
        }
        let rest = rest.trim_start();
        let quote = rest.chars().next().filter(|q| matches!(q, '"' | '\''))?;
        let value = &rest[1..];
        return unescape(&value[..value.find(quote)?]);
    }
    None
}

/// The five predefined entities decoded; `None` on any other.
fn unescape(text: &str) -> Option<String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find('&') {
        out.push_str(&rest[..start]);
        let end = rest[start..].find(';')? + start;
        out.push(match &rest[start + 1..end] {
            "amp" => '&',
            "lt" => '<',
            "gt" => '>',
            "apos" => '\'',
            "quot" => '"',
            _ => return None,
        });
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_are_read_whole_in_either_quote() {
        let element = "<owner xname=\"no\" name='yes' namespace=\"n\" other = 'x &lt; y'/>";
        assert_eq!(attribute(element, "name").as_deref(), Some("yes"));
        assert_eq!(attribute(element, "other").as_deref(), Some("x < y"));
        assert_eq!(attribute("<a b='&bogus;'/>", "b"), None);
        assert_eq!(attribute("<a/><b c='d'/>", "c"), None, "the first element only");
        assert_eq!(attribute("<a b='c'/>", ""), None, "an empty name ends the search");
    }

    #[test]
    fn escape_and_unescape_round_trip() {
        let text = "a&b<c>d'e\"f";
        assert_eq!(unescape(&escape(text)).as_deref(), Some(text));
    }
}
