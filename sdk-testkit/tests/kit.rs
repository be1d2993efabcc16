//! The kit end to end: a small provider driven through `TestKit`, which
//! exercises the SDK's own HTTP, key-value and log code off wasm.

use proxyfleet_sdk::http::{FailureKind, Request};
use proxyfleet_sdk::kv::KvError;
use proxyfleet_sdk::log::Level;
use proxyfleet_sdk::{
    CallContext, Capabilities, Health, HealthReason, HttpDestination, Instance, InstanceState,
    PluginInfo, Provider, ProviderError, ProxySpec, Result, kv, log,
};
use proxyfleet_sdk_testkit::{ErrorCode, Exchange, Reply, TestKit, spec, spec_with_auth};
use serde_json::json;

const API: &str = "https://api.example";

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    zone: String,
    #[serde(default)]
    leak: bool,
}

#[derive(serde::Deserialize)]
struct Vm {
    id: String,
    ip: String,
}

/// Creates a VM through the API, remembers its id under the Proxy's UID,
/// and reads it back; `leak: true` makes it log the credential, which the
/// kit must catch.
struct Vms;

impl Vms {
    fn instance(vm: Vm, spec: Option<&ProxySpec>) -> Instance {
        Instance {
            provider_id: vm.id,
            name: spec.map(|s| s.name.clone()).unwrap_or_default(),
            state: InstanceState::Running,
            addresses: vec![vm.ip],
            port: None,
            created_at: None,
            mark: None,
        }
    }
}

impl Provider for Vms {
    fn describe() -> PluginInfo {
        let http = vec![HttpDestination::https("api.example", None)];
        PluginInfo::new("vms", "0.1.0", "{}", Capabilities { http })
    }

    fn validate_config(config: &str) -> Result<()> {
        proxyfleet_sdk::parse_config::<Config>(config).map(drop)
    }

    fn create(ctx: &CallContext, spec: &ProxySpec) -> Result<Instance> {
        let config: Config = ctx.config()?;
        if config.leak
            && let Some(auth) = &spec.proxy_auth
        {
            log::info!("starting", password = auth.password);
        }
        let key = format!("vm/{}", spec.uid);
        if let Some(entry) = kv::get(&key)? {
            let id = String::from_utf8_lossy(&entry.value).into_owned();
            return Self::get(ctx, &id);
        }
        let vm: Vm = Request::post(format!("{API}/zones/{}/vms", config.zone))
            .json(&json!({"name": spec.name}))
            .send()?
            .json()?;
        kv::compare_and_swap(&key, None, Some(vm.id.as_bytes()))?;
        log::info!("created", id = vm.id);
        Ok(Self::instance(vm, Some(spec)))
    }

    fn get(ctx: &CallContext, provider_id: &str) -> Result<Instance> {
        let config: Config = ctx.config()?;
        let vm: Vm = Request::get(format!("{API}/zones/{}/vms/{provider_id}", config.zone))
            .send()?
            .json()?;
        Ok(Self::instance(vm, None))
    }

    fn delete(ctx: &CallContext, provider_id: &str) -> Result<()> {
        let config: Config = ctx.config()?;
        match Request::delete(format!("{API}/zones/{}/vms/{provider_id}", config.zone)).send() {
            Ok(_) => Ok(()),
            Err(failure) if failure.kind() == FailureKind::Status(404) => Ok(()),
            Err(failure) => Err(failure.into()),
        }
    }

    fn list(_: &CallContext) -> Result<Vec<Instance>> {
        // Somewhere no entry grants: the kit refuses it as the host would.
        Request::get("https://elsewhere.example/vms").send()?;
        Ok(Vec::new())
    }

    fn check(ctx: &CallContext) -> Health {
        let zone = match ctx.config::<Config>() {
            Ok(config) => config.zone,
            Err(error) => return Health::unhealthy(HealthReason::Other, error.to_string()),
        };
        match Request::get(format!("{API}/zones/{zone}")).send() {
            Ok(_) => Health::healthy(),
            Err(failure) => Health::unhealthy(failure.health_reason(), failure.to_string()),
        }
    }
}

fn kit() -> TestKit<Vms> {
    TestKit::new(&json!({"zone": "z1"})).expect("a valid config")
}

fn vm(id: &str) -> Reply {
    Reply::json(200, &json!({"id": id, "ip": "192.0.2.10"}))
}

#[test]
fn an_unknown_config_key_is_refused_naming_it() {
    let error = TestKit::<Vms>::new(&json!({"zone": "z1", "zoen": "z2"})).expect_err("refused");
    assert!(matches!(&error, ProviderError::InvalidConfig(m) if m.contains("zoen")), "{error}");
}

#[test]
fn a_retried_create_adopts_through_the_store() {
    let kit = kit();
    kit.expect(Exchange::post(&format!("{API}/zones/z1/vms")).reply(vm("vm-7")));
    kit.expect(Exchange::get(&format!("{API}/zones/z1/vms/vm-7")).reply(vm("vm-7")));
    let spec = spec("web-1");
    assert_eq!(kit.create(&spec).expect("created").provider_id, "vm-7");
    assert_eq!(kit.create(&spec).expect("adopted").provider_id, "vm-7");
    let requests = kit.requests();
    assert_eq!(requests.len(), 2, "the retry did not post again: {requests:?}");
    // The SDK sent what the operator would: a length and the JSON body.
    assert_eq!(requests[0].header("content-length"), Some(&b"16"[..]));
    assert_eq!(requests[0].body, br#"{"name":"web-1"}"#);
    let created = kit.logs().into_iter().find(|record| record.message == "created");
    assert_eq!(created.and_then(|r| r.field("id").map(str::to_owned)).as_deref(), Some("vm-7"));
    kit.verify();
}

#[test]
fn answers_are_classified_as_the_operator_would_see_them() {
    let kit = kit();
    kit.expect(Exchange::get(&format!("{API}/zones/z1/vms/gone")).reply(Reply::status(404)));
    kit.expect(Exchange::delete(&format!("{API}/zones/z1/vms/gone")).reply(Reply::status(404)));
    kit.expect(
        Exchange::post(&format!("{API}/zones/z1/vms"))
            .reply(Reply::transport(ErrorCode::ConnectionRefused)),
    );
    assert!(matches!(kit.get("gone"), Err(ProviderError::NotFound(_))));
    assert_eq!(kit.delete("gone"), Ok(()), "deleting what is gone succeeds");
    assert!(matches!(kit.create(&spec("web-1")), Err(ProviderError::Transient(_))));
    assert!(kit.kv().entries().is_empty(), "a failed create leaves nothing behind");
    kit.verify();
}

#[test]
fn a_destination_the_plugin_never_asked_for_is_refused() {
    let kit = kit();
    assert!(matches!(kit.list(), Err(ProviderError::Unauthorized(_))));
    kit.verify();
}

#[test]
fn check_reports_an_unreachable_backend() {
    let kit = kit();
    kit.route(|request| {
        request.url.ends_with("/zones/z1").then(|| Reply::transport(ErrorCode::ConnectionRefused))
    });
    let health = kit.check();
    assert!(!health.healthy);
    assert_eq!(health.issues[0].reason, HealthReason::Unreachable);
}

#[test]
fn an_unavailable_store_is_transient() {
    let kit = kit();
    kit.kv().fail_with(Some(KvError::Unavailable("down".into())));
    assert!(matches!(kit.create(&spec("web-1")), Err(ProviderError::Transient(_))));
    assert!(kit.requests().is_empty());
}

#[test]
#[should_panic(expected = "unanswered request: POST https://api.example/zones/z1/vms")]
fn verify_fails_on_a_request_nothing_answered() {
    let kit = kit();
    let _ = kit.create(&spec("web-1"));
    kit.verify();
}

#[test]
#[should_panic(
    expected = "unused exchange: GET https://api.example/zones/z1 answered 0 of 1 times"
)]
fn verify_fails_on_an_exchange_never_used() {
    let kit = kit();
    kit.expect(Exchange::get(&format!("{API}/zones/z1")));
    kit.verify();
}

#[test]
#[should_panic(expected = "a Proxy credential in log record 0 (Level::Info)")]
fn verify_fails_on_a_credential_in_a_log_record() {
    let kit = TestKit::<Vms>::new(&json!({"zone": "z1", "leak": true})).expect("a valid config");
    kit.expect(Exchange::post(&format!("{API}/zones/z1/vms")).reply(vm("vm-7")));
    kit.create(&spec_with_auth("web-1")).expect("created");
    assert_eq!(kit.logs()[0].level, Level::Info);
    kit.verify();
}

#[test]
fn a_plugin_call_outside_a_kit_names_the_fix() {
    let panic = std::panic::catch_unwind(|| kv::get("a")).expect_err("no host installed");
    let message = panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or_default();
    assert!(message.contains("proxyfleet-sdk-testkit"), "{message}");
}

/// Hands out the endpoints its config lists, each read from the entry's
/// lookup table; `"twice": true` answers a key twice.
struct Listed;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ListedConfig {
    endpoints: Vec<String>,
    #[serde(default)]
    twice: bool,
}

impl Provider for Listed {
    fn describe() -> PluginInfo {
        PluginInfo::new("listed", "0.1.0", "{}", Capabilities::default())
    }

    fn validate_config(config: &str) -> Result<()> {
        proxyfleet_sdk::parse_config::<ListedConfig>(config).map(drop)
    }

    fn lookup_table(config: &str) -> Result<Vec<(String, String)>> {
        let config: ListedConfig = proxyfleet_sdk::parse_config(config)?;
        let mut table: Vec<(String, String)> = config
            .endpoints
            .iter()
            .enumerate()
            .map(|(index, endpoint)| (format!("at/{index}"), endpoint.clone()))
            .collect();
        if config.twice {
            table.extend(table.first().cloned());
        }
        Ok(table)
    }

    fn create(_: &CallContext, _: &ProxySpec) -> Result<Instance> {
        Err(ProviderError::Permanent("not used".into()))
    }

    fn get(ctx: &CallContext, provider_id: &str) -> Result<Instance> {
        let endpoint = ctx
            .lookup(&format!("at/{provider_id}"))
            .ok_or_else(|| ProviderError::NotFound(format!("no endpoint {provider_id}")))?;
        Ok(Instance {
            provider_id: provider_id.to_owned(),
            name: endpoint.clone(),
            state: InstanceState::Running,
            addresses: vec![endpoint],
            port: None,
            created_at: None,
            mark: None,
        })
    }

    fn delete(_: &CallContext, _: &str) -> Result<()> {
        Ok(())
    }

    fn list(_: &CallContext) -> Result<Vec<Instance>> {
        Ok(Vec::new())
    }

    fn check(ctx: &CallContext) -> Health {
        // The whole config is there too, for the calls that need it.
        match ctx.config::<ListedConfig>() {
            Ok(config) if !config.endpoints.is_empty() => Health::healthy(),
            _ => Health::unhealthy(HealthReason::Misconfigured, "no endpoints"),
        }
    }
}

#[test]
fn calls_read_the_lookup_table_the_plugin_answered_for_its_config() {
    let kit = TestKit::<Listed>::new(&json!({"endpoints": ["192.0.2.1:3128", "192.0.2.2:3128"]}))
        .expect("a valid config");
    assert_eq!(kit.get("1").expect("listed").name, "192.0.2.2:3128");
    assert!(matches!(kit.get("2"), Err(ProviderError::NotFound(_))));
    assert!(kit.check().healthy);
    kit.verify();
}

#[test]
#[should_panic(expected = "lookup_table answered the key \"at/0\" twice")]
fn a_lookup_table_the_operator_would_refuse_fails_the_test() {
    let _kit = TestKit::<Listed>::new(&json!({"endpoints": ["192.0.2.1:3128"], "twice": true}));
}
