//! The web console as a platform engineer opens it after `helm install`:
//! headless Chromium on the host, through the chart's API Service (its
//! ClusterIP, which only the node's routes reach), against the two
//! replicas. The install has no API tokens, so the console is read-only.
//!
//! One page stays open across the leader's deletion and a scale-up: its
//! live stream reconnects to a replica still serving, and the page shows
//! the new Proxies without a reload.

use std::net::IpAddr;
use std::process::Command;
use std::time::Duration;

use fantoccini::Locator;
use proxyfleet_tests::browser::{Browser, serious};
use serde_json::Value;

/// Generous for a shared machine: pods start, replicas take over.
const WAIT: Duration = Duration::from_secs(120);

/// A browser that reaches the API Service.
pub struct Console {
    browser: Browser,
    /// `http://<ClusterIP>:<port>`.
    base: String,
}

impl Console {
    pub async fn open(service_ip: IpAddr, base: &str) -> Self {
        let browser = Browser::start_reaching(&[service_ip]).await;
        Self { browser, base: base.to_owned() }
    }

    async fn goto(&self, page: &str) {
        self.browser.goto(&format!("{}{page}", self.base)).await;
    }

    async fn accessible(&self, page: &str) {
        let violations = self.browser.axe().await;
        let serious = serious(&violations);
        assert!(serious.is_empty(), "{page} (in the cluster): {serious:#?}");
    }

    /// The overview names the replica that served it (one of `replicas`:
    /// the Service sends to every ready replica, leader or not).
    pub async fn overview_served_by_a_replica(&self, replicas: &[String], healthy: usize) {
        self.goto("/ui/").await;
        self.browser.wait_for_text("h1", |text| text == "Overview", WAIT).await;
        self.browser
            .wait_for_text(
                "#replica",
                |text| {
                    replicas.iter().any(|name| text.contains(&format!("Served by replica {name},")))
                },
                WAIT,
            )
            .await;
        let count = healthy.to_string();
        self.browser.wait_for_text("#count-healthy", |text| text == count, WAIT).await;
        self.accessible("overview").await;
    }

    /// The Providers page shows the entry serving the build its registry
    /// reference names.
    pub async fn providers_show_the_pull(&self, reference: &str) {
        self.goto("/ui/providers").await;
        self.browser.wait_for_text("p.pull", |text| text.contains(reference), WAIT).await;
        self.browser.wait_for_text("dd.active", |text| text.contains("kubernetes"), WAIT).await;
        self.accessible("providers").await;
    }

    /// Opens the Proxies page, waits for `count` healthy rows, checks that
    /// no action is offered (no tokens: read-only), and marks the document
    /// so that [`Console::proxies_follow`] can tell it was never reloaded.
    pub async fn proxies_read_only(&self, count: usize) {
        self.goto("/ui/proxies").await;
        self.wait_rows(count).await;
        self.browser.wait_for_text("#live-status", |text| text == "live", WAIT).await;
        let forms = self.browser.client().find_all(Locator::Css("form[method=post]")).await;
        assert!(forms.expect("a find").is_empty(), "no action controls without API tokens");
        self.accessible("proxies").await;
        self.browser.execute("window.__sameDocument = true; return null;").await;
    }

    /// The page opened by [`Console::proxies_read_only`] comes to show
    /// `count` healthy rows by itself, and is live again.
    pub async fn proxies_follow(&self, count: usize) {
        self.wait_rows(count).await;
        self.browser.wait_for_text("#live-status", |text| text == "live", WAIT).await;
        assert_eq!(
            self.browser.execute("return window.__sameDocument === true;").await,
            Value::Bool(true),
            "the Proxies page updated itself across the takeover, it was not reloaded"
        );
    }

    async fn wait_rows(&self, count: usize) {
        let script = "const rows = document.querySelectorAll('#proxies tbody tr');
             const healthy = document.querySelectorAll(
               '#proxies tbody tr td.health[data-verdict=healthy]');
             return [rows.length, healthy.length];";
        let want = serde_json::json!([count, count]);
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            let seen = self.browser.execute(script).await;
            if seen == want {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the Proxies page did not come to {count} healthy rows (rows, healthy: {seen})"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// A post without a session, as a forged form would send it, is
    /// refused: the console has nothing to act with.
    pub fn refuses_a_forged_post(&self) {
        let output = Command::new("curl")
            .args(["-sS", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST"])
            .args(["-d", "site="])
            .arg(format!("{}/ui/proxies/any/lift", self.base))
            .output()
            .expect("curl runs");
        let status = String::from_utf8_lossy(&output.stdout).into_owned();
        assert_eq!(status, "403", "a forged post without tokens to act with");
    }

    pub async fn close(self) {
        self.browser.close().await;
    }
}
