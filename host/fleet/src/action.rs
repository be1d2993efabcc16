//! Operators' actions on the fleet, as the mode records them: an Event on
//! the object (Kubernetes) or a line of the state log (standalone). Each
//! names what was done, to which Proxy or entry, and says it in a sentence.

use serde::{Deserialize, Serialize};

/// A Proxy an action concerns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProxyRef {
    /// The Proxy's UID.
    pub id: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl ProxyRef {
    /// `namespace/name`.
    pub fn qualified(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// What an operator did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "camelCase")]
pub enum Action {
    /// Kept a proxy out of the gateway's and `next`'s choices.
    Quarantine {
        /// The proxy.
        proxy: ProxyRef,
        /// Only for this site; every site when `None`.
        site: Option<String>,
        /// For how long.
        minutes: u64,
    },
    /// Put a quarantined or banned proxy back.
    PutBack {
        /// The proxy.
        proxy: ProxyRef,
        /// Only for this site; everywhere when `None`.
        site: Option<String>,
    },
    /// Released a crawler's lease.
    ReleaseLease {
        /// The lease.
        lease: String,
        /// The proxy it held, when known.
        proxy: Option<ProxyRef>,
    },
    /// Asked for a new instance in place of a Proxy's current one.
    Replace {
        /// The proxy.
        proxy: ProxyRef,
    },
    /// Brought back an entry's previous plugin build.
    Rollback {
        /// The provider entry.
        entry: String,
    },
}

impl Action {
    /// The Proxy it concerns, if any.
    pub fn proxy(&self) -> Option<&ProxyRef> {
        match self {
            Self::Quarantine { proxy, .. }
            | Self::PutBack { proxy, .. }
            | Self::Replace { proxy } => Some(proxy),
            Self::ReleaseLease { proxy, .. } => proxy.as_ref(),
            Self::Rollback { .. } => None,
        }
    }

    /// The entry it concerns, if it concerns an entry rather than a Proxy.
    pub fn entry(&self) -> Option<&str> {
        match self {
            Self::Rollback { entry } => Some(entry),
            _ => None,
        }
    }

    /// A Kubernetes Event's reason for it: CamelCase.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Quarantine { .. } => "OperatorQuarantined",
            Self::PutBack { .. } => "OperatorPutBack",
            Self::ReleaseLease { .. } => "OperatorReleasedLease",
            Self::Replace { .. } => "OperatorReplaced",
            Self::Rollback { .. } => "OperatorRolledBack",
        }
    }

    /// What was done, as a sentence for people.
    pub fn note(&self) -> String {
        let site = |site: &Option<String>| {
            site.as_deref().map_or_else(|| "every site".to_owned(), |site| format!("site {site}"))
        };
        match self {
            Self::Quarantine { proxy, site: s, minutes } => format!(
                "{} quarantined for {} for {minutes} min by an operator",
                proxy.qualified(),
                site(s)
            ),
            Self::PutBack { proxy, site: s } => {
                format!("{} put back for {} by an operator", proxy.qualified(), site(s))
            }
            Self::ReleaseLease { lease, proxy } => match proxy {
                Some(proxy) => {
                    format!("lease {lease} on {} released by an operator", proxy.qualified())
                }
                None => format!("lease {lease} released by an operator"),
            },
            Self::Replace { proxy } => format!(
                "{} gets a new instance in place of its current one, asked by an operator",
                proxy.qualified()
            ),
            Self::Rollback { entry } => {
                format!("provider entry {entry} rolled back to its previous build by an operator")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proxy() -> ProxyRef {
        ProxyRef { id: "uid-1".into(), namespace: "crawl".into(), name: "p-1".into() }
    }

    #[test]
    fn an_action_names_its_object_and_says_what_was_done() {
        let quarantine =
            Action::Quarantine { proxy: proxy(), site: Some("example.com".into()), minutes: 30 };
        assert_eq!(quarantine.proxy(), Some(&proxy()));
        assert_eq!(quarantine.reason(), "OperatorQuarantined");
        assert_eq!(
            quarantine.note(),
            "crawl/p-1 quarantined for site example.com for 30 min by an operator"
        );
        let rollback = Action::Rollback { entry: "lab".into() };
        assert_eq!((rollback.proxy(), rollback.entry()), (None, Some("lab")));
        // The state log keeps them as JSON, tagged by kind.
        let json = serde_json::to_value(&Action::Replace { proxy: proxy() }).unwrap();
        assert_eq!(json["action"], "replace");
        assert_eq!(
            serde_json::from_value::<Action>(json).unwrap(),
            Action::Replace { proxy: proxy() }
        );
    }
}
