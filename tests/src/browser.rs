//! A real browser for tests: headless Chromium (Debian's `chromium`)
//! driven over WebDriver by chromedriver (`chromium-driver`) through
//! fantoccini, and axe-core to check the accessibility of what it shows.
//!
//! Each [`Browser`] runs a chromedriver of its own on a loopback port, with
//! a fresh profile. Dropping it ends chromedriver's whole process group,
//! and so every Chromium process, even when a test panics half-way.
//!
//! Pages may load only from this machine: host names other than
//! `localhost` do not resolve, and every connection that is not to
//! loopback goes to a proxy that is not there. So a test page cannot reach
//! out, and neither can Chromium's own background services.
//!
//! [`Browser::axe`] injects axe-core through WebDriver, which a page's
//! Content-Security-Policy does not govern: pages under a strict policy
//! (no `unsafe-inline`, no `unsafe-eval`) are checked as they are served.
//! The script is read from the file the environment variable
//! `PROXYFLEET_AXE` names; the README's test command provides the pinned
//! release and sets it.

use std::fs::File;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::ports::free_port;

/// Where Debian's chromium-driver installs chromedriver.
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// Where Debian's chromium installs the browser.
const CHROMIUM: &str = "/usr/bin/chromium";
/// The variable naming axe-core's `axe.min.js`.
pub const AXE_ENV: &str = "PROXYFLEET_AXE";

/// The window a session starts with: a desktop layout.
const WIDTH: u32 = 1280;
const HEIGHT: u32 = 900;

/// How long chromedriver may take to listen, and Chromium to come up.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How long [`Browser::click`] and [`Browser::type_into`] look for an
/// element they can act on.
pub const ELEMENT_PATIENCE: Duration = Duration::from_secs(10);

/// Headless Chromium under a chromedriver of its own.
#[derive(Debug)]
pub struct Browser {
    client: Client,
    // Dropped before `_dir`: nothing writes to the profile while it goes.
    driver: Driver,
    /// The profile and chromedriver's output.
    _dir: tempfile::TempDir,
}

/// One rule axe-core found broken, with the elements that break it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct AxeViolation {
    /// The rule, e.g. `image-alt`.
    pub id: String,
    /// `minor`, `moderate`, `serious` or `critical`.
    pub impact: Option<String>,
    /// What the rule asks for, in a sentence.
    pub help: String,
    /// A CSS selector of each offending element; for an element inside
    /// frames or shadow roots, the selectors from the top joined by ` >>> `.
    pub nodes: Vec<String>,
}

impl AxeViolation {
    /// Impact `serious` or `critical`: what a page must not have.
    pub fn is_serious(&self) -> bool {
        matches!(self.impact.as_deref(), Some("serious" | "critical"))
    }
}

/// The violations of impact `serious` or `critical`.
pub fn serious(violations: &[AxeViolation]) -> Vec<&AxeViolation> {
    violations.iter().filter(|violation| violation.is_serious()).collect()
}

impl Browser {
    /// Starts chromedriver and opens a session with headless Chromium,
    /// which reaches loopback only.
    ///
    /// # Panics
    /// When chromedriver or Chromium is not installed or does not come up.
    pub async fn start() -> Self {
        Self::start_reaching(&[]).await
    }

    /// As [`Browser::start`], reaching `addresses` too: addresses on
    /// networks the test made (a test cluster's Service, a node's bridge).
    ///
    /// # Panics
    /// As [`Browser::start`].
    pub async fn start_reaching(addresses: &[std::net::IpAddr]) -> Self {
        assert!(
            Path::new(CHROMEDRIVER).is_file() && Path::new(CHROMIUM).is_file(),
            "{CHROMEDRIVER} or {CHROMIUM} is missing: `apt-get install chromium chromium-driver` \
             (the README's test command installs them)"
        );
        let dir = tempfile::tempdir().expect("temp dir");
        let port = free_port();
        let mut driver = Driver::spawn(port, dir.path().join("chromedriver.log"));
        driver.wait_listening(port).await;
        let client = ClientBuilder::new(HttpConnector::new())
            .capabilities(capabilities(&dir.path().join("profile"), addresses))
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
            .unwrap_or_else(|e| {
                panic!("no Chromium session: {e}\nchromedriver's output:\n{}", driver.log())
            });
        Self { client, driver, _dir: dir }
    }

    /// What chromedriver (and Chromium, whose output it passes on) printed.
    pub fn driver_log(&self) -> String {
        self.driver.log()
    }

    /// The WebDriver session, for everything this type does not wrap.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Opens `url` and waits for it to load.
    ///
    /// # Panics
    /// When the page does not load.
    pub async fn goto(&self, url: &str) {
        self.client.goto(url).await.unwrap_or_else(|e| panic!("opening {url}: {e}"));
    }

    /// Makes the page's layout viewport `px` CSS pixels wide (390 for a
    /// phone), keeping the window's height.
    ///
    /// # Panics
    /// When the window cannot be resized to that width.
    pub async fn set_width(&self, px: u32) {
        let (_, height) = self.client.get_window_size().await.expect("window size");
        let height = u32::try_from(height).expect("window height fits u32");
        self.client.set_window_size(px, height).await.expect("resize the window");
        // The window may be wider than the viewport by its frame.
        let inner = self.inner_width().await;
        if inner != px {
            let outer = (2 * px).saturating_sub(inner);
            self.client.set_window_size(outer, height).await.expect("resize the window");
        }
        let inner = self.inner_width().await;
        assert_eq!(inner, px, "the viewport is {inner} px wide, not {px}");
    }

    async fn inner_width(&self) -> u32 {
        let width = self.execute("return window.innerWidth;").await;
        width.as_u64().and_then(|w| u32::try_from(w).ok()).expect("innerWidth is a number")
    }

    /// Writes a PNG of the viewport to `path`.
    ///
    /// # Panics
    /// When the screenshot cannot be taken or written.
    pub async fn screenshot(&self, path: &Path) {
        let png = self.client.screenshot().await.expect("screenshot");
        std::fs::write(path, png).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    }

    /// Runs `script` in the page and returns what it returns.
    ///
    /// # Panics
    /// When the script throws.
    pub async fn execute(&self, script: &str) -> Value {
        self.client.execute(script, Vec::new()).await.unwrap_or_else(|e| panic!("script: {e}"))
    }

    /// The text of the first element matching `css`, once `done` accepts
    /// it.
    ///
    /// # Panics
    /// When no element matches, or `done` rejects its text for `timeout`.
    pub async fn wait_for_text(
        &self,
        css: &str,
        done: impl Fn(&str) -> bool,
        timeout: Duration,
    ) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let text = match self.client.find(Locator::Css(css)).await {
                Ok(element) => element.text().await.ok(),
                Err(_) => None,
            };
            if let Some(text) = text.as_deref().filter(|text| done(text)) {
                return text.to_owned();
            }
            assert!(
                Instant::now() < deadline,
                "{css} did not get the expected text within {timeout:?}; it has {text:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Clicks the first element matching `css`.
    ///
    /// # Panics
    /// When no element matches or it cannot be clicked within
    /// [`ELEMENT_PATIENCE`].
    pub async fn click(&self, css: &str) {
        self.on_element(css, "clicking", |element| async move { element.click().await.map(drop) })
            .await;
    }

    /// Types `text` into the element `css` names, as a person would: a
    /// click to focus it first (the console's live updates leave a page
    /// alone while a field has the focus), then the keys.
    ///
    /// # Panics
    /// When there is no such element within [`ELEMENT_PATIENCE`].
    pub async fn type_into(&self, css: &str, text: &str) {
        self.on_element(css, "typing into", |element| async move {
            element.click().await?;
            element.send_keys(text).await
        })
        .await;
    }

    /// Finds `css` and does `act` on it, again on a fresh find when the
    /// page replaced the element in between (the console's live updates
    /// swap the page's main part when the fleet changes).
    async fn on_element<F, Fut>(&self, css: &str, doing: &str, act: F)
    where
        F: Fn(fantoccini::elements::Element) -> Fut,
        Fut: std::future::Future<Output = Result<(), fantoccini::error::CmdError>>,
    {
        let deadline = Instant::now() + ELEMENT_PATIENCE;
        loop {
            let outcome = match self.client.find(Locator::Css(css)).await {
                Ok(element) => act(element).await,
                Err(err) => Err(err),
            };
            match outcome {
                Ok(()) => return,
                Err(err) if Instant::now() >= deadline => panic!("{doing} {css}: {err}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    /// Runs axe-core over the current page and returns every violation.
    ///
    /// # Panics
    /// When axe-core is not provided (see the module's docs) or fails.
    pub async fn axe(&self) -> Vec<AxeViolation> {
        let loaded = self.execute("return typeof window.axe?.run === 'function';").await;
        if loaded != Value::Bool(true) {
            self.execute(axe_source()).await;
        }
        let outcome = self
            .client
            .execute_async(RUN_AXE, Vec::new())
            .await
            .unwrap_or_else(|e| panic!("running axe-core: {e}"));
        if let Some(error) = outcome.get("error") {
            panic!("axe-core failed: {error}");
        }
        serde_json::from_value(outcome["violations"].clone())
            .unwrap_or_else(|e| panic!("axe-core's answer {outcome}: {e}"))
    }

    /// Ends the session (Chromium closes and chromedriver removes what it
    /// made), then chromedriver. Dropping does the same more abruptly.
    pub async fn close(self) {
        let _ = self.client.clone().close().await;
    }
}

/// chromedriver, in a process group of its own that Chromium joins.
#[derive(Debug)]
struct Driver {
    child: Child,
    log: PathBuf,
}

impl Driver {
    fn spawn(port: u16, log: PathBuf) -> Self {
        let output = File::create(&log).expect("chromedriver log");
        let mut command = Command::new(CHROMEDRIVER);
        command
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(output.try_clone().expect("log handle"))
            .stderr(output);
        // Drop reaches the browser's processes through the group.
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let child = command.spawn().unwrap_or_else(|e| panic!("starting {CHROMEDRIVER}: {e}"));
        Self { child, log }
    }

    async fn wait_listening(&mut self, port: u16) {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("chromedriver exited ({status}):\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "chromedriver did not listen on port {port} within {START_TIMEOUT:?}:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let group = rustix::process::Pid::from_child(&self.child);
        let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        let _ = self.child.wait();
    }
}

/// The capabilities of a session: headless Chromium that reaches loopback
/// only, with a profile in `profile`.
fn capabilities(profile: &Path, reaching: &[std::net::IpAddr]) -> fantoccini::wd::Capabilities {
    let reaching: Vec<String> = reaching
        .iter()
        .map(|ip| match ip {
            std::net::IpAddr::V4(ip) => ip.to_string(),
            std::net::IpAddr::V6(ip) => format!("[{ip}]"),
        })
        .collect();
    // The resolver's rules apply to address literals too: the addresses
    // the test reaches are exempt from them, as loopback is.
    let rules: Vec<String> = ["MAP * ~NOTFOUND", "EXCLUDE localhost", "EXCLUDE 127.0.0.1"]
        .into_iter()
        .map(str::to_owned)
        .chain(reaching.iter().map(|ip| format!("EXCLUDE {ip}")))
        .collect();
    let mut args = vec![
        "--headless=new".to_owned(),
        // Tests run as root, where Chromium's sandbox cannot start.
        "--no-sandbox".to_owned(),
        "--disable-gpu".to_owned(),
        // /dev/shm is small in containers; Chromium then crashes on big pages.
        "--disable-dev-shm-usage".to_owned(),
        format!("--window-size={WIDTH},{HEIGHT}"),
        format!("--user-data-dir={}", profile.display()),
        format!("--host-resolver-rules={}", rules.join(", ")),
        // Nothing leaves the machine: names other than localhost do not
        // resolve, and connections to anything but loopback (which
        // Chromium never proxies) go to a closed port.
        "--proxy-server=http://127.0.0.1:9".to_owned(),
        "--disable-background-networking".to_owned(),
        "--disable-component-update".to_owned(),
        "--no-first-run".to_owned(),
    ];
    if !reaching.is_empty() {
        // Connections to these go direct instead of to the closed port.
        args.push(format!("--proxy-bypass-list={}", reaching.join(";")));
    }
    let capabilities = json!({
        "browserName": "chrome",
        "goog:chromeOptions": { "binary": CHROMIUM, "args": args },
        // axe-core takes seconds on a large page.
        "timeouts": { "script": 60_000 },
    });
    match capabilities {
        Value::Object(map) => map,
        _ => unreachable!("a JSON object literal"),
    }
}

/// axe-core's source, read once per test process.
fn axe_source() -> &'static str {
    static SOURCE: OnceLock<String> = OnceLock::new();
    SOURCE.get_or_init(|| {
        let path = std::env::var_os(AXE_ENV).map(PathBuf::from).unwrap_or_else(|| {
            panic!(
                "{AXE_ENV} is not set: the README's test command provides axe-core and sets it; \
                 alone, set it to axe.min.js in ~/.cache/proxyfleet/tools/axe-core-<version>/"
            )
        });
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
    })
}

/// Runs axe-core over the document and hands back only what
/// [`AxeViolation`] holds, so a large page's results stay small.
const RUN_AXE: &str = r"
const done = arguments[arguments.length - 1];
const selector = (target) =>
  target.map((part) => (Array.isArray(part) ? part.join(' >>> ') : part)).join(' >>> ');
window.axe
  .run(document, { resultTypes: ['violations'] })
  .then((results) =>
    done({
      violations: results.violations.map((violation) => ({
        id: violation.id,
        impact: violation.impact ?? null,
        help: violation.help,
        nodes: violation.nodes.map((node) => selector(node.target)),
      })),
    }),
  )
  .catch((error) => done({ error: String(error && error.stack ? error.stack : error) }));
";
