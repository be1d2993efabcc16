//! Plugins from a real OCI registry: Debian's `docker-registry` on loopback
//! with TLS from a test CA and htpasswd auth. Builds are pushed with
//! `proxyfleet_oci::push` (what `proxyfleet plugin push` runs), checked
//! against the Wasm OCI layout with skopeo, pulled by tag and by digest,
//! followed as tags move, and refused when wrong. What a real registry will
//! not serve (oversized manifests, redirects to anywhere, token realms
//! anywhere) comes from a stand-in on loopback, [`StubRegistry`].
//!
//! The `answer` fixtures answer `get` with their version (`answer 1.0.0`,
//! `answer 2.0.0`; `answer 3.0.0` asks for an HTTP destination).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use proxyfleet_core::address::AddressKind;
use proxyfleet_core::kv::MemoryKv;
use proxyfleet_oci::{
    OciError, Overrun, PluginReference, PullLimits, RawRegistry, RefusedDestination, Registries,
};
use proxyfleet_runtime::admission::RejectionKind;
use proxyfleet_runtime::config::ProvidersConfig;
use proxyfleet_runtime::follow::FollowOptions;
use proxyfleet_runtime::{EntryState, Registry, RejectedCandidate, Runtime, RuntimeOptions};
use proxyfleet_tests::registry::{OciRegistry, PASSWORD, USER};
use proxyfleet_tests::stub_registry::{Answer, StubRegistry};
use proxyfleet_tests::{CapturedLogs, plugin, wait_for};

/// How long a swap or a recovery may take on a loaded machine before the
/// test fails; what it takes is printed, not asserted.
pub(crate) const PATIENCE: Duration = Duration::from_secs(30);
/// The poll interval of the tests that follow a tag.
pub(crate) const POLL: Duration = Duration::from_millis(200);

pub(crate) const V1: &str = "answer 1.0.0";
pub(crate) const V2: &str = "answer 2.0.0";

/// A registry, a password file for it, and a folder for plugin
/// directories and caches.
pub(crate) struct Setup {
    pub(crate) registry: OciRegistry,
    pub(crate) password_file: PathBuf,
    dir: tempfile::TempDir,
}

impl Setup {
    pub(crate) fn new() -> Self {
        let registry = OciRegistry::start();
        let dir = tempfile::tempdir().unwrap();
        let password_file = dir.path().join("registry-password");
        std::fs::write(&password_file, format!("{PASSWORD}\n")).unwrap();
        std::fs::create_dir(dir.path().join("plugins")).unwrap();
        Self { registry, password_file, dir }
    }

    pub(crate) fn registries(&self) -> Registries {
        Registries::validate(vec![RawRegistry {
            host: self.registry.host.clone(),
            username: Some(USER.to_owned()),
            password_file: Some(self.password_file.clone()),
            ca_file: Some(self.registry.ca_file.clone()),
            ..RawRegistry::default()
        }])
        .unwrap()
    }

    pub(crate) fn reference(&self, repository: &str, tag: &str) -> PluginReference {
        PluginReference::parse(&self.registry.reference(repository, tag)).unwrap()
    }

    /// Pushes fixture or plugin `name` to `repository:tag`; answers the
    /// pinned reference.
    pub(crate) async fn push(&self, name: &str, repository: &str, tag: &str) -> String {
        let reference = self.reference(repository, tag);
        let bytes = std::fs::read(plugin(name)).unwrap();
        let pushed =
            proxyfleet_oci::push(&self.registries(), &reference, name, bytes).await.unwrap();
        format!("oci://{}/{repository}@{}", self.registry.host, pushed.manifest_digest)
    }

    /// A providers file with this registry's item and `entries` (YAML list
    /// items, indented by two).
    pub(crate) fn providers(&self, entries: &str) -> ProvidersConfig {
        let text = format!(
            "registries:\n  - {}\nproviders:\n{entries}",
            self.registry.registries_item(&self.password_file)
        );
        ProvidersConfig::parse(&text).expect("valid providers file")
    }

    pub(crate) fn cache(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub(crate) fn plugin_dir(&self) -> PathBuf {
        self.dir.path().join("plugins")
    }
}

pub(crate) async fn load(
    config: &ProvidersConfig,
    plugin_dir: &Path,
    cache: &Path,
) -> Arc<Registry> {
    let runtime = Runtime::new(RuntimeOptions {
        cache_dir: Some(cache.to_owned()),
        ..RuntimeOptions::default()
    })
    .expect("runtime");
    Arc::new(
        Registry::load(&runtime, config, plugin_dir, Arc::new(MemoryKv::new()))
            .await
            .expect("plugin directory readable"),
    )
}

pub(crate) async fn answer(registry: &Registry, entry: &str) -> String {
    let provider = registry.provider(entry).expect("the entry serves");
    provider.get("probe").await.expect("get answers").name
}

pub(crate) fn unavailable(registry: &Registry, entry: &str) -> String {
    match &registry.entries()[entry] {
        EntryState::Failed(reason) => reason.clone(),
        other => panic!("{entry} should be unavailable: {other:?}"),
    }
}

pub(crate) async fn until_answer(registry: &Registry, entry: &str, expected: &str) -> Duration {
    let started = Instant::now();
    let answered = wait_for(PATIENCE, || async {
        let provider = registry.provider(entry).ok()?;
        let name = provider.get("probe").await.ok()?.name;
        (name == expected).then_some(())
    })
    .await;
    assert!(answered.is_some(), "{entry} did not answer {expected:?} within {PATIENCE:?}");
    started.elapsed()
}

pub(crate) async fn until_rejected(
    registry: &Registry,
    entry: &str,
    count: u64,
) -> RejectedCandidate {
    let rejected = wait_for(PATIENCE, || async {
        let revisions = registry.revisions_of(entry)?;
        (revisions.rejections >= count).then(|| revisions.rejected.last().cloned()).flatten()
    })
    .await;
    rejected.unwrap_or_else(|| {
        panic!("{entry} did not refuse {count} candidates: {:#?}", registry.revisions_of(entry))
    })
}

fn skopeo(setup: &Setup, args: &[&str], reference: &str) -> serde_json::Value {
    let cert_dir = setup.registry.ca_file.parent().unwrap();
    let output = std::process::Command::new("skopeo")
        .args(args)
        .arg("--cert-dir")
        .arg(cert_dir)
        .arg("--creds")
        .arg(format!("{USER}:{PASSWORD}"))
        .arg(format!("docker://{}", reference.trim_start_matches("oci://")))
        .output()
        .expect("skopeo runs (apt-get install skopeo)");
    assert!(output.status.success(), "skopeo: {}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).expect("skopeo prints JSON")
}

#[tokio::test]
async fn pushed_builds_follow_the_wasm_oci_layout_and_pull_by_tag_and_by_digest() {
    let setup = Setup::new();
    let pinned = setup.push("static", "plugins/static", "1.0").await;
    let component = std::fs::read(plugin("static")).unwrap();
    let layer = format!("sha256:{}", proxyfleet_runtime::file_digest(&component));

    // What skopeo reads from the registry, checked against the layout.
    let tagged = setup.registry.reference("plugins/static", "1.0");
    let manifest = skopeo(&setup, &["inspect", "--raw"], &tagged);
    assert_eq!(manifest["schemaVersion"], 2);
    assert_eq!(manifest["mediaType"], "application/vnd.oci.image.manifest.v1+json");
    assert_eq!(manifest["config"]["mediaType"], "application/vnd.wasm.config.v0+json");
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1, "{manifest}");
    assert_eq!(layers[0]["mediaType"], "application/wasm");
    assert_eq!(layers[0]["digest"], layer.as_str());
    assert_eq!(layers[0]["size"], component.len());
    let config = skopeo(&setup, &["inspect", "--config", "--raw"], &tagged);
    assert_eq!(config["architecture"], "wasm");
    assert_eq!(config["os"], "wasip2");
    assert_eq!(config["layerDigests"], serde_json::json!([layer]));
    assert!(config["component"]["exports"].is_array(), "the config describes the world: {config}");

    let by_tag = proxyfleet_oci::pull(
        &setup.registries(),
        &setup.reference("plugins/static", "1.0"),
        None,
        PullLimits::default(),
        &[],
    )
    .await
    .unwrap();
    assert_eq!(by_tag.bytes, component);
    assert_eq!(by_tag.layer_digest, layer);
    let by_digest = PluginReference::parse(&pinned).unwrap();
    let pulled =
        proxyfleet_oci::pull(&setup.registries(), &by_digest, None, PullLimits::default(), &[])
            .await
            .unwrap();
    assert_eq!(pulled, by_tag);
    assert_eq!(Some(pulled.manifest_digest.as_str()), by_digest.digest());
}

#[tokio::test]
async fn entries_serve_pulled_builds_and_a_registry_outage_fails_only_cold_entries() {
    let mut setup = Setup::new();
    let pinned = setup.push("fixtures/answer-v1", "plugins/answer", "stable").await;
    std::fs::copy(plugin("fixtures/answer-v1"), setup.plugin_dir().join("answer.wasm")).unwrap();
    let tagged = setup.registry.reference("plugins/answer", "stable");
    let config = setup.providers(&format!(
        "  - {{ name: tagged, plugin: '{tagged}' }}\n  - {{ name: pinned, plugin: '{pinned}' }}\n  \
         - {{ name: local, plugin: answer }}\n"
    ));

    let warm = setup.cache("warm");
    let first = load(&config, &setup.plugin_dir(), &warm).await;
    for entry in ["tagged", "pinned", "local"] {
        assert_eq!(answer(&first, entry).await, V1, "{entry}");
    }
    let shown = serde_json::to_value(first.revisions_of("tagged").unwrap()).unwrap();
    assert_eq!(shown["plugin"], tagged.as_str());
    assert!(shown["pull"]["manifestDigest"].is_string(), "{shown}");
    drop(first);

    setup.registry.stop();
    let restarted = load(&config, &setup.plugin_dir(), &warm).await;
    for entry in ["tagged", "pinned", "local"] {
        assert_eq!(answer(&restarted, entry).await, V1, "{entry} serves from the cache");
    }

    let cold = load(&config, &setup.plugin_dir(), &setup.cache("cold")).await;
    assert_eq!(answer(&cold, "local").await, V1, "a file entry does not need the registry");
    for (entry, reference) in [("tagged", &tagged), ("pinned", &pinned)] {
        let reason = unavailable(&cold, entry);
        assert!(reason.contains(reference.as_str()), "names the reference: {reason}");
        assert!(reason.contains("no build of it in the plugin cache"), "{reason}");
        assert!(!reason.contains(PASSWORD), "{reason}");
    }

    // The registry comes back: followed references become available.
    setup.registry.start_again();
    let _follow = cold.follow(FollowOptions { poll_interval: POLL });
    let took = until_answer(&cold, "tagged", V1).await;
    until_answer(&cold, "pinned", V1).await;
    eprintln!("cold entries available {took:?} after the registry came back");
}

/// Calls `get` through a handle taken before the swap until a call answers
/// `expected` or the caller is told to stop; answers each call's outcome.
async fn call_until_answered(
    provider: Arc<dyn proxyfleet_core::Provider>,
    expected: &'static str,
    stop: Arc<AtomicBool>,
) -> Vec<Result<String, String>> {
    let mut calls = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let call = provider.get("probe").await.map(|i| i.name).map_err(|e| e.to_string());
        let done = call.as_deref() == Ok(expected);
        calls.push(call);
        if done {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    calls
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_tag_is_swapped_within_the_poll_interval_and_no_call_fails() {
    let setup = Setup::new();
    setup.push("fixtures/answer-v1", "plugins/answer", "stable").await;
    let tagged = setup.registry.reference("plugins/answer", "stable");
    let config = setup.providers(&format!("  - {{ name: tagged, plugin: '{tagged}' }}\n"));
    let registry = load(&config, &setup.plugin_dir(), &setup.cache("cache")).await;
    let _follow = registry.follow(FollowOptions { poll_interval: POLL });
    assert_eq!(answer(&registry, "tagged").await, V1);

    // Each caller keeps calling until it has itself reached the new build.
    // Stopping them as soon as the swap is seen elsewhere (as this test once
    // did) could stop a caller before its first call after the swap.
    let stop = Arc::new(AtomicBool::new(false));
    let provider = registry.provider("tagged").unwrap();
    let callers: Vec<_> = (0..4)
        .map(|_| tokio::spawn(call_until_answered(Arc::clone(&provider), V2, Arc::clone(&stop))))
        .collect();
    let pushed_at = Instant::now();
    setup.push("fixtures/answer-v2", "plugins/answer", "stable").await;
    let swapped = until_answer(&registry, "tagged", V2).await;
    let stopper = {
        let stop = Arc::clone(&stop);
        tokio::spawn(async move {
            tokio::time::sleep(PATIENCE).await;
            stop.store(true, Ordering::Relaxed);
        })
    };
    let mut calls = Vec::new();
    for caller in callers {
        let made = caller.await.unwrap();
        assert_eq!(
            made.last().map(|call| call.as_deref()),
            Some(Ok(V2)),
            "a caller holding the entry's handle reached the new build within {PATIENCE:?}"
        );
        calls.extend(made);
    }
    stopper.abort();
    let failed: Vec<_> = calls.iter().filter(|call| call.is_err()).collect();
    assert!(failed.is_empty(), "{} of {} calls failed: {failed:?}", failed.len(), calls.len());
    let revisions = registry.revisions_of("tagged").unwrap();
    assert_eq!(revisions.previous.map(|p| p.version).as_deref(), Some("1.0.0"));
    eprintln!(
        "swap {:?} after the push ended ({:?} after it started), poll {POLL:?}; {} calls, 0 failed",
        swapped,
        pushed_at.elapsed(),
        calls.len()
    );
}

#[tokio::test]
async fn a_tag_moved_to_a_refused_build_leaves_the_serving_one() {
    let setup = Setup::new();
    setup.push("fixtures/answer-v1", "plugins/answer", "stable").await;
    let tagged = setup.registry.reference("plugins/answer", "stable");
    let config = setup.providers(&format!("  - {{ name: tagged, plugin: '{tagged}' }}\n"));
    let registry = load(&config, &setup.plugin_dir(), &setup.cache("cache")).await;
    let _follow = registry.follow(FollowOptions { poll_interval: POLL });
    assert_eq!(answer(&registry, "tagged").await, V1);

    setup.push("fixtures/wrong-major", "plugins/answer", "stable").await;
    let wrong_major = until_rejected(&registry, "tagged", 1).await;
    assert_eq!(wrong_major.kind, RejectionKind::Load);
    assert_eq!(wrong_major.contract_version.as_deref(), Some("0.1.0"));
    assert!(wrong_major.reason.contains(tagged.as_str()), "{}", wrong_major.reason);
    assert_eq!(answer(&registry, "tagged").await, V1);

    setup.push("fixtures/answer-wide", "plugins/answer", "stable").await;
    let widening = until_rejected(&registry, "tagged", 2).await;
    assert_eq!(widening.kind, RejectionKind::Capabilities);
    assert!(widening.reason.contains("grants.http"), "{}", widening.reason);
    assert_eq!(answer(&registry, "tagged").await, V1);
    let revisions = registry.revisions_of("tagged").unwrap();
    assert_eq!((revisions.swaps, revisions.rejections), (0, 2));
}

/// Issue 47, items 1 and 2: a build the entry refused while running took
/// the serving build out of the store, so the next start (registry down or
/// up) refused the newer one and had nothing to serve; and a start with the
/// registry down showed no manifest for the build the store served.
#[tokio::test]
async fn issue_47_item_1_a_restart_after_a_refused_build_serves_the_last_good_one() {
    let mut setup = Setup::new();
    setup.push("fixtures/answer-v1", "plugins/answer", "stable").await;
    let tagged = setup.registry.reference("plugins/answer", "stable");
    let config = setup.providers(&format!("  - {{ name: tagged, plugin: '{tagged}' }}\n"));
    let cache = setup.cache("cache");
    let running = load(&config, &setup.plugin_dir(), &cache).await;
    let follow = running.follow(FollowOptions { poll_interval: POLL });
    assert_eq!(answer(&running, "tagged").await, V1);
    let good = running.revisions_of("tagged").unwrap().active.unwrap().digest;
    setup.push("fixtures/answer-wide", "plugins/answer", "stable").await;
    let refused = until_rejected(&running, "tagged", 1).await;
    assert_eq!(refused.kind, RejectionKind::Capabilities);
    drop(follow);
    drop(running);

    let plugin_dir = setup.plugin_dir();
    let restarted = |up: &'static str| {
        let (config, dir, cache) = (config.clone(), plugin_dir.clone(), cache.clone());
        let refused = refused.clone();
        let good = good.clone();
        async move {
            let registry = load(&config, &dir, &cache).await;
            assert_eq!(answer(&registry, "tagged").await, V1, "registry {up}");
            let revisions = registry.revisions_of("tagged").unwrap();
            assert_eq!(revisions.active.as_ref().map(|a| a.digest.as_str()), Some(good.as_str()));
            // The newer build is offered again at start, and refused again.
            let again = revisions.rejected.last().expect("the refused build is listed again");
            assert_eq!((again.kind, &again.digest), (refused.kind, &refused.digest), "{up}");
            let shown = serde_json::to_value(&revisions).unwrap();
            assert!(shown["pull"]["manifestDigest"].is_string(), "registry {up}: {shown}");
            registry
        }
    };
    setup.registry.stop();
    drop(restarted("down").await);
    setup.registry.start_again();
    let registry = restarted("up").await;
    let _follow = registry.follow(FollowOptions { poll_interval: POLL });
    tokio::time::sleep(POLL * 5).await;
    assert_eq!(answer(&registry, "tagged").await, V1, "the poll leaves the refused build refused");

    // A build the entry takes serves after the next start, and the one it
    // replaced is no longer kept.
    setup.push("fixtures/answer-v2", "plugins/answer", "stable").await;
    until_answer(&registry, "tagged", V2).await;
    drop(_follow);
    drop(registry);
    setup.registry.stop();
    let registry = load(&config, &setup.plugin_dir(), &cache).await;
    assert_eq!(answer(&registry, "tagged").await, V2);
    let blobs = std::fs::read_dir(cache.join("oci/blobs/sha256")).unwrap();
    let held: Vec<String> =
        blobs.flatten().map(|b| b.file_name().to_string_lossy().into()).collect();
    assert!(!held.contains(&good), "the build no entry serves is removed: {held:?}");
}

#[tokio::test]
async fn wrong_credentials_name_the_registry_and_repository_and_never_the_secret() {
    let setup = Setup::new();
    setup.push("fixtures/answer-v1", "plugins/answer", "stable").await;
    let wrong = "wrong-password-9c1e";
    std::fs::write(&setup.password_file, wrong).unwrap();
    let logs = CapturedLogs::default();
    let _guard = logs.install();

    let err = proxyfleet_oci::pull(
        &setup.registries(),
        &setup.reference("plugins/answer", "stable"),
        None,
        PullLimits::default(),
        &[],
    )
    .await
    .unwrap_err();
    assert!(matches!(err, OciError::Denied { .. }), "{err:?}");
    let message = err.to_string();
    assert!(message.contains(&setup.registry.host), "{message}");
    assert!(message.contains("plugins/answer"), "{message}");

    let tagged = setup.registry.reference("plugins/answer", "stable");
    let config = setup.providers(&format!("  - {{ name: tagged, plugin: '{tagged}' }}\n"));
    let registry = load(&config, &setup.plugin_dir(), &setup.cache("cache")).await;
    let reason = unavailable(&registry, "tagged");
    assert!(reason.contains("refused access to repository plugins/answer"), "{reason}");
    let shown = serde_json::to_string(&registry.revisions()).unwrap();
    for text in [&message, &reason, &shown, &logs.text()] {
        assert!(!text.contains(wrong) && !text.contains(PASSWORD), "a secret leaked: {text}");
    }
}

#[tokio::test]
async fn a_layer_that_does_not_match_its_digest_is_refused() {
    let setup = Setup::new();
    setup.push("fixtures/answer-v1", "plugins/answer", "stable").await;
    let layer = format!(
        "sha256:{}",
        proxyfleet_runtime::file_digest(&std::fs::read(plugin("fixtures/answer-v1")).unwrap())
    );
    // The registry serves a blob from its storage as it is; swap the bytes.
    std::fs::copy(plugin("fixtures/answer-v2"), setup.registry.blob_file(&layer)).unwrap();

    let err = proxyfleet_oci::pull(
        &setup.registries(),
        &setup.reference("plugins/answer", "stable"),
        None,
        PullLimits::default(),
        &[],
    )
    .await
    .unwrap_err();
    assert!(matches!(err, OciError::Digest { what: "component layer", .. }), "{err:?}");
    assert!(err.to_string().contains(&layer), "{err}");

    let tagged = setup.registry.reference("plugins/answer", "stable");
    let config = setup.providers(&format!("  - {{ name: tagged, plugin: '{tagged}' }}\n"));
    let registry = load(&config, &setup.plugin_dir(), &setup.cache("cache")).await;
    let reason = unavailable(&registry, "tagged");
    assert!(reason.contains("does not match its digest"), "{reason}");
}

#[tokio::test]
async fn an_oversized_artifact_is_refused_before_its_layer_is_read() {
    let setup = Setup::new();
    setup.push("fixtures/answer-v1", "plugins/answer", "stable").await;
    let component = std::fs::read(plugin("fixtures/answer-v1")).unwrap();
    let layer = format!("sha256:{}", proxyfleet_runtime::file_digest(&component));
    let limit = 4096;
    let err = proxyfleet_oci::pull(
        &setup.registries(),
        &setup.reference("plugins/answer", "stable"),
        None,
        PullLimits { max_bytes: limit },
        &[],
    )
    .await
    .unwrap_err();
    match &err {
        OciError::TooLarge { size, limit: said, .. } => {
            assert_eq!((*size, *said), (component.len() as u64, limit));
        }
        other => panic!("expected TooLarge: {other:?}"),
    }
    assert!(err.to_string().contains("--plugin-max-bytes"), "the message names the fix: {err}");
    let fetched = format!("GET /v2/plugins/answer/blobs/{layer}");
    let log = setup.registry.log();
    assert!(
        log.contains("GET /v2/plugins/answer/manifests/stable"),
        "the access log shows requests"
    );
    assert!(!log.contains(&fetched), "the layer was requested: {log}");
}

#[tokio::test]
async fn artifacts_laid_out_by_other_tools_load_and_other_kinds_are_refused_by_name() {
    use oci_client::client::{Config, ImageLayer};
    use oci_client::manifest::OciImageManifest;

    let setup = Setup::new();
    let component = std::fs::read(plugin("fixtures/answer-v1")).unwrap();
    let client = oci_client::Client::new(oci_client::client::ClientConfig {
        extra_root_certificates: vec![oci_client::client::Certificate {
            encoding: oci_client::client::CertificateEncoding::Pem,
            data: std::fs::read(&setup.registry.ca_file).unwrap(),
        }],
        ..Default::default()
    });
    let auth = oci_client::secrets::RegistryAuth::Basic(USER.to_owned(), PASSWORD.to_owned());
    let publish = |repository: &'static str, config: Config, layers: Vec<ImageLayer>| {
        let client = &client;
        let auth = &auth;
        let target = oci_client::Reference::with_tag(
            setup.registry.host.clone(),
            repository.to_owned(),
            "1".to_owned(),
        );
        async move {
            let mut manifest = OciImageManifest::build(&layers, &config, None);
            manifest.media_type = Some("application/vnd.oci.image.manifest.v1+json".to_owned());
            client.push(&target, &layers, config, auth, Some(manifest)).await.unwrap();
        }
    };
    let titled = |bytes: Vec<u8>, media_type: &str| {
        let mut annotations = std::collections::BTreeMap::new();
        annotations.insert("org.opencontainers.image.title".to_owned(), "answer.wasm".to_owned());
        ImageLayer::new(bytes, media_type.to_owned(), Some(annotations))
    };
    // As `oras push REF --config config.json:application/vnd.wasm.config.v0+json
    // answer.wasm:application/wasm` lays it out: an empty config, a titled layer.
    let empty_config =
        Config::new(b"{}".to_vec(), "application/vnd.wasm.config.v0+json".to_owned(), None);
    publish(
        "oras/answer",
        empty_config.clone(),
        vec![titled(component.clone(), "application/wasm")],
    )
    .await;
    let pulled = proxyfleet_oci::pull(
        &setup.registries(),
        &setup.reference("oras/answer", "1"),
        None,
        PullLimits::default(),
        &[],
    )
    .await
    .unwrap();
    assert_eq!(pulled.bytes, component);

    let image_config = Config::new(
        b"{\"architecture\":\"amd64\",\"os\":\"linux\"}".to_vec(),
        "application/vnd.oci.image.config.v1+json".to_owned(),
        None,
    );
    publish(
        "images/answer",
        image_config,
        vec![titled(b"not a layer of ours".to_vec(), "application/vnd.oci.image.layer.v1.tar")],
    )
    .await;
    publish(
        "two/answer",
        empty_config,
        vec![
            titled(component.clone(), "application/wasm"),
            titled(b"x".to_vec(), "application/wasm"),
        ],
    )
    .await;
    for (repository, expected) in [
        ("images/answer", "application/vnd.oci.image.config.v1+json"),
        ("two/answer", "has 2 layers"),
    ] {
        let err = proxyfleet_oci::pull(
            &setup.registries(),
            &setup.reference(repository, "1"),
            None,
            PullLimits::default(),
            &[],
        )
        .await
        .unwrap_err();
        assert!(matches!(err, OciError::Layout { .. }), "{repository}: {err:?}");
        assert!(err.to_string().contains(expected), "{repository}: {err}");
    }
}

#[tokio::test]
async fn a_bearer_token_from_a_file_is_read_on_every_use_and_never_shown() {
    use proxyfleet_tests::registry::RegistryAuth;

    let registry =
        OciRegistry::start_with(std::net::Ipv4Addr::LOCALHOST.into(), RegistryAuth::Token);
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    let registries = Registries::validate(vec![RawRegistry {
        host: registry.host.clone(),
        token_file: Some(token_file.clone()),
        ca_file: Some(registry.ca_file.clone()),
        ..RawRegistry::default()
    }])
    .unwrap();
    let reference = PluginReference::parse(&registry.reference("plugins/answer", "1")).unwrap();
    let component = std::fs::read(plugin("fixtures/answer-v1")).unwrap();

    let push_and_pull = registry.token("plugins/answer", &["pull", "push"]);
    std::fs::write(&token_file, format!("{push_and_pull}\n")).unwrap();
    proxyfleet_oci::push(&registries, &reference, "answer-v1", component.clone()).await.unwrap();
    let pulled = proxyfleet_oci::pull(&registries, &reference, None, PullLimits::default(), &[])
        .await
        .unwrap();
    assert_eq!(pulled.bytes, component);

    // The file now holds a token for another repository: the next pull
    // reads it and is refused, naming the registry and the repository.
    let elsewhere = registry.token("plugins/other", &["pull"]);
    std::fs::write(&token_file, &elsewhere).unwrap();
    let err = proxyfleet_oci::pull(&registries, &reference, None, PullLimits::default(), &[])
        .await
        .unwrap_err();
    assert!(matches!(err, OciError::Denied { .. }), "{err:?}");
    let message = err.to_string();
    assert!(message.contains(&registry.host) && message.contains("plugins/answer"), "{message}");
    for token in [&push_and_pull, &elsewhere] {
        assert!(!message.contains(token.as_str()), "the token leaked: {message}");
    }
}

#[tokio::test]
async fn regression_a_damaged_stored_build_is_pulled_again_instead_of_failing_for_good() {
    let setup = Setup::new();
    let pinned = setup.push("fixtures/answer-v1", "plugins/answer", "stable").await;
    let config = setup.providers(&format!("  - {{ name: pinned, plugin: '{pinned}' }}\n"));
    let cache = setup.cache("cache");
    drop(load(&config, &setup.plugin_dir(), &cache).await);
    let component = std::fs::read(plugin("fixtures/answer-v1")).unwrap();
    let stored = cache.join("oci/blobs/sha256").join(proxyfleet_runtime::file_digest(&component));
    std::fs::write(&stored, b"damaged on disk").unwrap();

    let restarted = load(&config, &setup.plugin_dir(), &cache).await;
    assert_eq!(answer(&restarted, "pinned").await, V1, "pulled again from the registry");
    assert_eq!(std::fs::read(&stored).unwrap(), component, "the store holds the build again");
}

/// Pushes a container image (not a component) to `repository:tag` as
/// another tool would; answers its manifest digest.
async fn push_container_image(setup: &Setup, repository: &str, tag: &str) -> String {
    use oci_client::client::{Config, ImageLayer};
    use oci_client::manifest::OciImageManifest;

    let client = oci_client::Client::new(oci_client::client::ClientConfig {
        extra_root_certificates: vec![oci_client::client::Certificate {
            encoding: oci_client::client::CertificateEncoding::Pem,
            data: std::fs::read(&setup.registry.ca_file).unwrap(),
        }],
        ..Default::default()
    });
    let auth = oci_client::secrets::RegistryAuth::Basic(USER.to_owned(), PASSWORD.to_owned());
    let layers = vec![ImageLayer::new(
        b"a tar".to_vec(),
        "application/vnd.oci.image.layer.v1.tar".to_owned(),
        None,
    )];
    let image_config = Config::new(
        b"{\"architecture\":\"amd64\",\"os\":\"linux\"}".to_vec(),
        "application/vnd.oci.image.config.v1+json".to_owned(),
        None,
    );
    let manifest = OciImageManifest::build(&layers, &image_config, None);
    let target = oci_client::Reference::with_tag(
        setup.registry.host.clone(),
        repository.to_owned(),
        tag.to_owned(),
    );
    client.push(&target, &layers, image_config, &auth, Some(manifest)).await.unwrap();
    client.fetch_manifest_digest(&target, &auth).await.unwrap()
}

#[tokio::test]
async fn a_tag_moved_to_an_artifact_of_another_kind_is_listed_as_refused_once() {
    let setup = Setup::new();
    let pinned = setup.push("fixtures/answer-v1", "plugins/answer", "stable").await;
    let held = pinned.rsplit_once('@').unwrap().1.to_owned();
    let tagged = setup.registry.reference("plugins/answer", "stable");
    let config = setup.providers(&format!("  - {{ name: tagged, plugin: '{tagged}' }}\n"));
    let registry = load(&config, &setup.plugin_dir(), &setup.cache("cache")).await;
    let _follow = registry.follow(FollowOptions { poll_interval: POLL });

    let image = push_container_image(&setup, "plugins/answer", "stable").await;
    let refused = until_rejected(&registry, "tagged", 1).await;
    assert_eq!(refused.kind, RejectionKind::Load);
    assert_eq!(refused.digest, image.trim_start_matches("sha256:"), "named by its manifest");
    assert!(
        refused.reason.contains("application/vnd.oci.image.config.v1+json"),
        "{}",
        refused.reason
    );
    assert_eq!(answer(&registry, "tagged").await, V1, "the serving build stays");
    // Several polls later it is still refused once: not pulled again, and
    // the status names what the store holds.
    tokio::time::sleep(POLL * 5).await;
    let revisions = registry.revisions_of("tagged").unwrap();
    assert_eq!(revisions.rejections, 1);
    let status = revisions.pull.unwrap();
    assert_eq!((status.error, status.failures), (None, 0), "the registry itself answered");
    assert_eq!(status.manifest_digest.as_deref(), Some(held.as_str()));

    // The tag moves on to a good build and back: the move back is refused
    // (and listed) again.
    setup.push("fixtures/answer-v2", "plugins/answer", "stable").await;
    until_answer(&registry, "tagged", V2).await;
    push_container_image(&setup, "plugins/answer", "stable").await;
    until_rejected(&registry, "tagged", 2).await;
    assert_eq!(answer(&registry, "tagged").await, V2);
}

#[tokio::test]
async fn a_refused_build_at_a_cold_start_is_listed_and_its_entry_unavailable() {
    let setup = Setup::new();
    let image = push_container_image(&setup, "plugins/image", "1").await;
    let pinned = format!("oci://{}/plugins/image@{image}", setup.registry.host);
    let config = setup.providers(&format!("  - {{ name: pinned, plugin: '{pinned}' }}\n"));
    let registry = load(&config, &setup.plugin_dir(), &setup.cache("cache")).await;
    let reason = unavailable(&registry, "pinned");
    assert!(reason.contains("application/vnd.oci.image.config.v1+json"), "{reason}");
    let revisions = registry.revisions_of("pinned").unwrap();
    assert_eq!(revisions.rejections, 1, "{revisions:?}");
    assert_eq!(revisions.rejected[0].kind, RejectionKind::Load);
}

/// The `registries` of a stub: plain HTTP on loopback, with a user and a
/// password the stub never asks for unless a test makes it.
pub(crate) fn stub_registries(stub: &StubRegistry, password_file: &Path) -> Registries {
    std::fs::write(password_file, PASSWORD).unwrap();
    Registries::validate(vec![RawRegistry {
        host: stub.host.clone(),
        username: Some(USER.to_owned()),
        password_file: Some(password_file.to_owned()),
        plain_http: true,
        ..RawRegistry::default()
    }])
    .unwrap()
}

pub(crate) fn sha256_of(bytes: &[u8]) -> String {
    format!("sha256:{}", proxyfleet_runtime::file_digest(bytes))
}

/// Serves `component` from `stub` as `repository:tag` in the Wasm OCI
/// layout (an empty config); answers the layer's and the manifest's
/// digests.
pub(crate) fn stub_build(
    stub: &StubRegistry,
    repository: &str,
    tag: &str,
    component: &[u8],
) -> (String, String) {
    let config = b"{}".to_vec();
    let layer = sha256_of(component);
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.wasm.config.v0+json",
            "digest": sha256_of(&config),
            "size": config.len(),
        },
        "layers": [{ "mediaType": "application/wasm", "digest": layer, "size": component.len() }],
    }))
    .unwrap();
    for name in [tag.to_owned(), sha256_of(&manifest)] {
        stub.answer(&format!("/v2/{repository}/manifests/{name}"), Answer::Body(manifest.clone()));
    }
    stub.answer(&format!("/v2/{repository}/blobs/{}", sha256_of(&config)), Answer::Body(config));
    stub.answer(&format!("/v2/{repository}/blobs/{layer}"), Answer::Body(component.to_vec()));
    (layer, sha256_of(&manifest))
}

/// Issue 43, item 6: a 512 MiB manifest was read whole (+1 GiB RSS) before
/// it was refused. Now a declared length over the distribution spec's
/// 4 MiB is refused before the body is read, and a body without one is
/// cut off at the bound; the stub counts the body bytes it got out, which
/// include what the kernel's socket buffers took before the pull hung up.
#[tokio::test]
async fn issue_43_item_6_a_manifest_over_4_mib_is_refused_at_the_bound_with_and_without_a_length() {
    const BOUND: u64 = 4 << 20;
    const SERVED: u64 = 512 << 20;
    let dir = tempfile::tempdir().unwrap();
    for declared in [true, false] {
        let stub = StubRegistry::start().await;
        let registries = stub_registries(&stub, &dir.path().join("password"));
        let path = "/v2/plugins/huge/manifests/1";
        stub.answer(path, Answer::Filler { size: SERVED, declared });
        let reference =
            PluginReference::parse(&format!("oci://{}/plugins/huge:1", stub.host)).unwrap();

        let err = proxyfleet_oci::pull(&registries, &reference, None, PullLimits::default(), &[])
            .await
            .unwrap_err();
        let size = match &err {
            OciError::ManifestTooLarge { size, limit, .. } => {
                assert_eq!(*limit, BOUND);
                *size
            }
            other => panic!("expected ManifestTooLarge: {other:?}"),
        };
        match size {
            Overrun::Declared(length) => assert!(declared && length == SERVED, "{size:?}"),
            // One chunk of the transport past the bound, at most.
            Overrun::Read(read) => {
                assert!(!declared && read > BOUND && read <= BOUND + (1 << 20), "{size:?}");
            }
        }
        assert!(err.refuses_the_build(), "the same manifest is not asked for again");
        let message = err.to_string();
        let (Overrun::Declared(shown) | Overrun::Read(shown)) = size;
        for part in [reference.as_str(), "4194304", &shown.to_string()] {
            assert!(message.contains(part), "{message}");
        }
        let sent = stub.body_sent(path).await;
        eprintln!(
            "manifest of {SERVED} bytes, length {}: refused ({size}); the stub got {sent} body \
             bytes out ({:.2} MiB, bound {BOUND})",
            if declared { "declared" } else { "not declared (chunked)" },
            sent as f64 / f64::from(1 << 20),
        );
        // The client's receive buffer is the slack: the kernel's to size.
        assert!(sent < BOUND + (2 << 20), "{sent} bytes left the stub");

        // Resolving the tag, with no digest header to go by, reads the
        // manifest within the same bound.
        let err = proxyfleet_oci::resolve(&registries, &reference).await.unwrap_err();
        assert!(matches!(err, OciError::ManifestTooLarge { .. }), "{err:?}");
        assert!(stub.body_sent(path).await < BOUND + (2 << 20));
    }
    // The process's high-water mark: honest only when this test runs alone.
    let (rss, peak) = proxyfleet_tests::procfs::memory_mib(std::process::id());
    eprintln!("test process: VmRSS {rss:.1} MiB, VmHWM {peak:.1} MiB");
}

/// Issue 43, item 7: a registry's blob redirect to a link-local or metadata
/// address was followed (without the credential, but the request was
/// made). The redirect policy refuses it, in any spelling the URL parser
/// reads as such an address, before anything is sent there: the error is
/// the policy's own, which reqwest raises in place of the request, and a
/// connect to 169.254.169.254 would fail otherwise (or time out after
/// 10 s). The refusal names the target's host and keeps its query (where a
/// storage service's signature lives) out of the message.
#[tokio::test]
async fn issue_43_item_7_a_blob_redirect_to_a_metadata_or_link_local_address_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let stub = StubRegistry::start().await;
    let registries = stub_registries(&stub, &dir.path().join("password"));
    let component = std::fs::read(plugin("fixtures/answer-v1")).unwrap();
    let (layer, _) = stub_build(&stub, "plugins/answer", "1", &component);
    let reference =
        PluginReference::parse(&format!("oci://{}/plugins/answer:1", stub.host)).unwrap();
    let blob = format!("/v2/plugins/answer/blobs/{layer}");
    let metadata = |host: &str| RefusedDestination::Address {
        host: host.to_owned(),
        kind: AddressKind::CloudMetadata,
    };
    for (target, expected) in [
        (
            "http://169.254.169.254/latest/meta-data/iam/security-credentials/?X-Amz-Signature=s3cr3t",
            metadata("169.254.169.254"),
        ),
        ("http://2852039166/latest/meta-data/?sig=s3cr3t", metadata("169.254.169.254")),
        ("http://0xa9.0xfe.0xa9.0xfe/latest/", metadata("169.254.169.254")),
        ("http://[::ffff:a9fe:a9fe]/latest/", metadata("::ffff:169.254.169.254")),
        (
            "http://metadata.google.internal/computeMetadata/v1/?recursive=true",
            RefusedDestination::MetadataName { host: "metadata.google.internal".to_owned() },
        ),
        (
            "http://169.254.1.1/blob",
            RefusedDestination::Address {
                host: "169.254.1.1".to_owned(),
                kind: AddressKind::LinkLocal,
            },
        ),
    ] {
        stub.answer(&blob, Answer::Redirect(target.to_owned()));
        let before = stub.requests().len();
        let err = proxyfleet_oci::pull(&registries, &reference, None, PullLimits::default(), &[])
            .await
            .unwrap_err();
        match &err {
            OciError::Refused { source, registry, .. } => {
                assert_eq!(source, &expected, "{target}");
                assert_eq!(registry, &stub.host);
            }
            other => panic!("{target}: expected a refused redirect: {other:?}"),
        }
        let message = err.to_string();
        assert!(message.contains(reference.as_str()), "{message}");
        assert!(!message.contains("s3cr3t") && !message.contains(PASSWORD), "{message}");
        eprintln!("{target}: {message}");
        let requests = stub.requests();
        assert_eq!(
            requests[before..].last().map(String::as_str),
            Some(format!("GET {blob}").as_str()),
            "the pull ended at the redirect"
        );
    }
}

/// Issue 43, item 7: redirects the policy allows are followed (a loopback
/// registry's storage on another name of loopback), and at most five in a
/// row.
#[tokio::test]
async fn issue_43_item_7_storage_redirects_are_followed_at_most_five_in_a_row() {
    let dir = tempfile::tempdir().unwrap();
    let stub = StubRegistry::start().await;
    let registries = stub_registries(&stub, &dir.path().join("password"));
    let component = std::fs::read(plugin("fixtures/answer-v1")).unwrap();
    let (layer, _) = stub_build(&stub, "plugins/answer", "1", &component);
    let reference =
        PluginReference::parse(&format!("oci://{}/plugins/answer:1", stub.host)).unwrap();
    let blob = format!("/v2/plugins/answer/blobs/{layer}");

    // `localhost` is resolved, and its loopback addresses are reachable
    // from a registry on loopback.
    stub.answer(&blob, Answer::Redirect(format!("http://localhost:{}/storage/1", stub.port)));
    stub.answer("/storage/1", Answer::Body(component.clone()));
    let pulled = proxyfleet_oci::pull(&registries, &reference, None, PullLimits::default(), &[])
        .await
        .unwrap();
    assert_eq!(pulled.bytes, component);
    assert!(stub.requests().contains(&"GET /storage/1".to_owned()));

    for hop in 1..=10 {
        stub.answer(&format!("/hop/{hop}"), Answer::Redirect(format!("/hop/{}", hop + 1)));
    }
    stub.answer(&blob, Answer::Redirect("/hop/1".to_owned()));
    let err = proxyfleet_oci::pull(&registries, &reference, None, PullLimits::default(), &[])
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            OciError::Refused { source: RefusedDestination::TooManyRedirects { max: 5 }, .. }
        ),
        "{err:?}"
    );
    let hops = stub.requests().iter().filter(|request| request.starts_with("GET /hop/")).count();
    assert_eq!(hops, 5, "five redirects followed, the sixth refused");
}

/// Issue 43, item 7: a token realm is a destination the registry names,
/// held to the same policy: the basic credentials do not go to a metadata
/// address, and nothing is asked of it.
#[tokio::test]
async fn issue_43_item_7_a_token_realm_at_a_metadata_address_is_not_asked() {
    let dir = tempfile::tempdir().unwrap();
    let stub = StubRegistry::start().await;
    let registries = stub_registries(&stub, &dir.path().join("password"));
    stub.answer(
        "/v2/",
        Answer::Challenge(
            r#"Bearer realm="http://169.254.169.254/token",service="stub""#.to_owned(),
        ),
    );
    let reference =
        PluginReference::parse(&format!("oci://{}/plugins/answer:1", stub.host)).unwrap();
    let err = proxyfleet_oci::pull(&registries, &reference, None, PullLimits::default(), &[])
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            OciError::Refused {
                source: RefusedDestination::Address { kind: AddressKind::CloudMetadata, .. },
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(stub.requests(), ["GET /v2/"]);
}

/// The token flow the pull runs itself: the challenge's realm is asked for
/// a pull token with the basic credentials, and the token goes on the
/// registry's requests; a token server's refusal is a refused login that
/// shows neither secret.
#[tokio::test]
async fn a_token_from_the_registrys_realm_is_fetched_with_the_credentials_and_never_shown() {
    use base64::Engine as _;
    use proxyfleet_tests::registry::RegistryAuth;
    use proxyfleet_tests::{Canned, TestServer};

    let realm = TestServer::http(Canned { status: 503, body: "not yet".into() }).await;
    let registry = OciRegistry::start_with(
        std::net::Ipv4Addr::LOCALHOST.into(),
        RegistryAuth::TokenRealm(realm.addr.port()),
    );
    let dir = tempfile::tempdir().unwrap();
    let reference = PluginReference::parse(&registry.reference("plugins/answer", "1")).unwrap();
    let component = std::fs::read(plugin("fixtures/answer-v1")).unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, registry.token("plugins/answer", &["pull", "push"])).unwrap();
    let pusher = Registries::validate(vec![RawRegistry {
        host: registry.host.clone(),
        token_file: Some(token_file),
        ca_file: Some(registry.ca_file.clone()),
        ..RawRegistry::default()
    }])
    .unwrap();
    proxyfleet_oci::push(&pusher, &reference, "answer-v1", component.clone()).await.unwrap();

    let pull_token = registry.token("plugins/answer", &["pull"]);
    realm.set_canned(Canned {
        status: 200,
        body: serde_json::to_vec(&serde_json::json!({ "token": pull_token })).unwrap().into(),
    });
    let password_file = dir.path().join("password");
    std::fs::write(&password_file, PASSWORD).unwrap();
    let puller = Registries::validate(vec![RawRegistry {
        host: registry.host.clone(),
        username: Some(USER.to_owned()),
        password_file: Some(password_file),
        ca_file: Some(registry.ca_file.clone()),
        ..RawRegistry::default()
    }])
    .unwrap();
    let digest = proxyfleet_oci::resolve(&puller, &reference).await.unwrap();
    let pulled =
        proxyfleet_oci::pull(&puller, &reference, Some(&digest), PullLimits::default(), &[])
            .await
            .unwrap();
    assert_eq!(pulled.bytes, component);
    let asked = realm.seen();
    assert_eq!(asked.len(), 2, "one token per look and per pull: {asked:?}");
    let basic = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"))
    );
    for request in &asked {
        assert_eq!(request.header("authorization"), Some(basic.as_str()));
        assert!(request.path.contains("scope=repository%3Aplugins%2Fanswer%3Apull"), "{request:?}");
        assert!(
            request.path.contains(&format!("service={}", OciRegistry::TOKEN_SERVICE)),
            "{request:?}"
        );
    }

    realm.set_canned(Canned { status: 401, body: "wrong credentials".into() });
    let err = proxyfleet_oci::pull(&puller, &reference, None, PullLimits::default(), &[])
        .await
        .unwrap_err();
    assert!(matches!(err, OciError::Denied { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains("plugins/answer") && message.contains("wrong credentials"),
        "{message}"
    );
    assert!(!message.contains(PASSWORD) && !message.contains(&pull_token), "{message}");
}

/// Issue 43, item 8: a build planted in the content store under
/// `<cache-dir>/oci` was served for a tag and for a digest reference: the
/// store was trusted by path. Now a record pointing at a planted build (one
/// that hashes to its own name, but that the record's manifest does not
/// declare) is missing, and so is a blob whose bytes do not hash to its
/// name: with the registry up the entries pull the real build again, with
/// it down they are unavailable instead of serving the planted one.
#[tokio::test]
async fn issue_43_item_8_a_build_planted_in_the_store_is_pulled_again_or_missing() {
    let mut setup = Setup::new();
    let pinned = setup.push("fixtures/answer-v1", "plugins/answer", "stable").await;
    let tagged = setup.registry.reference("plugins/answer", "stable");
    let config = setup.providers(&format!(
        "  - {{ name: tagged, plugin: '{tagged}' }}\n  - {{ name: pinned, plugin: '{pinned}' }}\n"
    ));
    let cache = setup.cache("cache");
    drop(load(&config, &setup.plugin_dir(), &cache).await);
    let store = cache.join("oci");
    let real = std::fs::read(plugin("fixtures/answer-v1")).unwrap();
    let planted = std::fs::read(plugin("fixtures/answer-v2")).unwrap();
    let records: Vec<PathBuf> =
        std::fs::read_dir(store.join("refs")).unwrap().map(|entry| entry.unwrap().path()).collect();
    assert_eq!(records.len(), 2);

    // The planted build under its own digest, and both records moved to it.
    std::fs::write(
        store.join("blobs/sha256").join(proxyfleet_runtime::file_digest(&planted)),
        &planted,
    )
    .unwrap();
    for record in &records {
        let mut stored: serde_json::Value =
            serde_json::from_slice(&std::fs::read(record).unwrap()).unwrap();
        stored["layerDigest"] = sha256_of(&planted).into();
        std::fs::write(record, serde_json::to_vec(&stored).unwrap()).unwrap();
    }
    let restarted = load(&config, &setup.plugin_dir(), &cache).await;
    for entry in ["tagged", "pinned"] {
        assert_eq!(answer(&restarted, entry).await, V1, "{entry}: pulled again, not the plant");
    }
    drop(restarted);

    // The real build's file with the planted bytes, the registry down.
    let real_blob = store.join("blobs/sha256").join(proxyfleet_runtime::file_digest(&real));
    std::fs::write(&real_blob, &planted).unwrap();
    setup.registry.stop();
    let restarted = load(&config, &setup.plugin_dir(), &cache).await;
    for (entry, reference) in [("tagged", &tagged), ("pinned", &pinned)] {
        let reason = unavailable(&restarted, entry);
        assert!(reason.contains(reference.as_str()), "{reason}");
        assert!(reason.contains("no build of it in the plugin cache"), "{reason}");
    }
    assert!(!real_blob.exists(), "the planted file is removed");
}

/// Issue 47, item 12: pushing to (or pulling from) a plain-HTTP registry
/// without `plainHttp` failed with the TLS library's `InvalidContentType`
/// and no hint; it names the setting and the flag instead.
#[tokio::test]
async fn issue_47_item_12_a_plain_http_registry_reached_over_tls_names_plain_http() {
    // What a plain HTTP server (the registry's own, nginx) answers a TLS
    // ClientHello with: a 400, in plain text.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let host = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut hello = [0_u8; 512];
            let _ = stream.read(&mut hello).await;
            let _ =
                stream.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n").await;
        }
    });
    let registries =
        Registries::validate(vec![RawRegistry { host: host.clone(), ..RawRegistry::default() }])
            .unwrap();
    let reference = PluginReference::parse(&format!("oci://{host}/plugins/answer:1")).unwrap();
    let bytes = std::fs::read(plugin("fixtures/answer-v1")).unwrap();
    let pushed = proxyfleet_oci::push(&registries, &reference, "answer", bytes).await;
    let resolved = proxyfleet_oci::resolve(&registries, &reference).await;
    for err in [pushed.unwrap_err(), resolved.unwrap_err()] {
        assert!(matches!(err, OciError::PlainHttp { .. }), "{err:?}");
        let text = err.to_string();
        assert!(text.contains("plainHttp: true") && text.contains("--plain-http"), "{text}");
        assert!(text.contains(&host), "{text}");
    }
}
