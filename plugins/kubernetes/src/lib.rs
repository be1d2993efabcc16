//! The `kubernetes` provider: each proxy is a bare Pod in one namespace of a
//! cluster, driven through the Kubernetes REST API. The host injects the
//! bearer token (the pod's service-account token, or one from a file for a
//! remote cluster) and trusts the cluster's CA; the entry config never
//! holds the token.
//!
//! - The pod name comes from the Proxy UID (`pf-<12 hex digits>`); labels
//!   carry `app.kubernetes.io/managed-by=proxyfleet`, the entry and the UID,
//!   annotations the whole ownership mark. A create that meets an existing
//!   pod of that name adopts it when its UID label is ours, and is a
//!   `conflict` otherwise.
//! - A bare Pod rather than a one-replica Deployment: when the pod fails,
//!   the reconciler sees it (`failed`) and replaces it, instead of a
//!   controller doing so behind its back with a new name and address.
//! - `get` maps phase and readiness to the instance state; `delete` does
//!   not wait for the kubelet; `check` asks the API server whether the
//!   credential may do what the plugin needs (SelfSubjectAccessReview).
//!
//! See `docs/providers/kubernetes.md` for the config and the RBAC.

mod api;
mod config;
mod names;
mod pod;
mod secret;

use proxyfleet_sdk::http::encode_component;
use proxyfleet_sdk::{
    CallContext, Capabilities, Health, HealthReason, Instance, InstanceState, PluginInfo, Provider,
    ProviderError, ProxySpec, Result, export_provider, log, now_unix,
};
use serde_json::{Value, json};

use crate::api::{ApiError, Client};
use crate::config::{Config, config_schema};

/// Pods per page of `list`.
const LIST_PAGE: u32 = 250;
/// What the plugin does with pods, each asked of the API server in `check`.
const POD_VERBS: [&str; 4] = ["create", "get", "list", "delete"];

/// The provider exported by this plugin.
struct Kubernetes;

fn client(ctx: &CallContext, config: &Config) -> Client {
    Client::new(&config.api_server, ctx.deadline())
}

fn pods_path(namespace: &str) -> String {
    format!("/api/v1/namespaces/{namespace}/pods")
}

fn pod_path(namespace: &str, name: &str) -> String {
    format!("/api/v1/namespaces/{namespace}/pods/{name}")
}

/// A 404 from creating in a namespace: the namespace is missing, or the
/// URL does not lead to a Kubernetes API.
fn create_not_found(config: &Config, error: &ApiError) -> ProviderError {
    if error.kind == "namespaces" {
        ProviderError::InvalidConfig(format!(
            "config key `namespace`: namespace `{}` does not exist ({})",
            config.namespace,
            error.error.message()
        ))
    } else {
        ProviderError::InvalidConfig(format!(
            "config key `apiServer`: `{}` has no pods API ({}); is it a Kubernetes API server?",
            config.api_server,
            error.error.message()
        ))
    }
}

/// Deletes the pod read as `pod` (the precondition makes sure it is that
/// one, not someone else's that took the name in between); `force` skips
/// the grace period. A pod already gone counts as deleted.
fn delete_pod(client: &Client, pod: &Value, force: bool) -> Result<()> {
    let namespace = pod.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or_default();
    let name = pod.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    let uid = pod.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or_default();
    let mut options = json!({
        "apiVersion": "v1",
        "kind": "DeleteOptions",
        "preconditions": {"uid": uid}
    });
    if force {
        options["gracePeriodSeconds"] = json!(0);
    }
    match client.delete(&pod_path(namespace, name), &options) {
        Ok(_) => {
            log::info!("deleted pod", pod = name, namespace = namespace, forced = force);
            Ok(())
        }
        Err(error) if error.status == 404 => Ok(()),
        Err(error) => Err(error.into()),
    }
}

/// What a create does with the pod found holding its name.
enum Found {
    Adopted(Instance),
    /// Our pod, stranded in deletion and now forced out: create again.
    Cleared,
}

fn adopt(
    client: &Client,
    pod: &Value,
    entry: &str,
    spec: &ProxySpec,
    config: &Config,
) -> Result<Found> {
    let name = pod::pod_name(&spec.uid);
    if !pod::is_ours_for(pod, &spec.uid) {
        return Err(ProviderError::Conflict(format!(
            "pod {}/{name} exists and does not carry our label {}={}: someone else's pod holds \
             the name derived from this Proxy's UID; delete or rename it",
            config.namespace,
            pod::UID_LABEL,
            spec.uid
        )));
    }
    if pod::deletion_overdue(pod, now_unix()) {
        delete_pod(client, pod, true)?;
        return Ok(Found::Cleared);
    }
    if pod::is_deleting(pod) {
        return Err(ProviderError::Transient(format!(
            "our pod {}/{name} is still being deleted; it is created anew once it is gone",
            config.namespace
        )));
    }
    log::info!("adopting our pod", pod = name, namespace = config.namespace);
    if let Some(auth) = &spec.proxy_auth {
        secret::ensure(client, pod, &pod::labels(entry, spec)?, auth)?;
    }
    Ok(Found::Adopted(pod::instance_of(pod, config.port, now_unix())))
}

fn create(ctx: &CallContext, spec: &ProxySpec) -> Result<Instance> {
    let config = Config::parse(&ctx.config_json())?;
    let manifest = pod::manifest(&config, &ctx.entry, spec, now_unix())?;
    let name = pod::pod_name(&spec.uid);
    let client = client(ctx, &config);
    // Twice at most: a pod of ours that vanishes between the conflict and
    // the read, or is forced out of a stranded deletion, is created again
    // once.
    for _ in 0..2 {
        match client.post(&pods_path(&config.namespace), &manifest) {
            Ok(pod) => {
                log::info!("created pod", pod = name, namespace = config.namespace);
                if let Some(auth) = &spec.proxy_auth {
                    secret::ensure(&client, &pod, &pod::labels(&ctx.entry, spec)?, auth)?;
                }
                return Ok(pod::instance_of(&pod, config.port, now_unix()));
            }
            Err(error) if error.status == 409 && error.reason == "AlreadyExists" => {
                match client.get(&pod_path(&config.namespace, &name)) {
                    Ok(pod) => match adopt(&client, &pod, &ctx.entry, spec, &config)? {
                        Found::Adopted(instance) => return Ok(instance),
                        Found::Cleared => continue,
                    },
                    Err(error) if error.status == 404 => continue,
                    Err(error) => return Err(error.into()),
                }
            }
            Err(error) if error.status == 404 => return Err(create_not_found(&config, &error)),
            Err(error) => return Err(error.into()),
        }
    }
    Err(ProviderError::Transient(format!(
        "pod {}/{name} kept appearing and vanishing; retry",
        config.namespace
    )))
}

fn get(ctx: &CallContext, provider_id: &str) -> Result<Instance> {
    let config = Config::parse(&ctx.config_json())?;
    let Some((namespace, name)) = pod::parse_provider_id(provider_id) else {
        return Err(ProviderError::NotFound(format!("`{provider_id}` is not a namespace/pod")));
    };
    let pod = client(ctx, &config).get(&pod_path(namespace, name))?;
    if pod::mark_of(&pod).is_none() {
        return Err(ProviderError::NotFound(format!(
            "pod {namespace}/{name} no longer carries our mark: the name now holds someone else's pod"
        )));
    }
    let instance = pod::instance_of(&pod, config.port, now_unix());
    if instance.state == InstanceState::Provisioning
        && let Some(reason) = pod::waiting_reason(&pod)
    {
        log::debug!("pod not ready", pod = name, namespace = namespace, reason = reason);
    }
    Ok(instance)
}

fn delete(ctx: &CallContext, provider_id: &str) -> Result<()> {
    let config = Config::parse(&ctx.config_json())?;
    let Some((namespace, name)) = pod::parse_provider_id(provider_id) else {
        // Not an ID this plugin hands out: nothing of ours to delete.
        return Ok(());
    };
    let client = client(ctx, &config);
    let path = pod_path(namespace, name);
    let pod = match client.get(&path) {
        Ok(pod) => pod,
        Err(error) if error.status == 404 => return Ok(()),
        Err(error) => return Err(error.into()),
    };
    if pod::mark_of(&pod).is_none() {
        log::info!("the pod is not ours; leaving it alone", pod = name, namespace = namespace);
        return Ok(());
    }
    if pod::is_deleting(&pod) && !pod::deletion_overdue(&pod, now_unix()) {
        return Ok(());
    }
    delete_pod(&client, &pod, pod::is_deleting(&pod))?;
    // The garbage collector would remove it with the pod; not every
    // cluster runs one.
    secret::delete(&client, &pod)
}

fn list(ctx: &CallContext) -> Result<Vec<Instance>> {
    let config = Config::parse(&ctx.config_json())?;
    let client = client(ctx, &config);
    let selector = encode_component(&pod::selector(&ctx.entry));
    let mut instances = Vec::new();
    let mut continue_token: Option<String> = None;
    loop {
        let mut path =
            format!("{}?labelSelector={selector}&limit={LIST_PAGE}", pods_path(&config.namespace));
        if let Some(token) = &continue_token {
            path.push_str(&format!("&continue={}", encode_component(token)));
        }
        let page = client.get(&path)?;
        for pod in page.get("items").and_then(Value::as_array).into_iter().flatten() {
            // The selector finds our labels; the mark must agree with them.
            if pod::mark_of(pod).is_some() {
                instances.push(pod::instance_of(pod, config.port, now_unix()));
            }
        }
        continue_token = page
            .pointer("/metadata/continue")
            .and_then(Value::as_str)
            .filter(|token| !token.is_empty())
            .map(str::to_owned);
        if continue_token.is_none() {
            return Ok(instances);
        }
    }
}

/// Asks the API server whether the credential may `verb` pods in
/// `namespace`: `Ok(None)` when allowed, `Ok(Some(why))` when not.
fn may(client: &Client, namespace: &str, verb: &str) -> Result<Option<String>, ApiError> {
    let review = json!({
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {
            "namespace": namespace, "verb": verb, "group": "", "resource": "pods"
        }}
    });
    let answer = client.post("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", &review)?;
    let status = answer.get("status").unwrap_or(&Value::Null);
    if status.get("allowed").and_then(Value::as_bool) == Some(true) {
        return Ok(None);
    }
    let why = ["reason", "evaluationError"]
        .iter()
        .filter_map(|key| status.get(*key).and_then(Value::as_str))
        .filter(|text| !text.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    Ok(Some(why))
}

fn check(ctx: &CallContext) -> Health {
    let config = match Config::parse(&ctx.config_json()) {
        Ok(config) => config,
        Err(error) => return Health::unhealthy(HealthReason::Misconfigured, error.message()),
    };
    let client = client(ctx, &config);
    // One request first: when it fails (TLS, token, network) every other
    // one would fail the same way. Every authenticated user may read it.
    let version = match client.get("/version") {
        Ok(version) => version,
        Err(error) => return Health::unhealthy(error.health_reason(), error.error.message()),
    };
    log::debug!(
        "API server reachable",
        version = version.get("gitVersion").and_then(Value::as_str).unwrap_or("unknown")
    );

    let namespace = &config.namespace;
    let mut health = Health::healthy();
    let fail = |health: Health, reason: HealthReason, message: String| Health {
        healthy: false,
        ..health.with_issue(reason, message)
    };
    match client.get(&format!("/api/v1/namespaces/{namespace}")) {
        Ok(found) => {
            if found.pointer("/status/phase").and_then(Value::as_str) == Some("Terminating") {
                health = fail(
                    health,
                    HealthReason::Misconfigured,
                    format!("namespace `{namespace}` (config key `namespace`) is being deleted"),
                );
            }
        }
        Err(error) if error.status == 404 => {
            health = fail(
                health,
                HealthReason::Misconfigured,
                format!("namespace `{namespace}` (config key `namespace`) does not exist"),
            );
        }
        // Reading the namespace is a convenience the RBAC grants; without
        // it the pod permissions below still say whether calls can work.
        Err(error) if error.status == 403 => {
            health = health.with_issue(
                HealthReason::Unauthorized,
                format!(
                    "cannot tell whether namespace `{namespace}` exists: the credential may not get it ({})",
                    error.error.message()
                ),
            );
        }
        Err(error) => {
            health = fail(health, error.health_reason(), error.error.message().to_owned());
        }
    }

    let mut denied = Vec::new();
    let mut reasons = Vec::new();
    for verb in POD_VERBS {
        match may(&client, namespace, verb) {
            Ok(None) => {}
            Ok(Some(why)) => {
                denied.push(verb);
                if !why.is_empty() && !reasons.contains(&why) {
                    reasons.push(why);
                }
            }
            Err(error) => {
                return fail(
                    health,
                    error.health_reason(),
                    format!(
                        "cannot ask the API server for the credential's permissions: {}",
                        error.error.message()
                    ),
                );
            }
        }
    }
    if !denied.is_empty() {
        let mut message = format!(
            "the credential may not {} pods in namespace `{namespace}`; bind the Role of deploy/kubernetes/plugin-kubernetes-rbac.yaml",
            denied.join(", ")
        );
        if !reasons.is_empty() {
            message.push_str(&format!(" ({})", reasons.join("; ")));
        }
        health = fail(health, HealthReason::Unauthorized, message);
    }
    health
}

impl Provider for Kubernetes {
    fn describe() -> PluginInfo {
        PluginInfo::new(
            "kubernetes",
            env!("CARGO_PKG_VERSION"),
            config_schema(),
            Capabilities::default(),
        )
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

export_provider!(Kubernetes);

#[cfg(test)]
mod tests {
    use proxyfleet_sdk::http::{FailureKind, HostRefusal};

    use super::*;

    #[test]
    fn health_reasons_come_from_the_cause_not_the_text() {
        let failed = |cause: FailureKind, error: ProviderError| ApiError {
            status: 0,
            reason: String::new(),
            kind: String::new(),
            retry_after: None,
            cause,
            error,
        };
        let credential = FailureKind::Host(HostRefusal::CredentialUnavailable);
        for (cause, error, reason) in [
            (
                credential,
                ProviderError::Transient("x".into()),
                HealthReason::CredentialsUnavailable,
            ),
            (
                FailureKind::Tls,
                ProviderError::Permanent("x".into()),
                HealthReason::CertificateInvalid,
            ),
            (FailureKind::Timeout, ProviderError::Transient("x".into()), HealthReason::Timeout),
            (
                FailureKind::Status(401),
                ProviderError::Unauthorized("GET /version: HTTP 401 Unauthorized".into()),
                HealthReason::Unauthorized,
            ),
            (
                FailureKind::Connection,
                ProviderError::Transient("GET x: connection refused".into()),
                HealthReason::Unreachable,
            ),
            // An API server's own words decide nothing.
            (
                FailureKind::Status(500),
                ProviderError::Transient("HTTP 500: certificate rotation timed out".into()),
                HealthReason::Unreachable,
            ),
        ] {
            assert_eq!(failed(cause, error).health_reason(), reason, "{cause:?}");
        }
    }

    #[test]
    fn a_missing_namespace_is_named_in_the_config() {
        let config =
            Config::parse(r#"{"apiServer":"https://k:6443","namespace":"gone"}"#).expect("valid");
        let not_found = |kind: &str| ApiError {
            status: 404,
            reason: "NotFound".into(),
            kind: kind.into(),
            retry_after: None,
            cause: FailureKind::Status(404),
            error: ProviderError::NotFound("POST /api/v1/namespaces/gone/pods: HTTP 404".into()),
        };
        assert!(matches!(
            create_not_found(&config, &not_found("namespaces")),
            ProviderError::InvalidConfig(m) if m.starts_with("config key `namespace`: namespace `gone` does not exist")
        ));
        assert!(matches!(
            create_not_found(&config, &not_found("")),
            ProviderError::InvalidConfig(m) if m.starts_with("config key `apiServer`")
        ));
    }
}
