//! The web console in headless Chromium against `proxyfleet standalone`
//! with real tinyproxies: live health changes without a reload, a
//! quarantine for one site that the gateway honours, a read-only token
//! without controls, forged posts refused, a refused plugin build shown
//! beside the build that keeps serving, and axe-core on every page.
//!
//! Screenshots of each page go to `target/console-screenshots/`
//! (`docs/console.md` shows them).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use fantoccini::Locator;
use proxyfleet_tests::browser::{Browser, serious};
use proxyfleet_tests::operator::{Running, Site};
use proxyfleet_tests::ports::free_port;
use proxyfleet_tests::proxies::Tinyproxy;
use proxyfleet_tests::{Canned, TestServer, wait_for, workspace_root};

const OPERATOR: &str = "operator-token";
const VIEWER: &str = "viewer-token";

/// Generous bounds for what a shared machine may take; the figures the
/// console promises are reported, not asserted.
const WAIT: Duration = Duration::from_secs(45);

struct Fleet {
    proxies: Vec<Tinyproxy>,
    site: Site,
    api: String,
    gateway: String,
    _operator: Running,
}

/// The operator over a pool of two Proxies on two tinyproxies, once both
/// are healthy; probes every second.
async fn start() -> Fleet {
    let proxies: Vec<Tinyproxy> = (0..2).map(|_| Tinyproxy::start()).collect();
    let endpoints: Vec<String> = proxies.iter().map(|p| format!("'{}'", p.addr())).collect();
    let site = Site::new(
        &format!(
            "providers:\n  - {{ name: local, plugin: static, config: {{ endpoints: [{}] }}, proxyAddresses: ['127.0.0.0/8'] }}\n",
            endpoints.join(", ")
        ),
        &[("static", "static")],
        "apiVersion: proxyfleet.io/v1alpha1\nkind: ProxyPool\nmetadata: { name: web }\n\
         spec: { replicas: 2, template: { spec: { provider: local } } }\n",
    );
    std::fs::write(site.path("tokens"), format!("{OPERATOR} role=operate\n{VIEWER} role=read\n"))
        .unwrap();
    let api = format!("127.0.0.1:{}", free_port());
    let gateway = format!("127.0.0.1:{}", free_port());
    let tokens = site.path("tokens").display().to_string();
    let operator = site.standalone(
        Path::new(env!("CARGO_BIN_EXE_proxyfleet")),
        &[
            "--metrics-addr",
            "127.0.0.1:0",
            "--api-addr",
            &api,
            "--api-token-file",
            &tokens,
            "--gateway-addr",
            &gateway,
            "--gateway-allow-targets",
            "127.0.0.0/8",
            "--health-interval",
            "1s",
            "--health-timeout",
            "1s",
            "--health-healthy-after",
            "1",
            "--health-unhealthy-after",
            "1",
        ],
    );
    let fleet = Fleet { proxies, site, api, gateway, _operator: operator };
    let healthy = wait_for(Duration::from_secs(90), || async {
        let output = Command::new("curl")
            .args(["-sS", "-H", &format!("Authorization: Bearer {VIEWER}")])
            .arg(format!("http://{}/v1/proxies?healthy=true", fleet.api))
            .output()
            .ok()?;
        let list: serde_json::Value = serde_json::from_slice(&output.stdout).ok()?;
        (list["items"].as_array()?.len() == 2).then_some(())
    })
    .await;
    assert!(healthy.is_some(), "both Proxies turn healthy");
    fleet
}

fn screenshots() -> PathBuf {
    let dir = workspace_root().join("target/console-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn sign_in(browser: &Browser, api: &str, token: &str) {
    browser.goto(&format!("http://{api}/ui/login")).await;
    browser.type_into("#token", token).await;
    browser.click("form.login button[type=submit]").await;
    browser.wait_for_text("h1", |text| text == "Overview", WAIT).await;
}

/// axe-core over the page: no serious or critical violation.
async fn accessible(browser: &Browser, page: &str) {
    let violations = browser.axe().await;
    let serious = serious(&violations);
    assert!(serious.is_empty(), "{page}: {serious:#?}");
}

/// The verdict the Proxies table shows for the proxy at `addr`.
async fn verdict_of(browser: &Browser, addr: &str) -> Option<String> {
    let script = format!(
        "for (const row of document.querySelectorAll('#proxies tbody tr')) {{
           if (row.textContent.includes('{addr}')) {{
             return row.querySelector('td.health').getAttribute('data-verdict');
           }}
         }}
         return null;"
    );
    browser.execute(&script).await.as_str().map(str::to_owned)
}

async fn wait_verdict(browser: &Browser, addr: &str, want: &str) -> Duration {
    let started = Instant::now();
    loop {
        if verdict_of(browser, addr).await.as_deref() == Some(want) {
            return started.elapsed();
        }
        assert!(started.elapsed() < WAIT, "{addr} did not turn {want} on the page");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The proxy IDs that served `n` requests for `url` through the gateway.
fn served_by(fleet: &Fleet, url: &str, n: usize) -> Vec<String> {
    (0..n)
        .map(|_| {
            let output = Command::new("curl")
                .args(["-sS", "--max-time", "10", "-D", "-", "-o", "/dev/null", "--proxy"])
                .arg(format!("http://{}", fleet.gateway))
                .args(["--proxy-user", &format!("pool=default.web:{OPERATOR}")])
                .arg(url)
                .output()
                .unwrap();
            let head = String::from_utf8_lossy(&output.stdout).to_ascii_lowercase();
            assert!(head.starts_with("http/1.1 200"), "{url}: {head}");
            head.lines()
                .find_map(|line| line.strip_prefix("x-proxyfleet-proxy:"))
                .expect("the gateway names the proxy")
                .trim()
                .to_owned()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_console_follows_the_fleet_live_and_acts_for_operators_only() {
    let origin =
        TestServer::http(Canned { status: 200, body: bytes::Bytes::from_static(b"origin") }).await;
    let mut fleet = start().await;
    let shots = screenshots();
    let browser = Browser::start().await;
    let api = fleet.api.clone();

    // Nobody signed in: the sign-in page, which is accessible too.
    browser.goto(&format!("http://{api}/ui/proxies")).await;
    browser.wait_for_text("h1", |text| text == "Sign in", WAIT).await;
    accessible(&browser, "sign in").await;

    sign_in(&browser, &api, OPERATOR).await;
    accessible(&browser, "overview").await;
    browser.screenshot(&shots.join("overview.png")).await;

    // The Proxies page, live: a proxy stopped turns unhealthy and back
    // without a reload (the marker set on this document survives).
    browser.goto(&format!("http://{api}/ui/proxies")).await;
    let first = fleet.proxies[0].addr().to_string();
    let second = fleet.proxies[1].addr().to_string();
    wait_verdict(&browser, &first, "healthy").await;
    wait_verdict(&browser, &second, "healthy").await;
    browser.wait_for_text("#live-status", |text| text == "live", WAIT).await;
    accessible(&browser, "proxies").await;
    browser.screenshot(&shots.join("proxies.png")).await;
    browser.execute("window.__sameDocument = true; return null;").await;
    fleet.proxies[0].kill();
    let down = wait_verdict(&browser, &first, "unhealthy").await;
    fleet.proxies[0].restart();
    let up = wait_verdict(&browser, &first, "healthy").await;
    assert_eq!(
        browser.execute("return window.__sameDocument === true;").await,
        serde_json::Value::Bool(true),
        "the page updated itself, it was not reloaded"
    );
    eprintln!(
        "console: a stopped proxy showed unhealthy after {down:?}, a restarted one healthy after \
         {up:?} (probe interval 1 s)"
    );

    // Quarantine the first proxy for the origin's site from its page.
    let id = browser
        .execute(&format!(
            "for (const row of document.querySelectorAll('#proxies tbody tr')) {{
               if (row.textContent.includes('{first}')) return row.getAttribute('data-proxy');
             }}
             return null;"
        ))
        .await
        .as_str()
        .expect("the first proxy's row")
        .to_owned();
    browser.goto(&format!("http://{api}/ui/proxies/{id}")).await;
    accessible(&browser, "a proxy").await;
    browser.type_into("#quarantine-site", "127.0.0.1").await;
    browser.click("form[aria-label=Quarantine] button[type=submit]").await;
    browser.wait_for_text("#held + ul", |text| text.contains("Banned for 127.0.0.1"), WAIT).await;
    browser.screenshot(&shots.join("proxy.png")).await;
    // The gateway keeps it from that site only.
    let port = origin.addr.port();
    let by_address = served_by(&fleet, &format!("http://127.0.0.1:{port}/"), 6);
    assert!(!by_address.contains(&id), "quarantined for 127.0.0.1: {by_address:?}");
    let by_name = served_by(&fleet, &format!("http://localhost:{port}/"), 6);
    assert!(by_name.contains(&id), "still serving other sites: {by_name:?}");

    // A refused build: the file is replaced by one that is no component;
    // the page names the refusal while the old build keeps serving.
    std::fs::write(fleet.site.path("plugins").join("static.wasm"), b"not a component").unwrap();
    browser.goto(&format!("http://{api}/ui/providers")).await;
    browser.wait_for_text("ul.rejected", |text| text.contains("load"), WAIT).await;
    let serving = browser.wait_for_text("dd.active", |text| text.contains("static"), WAIT).await;
    assert!(serving.contains("0.1.0"), "{serving}");
    // What the entry grants its plugin, and the schema the plugin publishes.
    browser.wait_for_text("ul.grants", |text| text.contains("127.0.0.0/8"), WAIT).await;
    accessible(&browser, "providers").await;
    browser.screenshot(&shots.join("providers.png")).await;
    browser.click("details.schema summary").await;
    browser.wait_for_text("details.schema code", |text| text.contains("endpoints"), WAIT).await;
    accessible(&browser, "providers, with the schema open").await;

    // The gateway's page, with the requests above on its charts.
    browser.goto(&format!("http://{api}/ui/gateway")).await;
    browser.wait_for_text("h1", |text| text == "Gateway", WAIT).await;
    accessible(&browser, "gateway").await;
    browser.screenshot(&shots.join("gateway.png")).await;

    // The proxy's events name what the operator did.
    browser.goto(&format!("http://{api}/ui/proxies/{id}")).await;
    browser
        .wait_for_text(
            "ul.events",
            |text| text.contains("quarantined for 127.0.0.1 by an operator"),
            WAIT,
        )
        .await;

    // Replace the second proxy's instance: the action is in its events,
    // and the new instance comes up healthy under the same Proxy.
    browser.goto(&format!("http://{api}/ui/proxies")).await;
    wait_verdict(&browser, &second, "healthy").await;
    let other = browser
        .execute(&format!(
            "for (const row of document.querySelectorAll('#proxies tbody tr')) {{
               if (row.textContent.includes('{second}')) return row.getAttribute('data-proxy');
             }}
             return null;"
        ))
        .await
        .as_str()
        .expect("the second proxy's row")
        .to_owned();
    browser.goto(&format!("http://{api}/ui/proxies/{other}")).await;
    browser.click("form[aria-label='Replace the instance'] button[type=submit]").await;
    let replaced = wait_for(WAIT, || async {
        let events = browser.client().find(Locator::Css("ul.events")).await.ok()?;
        let text = events.text().await.ok()?;
        (text.contains("gets a new instance") && text.contains("Replaced: deleted instance"))
            .then_some(())
    })
    .await;
    assert!(
        replaced.is_some(),
        "the replacement did not show within {WAIT:?}; the operator's log ends:\n{}",
        fleet.site.log(60)
    );
    let conditions = browser.wait_for_text("#conditions + div table", |_| true, WAIT).await;
    assert!(conditions.contains("Provisioned"), "{conditions}");
    browser.goto(&format!("http://{api}/ui/proxies")).await;
    wait_verdict(&browser, &second, "healthy").await;

    // A phone's width.
    browser.set_width(390).await;
    browser.goto(&format!("http://{api}/ui/proxies")).await;
    accessible(&browser, "proxies at 390 px").await;
    browser.screenshot(&shots.join("proxies-390.png")).await;
    browser.close().await;

    // A read-only token: pages without controls.
    let reader = Browser::start().await;
    sign_in(&reader, &api, VIEWER).await;
    reader.goto(&format!("http://{api}/ui/proxies/{id}")).await;
    reader.wait_for_text(".who", |text| text.contains("read"), WAIT).await;
    let forms =
        reader.client().find_all(Locator::Css("form[method=post][action*=quarantine]")).await;
    assert!(forms.unwrap().is_empty(), "no action controls for a reader");
    reader.close().await;

    // Forged posts: no session, or a session-less script with a token.
    for extra in [&[][..], &["-H", "Origin: http://evil.example"][..]] {
        let output = Command::new("curl")
            .args(["-sS", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST"])
            .args(extra)
            .args(["-d", "site="])
            .arg(format!("http://{api}/ui/proxies/{id}/lift"))
            .output()
            .unwrap();
        let status = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(status == "401" || status == "403", "{extra:?}: {status}");
    }
    let still = served_by(&fleet, &format!("http://127.0.0.1:{port}/"), 4);
    assert!(!still.contains(&id), "the forged posts changed nothing: {still:?}");
}
