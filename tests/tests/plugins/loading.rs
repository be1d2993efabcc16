//! Loading components: the precompiled cache.

use std::path::{Path, PathBuf};

use proxyfleet_runtime::{Runtime, RuntimeOptions};
use proxyfleet_tests::plugin;

/// The compiled files in a cache directory (beside them: its key).
fn cwasm_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "cwasm"))
        .collect();
    files.sort();
    files
}

#[tokio::test]
async fn a_second_start_loads_from_the_precompiled_cache() {
    let cache = tempfile::tempdir().unwrap();
    let options = RuntimeOptions { cache_dir: Some(cache.path().to_owned()), ..Default::default() };
    let first =
        Runtime::new(options.clone()).unwrap().load_plugin(&plugin("static")).await.unwrap();
    assert!(!first.from_cache, "an empty cache cannot hit");
    assert_eq!(cwasm_files(cache.path()).len(), 1, "one compiled file per component and engine");

    // A new runtime stands for a restarted host.
    let second = Runtime::new(options).unwrap().load_plugin(&plugin("static")).await.unwrap();
    assert!(second.from_cache, "the restart must load the precompiled file");
    assert_eq!(second.digest, first.digest);
    assert_eq!(second.info, first.info);
}

#[tokio::test]
async fn a_corrupt_cache_file_is_ignored_and_rewritten() {
    let cache = tempfile::tempdir().unwrap();
    let options = RuntimeOptions { cache_dir: Some(cache.path().to_owned()), ..Default::default() };
    Runtime::new(options.clone()).unwrap().load_plugin(&plugin("static")).await.unwrap();
    let file = cwasm_files(cache.path()).remove(0);
    std::fs::write(&file, b"garbage").unwrap();
    let reloaded =
        Runtime::new(options.clone()).unwrap().load_plugin(&plugin("static")).await.unwrap();
    assert!(!reloaded.from_cache, "a corrupt cache file must not be used");
    let again = Runtime::new(options).unwrap().load_plugin(&plugin("static")).await.unwrap();
    assert!(again.from_cache, "the rewritten cache file is used next time");
}

/// Issue 15, item 5: the cache was trusted by file name, so native code
/// planted under another component's digest served an entry pinned to
/// that digest.
#[tokio::test]
async fn a_cache_file_planted_under_another_digest_is_not_loaded() {
    let cache = tempfile::tempdir().unwrap();
    let options = RuntimeOptions { cache_dir: Some(cache.path().to_owned()), ..Default::default() };
    let runtime = Runtime::new(options.clone()).unwrap();
    let noop = runtime.load_plugin(&plugin("fixtures/noop")).await.unwrap();
    let before = cwasm_files(cache.path());
    let hog = runtime.load_plugin(&plugin("fixtures/hog")).await.unwrap();
    let hog_file =
        cwasm_files(cache.path()).into_iter().find(|f| !before.contains(f)).expect("hog's file");
    // hog's compiled code, under noop's name.
    std::fs::copy(&hog_file, &before[0]).unwrap();

    let reloaded =
        Runtime::new(options).unwrap().load_plugin(&plugin("fixtures/noop")).await.unwrap();
    assert!(!reloaded.from_cache, "a file whose MAC does not match its name is not used");
    assert_eq!(reloaded.info, noop.info, "noop's own code serves noop");
    assert_ne!(reloaded.info, hog.info);
}

/// Bytes this thread has read through system calls so far. A load reads
/// its cache file on the calling thread (the component file and the
/// compilation run on blocking threads), so on a current-thread runtime
/// this counts what the cache read.
fn thread_bytes_read() -> u64 {
    let io = std::fs::read_to_string("/proc/thread-self/io").expect("procfs");
    io.lines()
        .find_map(|line| line.strip_prefix("rchar: "))
        .and_then(|n| n.parse().ok())
        .expect("an rchar line")
}

/// Issue 43, item 9: a 1 GiB file planted in the precompiled cache was
/// read whole before its MAC was checked (+2 GiB per load). It is refused
/// on its size without being read, the plugin is compiled, and its
/// compilation replaces the planted file.
#[tokio::test(flavor = "current_thread")]
async fn a_planted_oversized_cache_file_is_refused_unread_and_replaced() {
    let cache = tempfile::tempdir().unwrap();
    let options = RuntimeOptions { cache_dir: Some(cache.path().to_owned()), ..Default::default() };
    Runtime::new(options.clone()).unwrap().load_plugin(&plugin("static")).await.unwrap();
    let file = cwasm_files(cache.path()).remove(0);
    let compiled = std::fs::metadata(&file).unwrap().len();

    // The measure sees a load that reads the file.
    let runtime = Runtime::new(options.clone()).unwrap();
    let before = thread_bytes_read();
    assert!(runtime.load_plugin(&plugin("static")).await.unwrap().from_cache);
    let read_cached = thread_bytes_read() - before;
    assert!(read_cached >= compiled, "{read_cached} bytes read of {compiled}");

    // 1 GiB, sparse: no disk, but a read of it would take 1 GiB.
    std::fs::remove_file(&file).unwrap();
    std::fs::File::create(&file).unwrap().set_len(1 << 30).unwrap();
    let runtime = Runtime::new(options.clone()).unwrap();
    let before = thread_bytes_read();
    let reloaded = runtime.load_plugin(&plugin("static")).await.unwrap();
    let read_planted = thread_bytes_read() - before;
    assert!(!reloaded.from_cache, "the planted file is a miss");
    assert!(read_planted < 1 << 20, "{read_planted} bytes read: the planted file was read");
    assert_eq!(std::fs::metadata(&file).unwrap().len(), compiled, "the compilation replaced it");
    let again = Runtime::new(options).unwrap().load_plugin(&plugin("static")).await.unwrap();
    assert!(again.from_cache);
}

/// Issue 14: start-up waited for every plugin to compile (seconds each on
/// a cold cache) before the API and probes came up. An opened registry
/// answers at once with every entry loading, and settles each as its
/// plugin loads.
#[tokio::test]
async fn an_opened_registry_serves_each_entry_once_its_plugin_has_loaded() {
    use std::sync::Arc;

    use proxyfleet_core::ErrorClass;
    use proxyfleet_core::kv::MemoryKv;
    use proxyfleet_runtime::config::ProvidersConfig;
    use proxyfleet_runtime::{EntryState, Registry};

    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(plugin("fixtures/noop"), dir.path().join("noop.wasm")).unwrap();
    let config = ProvidersConfig::parse(
        "providers:\n  - { name: here, plugin: noop }\n  - { name: absent, plugin: missing }\n",
    )
    .unwrap();
    let runtime = Runtime::new(RuntimeOptions::default()).unwrap();
    let (registry, pending) =
        Registry::open(&runtime, &config, dir.path(), Arc::new(MemoryKv::new())).await.unwrap();
    let registry = Arc::new(registry);
    let lent = registry.entries();
    assert!(lent.values().all(|state| matches!(state, EntryState::Loading)));
    let err = registry.provider("here").err().expect("nothing serves yet");
    assert_eq!(err.class, ErrorClass::Unavailable, "{err}");
    assert!(err.message.contains("still loading"), "{err}");
    let revisions = registry.revisions();
    assert_eq!(revisions.len(), 2, "loading entries are listed: {revisions:?}");
    assert!(
        revisions.iter().all(|r| r.unavailable.as_deref() == Some("its plugin is still loading"))
    );

    let waiter = tokio::spawn({
        let registry = Arc::clone(&registry);
        async move { registry.wait_loaded().await }
    });
    registry.load_pending(pending).await;
    waiter.await.unwrap();
    assert!(matches!(registry.entries()["here"], EntryState::Ready(_)));
    assert!(
        lent.values().all(|state| matches!(state, EntryState::Loading)),
        "a map lent out earlier stays as it was"
    );
    registry.provider("here").expect("ready once loaded");
    let EntryState::Failed(reason) = &registry.entries()["absent"] else {
        panic!("an entry without a plugin file fails: {:?}", registry.entries()["absent"]);
    };
    assert!(reason.contains("no missing.wasm"), "{reason}");
}

#[tokio::test]
async fn plugin_files_no_entry_names_are_never_compiled() {
    use std::sync::Arc;

    use proxyfleet_core::kv::MemoryKv;
    use proxyfleet_runtime::config::ProvidersConfig;
    use proxyfleet_runtime::{EntryState, PluginLoad, Registry};
    use proxyfleet_tests::replace_file;

    let dir = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    for name in ["noop", "answer-v1"] {
        std::fs::copy(plugin(&format!("fixtures/{name}")), dir.path().join(format!("{name}.wasm")))
            .unwrap();
    }
    let config = ProvidersConfig::parse("providers:\n  - { name: here, plugin: noop }\n").unwrap();
    let options = RuntimeOptions { cache_dir: Some(cache.path().to_owned()), ..Default::default() };
    let runtime = Runtime::new(options).unwrap();
    let registry = Arc::new(
        Registry::load(&runtime, &config, dir.path(), Arc::new(MemoryKv::new())).await.unwrap(),
    );
    assert!(matches!(registry.entries()["here"], EntryState::Ready(_)));
    let plugins = registry.plugins();
    assert!(matches!(plugins["noop"], PluginLoad::Loaded(_)));
    assert!(matches!(plugins["answer-v1"], PluginLoad::Unused), "{:?}", plugins["answer-v1"]);
    assert_eq!(cwasm_files(cache.path()).len(), 1, "only the named plugin was compiled");

    // A new build of the unused file is not compiled either.
    replace_file(&plugin("fixtures/answer-v2"), &dir.path().join("answer-v1.wasm"));
    registry.rescan().await;
    assert!(matches!(registry.plugins()["answer-v1"], PluginLoad::Unused));
    assert_eq!(cwasm_files(cache.path()).len(), 1);
}
