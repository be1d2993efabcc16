//! Bounds on what a plugin returns: every string and list of an answer
//! has a size past which the host refuses the answer, checked before the
//! host copies, redacts, logs or stores any of it.
//!
//! What a plugin returns goes on: an instance's id into the Proxy's
//! status and every later call's span and log lines, the plugin's name and
//! version into every status and span, messages into conditions and
//! Events. Without a bound, one answer of 1 MiB costs that much in every
//! one of them, for as long as the Proxy lives. The bounds leave room for
//! what real backends answer (see each constant); an answer over one is
//! refused as `plugin-fault`, with a message naming the field and its
//! bound and never quoting the value.
//!
//! `docs/plugin-contract.md` ("What the host accepts back") lists them.

use crate::bindings::types as wit;

/// An instance's `provider-id`: room for a host, node or zone name of up
/// to 253 bytes (a DNS name), a separator and a name of up to 253 after
/// it, as ids of the form `host/domain`, `namespace/pod` and `zone/name`
/// are (the longest of the plugins' own is about 320 bytes).
pub(crate) const MAX_ID_BYTES: usize = 512;
/// An instance's `name`: as an id, since some plugins use the id as the
/// name (`host:port` of a static endpoint); backends' own names are at
/// most 253 bytes (a Kubernetes object, a DNS name).
pub(crate) const MAX_NAME_BYTES: usize = 512;
/// One address of an instance: an IP literal (at most 45 bytes, plus a
/// zone) or a DNS name (at most 253 bytes).
pub(crate) const MAX_ADDRESS_BYTES: usize = 253;
/// Addresses of one instance: a machine with eight interfaces, each with
/// an IPv4, an external IPv4 and a few IPv6 addresses, stays well within.
pub(crate) const MAX_ADDRESSES: usize = 64;
/// The mark's `installation`: its own format is 1 to 32 characters of
/// `[a-z0-9-]` (or empty, for marks written before it existed).
pub(crate) const MAX_MARK_INSTALLATION_BYTES: usize = 32;
/// The mark's `uid`: a Kubernetes UID is 36 bytes.
pub(crate) const MAX_MARK_UID_BYTES: usize = 128;
/// The mark's `namespace` and `name`: Kubernetes names are at most 253
/// bytes.
pub(crate) const MAX_MARK_NAME_BYTES: usize = 253;
/// Instances in one `list` answer: ten times the largest fleet measured
/// on one entry (`docs/sizing.md`, 10,000 Proxies). A longer list is
/// refused whole, never cut: a partial list would read as "these are all".
pub(crate) const MAX_LIST_INSTANCES: usize = 100_000;
/// Issues in one `check` answer.
pub(crate) const MAX_HEALTH_ISSUES: usize = 64;
/// A message: of an error a plugin answers with, or of a health issue.
/// The SDK quotes at most 200 characters of a backend's answer in one.
pub(crate) const MAX_MESSAGE_BYTES: usize = 4096;
/// The plugin's `name` in `describe`, as statuses, metrics and every
/// call's span carry it.
pub(crate) const MAX_PLUGIN_NAME_BYTES: usize = 64;
/// The plugin's `version` and `contract-version` in `describe`: a semantic
/// version with pre-release and build parts.
pub(crate) const MAX_PLUGIN_VERSION_BYTES: usize = 64;
/// The `config-schema` in `describe`: a JSON Schema for people to read.
pub(crate) const MAX_CONFIG_SCHEMA_BYTES: usize = 256 << 10;
/// HTTP destinations `describe` may ask for.
pub(crate) const MAX_HTTP_DESTINATIONS: usize = 256;
/// A destination's host (a DNS name) and scheme.
pub(crate) const MAX_DESTINATION_HOST_BYTES: usize = 253;

/// A field of an answer over its bound. It names the field and the bound,
/// never the value, which may be what the bound keeps out of the logs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Oversize {
    /// A string longer than its bound.
    #[error("the plugin returned {field} of {size} bytes, over the bound of {bound} bytes")]
    Bytes {
        /// The field, as the contract names it (`instance.provider-id`).
        field: String,
        /// Its size.
        size: usize,
        /// Its bound.
        bound: usize,
    },
    /// A list longer than its bound.
    #[error("the plugin returned {count} {items}, over the bound of {bound}")]
    Count {
        /// What was counted (`instances in list`).
        items: &'static str,
        /// How many there were.
        count: usize,
        /// The bound.
        bound: usize,
    },
}

/// `value` within `bound` bytes, or the field it is named by `field`.
fn within(value: &str, bound: usize, field: impl FnOnce() -> String) -> Result<(), Oversize> {
    if value.len() > bound {
        return Err(Oversize::Bytes { field: field(), size: value.len(), bound });
    }
    Ok(())
}

fn at_most(count: usize, bound: usize, items: &'static str) -> Result<(), Oversize> {
    if count > bound {
        return Err(Oversize::Count { items, count, bound });
    }
    Ok(())
}

/// An instance of `create`, `get` or `list`.
pub(crate) fn check_instance(instance: &wit::Instance) -> Result<(), Oversize> {
    within(&instance.provider_id, MAX_ID_BYTES, || "instance.provider-id".into())?;
    within(&instance.name, MAX_NAME_BYTES, || "instance.name".into())?;
    at_most(instance.addresses.len(), MAX_ADDRESSES, "addresses in instance.addresses")?;
    for (i, address) in instance.addresses.iter().enumerate() {
        within(address, MAX_ADDRESS_BYTES, || format!("instance.addresses[{i}]"))?;
    }
    if let Some(mark) = &instance.mark {
        within(&mark.installation, MAX_MARK_INSTALLATION_BYTES, || {
            "instance.mark.installation".into()
        })?;
        within(&mark.uid, MAX_MARK_UID_BYTES, || "instance.mark.uid".into())?;
        within(&mark.namespace, MAX_MARK_NAME_BYTES, || "instance.mark.namespace".into())?;
        within(&mark.name, MAX_MARK_NAME_BYTES, || "instance.mark.name".into())?;
    }
    Ok(())
}

/// The length of a `list` answer.
pub(crate) fn check_list_len(count: usize) -> Result<(), Oversize> {
    at_most(count, MAX_LIST_INSTANCES, "instances in list")
}

/// A `check` answer.
pub(crate) fn check_health(health: &wit::Health) -> Result<(), Oversize> {
    at_most(health.issues.len(), MAX_HEALTH_ISSUES, "issues in health.issues")?;
    for (i, issue) in health.issues.iter().enumerate() {
        within(&issue.message, MAX_MESSAGE_BYTES, || format!("health.issues[{i}].message"))?;
    }
    Ok(())
}

/// The message of an error a plugin answered with; `class` is the error's
/// case (`not-found`).
pub(crate) fn check_error_message(message: &str, class: &str) -> Result<(), Oversize> {
    within(message, MAX_MESSAGE_BYTES, || format!("the message of a `{class}` error"))
}

/// What `describe` answered.
pub(crate) fn check_plugin_info(info: &wit::PluginInfo) -> Result<(), Oversize> {
    within(&info.name, MAX_PLUGIN_NAME_BYTES, || "plugin-info.name".into())?;
    within(&info.version, MAX_PLUGIN_VERSION_BYTES, || "plugin-info.version".into())?;
    within(&info.contract_version, MAX_PLUGIN_VERSION_BYTES, || {
        "plugin-info.contract-version".into()
    })?;
    within(&info.config_schema, MAX_CONFIG_SCHEMA_BYTES, || "plugin-info.config-schema".into())?;
    let http = &info.capabilities.http;
    at_most(http.len(), MAX_HTTP_DESTINATIONS, "destinations in plugin-info.capabilities.http")?;
    for (i, destination) in http.iter().enumerate() {
        within(&destination.host, MAX_DESTINATION_HOST_BYTES, || {
            format!("plugin-info.capabilities.http[{i}].host")
        })?;
        within(&destination.scheme, MAX_DESTINATION_HOST_BYTES, || {
            format!("plugin-info.capabilities.http[{i}].scheme")
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instance(provider_id: &str) -> wit::Instance {
        wit::Instance {
            provider_id: provider_id.to_owned(),
            name: "proxy-1".to_owned(),
            state: wit::InstanceState::Running,
            addresses: vec!["10.0.0.7".to_owned()],
            port: None,
            created_at: None,
            mark: Some(wit::OwnershipMark {
                installation: "prod-eu".to_owned(),
                uid: "0f6c3b1e-5d6a-4c1b-9d3e-2a7f8b9c0d1e".to_owned(),
                namespace: "crawl".to_owned(),
                name: "web-1".to_owned(),
                created_at: 1,
            }),
        }
    }

    /// Issue 43, item 10: a provider id of 1 MiB was stored, and every
    /// later call of its Proxy logged it (9.4 MB per call). It is refused,
    /// named with its bound, and not quoted.
    #[test]
    fn issue_43_item_10_an_id_of_1_mib_is_refused_naming_the_field_not_quoting_it() {
        let huge = "i".repeat(1 << 20);
        let err = check_instance(&instance(&huge)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the plugin returned instance.provider-id of 1048576 bytes, over the bound of 512 bytes"
        );
        assert!(!err.to_string().contains("iiii"));
    }

    /// The longest ids and names the plugins make pass: `host/domain`
    /// (kvm), `namespace/pod` (kubernetes), `host:port` (static).
    #[test]
    fn what_real_backends_answer_fits() {
        let dns_name = format!("{}.lan", "h".repeat(249));
        assert_eq!(dns_name.len(), 253);
        for id in [
            format!("{dns_name}/pf-{}", "a".repeat(60)),
            format!("{}/{}", "n".repeat(63), "p".repeat(253)),
            format!("{dns_name}:65535"),
            format!("[{}]:8080", "ffff:".repeat(7) + "ffff"),
        ] {
            let mut answer = instance(&id);
            answer.name.clone_from(&id);
            answer.addresses = (0..MAX_ADDRESSES).map(|_| dns_name.clone()).collect();
            check_instance(&answer).unwrap_or_else(|err| panic!("{id}: {err}"));
        }
    }

    #[test]
    fn every_field_of_an_instance_is_bounded() {
        fn over(bytes: usize) -> String {
            "x".repeat(bytes + 1)
        }
        fn mark(instance: &mut wit::Instance) -> &mut wit::OwnershipMark {
            instance.mark.as_mut().expect("a mark")
        }
        type Change = fn(&mut wit::Instance);
        let cases: [(&str, Change); 7] = [
            ("instance.name", |i| i.name = over(MAX_NAME_BYTES)),
            ("instance.addresses[1]", |i| i.addresses.push(over(MAX_ADDRESS_BYTES))),
            ("addresses in instance.addresses", |i| {
                i.addresses = vec!["10.0.0.1".to_owned(); MAX_ADDRESSES + 1];
            }),
            ("instance.mark.installation", |i| {
                mark(i).installation = over(MAX_MARK_INSTALLATION_BYTES);
            }),
            ("instance.mark.uid", |i| mark(i).uid = over(MAX_MARK_UID_BYTES)),
            ("instance.mark.namespace", |i| mark(i).namespace = over(MAX_MARK_NAME_BYTES)),
            ("instance.mark.name", |i| mark(i).name = over(MAX_MARK_NAME_BYTES)),
        ];
        for (field, change) in cases {
            let mut answer = instance("pve1/101");
            check_instance(&answer).expect("the instance as it comes");
            change(&mut answer);
            let err = check_instance(&answer).expect_err(field).to_string();
            assert!(err.contains(field), "{field}: {err}");
            assert!(!err.contains("xxxx"), "the value is not quoted: {err}");
        }
    }

    #[test]
    fn a_list_is_bounded_as_a_whole() {
        check_list_len(MAX_LIST_INSTANCES).expect("at the bound");
        let err = check_list_len(MAX_LIST_INSTANCES + 1).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the plugin returned 100001 instances in list, over the bound of 100000"
        );
    }

    #[test]
    fn health_issues_and_messages_are_bounded() {
        let issue =
            |message: String| wit::HealthIssue { reason: wit::HealthReason::Other, message };
        let healthy = wit::Health { healthy: false, issues: vec![issue("x".repeat(4096))] };
        check_health(&healthy).expect("a message at the bound");
        let long = wit::Health { healthy: false, issues: vec![issue("x".repeat(4097))] };
        let err = check_health(&long).unwrap_err().to_string();
        assert!(err.contains("health.issues[0].message of 4097 bytes"), "{err}");
        let many = wit::Health { healthy: false, issues: vec![issue(String::new()); 65] };
        assert!(check_health(&many).unwrap_err().to_string().contains("65 issues"));
        let err = check_error_message(&"m".repeat(5000), "not-found").unwrap_err().to_string();
        assert!(err.contains("the message of a `not-found` error of 5000 bytes"), "{err}");
    }

    #[test]
    fn what_describe_answers_is_bounded() {
        let info = |name: String| wit::PluginInfo {
            name,
            version: "1.4.2-rc.1+git.0123456789abcdef".to_owned(),
            contract_version: "0.5.0".to_owned(),
            config_schema: "{}".to_owned(),
            capabilities: wit::Capabilities {
                http: vec![wit::HttpDestination {
                    scheme: "https".to_owned(),
                    host: "compute.googleapis.com".to_owned(),
                    port: None,
                }],
            },
        };
        check_plugin_info(&info("proxmox".to_owned())).expect("a plugin's own answer");
        let err = check_plugin_info(&info("p".repeat(1 << 20))).unwrap_err().to_string();
        assert!(err.contains("plugin-info.name of 1048576 bytes"), "{err}");
    }
}
