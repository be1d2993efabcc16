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
use crate::config::{Endpoints, StaticConfig, config_schema};

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

    fn create(ctx: &CallContext, spec: &ProxySpec) -> Result<Instance> {
        // Creates and gets read only what they need of the config, which
        // validate-config checked whole when the entry was admitted.
        let endpoints = Endpoints::read(&ctx.config)?;
        let instance = assign::assign(&HostStore, &endpoints, spec, proxyfleet_sdk::now_unix())?;
        log::info!("endpoint assigned", endpoint = instance.provider_id);
        Ok(instance)
    }

    fn get(ctx: &CallContext, provider_id: &str) -> Result<Instance> {
        assign::lookup(&HostStore, &Endpoints::read(&ctx.config)?, provider_id)
    }

    fn delete(_ctx: &CallContext, provider_id: &str) -> Result<()> {
        // Deliberately independent of the config: an endpoint removed from
        // the entry must still be releasable.
        assign::release(&HostStore, provider_id)?;
        log::info!("endpoint released", endpoint = provider_id);
        Ok(())
    }

    fn list(ctx: &CallContext) -> Result<Vec<Instance>> {
        let config = StaticConfig::parse(&ctx.config)?;
        assign::all(&HostStore, &config)
    }

    fn check(ctx: &CallContext) -> Health {
        let config = match StaticConfig::parse(&ctx.config) {
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
