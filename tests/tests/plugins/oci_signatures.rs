//! Signed registry builds: entries and registry items with `verify: {keys:
//! [...]}` serve only builds with a cosign signature by one of the keys,
//! against Debian's `docker-registry` on loopback; signatures are made with
//! `proxyfleet_oci::sign` (what `proxyfleet plugin sign` runs). What no
//! real registry would hold by accident (malformed signature artifacts)
//! comes from the stand-in, [`StubRegistry`].

use std::path::{Path, PathBuf};

use proxyfleet_oci::{
    KeyPolicy, OciError, PluginReference, PrivateKey, PullLimits, RawVerify, Registries,
};
use proxyfleet_runtime::admission::RejectionKind;
use proxyfleet_runtime::follow::FollowOptions;
use proxyfleet_tests::stub_registry::{Answer, StubRegistry};
use proxyfleet_tests::wait_for;

use crate::oci::{
    PATIENCE, POLL, Setup, V1, V2, answer, load, sha256_of, stub_build, stub_registries,
    unavailable, until_answer,
};

/// A key pair in `dir`: the private key, and its public key written as
/// `NAME.pub`.
fn key(dir: &Path, name: &str) -> (PrivateKey, PathBuf) {
    let key = PrivateKey::generate().unwrap();
    let public = dir.join(format!("{name}.pub"));
    std::fs::write(&public, key.public().to_pem()).unwrap();
    (key, public)
}

async fn sign(setup: &Setup, reference: &str, key: &PrivateKey) {
    let reference = PluginReference::parse(reference).unwrap();
    let signed = proxyfleet_oci::sign(&setup.registries(), &reference, key).await.unwrap();
    assert!(signed.added, "{signed:?}");
}

#[tokio::test]
async fn an_entry_with_keys_serves_only_builds_signed_with_one_and_keeps_the_last_good_one() {
    let setup = Setup::new();
    let keys = tempfile::tempdir().unwrap();
    let (ours, ours_pub) = key(keys.path(), "ours");
    let (stranger, _) = key(keys.path(), "stranger");
    setup.push("fixtures/answer-v1", "plugins/answer", "stable").await;
    let tagged = setup.registry.reference("plugins/answer", "stable");
    let config = setup.providers(&format!(
        "  - {{ name: signed, plugin: '{tagged}', verify: {{ keys: ['{}'] }} }}\n",
        ours_pub.display()
    ));

    // Not signed yet: refused at the cold start, naming the policy.
    let registry = load(&config, &setup.plugin_dir(), &setup.cache("cache")).await;
    let reason = unavailable(&registry, "signed");
    assert!(reason.contains("is not signed") && reason.contains("providers[0].verify"), "{reason}");
    let follow = registry.follow(FollowOptions { poll_interval: POLL });

    // A signature pushed later, the tag unmoved, is found by the next poll.
    sign(&setup, &tagged, &ours).await;
    let took = until_answer(&registry, "signed", V1).await;
    eprintln!("signed build served {took:?} after its signature was pushed");

    // A newer build signed only by another key is refused and listed once;
    // the signed one keeps serving. (A poll between the push and the
    // signature may list it as unsigned first: that is another reason.)
    setup.push("fixtures/answer-v2", "plugins/answer", "stable").await;
    sign(&setup, &tagged, &stranger).await;
    let foreign = "a key the policy does not name";
    let refused = wait_for(PATIENCE, || async {
        let revisions = registry.revisions_of("signed")?;
        revisions.rejected.iter().rev().find(|r| r.reason.contains(foreign)).cloned()
    })
    .await
    .unwrap_or_else(|| {
        panic!("no refusal naming {foreign:?}: {:#?}", registry.revisions_of("signed"))
    });
    assert_eq!(refused.kind, RejectionKind::Load);
    assert!(refused.reason.contains("providers[0].verify"), "{}", refused.reason);
    let listed = registry.revisions_of("signed").unwrap().rejections;
    tokio::time::sleep(POLL * 5).await;
    assert_eq!(answer(&registry, "signed").await, V1);
    assert_eq!(registry.revisions_of("signed").unwrap().rejections, listed, "listed once");

    // Our key signs it too: the same build is checked again and serves.
    sign(&setup, &tagged, &ours).await;
    until_answer(&registry, "signed", V2).await;
    drop(follow);
}

/// A registry item's policy applies to every build from it, and a policy
/// added after a build was stored holds for the stored build too: an
/// unsigned build pulled before serves no more after a restart, registry
/// down or up, until it is signed.
#[tokio::test]
async fn a_policy_added_later_holds_for_builds_already_in_the_store() {
    let mut setup = Setup::new();
    let keys = tempfile::tempdir().unwrap();
    let (ours, ours_pub) = key(keys.path(), "ours");
    setup.push("fixtures/answer-v1", "plugins/answer", "stable").await;
    let tagged = setup.registry.reference("plugins/answer", "stable");
    let cache = setup.cache("cache");
    let open = setup.providers(&format!("  - {{ name: plain, plugin: '{tagged}' }}\n"));
    let registry = load(&open, &setup.plugin_dir(), &cache).await;
    assert_eq!(answer(&registry, "plain").await, V1);
    drop(registry);

    let item = setup.registry.registries_item(&setup.password_file);
    let item = item.trim_end_matches('}');
    let strict = proxyfleet_runtime::config::ProvidersConfig::parse(&format!(
        "registries:\n  - {item}, verify: {{ keys: ['{}'] }} }}\n\
         providers:\n  - {{ name: plain, plugin: '{tagged}' }}\n",
        ours_pub.display()
    ))
    .unwrap();
    setup.registry.stop();
    let registry = load(&strict, &setup.plugin_dir(), &cache).await;
    let reason = unavailable(&registry, "plain");
    assert!(!reason.is_empty(), "the stored unsigned build does not serve");
    drop(registry);

    setup.registry.start_again();
    let registry = load(&strict, &setup.plugin_dir(), &cache).await;
    let reason = unavailable(&registry, "plain");
    assert!(reason.contains("registries[0].verify") && reason.contains("not signed"), "{reason}");
    let follow = registry.follow(FollowOptions { poll_interval: POLL });
    sign(&setup, &tagged, &ours).await;
    until_answer(&registry, "plain", V1).await;
    drop(follow);
    drop(registry);

    // Signed and stored: it serves after a restart with the registry down,
    // its signature checked again from the store.
    setup.registry.stop();
    let registry = load(&strict, &setup.plugin_dir(), &cache).await;
    assert_eq!(answer(&registry, "plain").await, V1);
}

/// Issue 47, bad input: a policy naming a key file that is missing or not
/// a key refuses the build naming the key's field, and nothing serves
/// that was not checked.
#[tokio::test]
async fn issue_47_bad_input_a_missing_or_unreadable_key_refuses_naming_its_field() {
    let setup = Setup::new();
    let keys = tempfile::tempdir().unwrap();
    let not_a_key = keys.path().join("notes.pub");
    std::fs::write(&not_a_key, "remember to rotate the key\n").unwrap();
    setup.push("fixtures/answer-v1", "plugins/answer", "stable").await;
    let tagged = setup.registry.reference("plugins/answer", "stable");
    for (key, says) in [
        (keys.path().join("gone.pub"), "cannot read"),
        (not_a_key, "not an ECDSA P-256 public key"),
    ] {
        let config = setup.providers(&format!(
            "  - {{ name: signed, plugin: '{tagged}', verify: {{ keys: ['{}'] }} }}\n",
            key.display()
        ));
        let registry = load(&config, &setup.plugin_dir(), &setup.cache("cache")).await;
        let reason = unavailable(&registry, "signed");
        assert!(
            reason.contains("providers[0].verify.keys[0]") && reason.contains(says),
            "{reason}"
        );
    }
}

/// The stand-in serves the `answer 1.0.0` build with the signature
/// manifest `signature` (its layers' payloads at their digests).
/// Answers the reference and the component layer's digest.
fn stub_signed(
    stub: &StubRegistry,
    signature: &serde_json::Value,
    blobs: &[Vec<u8>],
) -> (String, String) {
    let component = std::fs::read(proxyfleet_tests::plugin("fixtures/answer-v1")).unwrap();
    let (layer, manifest) = stub_build(stub, "plugins/answer", "stable", &component);
    let tag = proxyfleet_oci::signature_tag(&manifest);
    let body = serde_json::to_vec(signature).unwrap();
    stub.answer(&format!("/v2/plugins/answer/manifests/{tag}"), Answer::Body(body));
    for blob in blobs {
        let path = format!("/v2/plugins/answer/blobs/{}", sha256_of(blob));
        stub.answer(&path, Answer::Body(blob.clone()));
    }
    (format!("oci://{}/plugins/answer:stable", stub.host), layer)
}

fn layer(payload: &[u8], annotations: serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "mediaType": "application/vnd.dev.cosign.simplesigning.v1+json",
        "digest": sha256_of(payload),
        "size": payload.len(),
        "annotations": annotations,
    })
}

fn signature_manifest(layers: Vec<serde_json::Value>) -> serde_json::Value {
    serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": { "mediaType": "application/vnd.oci.image.config.v1+json",
                    "digest": sha256_of(b"{}"), "size": 2 },
        "layers": layers,
    })
}

/// Issue 47, bad input: a registry serving a malformed signature artifact
/// gets the build refused for its signature, with what was wrong, before
/// more than the bounds are read.
#[tokio::test]
async fn issue_47_bad_input_malformed_signature_artifacts_are_refused_within_bounds() {
    let keys = tempfile::tempdir().unwrap();
    let (_, public) = key(keys.path(), "ours");
    let policy =
        KeyPolicy::validate("providers[0].verify", RawVerify { keys: vec![public.clone()] })
            .unwrap();
    let payload = br#"{"critical":{"identity":{"docker-reference":"x"},"image":{"docker-manifest-digest":"sha256:00"},"type":"cosign container image signature"},"optional":null}"#.to_vec();
    let signed = serde_json::json!({ "dev.cosignproject.cosign/signature": "MEUCIQ==" });
    let huge = vec![b'{'; 1 << 20];
    let cases: Vec<(&str, serde_json::Value, Vec<Vec<u8>>, &str)> = vec![
        (
            "not a manifest",
            serde_json::json!({ "schemaVersion": 2, "layers": "no" }),
            vec![],
            "not an image manifest",
        ),
        (
            "no annotation",
            signature_manifest(vec![layer(&payload, serde_json::json!({}))]),
            vec![payload.clone()],
            "annotation",
        ),
        (
            "too many signatures",
            signature_manifest((0..40).map(|_| layer(&payload, signed.clone())).collect()),
            vec![payload.clone()],
            "40 signatures",
        ),
        (
            "a payload declared too large",
            signature_manifest(vec![layer(&huge, signed.clone())]),
            vec![huge.clone()],
            "a payload declares 1048576 bytes",
        ),
        (
            "a payload larger than declared",
            {
                let mut small = layer(&payload, signed.clone());
                small["digest"] = serde_json::Value::String(sha256_of(&huge));
                signature_manifest(vec![small])
            },
            vec![huge.clone()],
            "signature refused",
        ),
        (
            "a signature by no key of the policy",
            signature_manifest(vec![layer(&payload, signed.clone())]),
            vec![payload.clone()],
            "providers[0].verify",
        ),
    ];
    for (case, signature, blobs, says) in cases {
        let stub = StubRegistry::start().await;
        let dir = tempfile::tempdir().unwrap();
        let registries: Registries = stub_registries(&stub, &dir.path().join("password"));
        let (reference, component) = stub_signed(&stub, &signature, &blobs);
        let reference = PluginReference::parse(&reference).unwrap();
        let err = proxyfleet_oci::pull(
            &registries,
            &reference,
            None,
            PullLimits::default(),
            std::slice::from_ref(&policy),
        )
        .await
        .unwrap_err();
        assert!(matches!(err, OciError::Signature { .. }), "{case}: {err}");
        assert!(err.is_signature_refusal(), "{case}");
        assert!(err.to_string().contains(says), "{case}: {err}");
        let layer_read = stub.requests().iter().any(|request| request.contains(&component));
        assert!(!layer_read, "{case}: the component is not read before the signature passes");
    }
}
