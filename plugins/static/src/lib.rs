//! The `static` provider: for users who already run proxies. The entry lists
//! their endpoints; each Proxy is handed one that no other Proxy holds, and
//! gives it back when deleted. Nothing is created or destroyed on any
//! backend; the assignments live in the entry's key-value store (see
//! [`assign`]).
//!
//! Config: `{"endpoints": ["203.0.113.10:3128", "[2001:db8::1]:8080"]}`.

mod assign;
mod config;

use proxyfleet_sdk::{
    CallContext, Capabilities, Health, HealthReason, Instance, PluginInfo, Provider, ProxySpec,
    Result, export_provider, log,
};

use crate::assign::HostStore;
use crate::config::{StaticConfig, Table, config_schema};

/// The provider exported by this plugin.
struct Static;

impl Provider for Static {
    fn describe() -> PluginInfo {
        PluginInfo::new(
            "static",
            env!("CARGO_PKG_VERSION"),
            config_schema(),
            Capabilities::default(),
        )
    }

    fn validate_config(config: &str) -> Result<()> {
        StaticConfig::parse(config).map(drop)
    }

    fn lookup_table(config: &str) -> Result<Vec<(String, String)>> {
        StaticConfig::parse(config).map(|config| config.lookup_table())
    }

    fn create(ctx: &CallContext, spec: &ProxySpec) -> Result<Instance> {
        // Creates and gets read the endpoints they try, one lookup each:
        // reading the whole list made every call pay for all of them.
        let endpoints = Table::new(|key: &str| ctx.lookup(key));
        let instance = assign::assign(&HostStore, &endpoints, spec, proxyfleet_sdk::now_unix())?;
        log::info!("endpoint assigned", endpoint = instance.provider_id);
        Ok(instance)
    }

    fn get(ctx: &CallContext, provider_id: &str) -> Result<Instance> {
        // Every Proxy's resync is a get.
        assign::lookup(&HostStore, &Table::new(|key: &str| ctx.lookup(key)), provider_id)
    }

    fn delete(_ctx: &CallContext, provider_id: &str) -> Result<()> {
        // Deliberately independent of the config: an endpoint removed from
        // the entry must still be releasable.
        assign::release(&HostStore, provider_id)?;
        log::info!("endpoint released", endpoint = provider_id);
        Ok(())
    }

    fn list(ctx: &CallContext) -> Result<Vec<Instance>> {
        let config = StaticConfig::parse(&ctx.config_json())?;
        assign::all(&HostStore, &config)
    }

    fn check(ctx: &CallContext) -> Health {
        let config = match StaticConfig::parse(&ctx.config_json()) {
            Ok(config) => config,
            Err(error) => {
                return Health::unhealthy(HealthReason::Misconfigured, error.message());
            }
        };
        if config.endpoints.is_empty() {
            return Health::unhealthy(HealthReason::Unreachable, "no endpoints are configured");
        }
        // Warnings only: the entry can still serve with the endpoints it has.
        match assign::stranded(&HostStore, &config) {
            Ok(stranded) => stranded.into_iter().fold(Health::healthy(), |health, (id, holder)| {
                health.with_issue(
                    HealthReason::Misconfigured,
                    format!("endpoint {id} is assigned to {holder} but no longer configured"),
                )
            }),
            Err(error) => Health::healthy().with_issue(
                HealthReason::Other,
                format!("cannot read assignments: {}", error.message()),
            ),
        }
    }
}

export_provider!(Static);

/// The provider as the operator drives it, through the SDK's native host.
#[cfg(test)]
mod tests {
    use super::*;
    use proxyfleet_sdk::ProviderError;
    use proxyfleet_sdk_testkit::{TestKit, spec, spec_with_auth};
    use serde_json::json;

    fn kit(endpoints: &[&str]) -> TestKit<Static> {
        TestKit::new(&json!({ "endpoints": endpoints })).expect("a valid config")
    }

    #[test]
    fn each_proxy_holds_its_own_endpoint_until_deleted() {
        let kit = kit(&["192.0.2.1:3128", "192.0.2.2:3128"]);
        let first = kit.create(&spec("web-1")).expect("assigned");
        let second = kit.create(&spec_with_auth("web-2")).expect("assigned");
        assert_ne!(first.provider_id, second.provider_id);
        // A retry adopts the endpoint it was given.
        assert_eq!(kit.create(&spec("web-1")).expect("adopted"), first);
        assert!(matches!(kit.create(&spec("web-3")), Err(ProviderError::QuotaExceeded(_))));

        let mut listed: Vec<String> =
            kit.list().expect("listed").into_iter().map(|i| i.provider_id).collect();
        listed.sort();
        let mut expected = vec![first.provider_id.clone(), second.provider_id.clone()];
        expected.sort();
        assert_eq!(listed, expected);

        kit.delete(&first.provider_id).expect("released");
        kit.delete(&first.provider_id).expect("releasing twice is fine");
        assert!(matches!(kit.get(&first.provider_id), Err(ProviderError::NotFound(_))));
        assert_eq!(
            kit.create(&spec("web-3")).expect("the freed endpoint").provider_id,
            first.provider_id
        );
        assert!(kit.check().healthy);
        kit.verify();
    }

    #[test]
    fn the_config_schema_says_what_validate_config_accepts() {
        proxyfleet_sdk_testkit::assert_config_schema::<Static>(
            &json!({"endpoints": ["192.0.2.1:3128"]}),
        );
    }

    #[test]
    fn an_unknown_key_is_refused_before_any_call() {
        let error = TestKit::<Static>::new(&json!({"endpoints": [], "endpoint": "x"}))
            .expect_err("refused");
        assert!(matches!(&error, ProviderError::InvalidConfig(m) if m.contains("endpoint")));
    }
}
