//! axe-core, injected into pages that forbid inline scripts and `eval`,
//! finds what is broken and nothing on a clean page.

use proxyfleet_tests::browser::{Browser, serious};

use crate::site::Site;

const BROKEN: &str = r#"<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>Broken</title></head>
<body><main>
<h1>Broken</h1>
<img src="/logo.png">
<input type="text" name="search">
</main></body>
</html>
"#;

const CLEAN: &str = r#"<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>Clean</title><link rel="stylesheet" href="/site.css"></head>
<body><main>
<h1>Clean</h1>
<img src="/logo.png" alt="Proxyfleet">
<label for="search">Search</label>
<input id="search" type="text" name="search">
</main></body>
</html>
"#;

const CSS: &str = "body { font-family: sans-serif; color: #111; background: #fff; }\n";

#[tokio::test]
async fn an_image_without_alt_and_an_unlabeled_input_are_serious() {
    let site = Site::serve(&[("/", BROKEN)]).await;
    let browser = Browser::start().await;
    browser.goto(&site.url("/")).await;
    let violations = browser.axe().await;
    let serious: Vec<&str> = serious(&violations).iter().map(|v| v.id.as_str()).collect();
    assert!(serious.contains(&"image-alt"), "{violations:#?}");
    assert!(serious.contains(&"label"), "{violations:#?}");
    let alt = violations.iter().find(|v| v.id == "image-alt").expect("image-alt");
    assert_eq!(alt.nodes, ["img"], "{alt:#?}");
    browser.close().await;
}

#[tokio::test]
async fn a_clean_page_has_no_violation() {
    let site = Site::serve(&[("/", CLEAN), ("/site.css", CSS)]).await;
    let browser = Browser::start().await;
    browser.goto(&site.url("/")).await;
    let violations = browser.axe().await;
    assert!(violations.is_empty(), "{violations:#?}");
    // A second run on the same page reuses the injected engine.
    assert!(browser.axe().await.is_empty());
    browser.close().await;
}
