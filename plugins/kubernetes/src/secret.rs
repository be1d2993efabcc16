//! The proxy credential of a pod: a Secret named after the pod and owned by
//! it, which the proxy container reads as two environment variables. The
//! pod spec names the Secret and its keys; the credential itself never
//! appears in the pod, its labels or its annotations.
//!
//! The pod is created first, so that the Secret can name it as its owner:
//! the cluster's garbage collector removes the Secret with the pod, and
//! `delete` removes it as well for clusters that run no collector. Until
//! the Secret exists the kubelet holds the container back
//! (`CreateContainerConfigError`) and retries; the pod is `provisioning`.
//! A create that adopts its pod writes the Secret again, so a create cut
//! off between the two leaves nothing half done.

use proxyfleet_sdk::{ProviderError, ProxyAuth, Result, log};
use serde_json::{Map, Value, json};

use crate::api::Client;

/// The variable holding the username; empty or unset: no credential.
pub const USERNAME_ENV: &str = "PROXY_AUTH_USERNAME";
/// The variable holding the password.
pub const PASSWORD_ENV: &str = "PROXY_AUTH_PASSWORD";

const USERNAME_KEY: &str = "username";
const PASSWORD_KEY: &str = "password";

/// The Secret of the pod `pod_name`.
pub fn secret_name(pod_name: &str) -> String {
    format!("{pod_name}-auth")
}

fn secrets_path(namespace: &str) -> String {
    format!("/api/v1/namespaces/{namespace}/secrets")
}

/// The container's environment entries that read the credential.
pub fn env(pod_name: &str) -> [Value; 2] {
    let from = |key: &str| json!({"secretKeyRef": {"name": secret_name(pod_name), "key": key, "optional": false}});
    [
        json!({"name": USERNAME_ENV, "valueFrom": from(USERNAME_KEY)}),
        json!({"name": PASSWORD_ENV, "valueFrom": from(PASSWORD_KEY)}),
    ]
}

/// tinyproxy's `BasicAuth` line takes a username and a password of
/// letters, digits, `-`, `_` and `.` only; anything else stops it from
/// starting ("Syntax error"), so such a credential is refused up front.
pub fn check_for_tinyproxy(auth: &ProxyAuth) -> Result<()> {
    let allowed = |text: &str| {
        text.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    };
    if allowed(&auth.username) && allowed(&auth.password) {
        return Ok(());
    }
    Err(ProviderError::InvalidSpec(
        "proxyAuth: tinyproxy's BasicAuth takes only letters, digits, '-', '_' and '.' in the \
         username and the password; choose a credential of those (e.g. 32 random letters and \
         digits), or set the entry's `command`/`args` to a proxy that reads the credential from \
         $PROXY_AUTH_USERNAME and $PROXY_AUTH_PASSWORD"
            .to_owned(),
    ))
}

/// The Secret for `pod` (as the API server returned it), owned by it.
pub fn manifest(pod: &Value, labels: &Map<String, Value>, auth: &ProxyAuth) -> Value {
    let metadata = pod.get("metadata").unwrap_or(&Value::Null);
    let field = |key: &str| metadata.get(key).and_then(Value::as_str).unwrap_or_default();
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": secret_name(field("name")),
            "namespace": field("namespace"),
            "labels": labels,
            "ownerReferences": [{
                "apiVersion": "v1",
                "kind": "Pod",
                "name": field("name"),
                "uid": field("uid"),
            }]
        },
        "stringData": {USERNAME_KEY: auth.username, PASSWORD_KEY: auth.password}
    })
}

/// Writes the Secret of `pod`: created, or replaced when one of that name
/// is left (a pod of an earlier credential, or an earlier attempt).
pub fn ensure(
    client: &Client,
    pod: &Value,
    labels: &Map<String, Value>,
    auth: &ProxyAuth,
) -> Result<()> {
    let secret = manifest(pod, labels, auth);
    let namespace = secret.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("");
    let name = secret.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
    let collection = secrets_path(namespace);
    match client.post(&collection, &secret) {
        Ok(_) => {}
        Err(error) if error.status == 409 && error.reason == "AlreadyExists" => {
            client.put(&format!("{collection}/{name}"), &secret).map_err(ProviderError::from)?;
        }
        Err(error) => return Err(error.into()),
    }
    log::info!("wrote the proxy credential's secret", secret = name, namespace = namespace);
    Ok(())
}

/// Whether `pod` reads its credential from its Secret.
pub fn is_used_by(pod: &Value) -> bool {
    let name = pod.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    let wanted = secret_name(name);
    pod.pointer("/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|container| container.get("env").and_then(Value::as_array))
        .flatten()
        .any(|entry| {
            entry.pointer("/valueFrom/secretKeyRef/name").and_then(Value::as_str)
                == Some(wanted.as_str())
        })
}

/// Deletes the Secret of `pod`, if it has one; one already gone counts as
/// deleted.
pub fn delete(client: &Client, pod: &Value) -> Result<()> {
    if !is_used_by(pod) {
        return Ok(());
    }
    let namespace = pod.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or_default();
    let name = secret_name(pod.pointer("/metadata/name").and_then(Value::as_str).unwrap_or(""));
    let options = json!({"apiVersion": "v1", "kind": "DeleteOptions"});
    match client.delete(&format!("{}/{name}", secrets_path(namespace)), &options) {
        Ok(_) => Ok(()),
        Err(error) if error.status == 404 => Ok(()),
        Err(error) => Err(error.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth(username: &str, password: &str) -> ProxyAuth {
        ProxyAuth { username: username.into(), password: password.into() }
    }

    #[test]
    fn the_secret_is_owned_by_its_pod_and_holds_the_credential() {
        let pod = json!({"metadata": {"name": "pf-abc", "namespace": "proxies", "uid": "u-1"}});
        let labels = Map::from_iter([("app".to_owned(), json!("x"))]);
        let secret = manifest(&pod, &labels, &auth("crawler", "pw.1"));
        assert_eq!(secret["metadata"]["name"], "pf-abc-auth");
        assert_eq!(secret["metadata"]["namespace"], "proxies");
        assert_eq!(secret["metadata"]["labels"]["app"], "x");
        assert_eq!(
            secret["metadata"]["ownerReferences"],
            json!([{"apiVersion": "v1", "kind": "Pod", "name": "pf-abc", "uid": "u-1"}])
        );
        assert_eq!(secret["stringData"], json!({"username": "crawler", "password": "pw.1"}));
    }

    #[test]
    fn the_container_reads_the_credential_by_reference_only() {
        let env = env("pf-abc");
        let text = serde_json::to_string(&env).expect("a test value");
        assert!(text.contains("\"name\":\"pf-abc-auth\""), "{text}");
        assert_eq!(env[0]["name"], USERNAME_ENV);
        assert_eq!(env[1]["valueFrom"]["secretKeyRef"]["key"], "password");
        let pod = json!({"metadata": {"name": "pf-abc"}, "spec": {"containers": [{"env": env}]}});
        assert!(is_used_by(&pod));
        let other = json!({"metadata": {"name": "pf-def"}, "spec": {"containers": [{"env": env}]}});
        assert!(!is_used_by(&other), "another pod's secret is not this pod's");
        assert!(!is_used_by(&json!({"metadata": {"name": "pf-abc"}})));
    }

    #[test]
    fn tinyproxy_credentials_are_checked_for_what_its_config_parser_reads() {
        assert!(check_for_tinyproxy(&auth("crawler", "aZ09-_.x")).is_ok());
        for (username, password) in [("crawler", "p@ss"), ("a b", "pw"), ("crawler", "pw word")] {
            let err =
                check_for_tinyproxy(&auth(username, password)).expect_err("refused").to_string();
            assert!(err.contains("proxyAuth:") && !err.contains(password), "{err}");
        }
    }
}
