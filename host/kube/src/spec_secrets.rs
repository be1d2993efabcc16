//! The Secrets a Proxy's spec names (user-data, the proxy's credential),
//! read and checked: only a Secret that carries the label for its use is
//! read, so a Proxy author cannot make the operator read any Secret.
//! Errors name the field, the Secret and the key, never a value.

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt as _;
use kube::api::Api;
use proxyfleet_core::credential::ProxyCredential;

use crate::crd::{PROXY_AUTH_SECRET_LABEL, Proxy, USER_DATA_SECRET_LABEL};

/// Why a Secret a spec names cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// The Kubernetes API failed.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The Secret is missing, unlabelled or lacks a key: the spec's fault.
    #[error("{0}")]
    Refused(String),
}

/// The user-data of a Proxy: the content of the referenced key of a Secret
/// that carries the user-data label. The label keeps the operator from
/// reading arbitrary Secrets on a Proxy author's say-so.
pub async fn user_data(
    client: &kube::Client,
    namespace: &str,
    proxy: &Proxy,
) -> Result<Vec<u8>, SecretError> {
    let Some(reference) = &proxy.spec.user_data_secret_ref else {
        return Ok(Vec::new());
    };
    let field = "spec.userDataSecretRef";
    let secret =
        labelled_secret(client, namespace, field, &reference.name, USER_DATA_SECRET_LABEL).await?;
    let key = reference.key.as_deref().unwrap_or("user-data");
    secret_key(&secret, key).ok_or_else(|| {
        SecretError::Refused(format!(
            "{field}: Secret {namespace}/{} has no key {key:?}",
            reference.name
        ))
    })
}

/// The credential of a Proxy: the `username` and `password` keys of a
/// Secret that carries the proxy-auth label. Errors name what is wrong,
/// never the values.
pub async fn proxy_auth(
    client: &kube::Client,
    namespace: &str,
    proxy: &Proxy,
) -> Result<Option<ProxyCredential>, SecretError> {
    let Some(reference) = &proxy.spec.proxy_auth_secret_ref else {
        return Ok(None);
    };
    let field = "spec.proxyAuthSecretRef";
    let secret =
        labelled_secret(client, namespace, field, &reference.name, PROXY_AUTH_SECRET_LABEL).await?;
    let text = |key: &str| {
        let bytes = secret_key(&secret, key).ok_or_else(|| {
            SecretError::Refused(format!(
                "{field}: Secret {namespace}/{} has no key {key:?}; it needs username and password",
                reference.name
            ))
        })?;
        String::from_utf8(bytes).map_err(|_| {
            SecretError::Refused(format!(
                "{field}: Secret {namespace}/{}: {key} is not UTF-8",
                reference.name
            ))
        })
    };
    let credential = ProxyCredential::new(text("username")?, text("password")?).map_err(|err| {
        SecretError::Refused(format!("{field}: Secret {namespace}/{}: {err}", reference.name))
    })?;
    Ok(Some(credential))
}

/// Secret `name`, when it carries `label: "true"`. The label keeps the
/// operator from reading arbitrary Secrets on a Proxy author's say-so.
async fn labelled_secret(
    client: &kube::Client,
    namespace: &str,
    field: &str,
    name: &str,
    label: &str,
) -> Result<Secret, SecretError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret = secrets.get_opt(name).await?.ok_or_else(|| {
        SecretError::Refused(format!("{field}: Secret {namespace}/{name} does not exist"))
    })?;
    if secret.labels().get(label).map(String::as_str) != Some("true") {
        return Err(SecretError::Refused(format!(
            "{field}: Secret {namespace}/{name} lacks the label {label}=\"true\"; add it to let proxyfleet read it"
        )));
    }
    Ok(secret)
}

fn secret_key(secret: &Secret, key: &str) -> Option<Vec<u8>> {
    secret.data.as_ref().and_then(|data| data.get(key)).map(|bytes| bytes.0.clone())
}
