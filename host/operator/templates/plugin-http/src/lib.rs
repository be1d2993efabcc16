//! The `{{name}}` provider: each Proxy is an instance of the REST API at
//! the entry's endpoint (see `api.rs`), named after the Proxy's UID so that
//! a retried create finds what an earlier attempt made, and labelled with
//! the ownership mark so that `list` can tell ours from anyone else's.

mod api;
mod config;

use base64::Engine as _;
use proxyfleet_sdk::{
    CallContext, Capabilities, Health, Instance, InstanceState, OwnershipMark, PluginInfo,
    Provider, ProviderError, ProxySpec, Result, cloud_init, derive_name, export_provider, log,
    now_unix,
};
use serde_json::{Map, Value, json};

use crate::api::{Api, Created};
use crate::config::{Config, config_schema};

/// Longest instance name: a DNS label, which most APIs accept.
const NAME_MAX: usize = 63;

/// The label naming the provider entry that made an instance.
const ENTRY_LABEL: &str = "proxyfleet-entry";

struct Plugin;

impl Provider for Plugin {
    fn describe() -> PluginInfo {
        // The endpoint is config, so the entry's grants name it rather
        // than `describe`.
        PluginInfo::new(
            "{{name}}",
            env!("CARGO_PKG_VERSION"),
            config_schema(),
            Capabilities::default(),
        )
    }

    fn validate_config(config: &str) -> Result<()> {
        Config::parse(config).map(drop)
    }

    fn create(ctx: &CallContext, spec: &ProxySpec) -> Result<Instance> {
        let config = Config::parse(&ctx.config_json())?;
        // What this API cannot do is refused, never ignored.
        if let Some(tag) = spec.network.vlan_tag {
            return Err(ProviderError::InvalidSpec(format!(
                "network.vlanTag: {tag} cannot be served: the API has no VLANs"
            )));
        }
        if let Some((key, _)) = spec.placement.first() {
            return Err(ProviderError::InvalidSpec(format!(
                "placement.{key}: the API places instances itself; remove the key"
            )));
        }
        let api = Api::new(&config);
        let name = derive_name(&config.name_prefix, &spec.uid, NAME_MAX);
        // An earlier attempt may have made it before its answer was lost.
        if let Some(found) = api.find(&name)? {
            return adopt(&found, spec);
        }
        let mark = OwnershipMark::for_spec(spec, now_unix());
        let mut labels: Map<String, Value> = mark
            .to_labels()?
            .into_iter()
            .map(|(key, value)| (key, Value::String(value)))
            .collect();
        // Entries that share the API each list only their own instances.
        labels.insert(ENTRY_LABEL.to_owned(), Value::String(ctx.entry.clone()));
        // The proxy's credential travels in the user-data, where the proxy
        // reads it, and nowhere else.
        let user_data = cloud_init::user_data(&spec.user_data, spec.proxy_auth.as_ref())?;
        let body = json!({
            "name": name,
            "image": spec.image,
            "cores": spec.cores,
            "memoryMiB": spec.memory_mib,
            "diskGiB": spec.disk_gib,
            "port": spec.port,
            "userData": base64::engine::general_purpose::STANDARD.encode(user_data),
            "labels": labels,
        });
        log::info!("creating instance", name = name);
        match api.create(&body)? {
            // The mark written, whatever the API echoes of it.
            Created::Instance(created) => Ok(Instance {
                created_at: Some(mark.created_at),
                mark: Some(mark),
                ..instance(&created)?
            }),
            // Made meanwhile by another attempt: ours if it carries our mark.
            Created::Taken => match api.find(&name)? {
                Some(found) => adopt(&found, spec),
                None => Err(ProviderError::Transient(format!(
                    "instance {name} was reported to exist but is gone; retry"
                ))),
            },
        }
    }

    fn get(ctx: &CallContext, provider_id: &str) -> Result<Instance> {
        let config = Config::parse(&ctx.config_json())?;
        match Api::new(&config).find(provider_id)? {
            Some(found) => instance(&found),
            None => Err(ProviderError::NotFound(format!("instance {provider_id}"))),
        }
    }

    fn delete(ctx: &CallContext, provider_id: &str) -> Result<()> {
        let config = Config::parse(&ctx.config_json())?;
        Api::new(&config).delete(provider_id)?;
        log::info!("deleted instance", name = provider_id);
        Ok(())
    }

    fn list(ctx: &CallContext) -> Result<Vec<Instance>> {
        let config = Config::parse(&ctx.config_json())?;
        let listed = Api::new(&config).list()?;
        // Only instances with a mark, made by this entry: the rest are not
        // ours to show.
        listed
            .iter()
            .filter(|found| found["labels"][ENTRY_LABEL] == ctx.entry.as_str())
            .filter(|found| mark_of(found).is_some())
            .map(instance)
            .collect()
    }

    fn check(ctx: &CallContext) -> Health {
        let config = match Config::parse(&ctx.config_json()) {
            Ok(config) => config,
            Err(error) => {
                return Health::unhealthy(
                    proxyfleet_sdk::HealthReason::Misconfigured,
                    error.to_string(),
                );
            }
        };
        match Api::new(&config).health() {
            Ok(()) => Health::healthy(),
            Err(failure) => Health::unhealthy(failure.health_reason(), failure.to_string()),
        }
    }
}

export_provider!(Plugin);

/// The ownership mark an instance carries in its labels.
fn mark_of(found: &Value) -> Option<OwnershipMark> {
    let labels = found.get("labels")?.as_object()?;
    OwnershipMark::from_labels(
        labels
            .iter()
            .filter_map(|(key, value)| Some((key.as_str(), value.as_str()?))),
    )
}

/// The instance found under our name: ours when its mark names this
/// Proxy, someone else's otherwise.
fn adopt(found: &Value, spec: &ProxySpec) -> Result<Instance> {
    match mark_of(found) {
        Some(mark) if mark.uid == spec.uid => instance(found),
        _ => Err(ProviderError::Conflict(format!(
            "an instance named {} exists and is not this Proxy's",
            found["name"].as_str().unwrap_or_default()
        ))),
    }
}

/// The contract's view of an instance the API returned.
fn instance(found: &Value) -> Result<Instance> {
    let Some(name) = found.get("name").and_then(Value::as_str) else {
        return Err(ProviderError::Permanent(
            "the API returned an instance without a `name`".to_owned(),
        ));
    };
    let state = match found.get("state").and_then(Value::as_str) {
        Some("running") => InstanceState::Running,
        Some("stopped") => InstanceState::Stopped,
        Some("failed") => InstanceState::Failed,
        Some("deleting") => InstanceState::Deleting,
        _ => InstanceState::Provisioning,
    };
    let mark = mark_of(found);
    Ok(Instance {
        provider_id: name.to_owned(),
        name: name.to_owned(),
        state,
        addresses: found
            .get("address")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .into_iter()
            .collect(),
        // The Proxy's port: the API does not change it.
        port: None,
        created_at: mark.as_ref().map(|mark| mark.created_at),
        mark,
    })
}

/// The provider as the operator drives it, natively: the API is a map
/// behind `proxyfleet-sdk-testkit`'s route.
#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::collections::BTreeMap;
    use std::rc::Rc;

    use proxyfleet_sdk::HttpDestination;
    use proxyfleet_sdk::http::Method;
    use proxyfleet_sdk_testkit::{Reply, TestKit, spec_with_auth};

    use super::*;

    const ENDPOINT: &str = "https://backend.test";

    fn config() -> Value {
        json!({ "endpoint": ENDPOINT })
    }

    /// A kit whose API keeps instances in a map, as `backend.yaml` does.
    fn kit() -> (TestKit<Plugin>, Rc<RefCell<BTreeMap<String, Value>>>) {
        let kit = TestKit::<Plugin>::new(&config()).expect("a valid config");
        kit.grant(HttpDestination::https("backend.test", None));
        let instances: Rc<RefCell<BTreeMap<String, Value>>> = Rc::default();
        let api = Rc::clone(&instances);
        kit.route(move |request| {
            let path = request.url.strip_prefix(&format!("{ENDPOINT}/v1/"))?;
            let mut instances = api.borrow_mut();
            let missing = || Reply::json(404, &json!({ "error": "not found" }));
            Some(match (request.method, path.strip_prefix("instances")) {
                (Method::Get, _) if path == "health" => Reply::status(200),
                (Method::Get, Some("")) => Reply::json(
                    200,
                    &json!({ "items": instances.values().collect::<Vec<_>>() }),
                ),
                (Method::Post, Some("")) => {
                    let mut body: Value = serde_json::from_slice(&request.body).ok()?;
                    let name = body["name"].as_str()?.to_owned();
                    if instances.contains_key(&name) {
                        return Some(Reply::json(409, &json!({ "error": "exists" })));
                    }
                    body["state"] = json!("running");
                    body["address"] = json!("192.0.2.10");
                    instances.insert(name, body.clone());
                    Reply::json(201, &body)
                }
                (Method::Get, Some(name)) => match instances.get(name.trim_start_matches('/')) {
                    Some(found) => Reply::json(200, found),
                    None => missing(),
                },
                (Method::Delete, Some(name)) => {
                    match instances.remove(name.trim_start_matches('/')) {
                        Some(_) => Reply::status(204),
                        None => missing(),
                    }
                }
                _ => return None,
            })
        });
        (kit, instances)
    }

    #[test]
    fn a_proxy_is_created_adopted_listed_and_deleted() {
        let (kit, instances) = kit();
        let spec = spec_with_auth("web-1");
        let created = kit.create(&spec).expect("created");
        assert_eq!(created.addresses, ["192.0.2.10"]);
        assert_eq!(
            created.mark.as_ref().map(|mark| mark.uid.as_str()),
            Some(spec.uid.as_str())
        );
        assert_eq!(
            kit.create(&spec).expect("adopted"),
            created,
            "a retry adopts"
        );
        assert_eq!(instances.borrow().len(), 1, "and makes nothing more");

        // Someone else's instance is not listed.
        instances
            .borrow_mut()
            .insert("theirs".into(), json!({ "name": "theirs", "labels": {} }));
        let listed = kit.list().expect("listed");
        assert_eq!(
            listed
                .iter()
                .map(|i| i.provider_id.as_str())
                .collect::<Vec<_>>(),
            [created.provider_id.as_str()]
        );

        kit.delete(&created.provider_id).expect("deleted");
        kit.delete(&created.provider_id)
            .expect("deleting twice is fine");
        assert!(matches!(
            kit.get(&created.provider_id),
            Err(ProviderError::NotFound(_))
        ));
        assert!(kit.check().healthy);
        // No request unanswered, and the credential nowhere it must not be.
        kit.verify();
    }

    #[test]
    fn the_config_schema_says_what_validate_config_accepts() {
        proxyfleet_sdk_testkit::assert_config_schema::<Plugin>(&config());
    }

    #[test]
    fn what_the_api_cannot_do_is_refused_naming_the_field() {
        let (kit, instances) = kit();
        let mut tagged = spec_with_auth("web-1");
        tagged.network.vlan_tag = Some(42);
        let refused = kit.create(&tagged).expect_err("refused");
        assert!(
            matches!(&refused, ProviderError::InvalidSpec(m) if m.starts_with("network.vlanTag"))
        );
        let mut placed = spec_with_auth("web-2");
        placed.placement.push(("zone".into(), "a".into()));
        let refused = kit.create(&placed).expect_err("refused");
        assert!(
            matches!(&refused, ProviderError::InvalidSpec(m) if m.starts_with("placement.zone"))
        );
        assert!(instances.borrow().is_empty(), "nothing made");
    }
}
