//! The page's own script files run under the strict policy and change
//! the page, and inline scripts do not: the policy the console relies on
//! is in force in the browser the tests drive.

use std::time::Duration;

use proxyfleet_tests::browser::Browser;

use crate::site::Site;

const PAGE: &str = r#"<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>Counter</title><script src="/app.js" defer></script></head>
<body><main>
<h1>Counter</h1>
<button id="go" type="button">Go</button>
<p id="out">not clicked</p>
<p id="inline">inline blocked</p>
<script>document.getElementById('inline').textContent = 'inline ran';</script>
</main></body>
</html>
"#;

const APP: &str = "document.getElementById('go').addEventListener('click', () => {\n\
  document.getElementById('out').textContent = 'clicked';\n\
});\n";

#[tokio::test]
async fn a_click_runs_the_pages_script_file_and_no_inline_script_runs() {
    let site = Site::serve(&[("/", PAGE), ("/app.js", APP)]).await;
    let browser = Browser::start().await;
    browser.goto(&site.url("/")).await;
    browser.click("#go").await;
    let out = browser.wait_for_text("#out", |t| t == "clicked", Duration::from_secs(5)).await;
    assert_eq!(out, "clicked");
    let inline = browser.wait_for_text("#inline", |_| true, Duration::from_secs(1)).await;
    assert_eq!(inline, "inline blocked");
    browser.close().await;
}
