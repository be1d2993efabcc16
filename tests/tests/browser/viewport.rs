//! A phone-sized viewport, and screenshots of it.

use proxyfleet_tests::browser::Browser;

use crate::site::Site;

const PAGE: &str = r#"<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>Narrow</title></head>
<body><main><h1>Narrow</h1></main></body>
</html>
"#;

#[tokio::test]
async fn a_390_px_viewport_and_its_screenshot() {
    let site = Site::serve(&[("/", PAGE)]).await;
    let browser = Browser::start().await;
    browser.goto(&site.url("/")).await;
    let wide = browser.execute("return window.innerWidth;").await;
    assert_eq!(wide, 1280);
    browser.set_width(390).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("narrow.png");
    browser.screenshot(&path).await;
    let png = std::fs::read(&path).expect("screenshot written");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    // IHDR's width: the viewport's, at one device pixel per CSS pixel.
    let width = u32::from_be_bytes(png[16..20].try_into().expect("4 bytes"));
    assert_eq!(width, 390);
    browser.close().await;
}
