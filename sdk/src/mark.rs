//! Ownership marks: written into the backend when an instance is created and
//! read back from it, so the host's orphan collection can tell our instances
//! (and which Proxy owns each) from anyone else's.
//!
//! Three encodings, for the kinds of place a backend offers:
//!
//! - text, for a free-text field such as a VM description or notes: four
//!   `proxyfleet.io/<key>: <value>` lines, found again by
//!   [`OwnershipMark::from_text`] wherever they sit in the field;
//! - labels, for backends that only take restricted key/value labels (GCP,
//!   Kubernetes): lowercase `[a-z0-9_-]`, at most 63 characters each;
//! - XML attributes, with the owning entry, for an element in a libvirt
//!   domain's `<metadata>`.
//!
//! All carry the installation that created the instance
//! (`ProxySpec::installation`): the host collects only its own
//! installation's orphans. A mark read back without one (written before
//! marks carried it) has an empty installation and is never collected.

use sha2::{Digest, Sha256};

use crate::{OwnershipMark, ProviderError, ProxySpec};

const TEXT_INSTALLATION: &str = "proxyfleet.io/installation:";
const TEXT_UID: &str = "proxyfleet.io/uid:";
const TEXT_OWNER: &str = "proxyfleet.io/owner:";
const TEXT_CREATED_AT: &str = "proxyfleet.io/created-at:";

const LABEL_INSTALLATION: &str = "proxyfleet-installation";
const LABEL_UID: &str = "proxyfleet-uid";
const LABEL_NAMESPACE: &str = "proxyfleet-namespace";
const LABEL_NAME: &str = "proxyfleet-name";
const LABEL_CREATED_AT: &str = "proxyfleet-created-at";

/// The label keys [`OwnershipMark::to_labels`] writes, e.g. to filter a
/// backend's listing down to instances that carry a mark.
///
/// ```
/// use proxyfleet_sdk::{MARK_LABEL_KEYS, OwnershipMark};
///
/// let mark = OwnershipMark {
///     installation: "3f9a0c21d4e7".into(),
///     uid: "0b5bd7c4-5a54-4b7e-9d0c-1f3b8f3e2a11".into(),
///     namespace: "egress".into(),
///     name: "proxy-a".into(),
///     created_at: 1_767_225_600,
/// };
/// let labels = mark.to_labels().expect("the mark fits in labels");
/// let keys: Vec<&str> = labels.iter().map(|(key, _)| key.as_str()).collect();
/// assert_eq!(keys, MARK_LABEL_KEYS);
/// ```
pub const MARK_LABEL_KEYS: [&str; 5] =
    [LABEL_INSTALLATION, LABEL_UID, LABEL_NAMESPACE, LABEL_NAME, LABEL_CREATED_AT];

/// Longest label key or value GCP and Kubernetes accept.
const LABEL_MAX: usize = 63;

/// Hex digits of the hash that stands in for the tail of a name too long for
/// a label value.
const NAME_HASH_HEX: usize = 10;

/// A mark field that cannot be stored as a label value without losing it.
///
/// It converts into [`ProviderError::InvalidSpec`] with `?`.
///
/// ```
/// use proxyfleet_sdk::{LabelError, OwnershipMark};
///
/// let mark = OwnershipMark {
///     installation: "3f9a0c21d4e7".into(),
///     uid: "0b5bd7c4-5a54-4b7e-9d0c-1f3b8f3e2a11".into(),
///     namespace: "Egress Proxies".into(),
///     name: "proxy-a".into(),
///     created_at: 1_767_225_600,
/// };
/// assert_eq!(mark.to_labels(), Err(LabelError::Namespace("Egress Proxies".into())));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LabelError {
    /// The host hands out only valid installation IDs; this one is not.
    #[error(
        "installation `{0}` cannot be stored as a label value (needs 1-63 characters of [a-z0-9_-], starting and ending alphanumeric)"
    )]
    Installation(String),
    /// The UID is the mark's identity, so it is never shortened or hashed.
    #[error(
        "uid `{0}` cannot be stored as a label value (needs 1-63 characters of [a-z0-9_-], starting and ending alphanumeric)"
    )]
    Uid(String),
    /// Namespaces are DNS labels in Kubernetes, so they always fit there.
    #[error(
        "namespace `{0}` cannot be stored as a label value (needs 1-63 characters of [a-z0-9_-], starting and ending alphanumeric)"
    )]
    Namespace(String),
}

impl From<LabelError> for ProviderError {
    fn from(error: LabelError) -> Self {
        ProviderError::InvalidSpec(error.to_string())
    }
}

impl OwnershipMark {
    /// The mark for an instance created for `spec` at `created_at` (seconds
    /// since the Unix epoch, e.g. [`crate::now_unix`]).
    ///
    /// ```
    /// use proxyfleet_sdk::{Network, OwnershipMark, ProxySpec};
    ///
    /// let spec = ProxySpec {
    ///     installation: "3f9a0c21d4e7".into(),
    ///     name: "proxy-a".into(),
    ///     namespace: "egress".into(),
    ///     uid: "0b5bd7c4-5a54-4b7e-9d0c-1f3b8f3e2a11".into(),
    /// #   cores: 1,
    /// #   memory_mib: 512,
    /// #   disk_gib: 4,
    /// #   image: "debian-12".into(),
    /// #   placement: Vec::new(),
    /// #   network: Network { vlan_tag: None },
    /// #   port: 3128,
    /// #   user_data: Vec::new(),
    /// #   labels: Vec::new(),
    /// #   proxy_auth: None,
    ///     // ...
    /// };
    /// let mark = OwnershipMark::for_spec(&spec, 1_767_225_600);
    /// assert_eq!((mark.uid.as_str(), mark.name.as_str()), (spec.uid.as_str(), "proxy-a"));
    /// assert_eq!(mark.installation, "3f9a0c21d4e7");
    /// ```
    pub fn for_spec(spec: &ProxySpec, created_at: u64) -> Self {
        Self {
            installation: spec.installation.clone(),
            uid: spec.uid.clone(),
            namespace: spec.namespace.clone(),
            name: spec.name.clone(),
            created_at,
        }
    }

    /// The text encoding, four lines without a trailing newline:
    ///
    /// ```text
    /// proxyfleet.io/installation: 3f9a0c21d4e7
    /// proxyfleet.io/uid: 6f1c…
    /// proxyfleet.io/owner: <namespace>/<name>
    /// proxyfleet.io/created-at: 1767225600
    /// ```
    ///
    /// Kubernetes UIDs, namespaces and names contain no whitespace or `/`
    /// (the namespace), which is what keeps this decodable.
    ///
    /// ```
    /// use proxyfleet_sdk::OwnershipMark;
    ///
    /// let mark = OwnershipMark {
    ///     installation: "3f9a0c21d4e7".into(),
    ///     uid: "0b5bd7c4-5a54-4b7e-9d0c-1f3b8f3e2a11".into(),
    ///     namespace: "egress".into(),
    ///     name: "proxy-a".into(),
    ///     created_at: 1_767_225_600,
    /// };
    /// let notes = format!("Managed by proxyfleet.\n{}", mark.to_text());
    /// assert!(notes.contains("proxyfleet.io/owner: egress/proxy-a"));
    /// assert_eq!(OwnershipMark::from_text(&notes), Some(mark));
    /// ```
    pub fn to_text(&self) -> String {
        format!(
            "{TEXT_INSTALLATION} {}\n{TEXT_UID} {}\n{TEXT_OWNER} {}/{}\n{TEXT_CREATED_AT} {}",
            self.installation, self.uid, self.namespace, self.name, self.created_at
        )
    }

    /// Finds a mark written by [`Self::to_text`] in `text`, tolerating other
    /// lines around it, text before the key on its line (a comment marker,
    /// indentation), `\r\n` line ends, and the lines in any order. The first
    /// occurrence of each key wins. `None` when the UID, owner or creation
    /// time is missing or malformed; a missing installation reads as empty.
    ///
    /// ```
    /// use proxyfleet_sdk::OwnershipMark;
    ///
    /// let description = concat!(
    ///     "web proxy\r\n",
    ///     "# proxyfleet.io/owner: egress/proxy-a\r\n",
    ///     "# proxyfleet.io/uid: 0b5bd7c4-5a54-4b7e-9d0c-1f3b8f3e2a11\r\n",
    ///     "# proxyfleet.io/created-at: 1767225600\r\n",
    /// );
    /// let mark = OwnershipMark::from_text(description).expect("a mark");
    /// assert_eq!(mark.namespace, "egress");
    /// assert_eq!(mark.installation, "", "written before marks carried one");
    /// assert_eq!(OwnershipMark::from_text("a VM of someone else's"), None);
    /// ```
    pub fn from_text(text: &str) -> Option<Self> {
        let uid = text_value(text, TEXT_UID).filter(|uid| !uid.contains(char::is_whitespace))?;
        let installation = text_value(text, TEXT_INSTALLATION)
            .filter(|id| !id.contains(char::is_whitespace))
            .unwrap_or_default();
        let (namespace, name) = text_value(text, TEXT_OWNER)?.split_once('/')?;
        let created_at = text_value(text, TEXT_CREATED_AT)?.parse().ok()?;
        let well_formed = |part: &str| !part.is_empty() && !part.contains(char::is_whitespace);
        if !(well_formed(namespace) && well_formed(name)) {
            return None;
        }
        Some(Self {
            installation: installation.to_owned(),
            uid: uid.to_owned(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            created_at,
        })
    }

    /// The label encoding: [`MARK_LABEL_KEYS`] with values that are valid
    /// GCP and Kubernetes label values.
    ///
    /// The UID and namespace are stored as they are and must fit (Kubernetes
    /// UIDs and namespaces always do). The name may be a DNS subdomain of up
    /// to 253 characters: dots become underscores (reversed on decode), and
    /// a name still too long is cut and given a hash suffix, so it comes back
    /// shortened. Compare marks by UID.
    ///
    /// ```
    /// use proxyfleet_sdk::OwnershipMark;
    ///
    /// let mark = OwnershipMark {
    ///     installation: "3f9a0c21d4e7".into(),
    ///     uid: "0b5bd7c4-5a54-4b7e-9d0c-1f3b8f3e2a11".into(),
    ///     namespace: "egress".into(),
    ///     name: "proxy.eu-west".into(),
    ///     created_at: 1_767_225_600,
    /// };
    /// let labels = mark.to_labels()?;
    /// assert!(labels.contains(&("proxyfleet-name".into(), "proxy_eu-west".into())));
    /// # Ok::<(), proxyfleet_sdk::LabelError>(())
    /// ```
    pub fn to_labels(&self) -> Result<Vec<(String, String)>, LabelError> {
        if !is_label_value(&self.installation) {
            return Err(LabelError::Installation(self.installation.clone()));
        }
        if !is_label_value(&self.uid) {
            return Err(LabelError::Uid(self.uid.clone()));
        }
        if !is_label_value(&self.namespace) {
            return Err(LabelError::Namespace(self.namespace.clone()));
        }
        Ok(vec![
            (LABEL_INSTALLATION.to_owned(), self.installation.clone()),
            (LABEL_UID.to_owned(), self.uid.clone()),
            (LABEL_NAMESPACE.to_owned(), self.namespace.clone()),
            (LABEL_NAME.to_owned(), name_label(&self.name)),
            (LABEL_CREATED_AT.to_owned(), self.created_at.to_string()),
        ])
    }

    /// The mark as the attributes of an element in a libvirt domain's
    /// `<metadata>`, with the provider entry that owns the domain (several
    /// entries may share a hypervisor). Values are escaped.
    ///
    /// ```
    /// use proxyfleet_sdk::OwnershipMark;
    ///
    /// let mark = OwnershipMark {
    ///     installation: "3f9a0c21d4e7".into(),
    ///     uid: "0b5bd7c4".into(),
    ///     namespace: "egress".into(),
    ///     name: "proxy-1".into(),
    ///     created_at: 1_767_225_600,
    /// };
    /// let element = format!("<pf:owner xmlns:pf='urn:example' {}/>", mark.to_xml_attributes("lab"));
    /// assert!(element.contains(r#"entry="lab" installation="3f9a0c21d4e7" uid="0b5bd7c4""#));
    /// ```
    pub fn to_xml_attributes(&self, entry: &str) -> String {
        use crate::xml::escape;
        format!(
            "entry=\"{}\" installation=\"{}\" uid=\"{}\" namespace=\"{}\" name=\"{}\" created-at=\"{}\"",
            escape(entry),
            escape(&self.installation),
            escape(&self.uid),
            escape(&self.namespace),
            escape(&self.name),
            self.created_at
        )
    }

    /// The entry and mark of an element written with
    /// [`Self::to_xml_attributes`], as libvirt hands it back (its own
    /// quotes and namespace prefix); `None` when it is not a complete mark.
    /// A missing installation reads as empty.
    ///
    /// ```
    /// use proxyfleet_sdk::OwnershipMark;
    ///
    /// let element = "<owner xmlns='urn:example' entry='lab' installation='i' uid='u' \
    ///                namespace='egress' name='proxy-1' created-at='7'/>";
    /// let (entry, mark) = OwnershipMark::from_xml_attributes(element).expect("a mark");
    /// assert_eq!((entry.as_str(), mark.uid.as_str(), mark.created_at), ("lab", "u", 7));
    /// assert_eq!(OwnershipMark::from_xml_attributes("<owner entry='lab'/>"), None);
    /// ```
    pub fn from_xml_attributes(xml: &str) -> Option<(String, Self)> {
        use crate::xml::attribute;
        let entry = attribute(xml, "entry")?;
        let mark = Self {
            installation: attribute(xml, "installation").unwrap_or_default(),
            uid: attribute(xml, "uid")?,
            namespace: attribute(xml, "namespace")?,
            name: attribute(xml, "name")?,
            created_at: attribute(xml, "created-at")?.parse().ok()?,
        };
        let complete =
            [&entry, &mark.uid, &mark.namespace, &mark.name].iter().all(|v| !v.is_empty());
        complete.then_some((entry, mark))
    }

    /// Reads a mark back from labels written by [`Self::to_labels`]; other
    /// labels are ignored. `None` when a mark label is missing or malformed;
    /// a missing installation label reads as empty.
    ///
    /// For a slice of pairs pass `labels.iter().map(|(k, v)| (k, v))`.
    ///
    /// ```
    /// use std::collections::HashMap;
    /// use proxyfleet_sdk::OwnershipMark;
    ///
    /// let mark = OwnershipMark {
    ///     installation: "3f9a0c21d4e7".into(),
    ///     uid: "0b5bd7c4-5a54-4b7e-9d0c-1f3b8f3e2a11".into(),
    ///     namespace: "egress".into(),
    ///     name: "proxy.eu-west".into(),
    ///     created_at: 1_767_225_600,
    /// };
    /// // Labels as a backend returns them, with some of the user's own.
    /// let mut labels: HashMap<String, String> = mark.to_labels()?.into_iter().collect();
    /// labels.insert("team".into(), "crawl".into());
    /// assert_eq!(OwnershipMark::from_labels(&labels), Some(mark));
    /// assert_eq!(OwnershipMark::from_labels([("team", "crawl")]), None);
    /// # Ok::<(), proxyfleet_sdk::LabelError>(())
    /// ```
    pub fn from_labels<K, V>(labels: impl IntoIterator<Item = (K, V)>) -> Option<Self>
    where
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let (mut uid, mut namespace, mut name, mut created_at) = (None, None, None, None);
        let mut installation = String::new();
        for (key, value) in labels {
            let value = value.as_ref();
            match key.as_ref() {
                LABEL_INSTALLATION => value.clone_into(&mut installation),
                LABEL_UID => uid = Some(value.to_owned()),
                LABEL_NAMESPACE => namespace = Some(value.to_owned()),
                LABEL_NAME => name = Some(value.replace('_', ".")),
                LABEL_CREATED_AT => created_at = Some(value.parse().ok()?),
                _ => {}
            }
        }
        let mark = Self {
            installation,
            uid: uid?,
            namespace: namespace?,
            name: name?,
            created_at: created_at?,
        };
        (!mark.uid.is_empty() && !mark.namespace.is_empty() && !mark.name.is_empty())
            .then_some(mark)
    }
}

/// The trimmed rest of the first line that contains `key`.
fn text_value<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines().find_map(|line| {
        let start = line.find(key)? + key.len();
        Some(line[start..].trim()).filter(|value| !value.is_empty())
    })
}

/// A value both GCP (`[a-z0-9_-]{0,63}`) and Kubernetes (alphanumeric at both
/// ends) accept, and not empty.
fn is_label_value(value: &str) -> bool {
    let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-';
    let alphanumeric = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    !value.is_empty()
        && value.len() <= LABEL_MAX
        && value.chars().all(allowed)
        && value.starts_with(alphanumeric)
        && value.ends_with(alphanumeric)
}

fn name_label(name: &str) -> String {
    let mapped: String = name
        .chars()
        .map(|c| match c {
            '.' => '_',
            c if c.is_ascii_alphanumeric() => c.to_ascii_lowercase(),
            '-' | '_' => c,
            _ => '-',
        })
        .collect();
    if mapped == name.replace('.', "_") && is_label_value(&mapped) {
        return mapped;
    }
    // Lossy: keep a readable head and make it unique with a hash of the
    // whole name. The head stays alphanumeric at its end after trimming.
    let digest = hex(&Sha256::digest(name.as_bytes()));
    let head_len = LABEL_MAX - NAME_HASH_HEX - 1;
    let head: String = mapped.chars().take(head_len).collect();
    let head = head.trim_matches(|c: char| c == '-' || c == '_');
    if head.is_empty() {
        format!("h{}", &digest[..NAME_HASH_HEX])
    } else {
        format!("{head}-{}", &digest[..NAME_HASH_HEX])
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        // Writing to a String cannot fail.
        let _ = write!(out, "{byte:02x}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Network;

    fn mark() -> OwnershipMark {
        OwnershipMark {
            installation: "3f9a0c21d4e7".into(),
            uid: "0b5bd7c4-5a54-4b7e-9d0c-1f3b8f3e2a11".into(),
            namespace: "egress".into(),
            name: "proxy-a".into(),
            created_at: 1_767_225_600,
        }
    }

    #[test]
    fn for_spec_copies_identity() {
        let spec = ProxySpec {
            installation: "prod".into(),
            name: "p".into(),
            namespace: "ns".into(),
            uid: "u".into(),
            cores: 1,
            memory_mib: 512,
            disk_gib: 8,
            image: "debian".into(),
            placement: Vec::new(),
            network: Network { vlan_tag: None },
            port: 3128,
            user_data: Vec::new(),
            labels: Vec::new(),
            proxy_auth: None,
        };
        let mark = OwnershipMark::for_spec(&spec, 42);
        assert_eq!(
            (mark.uid.as_str(), mark.namespace.as_str(), mark.name.as_str()),
            ("u", "ns", "p")
        );
        assert_eq!(mark.created_at, 42);
        assert_eq!(mark.installation, "prod");
    }

    #[test]
    fn text_round_trips() {
        let text = mark().to_text();
        assert_eq!(
            text,
            "proxyfleet.io/installation: 3f9a0c21d4e7\n\
             proxyfleet.io/uid: 0b5bd7c4-5a54-4b7e-9d0c-1f3b8f3e2a11\n\
             proxyfleet.io/owner: egress/proxy-a\n\
             proxyfleet.io/created-at: 1767225600"
        );
        assert_eq!(OwnershipMark::from_text(&text), Some(mark()));
    }

    #[test]
    fn text_is_found_among_other_text() {
        let description = format!(
            "Managed by the network team.\r\n\r\n# {}\r\nDo not edit.\r\n",
            mark().to_text().replace('\n', "\r\n# ")
        );
        assert_eq!(OwnershipMark::from_text(&description), Some(mark()));

        let reordered = "proxyfleet.io/created-at: 1767225600\n\
                         notes\n\
                         proxyfleet.io/owner: egress/proxy-a\n\
                         proxyfleet.io/uid: 0b5bd7c4-5a54-4b7e-9d0c-1f3b8f3e2a11\n\
                         proxyfleet.io/installation: 3f9a0c21d4e7";
        assert_eq!(OwnershipMark::from_text(reordered), Some(mark()));
    }

    #[test]
    fn a_mark_written_before_installations_reads_with_an_empty_one() {
        let old = "proxyfleet.io/uid: u\nproxyfleet.io/owner: a/b\nproxyfleet.io/created-at: 1";
        let mark = OwnershipMark::from_text(old).expect("still a mark");
        assert_eq!((mark.installation.as_str(), mark.uid.as_str()), ("", "u"));
        let labels = [
            ("proxyfleet-uid", "u"),
            ("proxyfleet-namespace", "n"),
            ("proxyfleet-name", "p"),
            ("proxyfleet-created-at", "1"),
        ];
        assert_eq!(OwnershipMark::from_labels(labels).expect("a mark").installation, "");
    }

    #[test]
    fn text_without_a_complete_mark_is_not_ours() {
        assert_eq!(OwnershipMark::from_text(""), None);
        assert_eq!(OwnershipMark::from_text("a VM someone made by hand"), None);
        let without_owner = "proxyfleet.io/uid: u\nproxyfleet.io/created-at: 1";
        assert_eq!(OwnershipMark::from_text(without_owner), None);
        let bad_time =
            "proxyfleet.io/uid: u\nproxyfleet.io/owner: a/b\nproxyfleet.io/created-at: soon";
        assert_eq!(OwnershipMark::from_text(bad_time), None);
        let bad_owner =
            "proxyfleet.io/uid: u\nproxyfleet.io/owner: ab\nproxyfleet.io/created-at: 1";
        assert_eq!(OwnershipMark::from_text(bad_owner), None);
    }

    #[test]
    fn labels_round_trip() {
        let labels = mark().to_labels().expect("a Kubernetes mark fits");
        for (key, value) in &labels {
            assert!(is_label_value(key), "{key}");
            assert!(is_label_value(value), "{value}");
        }
        let mut with_others = vec![("team".to_owned(), "net".to_owned())];
        with_others.extend(labels);
        let decoded = OwnershipMark::from_labels(with_others.iter().map(|(k, v)| (k, v)));
        assert_eq!(decoded, Some(mark()));
    }

    #[test]
    fn dotted_names_round_trip_through_labels() {
        let dotted = OwnershipMark { name: "proxy.eu-west.example".into(), ..mark() };
        let labels = dotted.to_labels().expect("fits");
        assert_eq!(OwnershipMark::from_labels(labels), Some(dotted));
    }

    #[test]
    fn long_names_are_shortened_with_a_hash() {
        let long = OwnershipMark { name: format!("{}.example.com", "a".repeat(100)), ..mark() };
        let other = OwnershipMark { name: format!("{}.example.org", "a".repeat(100)), ..mark() };
        let value = |mark: &OwnershipMark| {
            mark.to_labels()
                .expect("fits")
                .into_iter()
                .find(|(key, _)| key == LABEL_NAME)
                .map(|(_, value)| value)
                .expect("name label")
        };
        let (long_value, other_value) = (value(&long), value(&other));
        assert!(is_label_value(&long_value), "{long_value}");
        assert_eq!(long_value.len(), LABEL_MAX);
        assert_ne!(long_value, other_value);
        assert_eq!(long_value, value(&long), "deterministic");
    }

    #[test]
    fn identity_fields_that_do_not_fit_are_refused() {
        let unnamed = OwnershipMark { installation: String::new(), ..mark() };
        assert_eq!(unnamed.to_labels(), Err(LabelError::Installation(String::new())));
        let upper = OwnershipMark { uid: "UID-1".into(), ..mark() };
        assert_eq!(upper.to_labels(), Err(LabelError::Uid("UID-1".into())));
        let bad_namespace = OwnershipMark { namespace: "-x".into(), ..mark() };
        assert!(matches!(bad_namespace.to_labels(), Err(LabelError::Namespace(_))));
        assert!(matches!(
            ProviderError::from(LabelError::Uid("U".into())),
            ProviderError::InvalidSpec(_)
        ));
    }

    #[test]
    fn incomplete_labels_are_not_a_mark() {
        let labels = [("proxyfleet-uid", "u"), ("proxyfleet-namespace", "n")];
        assert_eq!(OwnershipMark::from_labels(labels), None);
        let bad_time = [
            ("proxyfleet-uid", "u"),
            ("proxyfleet-namespace", "n"),
            ("proxyfleet-name", "p"),
            ("proxyfleet-created-at", "x"),
        ];
        assert_eq!(OwnershipMark::from_labels(bad_time), None);
    }

    #[test]
    fn an_xml_mark_survives_libvirts_rewriting_and_escapes() {
        let element = format!("<owner {}/>", mark().to_xml_attributes("kvm&lab"));
        assert_eq!(
            OwnershipMark::from_xml_attributes(&element),
            Some(("kvm&lab".to_owned(), mark()))
        );
        // libvirt hands the element back with its namespace and its own quoting.
        let single = "<owner xmlns='https://proxyfleet.io/xmlns/kvm/1' entry='a&amp;b' \
                      uid='u' namespace='n' name='x' created-at='7'/>";
        let (entry, parsed) = OwnershipMark::from_xml_attributes(single).expect("valid");
        assert_eq!((entry.as_str(), parsed.uid.as_str(), parsed.created_at), ("a&b", "u", 7));
        assert_eq!(parsed.installation, "", "marked before installations");
        let incomplete = "<owner entry='e' uid='' namespace='n' name='x' created-at='1'/>";
        assert_eq!(OwnershipMark::from_xml_attributes(incomplete), None);
    }
}
