//! Loading components: the precompiled cache.

use proxyfleet_runtime::{Runtime, RuntimeOptions};
use proxyfleet_tests::plugin;

#[tokio::test]
async fn a_second_start_loads_from_the_precompiled_cache() {
    let cache = tempfile::tempdir().unwrap();
    let options = RuntimeOptions { cache_dir: Some(cache.path().to_owned()), ..Default::default() };
    let first =
        Runtime::new(options.clone()).unwrap().load_plugin(&plugin("static")).await.unwrap();
    assert!(!first.from_cache, "an empty cache cannot hit");
    let cached: Vec<_> = std::fs::read_dir(cache.path()).unwrap().collect();
    assert_eq!(cached.len(), 1, "one compiled file per component and engine");

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
    let file = std::fs::read_dir(cache.path()).unwrap().next().unwrap().unwrap().path();
    std::fs::write(&file, b"garbage").unwrap();
    let reloaded =
        Runtime::new(options.clone()).unwrap().load_plugin(&plugin("static")).await.unwrap();
    assert!(!reloaded.from_cache, "a corrupt cache file must not be used");
    let again = Runtime::new(options).unwrap().load_plugin(&plugin("static")).await.unwrap();
    assert!(again.from_cache, "the rewritten cache file is used next time");
}
