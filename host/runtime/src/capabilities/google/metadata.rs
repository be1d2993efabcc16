//! Tokens from the metadata server: the service account attached to the
//! VM, or, on GKE with Workload Identity, the Google service account the
//! pod's Kubernetes service account is bound to. No key file exists to
//! leak or rotate.
//!
//! The host asks `GET http://{metadataHost}/computeMetadata/v1/instance/
//! service-accounts/{account}/token?scopes=...` with `Metadata-Flavor:
//! Google`, as Google's client libraries do, and believes only an answer
//! that carries `Metadata-Flavor: Google` back. The request is the host's
//! own, on a client of its own that never goes through a proxy (the
//! metadata server refuses requests with `X-Forwarded-For`) and follows
//! no redirect; the plugin's address policy, which keeps it away from the
//! metadata address, is not involved, and the plugin never sees the
//! token.

use std::time::Duration;

use http::StatusCode;

use super::{Fetched, MAX_TOKEN_RESPONSE, TokenError};
use crate::capabilities::http::config::GoogleMetadataCredential;
use crate::limits::Limits;

/// The header both sides send.
const FLAVOR: &str = "Metadata-Flavor";
/// Most of a refusal's text quoted in an error.
const QUOTED: usize = 400;

/// A metadata server and the account and scopes asked for.
#[derive(Debug)]
pub(super) struct MetadataServer {
    pub(super) config: GoogleMetadataCredential,
}

impl MetadataServer {
    /// The token URL.
    pub(super) fn url(&self) -> String {
        let GoogleMetadataCredential { metadata_host, service_account, scopes } = &self.config;
        let mut url = format!(
            "http://{metadata_host}/computeMetadata/v1/instance/service-accounts/\
             {service_account}/token"
        );
        if !scopes.is_empty() {
            let list = scopes.join(",");
            let encoded =
                percent_encoding::utf8_percent_encode(&list, percent_encoding::NON_ALPHANUMERIC);
            url.push_str(&format!("?scopes={encoded}"));
        }
        url
    }

    /// A new token from the metadata server.
    pub(super) async fn fetch(&self, limits: &Limits) -> Result<Fetched, TokenError> {
        let url = self.url();
        let server = &self.config.metadata_host;
        let client = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(limits.http_connect_timeout)
            .timeout(limits.http_first_byte_timeout)
            .build()
            .map_err(|err| {
                TokenError::Unavailable(format!("cannot make a client for {server}: {err}"))
            })?;
        let response = client.get(&url).header(FLAVOR, "Google").send().await.map_err(|err| {
            TokenError::Unavailable(format!(
                "cannot reach the metadata server {server}: {err} (on GKE the node pool needs \
                 the GKE metadata server, Workload Identity; a NetworkPolicy must let the pod \
                 reach it)"
            ))
        })?;
        let status = response.status();
        let flavored = response
            .headers()
            .get(FLAVOR)
            .is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"Google"));
        let body = read_limited(response).await.map_err(|err| {
            TokenError::Unavailable(format!("reading the answer of {server} failed: {err}"))
        })?;
        if !flavored {
            return Err(TokenError::Refused(format!(
                "{server} answered HTTP {} without `{FLAVOR}: Google`: it is not a metadata \
                 server; check credential.metadataHost",
                status.as_u16()
            )));
        }
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body);
            let text: String = text.trim().chars().take(QUOTED).collect();
            let text = format!(
                "the metadata server {server} refused a token for {} (HTTP {}): {text}",
                self.config.service_account,
                status.as_u16()
            );
            return Err(if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS {
                TokenError::Unavailable(text)
            } else {
                TokenError::Refused(text)
            });
        }
        let answer: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        let Some(token) = answer["access_token"].as_str().filter(|token| !token.is_empty()) else {
            return Err(TokenError::Unavailable(format!(
                "the metadata server {server} answered without an access_token"
            )));
        };
        let lifetime = answer["expires_in"].as_u64().unwrap_or(60).max(1);
        Ok(Fetched {
            token: token.to_owned(),
            lifetime: Duration::from_secs(lifetime),
            account: self.config.service_account.clone(),
        })
    }
}

/// The body, up to [`MAX_TOKEN_RESPONSE`].
async fn read_limited(mut response: reqwest::Response) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|err| err.to_string())? {
        if body.len() + chunk.len() > MAX_TOKEN_RESPONSE {
            return Err(format!("the answer is larger than {MAX_TOKEN_RESPONSE} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

#[cfg(test)]
mod tests;
