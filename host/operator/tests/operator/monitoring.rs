//! The monitoring kit against a running operator: every metric the alerts
//! and the Grafana dashboard name is one `proxyfleet standalone` exports,
//! and Debian's Prometheus, scraping it on loopback, evaluates every alert
//! rule and every dashboard query without an error.

use std::collections::BTreeSet;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use proxyfleet_tests::operator::{Site, proxy_manifest};
use proxyfleet_tests::ports::free_port;
use proxyfleet_tests::wait_for;
use serde_json::Value;

fn chart_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/helm/proxyfleet/files").join(name)
}

fn scrape(port: u16) -> Option<String> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    response.starts_with("HTTP/1.1 200").then_some(response)
}

/// The names a query may use for what `text` (the OpenMetrics exposition)
/// holds: every sample's name, and for each family, even one without
/// samples yet, the names its type gives its samples.
fn exported_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        if let Some(declared) = line.strip_prefix("# TYPE ") {
            let mut words = declared.split_whitespace();
            let (Some(name), Some(kind)) = (words.next(), words.next()) else { continue };
            let suffixes: &[&str] = match kind {
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_sum", "_count"],
                "info" => &["_info"],
                _ => &[""],
            };
            names.extend(suffixes.iter().map(|suffix| format!("{name}{suffix}")));
        } else if !line.starts_with('#') {
            let name = line.split(['{', ' ']).next().unwrap_or_default();
            if !name.is_empty() {
                names.insert(name.to_owned());
            }
        }
    }
    names
}

/// The `proxyfleet_*` and `process_*` names in a PromQL expression.
fn metric_names(expr: &str) -> BTreeSet<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|word| word.starts_with("proxyfleet_") || word.starts_with("process_"))
        .map(str::to_owned)
        .collect()
}

/// The alert rules' expressions, by alert name.
fn alert_exprs() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(chart_file("prometheus-rules.yaml")).unwrap();
    let mut alerts = Vec::new();
    let mut current: Option<String> = None;
    let mut lines = text.lines().peekable();
    // The file's own shape: `- alert: Name`, then `expr:` on one line or
    // folded (`>-`) over the more-indented lines after it.
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if let Some(name) = trimmed.strip_prefix("- alert: ") {
            current = Some(name.trim().to_owned());
        } else if let Some(expr) = trimmed.strip_prefix("expr: ") {
            let indent = line.len() - trimmed.len();
            let mut expr = expr.trim().to_owned();
            if expr == ">-" {
                let mut folded = Vec::new();
                while let Some(next) = lines.peek() {
                    if next.len() - next.trim_start().len() <= indent {
                        break;
                    }
                    folded.push(next.trim().to_owned());
                    lines.next();
                }
                expr = folded.join(" ");
            }
            alerts.push((current.clone().expect("an expr follows its alert"), expr));
        }
    }
    assert!(alerts.len() >= 8, "the rule file's alerts: {alerts:?}");
    alerts
}

/// Every query of the dashboard, with its panel's title.
fn dashboard_queries() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(chart_file("grafana-dashboard.json")).unwrap();
    let dashboard: Value = serde_json::from_str(&text).unwrap();
    let mut queries = Vec::new();
    let mut stack: Vec<&Value> = dashboard["panels"].as_array().unwrap().iter().collect();
    while let Some(panel) = stack.pop() {
        let title = panel["title"].as_str().unwrap_or_default().to_owned();
        for target in panel["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = target["expr"].as_str() {
                queries.push((title.clone(), expr.to_owned()));
            }
        }
        stack.extend(panel["panels"].as_array().into_iter().flatten());
    }
    assert!(queries.len() > 20, "{queries:?}");
    queries
}

/// A dashboard query as Prometheus takes it: Grafana's variables filled
/// with what "All" and the default interval would give.
fn filled(query: &str) -> String {
    query
        .replace("$__rate_interval", "1m")
        .replace("$__interval", "15s")
        .replace("$__range", "6h")
        .replace("$job", ".*")
        .replace("$pool", ".*")
        .replace("$entry", ".*")
}

/// A standalone operator with a Proxy, a pool and an open gateway, which
/// has refused one request: every family the kit names has a series.
async fn standalone(site: &Site, metrics_port: u16) -> proxyfleet_tests::operator::Running {
    let gateway = free_port();
    let running = site.standalone(
        Path::new(env!("CARGO_BIN_EXE_proxyfleet")),
        &[
            "--metrics-addr",
            &format!("127.0.0.1:{metrics_port}"),
            "--api-addr",
            "127.0.0.1:0",
            "--gateway-addr",
            &format!("127.0.0.1:{gateway}"),
            "--gateway-open",
        ],
    );
    let refused = wait_for(Duration::from_secs(30), || async {
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", gateway)).ok()?;
        // A cloud metadata address: refused before any proxy is chosen.
        let request = "GET http://169.254.169.254/ HTTP/1.1\r\nHost: 169.254.169.254\r\nConnection: close\r\n\r\n";
        stream.write_all(request.as_bytes()).ok()?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).ok()?;
        answer.starts_with("HTTP/1.1 403").then_some(())
    })
    .await;
    assert!(refused.is_some(), "the gateway refuses the metadata address; log:\n{}", site.log(50));
    running
}

fn static_site() -> Site {
    let pool = "apiVersion: proxyfleet.io/v1alpha1\nkind: ProxyPool\nmetadata: { name: web }\n\
                spec: { replicas: 2, template: { spec: { provider: local } } }\n";
    Site::new(
        "providers:\n  - { name: local, plugin: static, config: { endpoints: ['127.0.0.1:18001', '127.0.0.1:18002', '127.0.0.1:18003'] }, proxyAddresses: ['127.0.0.0/8'] }\n",
        &[("static", "static")],
        &format!("{}{pool}", proxy_manifest("a", "local")),
    )
}

#[tokio::test]
async fn every_metric_the_alerts_and_the_dashboard_name_is_exported() {
    let site = static_site();
    let port = free_port();
    let _operator = standalone(&site, port).await;
    // The pool's counts come with its first plan; the entry's counters
    // with its first check.
    let text = wait_for(Duration::from_secs(60), || async {
        scrape(port).filter(|text| {
            text.contains("proxyfleet_pool_replicas{")
                && text.contains("proxyfleet_plugin_faults_total{")
        })
    })
    .await
    .unwrap_or_else(|| panic!("no scrape; log:\n{}", site.log(50)));
    let exported = exported_names(&text);
    let mut missing = Vec::new();
    let named = alert_exprs().into_iter().chain(dashboard_queries());
    for (what, expr) in named {
        for name in metric_names(&expr) {
            if !exported.contains(&name) {
                missing.push(format!("{name} (in {what}: {expr})"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "named but not exported:\n{}\nexported: {exported:?}",
        missing.join("\n")
    );
}

/// Debian's Prometheus on loopback, scraping `target` every second with
/// the alert rules loaded.
struct Prometheus {
    child: Child,
    base: String,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    fn start(target: u16) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config = format!(
            "global: {{ scrape_interval: 1s, evaluation_interval: 1s }}\n\
             rule_files: [{rules:?}]\n\
             scrape_configs:\n  - job_name: proxyfleet\n    static_configs: [{{ targets: ['127.0.0.1:{target}'] }}]\n",
            rules = chart_file("prometheus-rules.yaml").display().to_string(),
        );
        std::fs::write(dir.path().join("prometheus.yml"), config).unwrap();
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", dir.path().join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("Debian's prometheus (the test command installs the package)");
        Self { child, base: format!("http://127.0.0.1:{port}"), _dir: dir }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("prometheus.log")).unwrap_or_default()
    }

    async fn api(&self, path: &str, query: &[(&str, &str)]) -> Option<Value> {
        let answer = reqwest::Client::new()
            .get(format!("{}{path}", self.base))
            .query(query)
            .send()
            .await
            .ok()?;
        serde_json::from_slice(&answer.bytes().await.ok()?).ok()
    }
}

/// Prometheus scrapes the operator, loads every alert rule and evaluates it
/// with no error, and answers every dashboard query with no error; the
/// overview's version and leader panels find their series.
#[tokio::test]
async fn prometheus_scrapes_the_operator_and_evaluates_the_alerts_and_the_dashboard() {
    let site = static_site();
    let port = free_port();
    let _operator = standalone(&site, port).await;
    wait_for(Duration::from_secs(30), || async { scrape(port) })
        .await
        .unwrap_or_else(|| panic!("no scrape; log:\n{}", site.log(50)));
    let prometheus = Prometheus::start(port);
    // The target is up, and every rule has been evaluated at least once
    // (its health leaves "unknown").
    let rules = wait_for(Duration::from_secs(60), || async {
        let targets = prometheus.api("/api/v1/targets", &[]).await?;
        let up = targets["data"]["activeTargets"]
            .as_array()?
            .iter()
            .any(|t| t["health"] == "up" && t["labels"]["job"] == "proxyfleet");
        let rules = prometheus.api("/api/v1/rules", &[]).await?;
        let all: Vec<Value> = rules["data"]["groups"]
            .as_array()?
            .iter()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .collect();
        (up && !all.is_empty() && all.iter().all(|r| r["health"] != "unknown")).then_some(all)
    })
    .await
    .unwrap_or_else(|| {
        panic!("Prometheus never scraped and evaluated; its log:\n{}", prometheus.log())
    });
    assert_eq!(rules.len(), alert_exprs().len(), "{rules:?}");
    for rule in &rules {
        assert_eq!(rule["health"], "ok", "the rule {} fails to evaluate: {rule}", rule["name"]);
    }
    for (title, query) in dashboard_queries() {
        let answer = prometheus.api("/api/v1/query", &[("query", &filled(&query))]).await;
        let answer = answer.unwrap_or_else(|| panic!("no answer to {query}"));
        assert_eq!(answer["status"], "success", "the panel {title:?} query {query}: {answer}");
    }
    let version =
        prometheus.api("/api/v1/query", &[("query", "proxyfleet_build_info")]).await.unwrap();
    assert_eq!(
        version["data"]["result"][0]["metric"]["version"],
        env!("CARGO_PKG_VERSION"),
        "{version}"
    );
    let leader =
        prometheus.api("/api/v1/query", &[("query", "proxyfleet_leader == 1")]).await.unwrap();
    assert_eq!(leader["data"]["result"].as_array().map(Vec::len), Some(1), "{leader}");
    // The standalone process leads: the no-leader alert, pending while
    // nothing was scraped yet, clears.
    let quiet = wait_for(Duration::from_secs(30), || async {
        let firing = prometheus
            .api("/api/v1/query", &[("query", "ALERTS{alertname=\"ProxyfleetNoLeader\"}")])
            .await?;
        (firing["data"]["result"].as_array()?.is_empty()).then_some(())
    })
    .await;
    assert!(quiet.is_some(), "ProxyfleetNoLeader stays pending with a leader scraped");
}
