//! Signatures of plugin builds as cosign writes them for a key: an OCI
//! manifest tagged `sha256-<manifest hex>.sig` in the build's repository,
//! each layer a "simple signing" payload that names the signed manifest's
//! digest, with the signature of that payload in the layer's
//! `dev.cosignproject.cosign/signature` annotation (base64 of ASN.1 DER
//! ECDSA P-256). Several signatures are several layers of that manifest.
//!
//! A [`KeyPolicy`] is a set of public keys, named by a `verify` field of
//! the providers file; a build passes when, for every policy that applies
//! to it, one signature verifies under one of the policy's keys and its
//! payload names the build's manifest. Key files are read on every check,
//! so a rotated key takes effect at the next one.

use std::path::PathBuf;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use oci_client::manifest::{OciDescriptor, OciImageManifest};
use serde::{Deserialize, Serialize};

use crate::cosign_key::PublicKey;
use crate::error::OciError;
use crate::reference::PluginReference;

/// The media type of a signature layer.
pub const SIMPLE_SIGNING_MEDIA_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// The annotation that holds a layer's signature.
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
/// The payload's `critical.type`.
const PAYLOAD_TYPE: &str = "cosign container image signature";
/// The most signature layers looked at, and the largest payload and
/// signature read: a payload is about 250 bytes, a signature about 100.
const MAX_SIGNATURES: usize = 32;
pub(crate) const MAX_PAYLOAD_BYTES: u64 = 16 << 10;
const MAX_SIGNATURE_CHARS: usize = 1 << 10;

/// The tag cosign signs a manifest under.
pub fn signature_tag(manifest_digest: &str) -> String {
    format!("{}.sig", manifest_digest.replacen(':', "-", 1))
}

/// A `verify` item as written: public key files.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawVerify {
    /// PEM files of ECDSA P-256 public keys (`cosign.pub`).
    pub keys: Vec<PathBuf>,
}

/// Public keys a build must carry a signature by (one of them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPolicy {
    /// Where the policy is written, e.g. `registries[0].verify`: named in
    /// every refusal it causes.
    field: String,
    keys: Vec<PathBuf>,
}

impl KeyPolicy {
    /// Validates a `verify` item written at `field`: at least one key, and
    /// no key twice. The files are read when a build is checked. An error
    /// names the key within the item (`keys`, `keys[1]`) and the fix.
    pub fn validate(field: impl Into<String>, raw: RawVerify) -> Result<Self, String> {
        let field = field.into();
        if raw.keys.is_empty() {
            return Err("keys: name at least one public key file (cosign.pub), or leave \
                 `verify` out to accept builds without signatures"
                .to_owned());
        }
        for (i, key) in raw.keys.iter().enumerate() {
            if key.as_os_str().is_empty() {
                return Err(format!("keys[{i}]: must name a file"));
            }
            if raw.keys[..i].contains(key) {
                return Err(format!("keys[{i}]: {} is listed twice", key.display()));
            }
        }
        Ok(Self { field, keys: raw.keys })
    }

    /// The field the policy is written at.
    pub fn field(&self) -> &str {
        &self.field
    }

    /// The key files.
    pub fn keys(&self) -> &[PathBuf] {
        &self.keys
    }

    /// Reads every key: a key that cannot be read refuses the check, since
    /// a policy that silently lost a key would accept less than it says.
    fn read_keys(&self, reference: &PluginReference) -> Result<Vec<PublicKey>, OciError> {
        self.keys
            .iter()
            .enumerate()
            .map(|(i, path)| {
                PublicKey::read(path).map_err(|source| OciError::VerifyKey {
                    reference: reference.to_string(),
                    field: format!("{}.keys[{i}]", self.field),
                    source,
                })
            })
            .collect()
    }
}

/// Policies with their keys read, ready to check signatures.
pub(crate) struct ReadPolicies<'a>(Vec<(&'a KeyPolicy, Vec<PublicKey>)>);

/// Reads the keys of every policy, before anything is asked of the
/// registry: a key problem is the configuration's, whatever the build.
pub(crate) fn read_policies<'a>(
    reference: &PluginReference,
    policies: &'a [KeyPolicy],
) -> Result<ReadPolicies<'a>, OciError> {
    policies
        .iter()
        .map(|policy| Ok((policy, policy.read_keys(reference)?)))
        .collect::<Result<_, _>>()
        .map(ReadPolicies)
}

/// The simple signing payload.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Payload {
    critical: Critical,
    optional: Option<serde_json::Value>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Critical {
    identity: Identity,
    image: Image,
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct Identity {
    #[serde(rename = "docker-reference")]
    docker_reference: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct Image {
    #[serde(rename = "docker-manifest-digest")]
    docker_manifest_digest: String,
}

impl Payload {
    /// The payload signing `manifest_digest` of `reference`'s repository.
    pub(crate) fn new(reference: &PluginReference, manifest_digest: &str) -> Self {
        Self {
            critical: Critical {
                identity: Identity {
                    docker_reference: format!(
                        "{}/{}",
                        reference.registry(),
                        reference.repository()
                    ),
                },
                image: Image { docker_manifest_digest: manifest_digest.to_owned() },
                kind: PAYLOAD_TYPE.to_owned(),
            },
            optional: None,
        }
    }

    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// One signature layer of a signature manifest.
pub(crate) struct SignatureLayer<'a> {
    pub(crate) descriptor: &'a OciDescriptor,
    signature: Vec<u8>,
}

impl SignatureLayer<'_> {
    /// True when this layer's signature signs `payload` under `key`.
    pub(crate) fn verifies(&self, payload: &[u8], key: &PublicKey) -> bool {
        key.verifies(payload, &self.signature)
    }

    /// The signature with its payload, once read.
    pub(crate) fn with(self, payload: Vec<u8>) -> Signature {
        Signature { payload, signature: self.signature }
    }
}

/// The signature layers of a signature manifest, their signatures
/// decoded; anything malformed refuses the whole artifact.
pub(crate) fn signature_layers<'a>(
    reference: &PluginReference,
    manifest: &'a OciImageManifest,
) -> Result<Vec<SignatureLayer<'a>>, OciError> {
    let refuse = |reason: String| OciError::Signature { reference: reference.to_string(), reason };
    let layers: Vec<&OciDescriptor> = manifest
        .layers
        .iter()
        .filter(|layer| layer.media_type == SIMPLE_SIGNING_MEDIA_TYPE)
        .collect();
    if layers.len() > MAX_SIGNATURES {
        return Err(refuse(format!(
            "the signature artifact holds {} signatures, over the {MAX_SIGNATURES} looked at",
            layers.len()
        )));
    }
    layers
        .into_iter()
        .map(|descriptor| {
            let text = descriptor
                .annotations
                .as_ref()
                .and_then(|annotations| annotations.get(SIGNATURE_ANNOTATION))
                .ok_or_else(|| {
                    refuse(format!("a layer has no {SIGNATURE_ANNOTATION} annotation"))
                })?;
            if text.len() > MAX_SIGNATURE_CHARS {
                return Err(refuse(format!(
                    "a signature is {} characters, over the {MAX_SIGNATURE_CHARS} of any \
                     ECDSA P-256 signature",
                    text.len()
                )));
            }
            let signature = BASE64
                .decode(text.trim())
                .map_err(|err| refuse(format!("a signature is not base64: {err}")))?;
            if u64::try_from(descriptor.size).unwrap_or(u64::MAX) > MAX_PAYLOAD_BYTES {
                return Err(refuse(format!(
                    "a payload declares {} bytes, over the {MAX_PAYLOAD_BYTES} read",
                    descriptor.size
                )));
            }
            Ok(SignatureLayer { descriptor, signature })
        })
        .collect()
}

/// One signature: the payload and its signature over it (DER).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signature {
    /// The simple signing payload, as signed.
    #[serde(with = "crate::base64_bytes")]
    pub payload: Vec<u8>,
    /// The signature, ASN.1 DER.
    #[serde(with = "crate::base64_bytes")]
    pub signature: Vec<u8>,
}

/// What verified a build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// Per policy that applied, in order: its field and the fingerprint of
    /// the key that verified (see [`PublicKey::fingerprint`]).
    pub by: Vec<(String, String)>,
    /// The signatures that did, kept with the build so that it can be
    /// checked again without the registry ([`verify_kept`]).
    pub signatures: Vec<Signature>,
}

/// Checks the signatures kept with a stored build of `manifest_digest`
/// against `policies` again, as at its pull: a policy (or a key) added
/// or changed since holds for builds already on disk too.
pub fn verify_kept(
    reference: &PluginReference,
    manifest_digest: &str,
    policies: &[KeyPolicy],
    signatures: &[Signature],
) -> Result<Verified, OciError> {
    let keyed = read_policies(reference, policies)?;
    check(reference, manifest_digest, &keyed, signatures)
}

/// Checks `policies` against `signatures` (payloads read and
/// digest-checked by the caller): each policy needs one whose payload
/// names `manifest_digest` and whose signature verifies under one of its
/// keys.
pub(crate) fn check(
    reference: &PluginReference,
    manifest_digest: &str,
    policies: &ReadPolicies<'_>,
    signatures: &[Signature],
) -> Result<Verified, OciError> {
    let mut by = Vec::with_capacity(policies.0.len());
    let mut used: Vec<Signature> = Vec::new();
    for (policy, keys) in &policies.0 {
        let mut tried = Vec::new();
        let found = signatures.iter().find_map(|Signature { payload, signature }| {
            let named = match serde_json::from_slice::<Payload>(payload) {
                Ok(parsed) if parsed.critical.kind != PAYLOAD_TYPE => {
                    tried.push(format!("a payload of type {:?}", parsed.critical.kind));
                    return None;
                }
                Ok(parsed) => parsed.critical.image.docker_manifest_digest,
                Err(err) => {
                    tried.push(format!("a payload that is not cosign's: {err}"));
                    return None;
                }
            };
            let key = keys.iter().find(|key| key.verifies(payload, signature));
            match key {
                None => {
                    tried.push("a signature by a key the policy does not name".to_owned());
                    None
                }
                Some(_) if named != manifest_digest => {
                    tried.push(format!("a valid signature of another manifest ({named})"));
                    None
                }
                Some(key) => Some((
                    key.fingerprint(),
                    Signature { payload: payload.clone(), signature: signature.clone() },
                )),
            }
        });
        match found {
            Some((fingerprint, signature)) => {
                by.push((policy.field.clone(), fingerprint));
                if !used.contains(&signature) {
                    used.push(signature);
                }
            }
            None => {
                let seen = if tried.is_empty() {
                    "the signature artifact holds no signature layer".to_owned()
                } else {
                    tried.join("; ")
                };
                return Err(OciError::Signature {
                    reference: reference.to_string(),
                    reason: format!(
                        "no signature of manifest {manifest_digest} verifies under the keys of \
                         {} ({seen}); sign it with a key {} names (`proxyfleet plugin sign` or \
                         `cosign sign --key`)",
                        policy.field, policy.field
                    ),
                });
            }
        }
    }
    Ok(Verified { by, signatures: used })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cosign_key::PrivateKey;

    fn reference() -> PluginReference {
        PluginReference::parse("oci://registry.example/team/static:1").unwrap()
    }

    const DIGEST: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";

    fn manifest(layers: Vec<OciDescriptor>) -> OciImageManifest {
        OciImageManifest { layers, ..OciImageManifest::default() }
    }

    fn layer(payload: &[u8], signature: &[u8]) -> OciDescriptor {
        OciDescriptor {
            media_type: SIMPLE_SIGNING_MEDIA_TYPE.to_owned(),
            digest: crate::digest::sha256(payload),
            size: i64::try_from(payload.len()).unwrap(),
            annotations: Some(
                [(SIGNATURE_ANNOTATION.to_owned(), BASE64.encode(signature))].into_iter().collect(),
            ),
            ..OciDescriptor::default()
        }
    }

    struct Keys {
        _dir: tempfile::TempDir,
        policy: KeyPolicy,
        key: PrivateKey,
    }

    fn keys() -> Keys {
        let dir = tempfile::tempdir().unwrap();
        let key = PrivateKey::generate().unwrap();
        let path = dir.path().join("cosign.pub");
        std::fs::write(&path, key.public().to_pem()).unwrap();
        let policy =
            KeyPolicy::validate("registries[0].verify", RawVerify { keys: vec![path] }).unwrap();
        Keys { _dir: dir, policy, key }
    }

    /// A signature `cosign sign --key` made of an image, with the payload
    /// it signed and its public key: it verifies as cosign's own does.
    #[test]
    fn verifies_a_signature_cosign_made() {
        let dir = tempfile::tempdir().unwrap();
        let public = dir.path().join("cosign.pub");
        std::fs::write(
            &public,
            "-----BEGIN PUBLIC KEY-----\n\
             MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAENptdY/l3nB0yqkXLBWkZWQwo6+cu\n\
             OSWS1X9vPavpiQOoTTGC0xX57OojUadxF1cdQmrsiReWg2Wn4FneJfa8xw==\n\
             -----END PUBLIC KEY-----\n",
        )
        .unwrap();
        let payload = br#"{"critical":{"identity":{"docker-reference":"registry-testing.svc.lan/busybox"},"image":{"docker-manifest-digest":"sha256:f3cfc9d0dbf931d3db4685ec659b7ac68e2a578219da4aae65427886e649b06b"},"type":"cosign container image signature"},"optional":null}"#;
        let signature = BASE64
            .decode(
                "MEUCIQD6q/COgzOyW0YH1Dk+CCYSt4uAhm3FDHUwvPI55zwnlwIgE0ZK58ZOWpZw8YVmBapJhBqCfdPekIknimuO0xH8Jh8=",
            )
            .unwrap();
        let policy =
            KeyPolicy::validate("registries[0].verify", RawVerify { keys: vec![public] }).unwrap();
        let digest = "sha256:f3cfc9d0dbf931d3db4685ec659b7ac68e2a578219da4aae65427886e649b06b";
        let signatures = [Signature { payload: payload.to_vec(), signature }];
        verify_kept(&reference(), digest, std::slice::from_ref(&policy), &signatures).unwrap();
        let other = DIGEST;
        let err = verify_kept(&reference(), other, &[policy], &signatures).unwrap_err();
        assert!(err.to_string().contains("another manifest"), "{err}");
    }

    #[test]
    fn the_tag_is_cosigns() {
        assert_eq!(
            signature_tag(DIGEST),
            "sha256-1111111111111111111111111111111111111111111111111111111111111111.sig"
        );
    }

    #[test]
    fn a_signature_by_a_named_key_over_this_manifest_passes() {
        let keys = keys();
        let payload = Payload::new(&reference(), DIGEST).to_bytes();
        let manifest = manifest(vec![layer(&payload, &keys.key.sign(&payload))]);
        let layers = signature_layers(&reference(), &manifest).unwrap();
        let read: Vec<_> = layers.into_iter().map(|layer| layer.with(payload.clone())).collect();
        let policies = std::slice::from_ref(&keys.policy);
        let policies = read_policies(&reference(), policies).unwrap();
        let verified = check(&reference(), DIGEST, &policies, &read).unwrap();
        // Kept with the build, the signatures verify again offline.
        let again = verify_kept(
            &reference(),
            DIGEST,
            std::slice::from_ref(&keys.policy),
            &verified.signatures,
        )
        .unwrap();
        assert_eq!(again, verified);
        assert_eq!(
            verified.by,
            [("registries[0].verify".to_owned(), keys.key.public().fingerprint())]
        );
    }

    #[test]
    fn another_key_or_another_manifest_is_refused_naming_the_policy() {
        let keys = keys();
        let stranger = PrivateKey::generate().unwrap();
        let payload = Payload::new(&reference(), DIGEST).to_bytes();
        let other = "sha256:2222222222222222222222222222222222222222222222222222222222222222";
        let moved = Payload::new(&reference(), other).to_bytes();
        for (payload, signature, says) in [
            (payload.clone(), stranger.sign(&payload), "a key the policy does not name"),
            (moved.clone(), keys.key.sign(&moved), "another manifest"),
            (payload.clone(), keys.key.sign(b"something else"), "a key the policy does not name"),
        ] {
            let manifest = manifest(vec![layer(&payload, &signature)]);
            let layers = signature_layers(&reference(), &manifest).unwrap();
            let read: Vec<_> =
                layers.into_iter().map(|layer| layer.with(payload.clone())).collect();
            let policies = std::slice::from_ref(&keys.policy);
            let policies = read_policies(&reference(), policies).unwrap();
            let err = check(&reference(), DIGEST, &policies, &read).unwrap_err();
            assert!(matches!(err, OciError::Signature { .. }), "{err}");
            let text = err.to_string();
            assert!(text.contains("registries[0].verify") && text.contains(says), "{text}");
        }
    }

    #[test]
    fn malformed_signature_artifacts_are_refused_before_anything_is_read() {
        let mut no_annotation = layer(b"{}", b"x");
        no_annotation.annotations = None;
        let mut huge = layer(b"{}", b"x");
        huge.size = 1 << 30;
        let many = (0..=MAX_SIGNATURES).map(|_| layer(b"{}", b"x")).collect();
        let mut garbled = layer(b"{}", b"x");
        garbled
            .annotations
            .as_mut()
            .unwrap()
            .insert(SIGNATURE_ANNOTATION.to_owned(), "not base64!".to_owned());
        for (layers, says) in [
            (vec![no_annotation], "annotation"),
            (vec![huge], "over the"),
            (many, "signatures, over"),
            (vec![garbled], "not base64"),
        ] {
            let err = signature_layers(&reference(), &manifest(layers)).err().unwrap();
            assert!(matches!(err, OciError::Signature { .. }), "{err}");
            assert!(err.to_string().contains(says), "{err}");
        }
    }

    #[test]
    fn a_missing_key_file_refuses_naming_the_key_field() {
        let dir = tempfile::tempdir().unwrap();
        let policy = KeyPolicy::validate(
            "provider entry \"a\" verify",
            RawVerify { keys: vec![dir.path().join("gone.pub")] },
        )
        .unwrap();
        let err = read_policies(&reference(), &[policy]).err().unwrap();
        assert!(matches!(err, OciError::VerifyKey { .. }), "{err}");
        assert!(err.to_string().contains("verify.keys[0]"), "{err}");
    }

    #[test]
    fn a_policy_without_keys_or_with_one_twice_is_refused() {
        let err = KeyPolicy::validate("registries[0].verify", RawVerify::default()).unwrap_err();
        assert!(err.starts_with("keys:") && err.contains("at least one"), "{err}");
        let twice = RawVerify { keys: vec!["a.pub".into(), "a.pub".into()] };
        let err = KeyPolicy::validate("registries[0].verify", twice).unwrap_err();
        assert!(err.contains("keys[1]") && err.contains("twice"), "{err}");
    }
}
