//! The API server's rules for names, label keys and label values, checked
//! here so that a bad config or spec is refused with the key that is wrong
//! instead of an `Invalid` answer about a field of the pod.

/// Longest label value and name segment.
const LABEL_MAX: usize = 63;
/// Longest DNS subdomain (object names, label key prefixes).
const SUBDOMAIN_MAX: usize = 253;

fn alphanumeric(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

/// A DNS-1123 label: namespaces, container names.
pub fn is_dns_label(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= LABEL_MAX
        && text.chars().all(|c| alphanumeric(c) || c == '-')
        && text.starts_with(alphanumeric)
        && text.ends_with(alphanumeric)
}

/// A DNS-1123 subdomain: most object names (Secrets, pods).
pub fn is_dns_subdomain(text: &str) -> bool {
    !text.is_empty() && text.len() <= SUBDOMAIN_MAX && text.split('.').all(is_dns_label)
}

/// A label value; the empty value is left to the caller, which decides
/// whether it means anything.
pub fn is_label_value(text: &str) -> bool {
    let inner = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    !text.is_empty()
        && text.len() <= LABEL_MAX
        && text.chars().all(inner)
        && text.starts_with(|c: char| c.is_ascii_alphanumeric())
        && text.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// A label or annotation key, or a taint key: `[prefix/]name`, the prefix a
/// DNS subdomain, the name a label value.
pub fn is_qualified_name(text: &str) -> bool {
    match text.split_once('/') {
        Some((prefix, name)) => is_dns_subdomain(prefix) && is_label_value(name),
        None => is_label_value(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_subdomains() {
        assert!(is_dns_label("proxies-1"));
        for bad in ["", "-a", "a-", "A", "a.b", &"a".repeat(64)] {
            assert!(!is_dns_label(bad), "{bad}");
        }
        assert!(is_dns_subdomain("registry.example.com"));
        assert!(!is_dns_subdomain("a..b"));
        assert!(!is_dns_subdomain("Pull-Secret"));
    }

    #[test]
    fn label_values_and_keys() {
        assert!(is_label_value("Eu-West_1.b"));
        for bad in ["", "-a", "a_", "a b", "a/b", &"a".repeat(64)] {
            assert!(!is_label_value(bad), "{bad}");
        }
        assert!(is_qualified_name("disktype"));
        assert!(is_qualified_name("node.kubernetes.io/instance-type"));
        assert!(is_qualified_name("topology.kubernetes.io/zone"));
        for bad in ["", "/zone", "Example.com/zone", "a/b/c", "disk type"] {
            assert!(!is_qualified_name(bad), "{bad}");
        }
    }
}
