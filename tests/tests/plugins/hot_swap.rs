//! Hot swap of provider plugins: new files in the plugin directory become
//! the entries' revisions while calls keep flowing, unless they fail the
//! admission checks; rollback, file removal and pins.
//!
//! The `answer` fixtures differ only in their version, which every `get`
//! answer carries (`answer 1.0.0`, `answer 2.0.0`, and `answer 3.0.0` for
//! the build that asks for an HTTP destination).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use proxyfleet_core::Provider;
use proxyfleet_core::kv::MemoryKv;
use proxyfleet_runtime::admission::RejectionKind;
use proxyfleet_runtime::config::ProvidersConfig;
use proxyfleet_runtime::watch::WatchOptions;
use proxyfleet_runtime::{
    EntryState, PluginLoad, PluginRevision, Registry, RejectedCandidate, RollbackError, Runtime,
    RuntimeOptions, file_digest,
};
use proxyfleet_tests::{ConfigMapDir, plugin, replace_file, wait_for};

/// How long a swap may take on a loaded machine before the test fails;
/// what it takes is measured and printed, not asserted.
const PATIENCE: Duration = Duration::from_secs(30);

const V1: &str = "answer 1.0.0";
const V2: &str = "answer 2.0.0";
const WIDE: &str = "answer 3.0.0";

async fn load(dir: &Path, providers: &str, cache: Option<&Path>) -> Arc<Registry> {
    let config = ProvidersConfig::parse(providers).expect("valid providers file");
    let runtime = Runtime::new(RuntimeOptions {
        cache_dir: cache.map(Path::to_owned),
        ..RuntimeOptions::default()
    })
    .expect("runtime");
    Arc::new(
        Registry::load(&runtime, &config, dir, Arc::new(MemoryKv::new()))
            .await
            .expect("plugin directory readable"),
    )
}

/// What `entry`'s `get` answers now.
async fn answer(registry: &Registry, entry: &str) -> String {
    let provider = registry.provider(entry).expect("the entry serves");
    provider.get("probe").await.expect("get answers").name
}

fn active_revision(registry: &Registry, entry: &str) -> Arc<PluginRevision> {
    match &registry.entries()[entry] {
        EntryState::Ready(provider) => provider.revision(),
        other => panic!("entry {entry} is not serving: {other:?}"),
    }
}

async fn until_answer(registry: &Registry, entry: &str, expected: &str) {
    let answered = wait_for(PATIENCE, || async {
        let provider = registry.provider(entry).ok()?;
        let name = provider.get("probe").await.ok()?.name;
        (name == expected).then_some(())
    })
    .await;
    assert!(answered.is_some(), "{entry} did not answer {expected:?} within {PATIENCE:?}");
}

/// The newest refused candidate of `entry` once it has refused `count`.
async fn until_rejected(registry: &Registry, entry: &str, count: u64) -> RejectedCandidate {
    let rejected = wait_for(PATIENCE, || async {
        let revisions = registry.revisions_of(entry)?;
        (revisions.rejections >= count).then(|| revisions.rejected.last().cloned()).flatten()
    })
    .await;
    rejected.unwrap_or_else(|| {
        panic!(
            "{entry} did not refuse {count} candidates within {PATIENCE:?}: {:#?}",
            registry.revisions_of(entry)
        )
    })
}

fn copy_plugin(name: &str, dir: &Path) {
    std::fs::copy(plugin(name), dir.join("answer.wasm")).expect("copy the plugin");
}

#[derive(Debug)]
struct Call {
    started: Instant,
    ended: Instant,
    answer: Result<String, String>,
}

async fn call_until_stopped(provider: Arc<dyn Provider>, stop: Arc<AtomicBool>) -> Vec<Call> {
    let mut calls = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        let answer = provider.get("probe").await.map(|i| i.name).map_err(|e| e.to_string());
        calls.push(Call { started, ended: Instant::now(), answer });
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    calls
}

struct Swap {
    expected: &'static str,
    landed: Instant,
    /// When the registry was first seen reporting the new revision active.
    seen_active: Instant,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_swaps_under_load_fail_no_call() {
    let (v1, v2) = (plugin("fixtures/answer-v1"), plugin("fixtures/answer-v2"));
    let dir = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let mut mounted = ConfigMapDir::create(dir.path(), &[("answer.wasm", &v1)]);
    let registry = load(
        dir.path(),
        "providers:\n  - { name: swap, plugin: answer, limits: { concurrency: 16 } }\n",
        Some(cache.path()),
    )
    .await;
    let first_v1 = active_revision(&registry, "swap");
    let _watch = registry.watch(WatchOptions::default());

    let provider = registry.provider("swap").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let callers: Vec<_> = (0..8)
        .map(|_| tokio::spawn(call_until_stopped(Arc::clone(&provider), Arc::clone(&stop))))
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;

    let mut swaps = Vec::new();
    for round in 0..20 {
        let (file, version, expected) =
            if round % 2 == 0 { (&v2, "2.0.0", V2) } else { (&v1, "1.0.0", V1) };
        mounted.update(&[("answer.wasm", file)]);
        let landed = Instant::now();
        let seen_active = loop {
            let active = registry.revisions_of("swap").and_then(|r| r.active);
            if active.is_some_and(|a| a.version == version) {
                break Instant::now();
            }
            assert!(landed.elapsed() < PATIENCE, "round {round}: {version} not active in time");
            tokio::time::sleep(Duration::from_millis(2)).await;
        };
        // Calls on the new revision before the next file lands.
        tokio::time::sleep(Duration::from_millis(200)).await;
        swaps.push(Swap { expected, landed, seen_active });
    }
    stop.store(true, Ordering::Relaxed);
    let mut calls = Vec::new();
    for caller in callers {
        calls.extend(caller.await.unwrap());
    }

    let failed: Vec<_> = calls.iter().filter_map(|c| c.answer.as_ref().err()).collect();
    assert!(failed.is_empty(), "{} of {} calls failed: {:?}", failed.len(), calls.len(), failed);
    for call in &calls {
        let answer = call.answer.as_deref().unwrap();
        assert!(answer == V1 || answer == V2, "answered by no known revision: {answer:?}");
    }
    let mut first_answers = Vec::new();
    let mut activations = Vec::new();
    for (round, swap) in swaps.iter().enumerate() {
        let next_landed = swaps.get(round + 1).map(|s| s.landed);
        // Once the new revision is active, every call that starts before
        // the next file lands is answered by it alone.
        for call in calls.iter().filter(|c| {
            c.started >= swap.seen_active && next_landed.is_none_or(|next| c.started < next)
        }) {
            assert_eq!(call.answer.as_deref().unwrap(), swap.expected, "round {round}");
        }
        let first = calls
            .iter()
            .filter(|c| c.started >= swap.landed && c.answer.as_deref() == Ok(swap.expected))
            .map(|c| c.ended - swap.landed)
            .min()
            .unwrap_or_else(|| panic!("round {round}: no call answered {}", swap.expected));
        first_answers.push(first);
        activations.push(swap.seen_active - swap.landed);
    }
    let revisions = registry.revisions_of("swap").unwrap();
    assert_eq!(revisions.swaps, 20, "{revisions:#?}");
    assert_eq!(revisions.rejections, 0, "{revisions:#?}");
    assert!(
        Arc::ptr_eq(&first_v1, &active_revision(&registry, "swap")),
        "swapping back must reuse the revision kept in memory, not compile again"
    );

    let stats = |mut samples: Vec<Duration>| {
        samples.sort();
        format!(
            "min {:?}, median {:?}, max {:?}",
            samples[0],
            samples[samples.len() / 2],
            samples[samples.len() - 1]
        )
    };
    eprintln!(
        "hot swap: {} calls over 20 swaps (ConfigMap-style ..data link swaps), 0 failed",
        calls.len()
    );
    eprintln!(
        "hot swap: file landed -> first answer by the new revision: {}",
        stats(first_answers.clone())
    );
    eprintln!("hot swap: file landed -> registry reports it active: {}", stats(activations));
    eprintln!("hot swap: per swap (landed -> first answer): {first_answers:?}");
}

#[tokio::test]
async fn refused_candidates_leave_the_active_revision_serving() {
    let dir = tempfile::tempdir().unwrap();
    copy_plugin("fixtures/answer-v1", dir.path());
    let registry = load(
        dir.path(),
        "providers:
  - { name: strict, plugin: answer }
  - name: wide
    plugin: answer
    grants: { http: [ { url: 'https://wide.example:8443' } ] }
",
        None,
    )
    .await;
    let _watch = registry.watch(WatchOptions::default());
    let target = dir.path().join("answer.wasm");

    let garbage = dir.path().join("garbage.bin");
    std::fs::write(&garbage, b"\0asm but not a component").unwrap();
    replace_file(&garbage, &target);
    let corrupt = until_rejected(&registry, "strict", 1).await;
    assert_eq!(corrupt.kind, RejectionKind::Load);
    assert_eq!(corrupt.digest, file_digest(&std::fs::read(&garbage).unwrap()));
    assert_eq!((corrupt.plugin.as_deref(), corrupt.version.as_deref()), (None, None));
    assert!(corrupt.reason.contains("not a usable WebAssembly component"), "{}", corrupt.reason);
    assert_eq!(answer(&registry, "strict").await, V1);

    replace_file(&plugin("fixtures/wrong-major"), &target);
    let wrong_major = until_rejected(&registry, "strict", 2).await;
    assert_eq!(wrong_major.kind, RejectionKind::Load);
    assert_eq!(wrong_major.contract_version.as_deref(), Some("0.1.0"));
    assert!(wrong_major.reason.contains("@0.1.0"), "{}", wrong_major.reason);
    assert_eq!(answer(&registry, "strict").await, V1);
    assert_eq!(answer(&registry, "wide").await, V1);

    replace_file(&plugin("fixtures/answer-wide"), &target);
    let widening = until_rejected(&registry, "strict", 3).await;
    assert_eq!(widening.kind, RejectionKind::Capabilities);
    assert_eq!(widening.version.as_deref(), Some("3.0.0"));
    assert!(
        widening.reason.contains("grants.http https://wide.example:8443"),
        "the reason names the missing grant: {}",
        widening.reason
    );
    assert_eq!(answer(&registry, "strict").await, V1);
    // The entry that grants the destination takes the same file.
    until_answer(&registry, "wide", WIDE).await;

    let strict = registry.revisions_of("strict").unwrap();
    assert_eq!(strict.active.as_ref().map(|a| a.version.as_str()), Some("1.0.0"));
    assert_eq!((strict.swaps, strict.rejections, strict.rejected.len()), (0, 3, 3));
    assert!(strict.previous.is_none());
    let shown = serde_json::to_value(registry.revisions()).unwrap();
    assert_eq!(shown[0]["entry"], "strict");
    assert_eq!(shown[0]["rejected"][2]["kind"], "capabilities");
    assert_eq!(shown[1]["entry"], "wide");
    assert_eq!(shown[1]["active"]["version"], "3.0.0");
    assert_eq!(shown[1]["previous"]["version"], "1.0.0");
}

#[tokio::test]
async fn rollback_removal_and_restore_bring_back_the_previous_revision() {
    let dir = tempfile::tempdir().unwrap();
    copy_plugin("fixtures/answer-v1", dir.path());
    let registry = load(dir.path(), "providers:\n  - { name: e, plugin: answer }\n", None).await;
    let _watch = registry.watch(WatchOptions::default());
    let target = dir.path().join("answer.wasm");
    let original = active_revision(&registry, "e");

    assert_eq!(registry.rollback("e"), Err(RollbackError::NoPrevious { entry: "e".into() }));
    assert_eq!(
        registry.rollback("nope"),
        Err(RollbackError::UnknownEntry { entry: "nope".into() })
    );

    replace_file(&plugin("fixtures/answer-v2"), &target);
    until_answer(&registry, "e", V2).await;
    let second = active_revision(&registry, "e");

    let back = registry.rollback("e").unwrap();
    assert_eq!(back.version, "1.0.0");
    assert_eq!(answer(&registry, "e").await, V1, "a rollback takes effect at once");
    assert!(Arc::ptr_eq(&active_revision(&registry, "e"), &original));
    let revisions = registry.revisions_of("e").unwrap();
    assert_eq!(revisions.previous.map(|p| p.version), Some("2.0.0".into()));
    assert_eq!(registry.rollback("e").unwrap().version, "2.0.0", "a second rollback undoes it");
    assert_eq!(answer(&registry, "e").await, V2);

    // Removing the new file brings back the old revision.
    std::fs::remove_file(&target).unwrap();
    until_answer(&registry, "e", V1).await;
    assert!(Arc::ptr_eq(&active_revision(&registry, "e"), &original));

    // Restoring either file reuses its revision: nothing is compiled again.
    replace_file(&plugin("fixtures/answer-v2"), &target);
    until_answer(&registry, "e", V2).await;
    assert!(Arc::ptr_eq(&active_revision(&registry, "e"), &second));
    replace_file(&plugin("fixtures/answer-v1"), &target);
    until_answer(&registry, "e", V1).await;
    assert!(Arc::ptr_eq(&active_revision(&registry, "e"), &original));

    // A rollback stays until the file changes again.
    registry.rollback("e").unwrap();
    registry.rescan().await;
    assert_eq!(answer(&registry, "e").await, V2);
    assert_eq!(registry.revisions_of("e").unwrap().swaps, 7);
}

#[tokio::test]
async fn pins_and_config_refusals_keep_other_builds_out() {
    let dir = tempfile::tempdir().unwrap();
    copy_plugin("fixtures/answer-v1", dir.path());
    let v2_digest = file_digest(&std::fs::read(plugin("fixtures/answer-v2")).unwrap());
    let registry = load(
        dir.path(),
        &format!(
            "providers:
  - {{ name: free, plugin: answer }}
  - {{ name: by-version, plugin: answer, pin: {{ version: 1.0.0 }} }}
  - {{ name: by-digest, plugin: answer, pin: {{ digest: 'sha256:{v2_digest}' }} }}
  - {{ name: refusing, plugin: answer, config: {{ refuse: ['2.0.0'] }} }}
"
        ),
        None,
    )
    .await;
    let EntryState::Failed(reason) = &registry.entries()["by-digest"] else {
        panic!("an entry pinned to another build must not serve");
    };
    assert!(reason.contains(&format!("pins digest sha256:{v2_digest}")), "{reason}");
    assert!(reason.contains("version 1.0.0"), "{reason}");
    let unavailable = registry.revisions_of("by-digest").unwrap();
    assert!(unavailable.active.is_none() && unavailable.unavailable.is_some());
    let _watch = registry.watch(WatchOptions::default());

    replace_file(&plugin("fixtures/answer-v2"), &dir.path().join("answer.wasm"));
    until_answer(&registry, "free", V2).await;
    // The pinned build landed: the entry that failed at load serves now.
    until_answer(&registry, "by-digest", V2).await;
    assert!(matches!(registry.entries()["by-digest"], EntryState::Ready(_)));

    let pinned = until_rejected(&registry, "by-version", 1).await;
    assert_eq!(pinned.kind, RejectionKind::Pin);
    assert!(pinned.reason.contains("pins version 1.0.0"), "{}", pinned.reason);
    assert!(pinned.reason.contains("version 2.0.0"), "{}", pinned.reason);
    assert_eq!(answer(&registry, "by-version").await, V1);

    let refused = until_rejected(&registry, "refusing", 1).await;
    assert_eq!(refused.kind, RejectionKind::Config);
    assert!(refused.reason.contains("refused the entry's config"), "{}", refused.reason);
    assert!(refused.reason.contains("refuse"), "{}", refused.reason);
    assert_eq!(answer(&registry, "refusing").await, V1);
}

/// Issue 15, item 2: a new file was compiled and described before its
/// digest was held against the entries' pins, so a digest pin still let
/// any file run code in the host.
#[tokio::test]
async fn a_file_every_entry_refuses_by_digest_is_never_compiled() {
    let dir = tempfile::tempdir().unwrap();
    copy_plugin("fixtures/answer-v1", dir.path());
    let v1_digest = file_digest(&std::fs::read(plugin("fixtures/answer-v1")).unwrap());
    let v2_digest = file_digest(&std::fs::read(plugin("fixtures/answer-v2")).unwrap());
    let providers = format!(
        "providers:\n  - {{ name: pinned, plugin: answer, pin: {{ digest: 'sha256:{v1_digest}' }} }}\n"
    );
    let registry = load(dir.path(), &providers, None).await;
    assert_eq!(answer(&registry, "pinned").await, V1);

    replace_file(&plugin("fixtures/answer-v2"), &dir.path().join("answer.wasm"));
    registry.rescan().await;
    let rejected = registry.revisions_of("pinned").unwrap().rejected.last().cloned().unwrap();
    assert_eq!(rejected.kind, RejectionKind::Pin);
    assert_eq!((rejected.plugin, rejected.version), (None, None), "never described");
    assert!(
        rejected.reason.contains(&format!("sha256:{v2_digest} (not compiled)")),
        "{}",
        rejected.reason
    );
    let PluginLoad::Failed(why) = &registry.plugins()["answer"] else {
        panic!("the file must not load");
    };
    assert!(why.contains("not compiled"), "{why}");
    assert_eq!(answer(&registry, "pinned").await, V1);

    // At a start, the same.
    let restarted = load(dir.path(), &providers, None).await;
    let EntryState::Failed(reason) = &restarted.entries()["pinned"] else {
        panic!("an entry pinned to another build must not serve");
    };
    assert!(reason.contains("(not compiled)"), "{reason}");
}

#[tokio::test]
async fn revisions_older_than_the_previous_one_are_dropped_once_idle() {
    let dir = tempfile::tempdir().unwrap();
    copy_plugin("fixtures/answer-v1", dir.path());
    let registry = load(
        dir.path(),
        "providers:
  - name: e
    plugin: answer
    grants: { http: [ { url: 'https://wide.example:8443' } ] }
",
        None,
    )
    .await;
    let target = dir.path().join("answer.wasm");
    let first = Arc::downgrade(&active_revision(&registry, "e"));

    // Driven by explicit rescans rather than a watcher.
    replace_file(&plugin("fixtures/answer-v2"), &target);
    registry.rescan().await;
    assert_eq!(answer(&registry, "e").await, V2);
    assert!(first.upgrade().is_some(), "the previous revision is kept for a rollback");
    replace_file(&plugin("fixtures/answer-wide"), &target);
    registry.rescan().await;
    assert_eq!(answer(&registry, "e").await, WIDE);
    assert!(first.upgrade().is_none(), "neither active nor previous: dropped");
    let revisions = registry.revisions_of("e").unwrap();
    assert_eq!(revisions.previous.map(|p| p.version), Some("2.0.0".into()));
}
