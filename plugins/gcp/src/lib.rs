//! The `gcp` provider: each proxy is a Compute Engine instance in a Google
//! Cloud project, driven through the Compute Engine v1 REST API. The host
//! holds the service account's key, gets the access token and injects
//! `Authorization: Bearer …`; the plugin never sees either.
//!
//! - The instance name comes from the Proxy UID
//!   ([`proxyfleet_sdk::derive_name`]), and the instance carries the
//!   ownership mark as labels plus `proxyfleet: <entry>`, which `list`
//!   filters on.
//! - A create first looks for our instance in every configured zone (an
//!   earlier attempt may have made it before its answer was lost), then
//!   inserts with a `requestId` derived from the UID, the zone and an
//!   attempt number kept in the key-value store: a retry of the same
//!   attempt gets the first request's operation back instead of a second
//!   instance, and the number moves on only once an attempt is known to
//!   have failed (or its operation is stale: done, but the instance was
//!   deleted since).
//! - Zones are tried in an order fixed by the UID; a zone without capacity
//!   (`ZONE_RESOURCE_POOL_EXHAUSTED`) sends the create to the next.
//!
//! See `docs/providers/gcp.md` for the config and the IAM role.

mod config;
mod gce;
mod instance;
mod names;

use proxyfleet_sdk::http::{Failure, Method, encode_component};
use proxyfleet_sdk::kv::{self, CasOutcome};
use proxyfleet_sdk::{
    CallContext, Capabilities, Health, HealthReason, Instance, InstanceState, OwnershipMark,
    PluginInfo, Provider, ProviderError, ProxySpec, Result, export_provider, log,
};
use serde_json::Value;

use crate::config::{Config, Source, config_schema};
use crate::gce::{Client, OperationFailure};
use crate::instance::{FLEET_LABEL, instance_name, mark_of, parse_provider_id, request_id};

/// How often one zone's insert moves to a fresh attempt within one call
/// (stale operations from earlier instances of the same name).
const ROUNDS: u32 = 3;

/// The provider exported by this plugin.
struct Gcp;

fn instance_path(zone: &str, name: &str) -> String {
    format!("zones/{zone}/instances/{name}")
}

/// The instance `name` in `zone`; `None` when there is none.
fn find(client: &Client, zone: &str, name: &str) -> Result<Option<Value>> {
    match client.get(&instance_path(zone, name)) {
        Ok(instance) => Ok(Some(instance)),
        Err(failure) if matches!(failure.error(), ProviderError::NotFound(_)) => Ok(None),
        Err(failure) => Err(failure.into()),
    }
}

/// The zones a create tries, in order: the placement's, or every
/// configured zone starting at one the UID picks.
fn zone_order(config: &Config, spec: &ProxySpec) -> Result<Vec<String>> {
    if let Some((_, zone)) = spec.placement.iter().find(|(key, _)| key == "zone") {
        return if config.zones.contains(zone) {
            Ok(vec![zone.clone()])
        } else {
            Err(ProviderError::InvalidSpec(format!(
                "placement.zone: `{zone}` is not one of the entry's config key `zones`"
            )))
        };
    }
    let count = u32::try_from(config.zones.len()).unwrap_or(u32::MAX);
    let start =
        proxyfleet_sdk::derive_number(&spec.uid, 0..=count.saturating_sub(1), 0).unwrap_or(0);
    let start = usize::try_from(start).unwrap_or(0);
    Ok(config.zones[start..].iter().chain(&config.zones[..start]).cloned().collect())
}

fn attempt_key(uid: &str, zone: &str) -> String {
    format!("insert-attempt/{uid}/{zone}")
}

/// The current insert attempt for `uid` in `zone`, from the store.
fn attempt(uid: &str, zone: &str) -> Result<u64> {
    Ok(kv::get(&attempt_key(uid, zone))?
        .and_then(|entry| String::from_utf8_lossy(&entry.value).parse().ok())
        .unwrap_or(0))
}

/// Moves `uid`'s attempt in `zone` past `current`, so the next insert gets
/// a fresh `requestId`.
fn next_attempt(uid: &str, zone: &str, current: u64) -> Result<()> {
    let key = attempt_key(uid, zone);
    let existing = kv::get(&key)?;
    let stored =
        existing.as_ref().and_then(|e| String::from_utf8_lossy(&e.value).parse::<u64>().ok());
    if stored.unwrap_or(0) > current {
        return Ok(());
    }
    let next = (current + 1).to_string();
    match kv::compare_and_swap(&key, existing.map(|e| e.version), Some(next.as_bytes()))? {
        // Someone moved it meanwhile: theirs is as good.
        CasOutcome::Applied(_) | CasOutcome::Conflict(_) => Ok(()),
    }
}

/// What an insert in one zone came to.
enum Inserted {
    Instance(Instance),
    NoCapacity(String),
}

/// Our instance, or a conflict when the name holds someone else's.
fn adopt(config: &Config, zone: &str, resource: &Value, uid: &str) -> Result<Instance> {
    match mark_of(resource) {
        Some(mark) if mark.uid == uid => {
            log::info!(
                "adopting our instance",
                zone = zone,
                name = resource["name"].as_str().unwrap_or("")
            );
            Ok(instance::to_instance(resource, zone, config.address))
        }
        _ => Err(ProviderError::Conflict(format!(
            "instance {} in zone {zone} exists and does not carry this Proxy's mark; \
             rename it or change config key `namePrefix`",
            resource["name"].as_str().unwrap_or("")
        ))),
    }
}

fn provisioning(zone: &str, name: &str, mark: &OwnershipMark) -> Instance {
    Instance {
        provider_id: instance::provider_id(zone, name),
        name: name.to_owned(),
        state: InstanceState::Provisioning,
        addresses: Vec::new(),
        port: None,
        created_at: Some(mark.created_at),
        mark: Some(mark.clone()),
    }
}

fn insert_in_zone(
    client: &Client,
    config: &Config,
    ctx: &CallContext,
    spec: &ProxySpec,
    zone: &str,
    name: &str,
) -> Result<Inserted> {
    let mark = OwnershipMark::for_spec(spec, proxyfleet_sdk::now_unix());
    let body = instance::insert_body(config, &ctx.entry, spec, zone, name, &mark)?;
    let mut query = Vec::new();
    if let Source::Template(template) = config.source_for(&spec.image)? {
        query.push(("sourceInstanceTemplate", template));
    }
    for _ in 0..ROUNDS {
        let current = attempt(&spec.uid, zone)?;
        let id = request_id(&["insert", &spec.uid, zone, &current.to_string()]);
        let mut query = query.clone();
        query.push(("requestId", id.clone()));
        let path = format!("zones/{zone}/instances");
        log::info!("inserting instance", zone = zone, name = name, request_id = id);
        let (status, answer) = client.request(Method::Post, &path, &query, Some(&body))?;
        if status == 409 {
            // Made by an attempt whose operation we no longer know.
            return match find(client, zone, name)? {
                Some(resource) => adopt(config, zone, &resource, &spec.uid).map(Inserted::Instance),
                None => Err(ProviderError::Transient(format!(
                    "instance {name} in zone {zone} was reported to exist but is gone; retry"
                ))),
            };
        }
        if status == 404 {
            let error = gce::classify(Method::Post, &client.label(&path), status, &answer);
            return Err(ProviderError::InvalidConfig(format!(
                "{} (check config keys `zones`, `images`, `instanceTemplates`, `network`)",
                error.message()
            )));
        }
        if status >= 400 {
            return Err(gce::classify(Method::Post, &client.label(&path), status, &answer));
        }
        let Some(done) = client.wait(zone, &answer)? else {
            // Out of time: the instance exists; `get` follows it.
            return Ok(Inserted::Instance(provisioning(zone, name, &mark)));
        };
        match gce::operation_failure(&done) {
            None => match find(client, zone, name)? {
                Some(resource) => {
                    return adopt(config, zone, &resource, &spec.uid).map(Inserted::Instance);
                }
                None => {
                    // A finished operation of an earlier instance of this
                    // name, deleted since: take a fresh attempt.
                    log::debug!("stale insert operation; taking a fresh requestId", zone = zone);
                    next_attempt(&spec.uid, zone, current)?;
                }
            },
            Some(OperationFailure::Capacity(message)) => {
                next_attempt(&spec.uid, zone, current)?;
                log::warn!("zone has no capacity", zone = zone, detail = message);
                return Ok(Inserted::NoCapacity(message));
            }
            Some(OperationFailure::Failed(error)) => {
                next_attempt(&spec.uid, zone, current)?;
                return Err(error);
            }
        }
    }
    Err(ProviderError::Transient(format!(
        "inserting {name} in zone {zone} kept finding stale operations; retry"
    )))
}

fn create(ctx: &CallContext, spec: &ProxySpec) -> Result<Instance> {
    let config = Config::parse(&ctx.config_json())?;
    config.source_for(&spec.image)?;
    let zones = zone_order(&config, spec)?;
    let name = instance_name(&config.name_prefix, &spec.uid);
    let client = Client::new(&config, ctx.deadline());
    // An earlier attempt may have made it anywhere, before a lost answer or
    // after moving on from a zone without capacity.
    for zone in &config.zones {
        if let Some(resource) = find(&client, zone, &name)? {
            return adopt(&config, zone, &resource, &spec.uid);
        }
    }
    let mut exhausted = Vec::new();
    for zone in &zones {
        match insert_in_zone(&client, &config, ctx, spec, zone, &name)? {
            Inserted::Instance(instance) => return Ok(instance),
            Inserted::NoCapacity(message) => exhausted.push(format!("{zone}: {message}")),
        }
    }
    // There is no capacity class in the contract: capacity comes back, so
    // this is retried like any transient failure.
    Err(ProviderError::Transient(format!(
        "no capacity for the instance in any zone tried; retry later or add zones to config key `zones` ({})",
        exhausted.join("; ")
    )))
}

fn get(ctx: &CallContext, provider_id: &str) -> Result<Instance> {
    let config = Config::parse(&ctx.config_json())?;
    let (zone, name) = parse_provider_id(provider_id).ok_or_else(|| {
        ProviderError::NotFound(format!("`{provider_id}` is not an instance of this plugin"))
    })?;
    let client = Client::new(&config, ctx.deadline());
    let resource = client.get(&instance_path(zone, name))?;
    if mark_of(&resource).is_none() {
        return Err(ProviderError::NotFound(format!(
            "instance {name} in zone {zone} no longer carries our mark: the name now holds someone else's instance"
        )));
    }
    Ok(instance::to_instance(&resource, zone, config.address))
}

fn delete(ctx: &CallContext, provider_id: &str) -> Result<()> {
    let config = Config::parse(&ctx.config_json())?;
    let Some((zone, name)) = parse_provider_id(provider_id) else {
        // Not an ID this plugin hands out: nothing of ours to delete.
        return Ok(());
    };
    let client = Client::new(&config, ctx.deadline());
    let Some(resource) = find(&client, zone, name)? else { return Ok(()) };
    if mark_of(&resource).is_none() {
        log::info!("instance is not ours; leaving it alone", zone = zone, name = name);
        return Ok(());
    }
    // The numeric ID tells incarnations of one name apart, so a retry
    // joins this delete and a later instance of the name gets its own.
    let id = resource["id"].as_str().unwrap_or_default();
    let query = [("requestId", request_id(&["delete", zone, name, id]))];
    let path = instance_path(zone, name);
    let (status, answer) = client.request(Method::Delete, &path, &query, None)?;
    if status == 404 {
        return Ok(());
    }
    if status >= 400 {
        return Err(gce::classify(Method::Delete, &client.label(&path), status, &answer));
    }
    match client.wait(zone, &answer)? {
        None => Err(ProviderError::Transient(format!(
            "deleting instance {name} in zone {zone} is still running; it finishes on its own"
        ))),
        Some(done) => match gce::operation_failure(&done) {
            None => {
                log::info!("deleted", zone = zone, name = name);
                Ok(())
            }
            Some(OperationFailure::Capacity(message)) => Err(ProviderError::Transient(message)),
            Some(OperationFailure::Failed(ProviderError::NotFound(_))) => Ok(()),
            Some(OperationFailure::Failed(error)) => Err(error),
        },
    }
}

fn list(ctx: &CallContext) -> Result<Vec<Instance>> {
    let config = Config::parse(&ctx.config_json())?;
    let client = Client::new(&config, ctx.deadline());
    let mut instances = Vec::new();
    for zone in &config.zones {
        let mut page_token: Option<String> = None;
        loop {
            let mut query = vec![
                ("filter", format!("labels.{FLEET_LABEL}:*")),
                ("maxResults", "500".to_owned()),
            ];
            if let Some(token) = page_token.take() {
                query.push(("pageToken", token));
            }
            let page =
                client.call(Method::Get, &format!("zones/{zone}/instances"), &query, None)?;
            for resource in page["items"].as_array().map(Vec::as_slice).unwrap_or_default() {
                // Another entry's (or deployment's) instances in the same
                // project are not ours to collect.
                if instance::fleet_of(resource) == Some(ctx.entry.as_str())
                    && mark_of(resource).is_some()
                {
                    instances.push(instance::to_instance(resource, zone, config.address));
                }
            }
            match page["nextPageToken"].as_str() {
                Some(token) if !token.is_empty() => page_token = Some(token.to_owned()),
                _ => break,
            }
        }
    }
    Ok(instances)
}

/// The health reason for a failed request: a project, zone or source
/// that is not there is the entry's config; the rest as the failure says.
fn reason_of(failure: &Failure) -> HealthReason {
    match failure.error() {
        ProviderError::NotFound(_) => HealthReason::Misconfigured,
        _ => failure.health_reason(),
    }
}

/// The API path of a source image or template (`projects/...`).
fn source_path(path: &str) -> String {
    path.split("/compute/v1/").last().unwrap_or(path).trim_start_matches('/').to_owned()
}

fn check(ctx: &CallContext) -> Health {
    let config = match Config::parse(&ctx.config_json()) {
        Ok(config) => config,
        Err(error) => return Health::unhealthy(HealthReason::Misconfigured, error.message()),
    };
    let client = Client::new(&config, ctx.deadline());
    // The project first: it proves the token and the project at once, and
    // when it fails every other request would fail the same way.
    if let Err(failure) = client.get("") {
        let error = failure.error();
        let message = match error {
            ProviderError::NotFound(_) => format!(
                "config key `project`: {} (does the project exist, and may the service account see it?)",
                error.message()
            ),
            _ => error.message().to_owned(),
        };
        return Health::unhealthy(reason_of(&failure), message);
    }
    let mut issues = Vec::new();
    for (index, zone) in config.zones.iter().enumerate() {
        if let Err(failure) = client.get(&format!("zones/{}", encode_component(zone))) {
            let message = format!("config key `zones[{index}]`: {}", failure.error().message());
            issues.push((reason_of(&failure), message));
        }
    }
    let sources = config.images.iter().map(|(key, path)| (format!("images.{key}"), path)).chain(
        config
            .instance_templates
            .iter()
            .map(|(key, path)| (format!("instanceTemplates.{key}"), path)),
    );
    for (key, path) in sources {
        let path = source_path(path);
        let path = if path.starts_with("projects/") {
            path
        } else {
            format!("projects/{}/{path}", config.project)
        };
        if let Err(failure) = client.get(&path) {
            let reason = match failure.error() {
                ProviderError::NotFound(_) => HealthReason::TemplateNotFound,
                _ => reason_of(&failure),
            };
            issues.push((reason, format!("config key `{key}`: {}", failure.error().message())));
        }
    }
    issues.into_iter().fold(Health::healthy(), |health, (reason, message)| Health {
        healthy: false,
        ..health.with_issue(reason, message)
    })
}

impl Provider for Gcp {
    fn describe() -> PluginInfo {
        // The endpoint is config (the simulator, a private endpoint), so the
        // grants name it rather than `describe`.
        PluginInfo::new("gcp", env!("CARGO_PKG_VERSION"), config_schema(), Capabilities::default())
    }

    fn validate_config(config: &str) -> Result<()> {
        Config::parse(config).map(drop)
    }

    fn create(ctx: &CallContext, spec: &ProxySpec) -> Result<Instance> {
        create(ctx, spec)
    }

    fn get(ctx: &CallContext, provider_id: &str) -> Result<Instance> {
        get(ctx, provider_id)
    }

    fn delete(ctx: &CallContext, provider_id: &str) -> Result<()> {
        delete(ctx, provider_id)
    }

    fn list(ctx: &CallContext) -> Result<Vec<Instance>> {
        list(ctx)
    }

    fn check(ctx: &CallContext) -> Health {
        check(ctx)
    }
}

export_provider!(Gcp);

#[cfg(test)]
mod tests {
    use proxyfleet_sdk::http::{FailureKind, HostRefusal};

    use super::*;

    fn spec(uid: &str, placement: &[(&str, &str)]) -> ProxySpec {
        ProxySpec {
            installation: "prod".into(),
            name: "web".into(),
            namespace: "edge".into(),
            uid: uid.into(),
            cores: 2,
            memory_mib: 2048,
            disk_gib: 10,
            image: "debian-12".into(),
            placement: placement.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
            network: proxyfleet_sdk::Network { vlan_tag: None },
            port: 3128,
            user_data: Vec::new(),
            labels: Vec::new(),
            proxy_auth: None,
        }
    }

    fn config() -> Config {
        Config::parse(
            r#"{"project":"p-1","zones":["europe-west1-b","europe-west1-c","europe-west1-d"],"images":{"debian-12":"projects/debian-cloud/global/images/family/debian-12"}}"#,
        )
        .expect("valid")
    }

    #[test]
    fn zone_order_is_a_rotation_fixed_by_the_uid() {
        let config = config();
        let order = zone_order(&config, &spec("uid-1", &[])).expect("an order");
        assert_eq!(order, zone_order(&config, &spec("uid-1", &[])).expect("an order"));
        let mut sorted = order.clone();
        sorted.sort();
        assert_eq!(sorted, config.zones, "every zone once");
        let start = config.zones.iter().position(|z| *z == order[0]).expect("a configured zone");
        assert_eq!(order[1], config.zones[(start + 1) % 3], "then in config order");
        let starts: std::collections::BTreeSet<String> = (0..32)
            .map(|i| {
                zone_order(&config, &spec(&format!("uid-{i}"), &[])).expect("an order")[0].clone()
            })
            .collect();
        assert!(starts.len() > 1, "UIDs spread over zones");
    }

    #[test]
    fn placement_pins_one_configured_zone() {
        let config = config();
        assert_eq!(
            zone_order(&config, &spec("u", &[("zone", "europe-west1-c")])).expect("the zone"),
            ["europe-west1-c"]
        );
        assert!(matches!(
            zone_order(&config, &spec("u", &[("zone", "us-east1-b")])),
            Err(ProviderError::InvalidSpec(m)) if m.starts_with("placement.zone")
        ));
    }

    #[test]
    fn health_reasons_come_from_the_failure_not_its_text() {
        let credential = Failure::new(
            FailureKind::Host(HostRefusal::CredentialUnavailable),
            ProviderError::Unauthorized("GET p: HTTP 401".into()),
        );
        assert_eq!(reason_of(&credential), HealthReason::CredentialsUnavailable);
        let forbidden = Failure::new(
            FailureKind::Status(403),
            ProviderError::Unauthorized("GET p: HTTP 403".into()),
        );
        assert_eq!(reason_of(&forbidden), HealthReason::Unauthorized);
        let slow = Failure::new(FailureKind::Timeout, ProviderError::Transient("x".into()));
        assert_eq!(reason_of(&slow), HealthReason::Timeout);
        let missing = Failure::new(
            FailureKind::Status(404),
            ProviderError::NotFound("GET p: HTTP 404".into()),
        );
        assert_eq!(reason_of(&missing), HealthReason::Misconfigured);
        // Google's own words about tokens decide nothing: only the host's
        // header marks its refusal.
        let backend = Failure::new(
            FailureKind::Status(401),
            ProviderError::Unauthorized("GET p: HTTP 401: could not get an access token".into()),
        );
        assert_eq!(reason_of(&backend), HealthReason::Unauthorized);
        assert_eq!(
            source_path("https://www.googleapis.com/compute/v1/projects/a/global/images/b"),
            "projects/a/global/images/b"
        );
    }

    /// Create, retry, get and delete through the SDK's native host, against
    /// a few lines of Compute Engine: instances by name, inserts that finish
    /// at once.
    #[test]
    fn a_create_through_the_api_is_adopted_on_retry_and_deleted() {
        use std::cell::RefCell;
        use std::collections::BTreeMap;
        use std::rc::Rc;

        use proxyfleet_sdk::HttpDestination;
        use proxyfleet_sdk::http::Method;
        use proxyfleet_sdk_testkit::{Reply, TestKit};
        use serde_json::json;

        let kit = TestKit::<Gcp>::new(&json!({
            "endpoint": "https://gce.test",
            "project": "p-1",
            "zones": ["europe-west1-b"],
            "images": {"debian-12": "projects/debian-cloud/global/images/family/debian-12"},
            "operationPollMs": 50
        }))
        .expect("a valid config");
        kit.grant(HttpDestination::https("gce.test", None));
        let instances: Rc<RefCell<BTreeMap<String, Value>>> = Rc::default();
        let api = Rc::clone(&instances);
        let done = |name: &str| Reply::json(200, &json!({"name": name, "status": "DONE"}));
        kit.route(move |request| {
            let path = request
                .url
                .strip_prefix("https://gce.test/compute/v1/projects/p-1/zones/europe-west1-b/")?;
            let path = path.split('?').next().unwrap_or_default();
            let mut instances = api.borrow_mut();
            match (request.method, path.strip_prefix("instances")) {
                (Method::Post, Some("")) => {
                    let mut body: Value = serde_json::from_slice(&request.body).ok()?;
                    let name = body["name"].as_str()?.to_owned();
                    body["networkInterfaces"] = json!([{
                        "networkIP": "10.0.0.7",
                        "accessConfigs": [{"natIP": "203.0.113.7"}]
                    }]);
                    body["status"] = json!("RUNNING");
                    instances.insert(name, body);
                    Some(done("op-insert"))
                }
                (Method::Get, Some(name)) => {
                    Some(match instances.get(name.trim_start_matches('/')) {
                        Some(instance) => Reply::json(200, instance),
                        None => Reply::json(
                            404,
                            &json!({"error": {"code": 404, "message": "not found"}}),
                        ),
                    })
                }
                (Method::Delete, Some(name)) => {
                    instances.remove(name.trim_start_matches('/'))?;
                    Some(done("op-delete"))
                }
                _ => None,
            }
        });

        let spec = proxyfleet_sdk_testkit::spec_with_auth("web-1");
        let created = kit.create(&spec).expect("created");
        // The external address: the entry's `externalAddress` is on by default.
        assert_eq!(created.addresses, ["203.0.113.7"]);
        assert_eq!(created.mark.as_ref().map(|mark| mark.uid.as_str()), Some(spec.uid.as_str()));
        let inserts = || kit.requests().iter().filter(|r| r.method == Method::Post).count();
        assert_eq!(kit.create(&spec).expect("adopted"), created, "a retry adopts");
        assert_eq!(inserts(), 1, "and inserts nothing");
        assert_eq!(kit.get(&created.provider_id).expect("found").addresses, ["203.0.113.7"]);
        kit.delete(&created.provider_id).expect("deleted");
        assert!(instances.borrow().is_empty());
        assert!(matches!(kit.get(&created.provider_id), Err(ProviderError::NotFound(_))));
        kit.verify();
    }

    #[test]
    fn the_config_schema_says_what_validate_config_accepts() {
        proxyfleet_sdk_testkit::assert_config_schema::<Gcp>(&serde_json::json!({
            "project": "p-1",
            "zones": ["europe-west1-b"],
            "images": {"debian-12": "projects/debian-cloud/global/images/family/debian-12"}
        }));
    }
}
