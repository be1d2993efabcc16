//! A pull's conversation with one registry: its HTTP client (the
//! registry's CA and timeouts, redirects and names judged by
//! [`crate::destination`]), the authorization the registry asks for,
//! manifests read whole only up to [`MAX_MANIFEST_BYTES`], and blobs
//! handed back unread for the pull to stream.
//!
//! The pull makes these requests itself rather than through oci-client,
//! which reads a manifest (or a tag's, when resolving it) whole before any
//! check, follows a descriptor's `urls`, and builds its HTTP client with
//! the default redirect policy and resolver, which a caller cannot
//! replace. oci-client still supplies the types and errors, and pushes.

use reqwest_oci::header::{ACCEPT, HeaderName};
use reqwest_oci::{Client, Response, StatusCode, Url};

use crate::access::Registries;
use crate::answer::{BoundedError, read_response, refusal};
use crate::destination::Destinations;
use crate::digest::{is_sha256, sha256};
use crate::error::OciError;
use crate::layout::MAX_MANIFEST_BYTES;
use crate::reference::PluginReference;
use crate::token::{Authorization, authorize};

/// The header in which registries name a manifest's digest.
const DIGEST_HEADER: HeaderName = HeaderName::from_static("docker-content-digest");

/// Every manifest type a tag may point at, for resolving it: what it
/// points at is judged when it is pulled.
const ANY_MANIFEST: &[&str] = &[
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];

/// One pull's requests to the registry of one reference.
#[derive(Debug)]
pub(crate) struct Session<'a> {
    reference: &'a PluginReference,
    http: Client,
    /// `SCHEME://REGISTRY/v2/REPOSITORY/`.
    repository: Url,
    authorization: Authorization,
}

impl<'a> Session<'a> {
    /// Opens a session for `reference`: its registry's client, credentials
    /// read now, and the authorization the registry asks for.
    pub(crate) async fn open(
        registries: &Registries,
        reference: &'a PluginReference,
    ) -> Result<Self, OciError> {
        let access = registries.for_host(reference.registry());
        let destinations = Destinations::new(reference.registry());
        let http = access.http_client(&destinations)?;
        let auth = access.auth()?;
        let scheme = if access.plain_http() { "http" } else { "https" };
        // As oci-client names registries (`docker.io` is reached at
        // `index.docker.io`).
        let client_reference = reference.to_client();
        let host = client_reference.resolve_registry();
        let root = Url::parse(&format!("{scheme}://{host}/")).map_err(|err| {
            OciError::from_client(
                reference,
                oci_client::errors::OciDistributionError::UrlParseError(format!(
                    "{scheme}://{host}/: {err}"
                )),
            )
        })?;
        let repository = root.join(&format!("v2/{}/", reference.repository())).map_err(|err| {
            OciError::from_client(
                reference,
                oci_client::errors::OciDistributionError::UrlParseError(err.to_string()),
            )
        })?;
        let authorization = authorize(&http, &root, auth, reference, &destinations).await?;
        Ok(Self { reference, http, repository, authorization })
    }

    /// The manifest `tag_or_digest` names, accepting `media_types`, read
    /// whole only within [`MAX_MANIFEST_BYTES`].
    pub(crate) async fn manifest(
        &self,
        tag_or_digest: &str,
        media_types: &[&str],
    ) -> Result<Vec<u8>, OciError> {
        let response = self.get(&format!("manifests/{tag_or_digest}"), media_types).await?;
        read_response(response, MAX_MANIFEST_BYTES).await.map_err(|err| match err {
            BoundedError::Over(size) => OciError::ManifestTooLarge {
                reference: self.reference.to_string(),
                size,
                limit: MAX_MANIFEST_BYTES,
            },
            BoundedError::Transport(err) => OciError::from_transport(self.reference, err),
        })
    }

    /// The digest of the manifest `tag` points at: the registry's
    /// `Docker-Content-Digest` from a `HEAD`, or, without one, the sha256
    /// of the manifest itself, read within [`MAX_MANIFEST_BYTES`].
    pub(crate) async fn manifest_digest(&self, tag: &str) -> Result<String, OciError> {
        let url = self.url(&format!("manifests/{tag}"))?;
        let request = self.http.head(url).header(ACCEPT, ANY_MANIFEST.join(", "));
        let response = self.send(request).await?;
        let named = response.headers().get(DIGEST_HEADER).and_then(|value| value.to_str().ok());
        if let Some(digest) = named.filter(|digest| is_sha256(digest)) {
            return Ok(digest.to_owned());
        }
        Ok(sha256(&self.manifest(tag, ANY_MANIFEST).await?))
    }

    /// The blob `digest`, its body unread.
    pub(crate) async fn blob(&self, digest: &str) -> Result<Response, OciError> {
        self.get(&format!("blobs/{digest}"), &[]).await
    }

    async fn get(&self, path: &str, media_types: &[&str]) -> Result<Response, OciError> {
        let mut request = self.http.get(self.url(path)?);
        if !media_types.is_empty() {
            request = request.header(ACCEPT, media_types.join(", "));
        }
        self.send(request).await
    }

    /// Sends `request` with the session's authorization; anything but
    /// `200 OK` is the registry's refusal.
    async fn send(&self, request: reqwest_oci::RequestBuilder) -> Result<Response, OciError> {
        let response = self
            .authorization
            .apply(request)
            .send()
            .await
            .map_err(|err| OciError::from_transport(self.reference, err))?;
        if response.status() != StatusCode::OK {
            return Err(OciError::from_client(self.reference, refusal(response).await));
        }
        Ok(response)
    }

    fn url(&self, path: &str) -> Result<Url, OciError> {
        self.repository.join(path).map_err(|err| {
            OciError::from_client(
                self.reference,
                oci_client::errors::OciDistributionError::UrlParseError(format!("{path}: {err}")),
            )
        })
    }
}
