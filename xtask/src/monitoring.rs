//! The monitoring kit: the alerts (`files/prometheus-rules.yaml`) and the
//! Grafana dashboard (`files/grafana-dashboard.json`) live in the chart,
//! which ships them as a PrometheusRule and a ConfigMap; `deploy/monitoring/`
//! holds copies for Prometheus and Grafana installations without the chart.
//!
//! - [`sync`]: writes the copies (or, checking, reports them stale);
//! - [`check`]: Debian's `promtool` checks the rules, runs their unit tests
//!   (`deploy/monitoring/proxyfleet-rules.test.yaml`) and parses every query
//!   of the dashboard (as recording rules, with Grafana's variables filled
//!   in). That each metric a query names is one the operator exports is the
//!   operator's own test (`standalone_metrics` in its test binary), which
//!   scrapes a running one.

use std::collections::BTreeSet;
use std::fs;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;

use crate::apt::{self, Need};
use crate::{Repo, process};

/// Each copy: the chart's file and the copy's name in `deploy/monitoring/`.
const COPIES: [(&str, &str); 2] = [
    ("files/prometheus-rules.yaml", "proxyfleet-rules.yaml"),
    ("files/grafana-dashboard.json", "proxyfleet-dashboard.json"),
];

fn chart(repo: &Repo) -> PathBuf {
    repo.root.join("deploy/helm/proxyfleet")
}

fn out_dir(repo: &Repo) -> PathBuf {
    repo.root.join("deploy/monitoring")
}

/// Copies the chart's rules and dashboard to `deploy/monitoring/`; with
/// `check`, fails when a copy differs instead.
pub fn sync(repo: &Repo, check: bool) -> Result<()> {
    let mut stale = Vec::new();
    for (source, copy) in COPIES {
        let text = fs::read_to_string(chart(repo).join(source))
            .with_context(|| format!("reading the chart's {source}"))?;
        let path = out_dir(repo).join(copy);
        if fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
            stale.push(format!("deploy/monitoring/{copy}"));
            if !check {
                fs::write(&path, &text).with_context(|| format!("writing {}", path.display()))?;
                eprintln!("xtask render: wrote deploy/monitoring/{copy}");
            }
        }
    }
    ensure!(
        !check || stale.is_empty(),
        "the monitoring copies differ from the chart's files (run `cargo xtask render`): {}",
        stale.join(", ")
    );
    Ok(())
}

/// `promtool` on the rules, their tests and the dashboard's queries.
pub fn check(repo: &Repo) -> Result<()> {
    apt::ensure(&[Need::any("prometheus")])?;
    let dir = out_dir(repo);
    process::run(
        Command::new("promtool")
            .args(["check", "rules", "proxyfleet-rules.yaml"])
            .current_dir(&dir),
    )?;
    process::run(
        Command::new("promtool")
            .args(["test", "rules", "proxyfleet-rules.test.yaml"])
            .current_dir(&dir),
    )?;
    let dashboard: Value = serde_json::from_str(
        &fs::read_to_string(dir.join("proxyfleet-dashboard.json"))
            .context("reading the dashboard")?,
    )
    .context("the dashboard is not JSON")?;
    let queries = dashboard_queries(&dashboard)?;
    let rules = recording_rules(&queries);
    let scratch =
        std::env::temp_dir().join(format!("proxyfleet-dashboard-{}.yaml", std::process::id()));
    fs::write(&scratch, rules).context("writing the dashboard's queries as rules")?;
    let checked = process::run(Command::new("promtool").args(["check", "rules"]).arg(&scratch));
    let _ = fs::remove_file(&scratch);
    checked.context(
        "a dashboard query does not parse (the rule's number is its order in the dashboard)",
    )?;
    eprintln!(
        "xtask render: the alerts pass their tests; the dashboard's {} queries parse",
        queries.len()
    );
    Ok(())
}

/// Every query of the dashboard's panels (rows' panels too), in order,
/// after checking the panels' ids are unique.
fn dashboard_queries(dashboard: &Value) -> Result<Vec<String>> {
    let mut queries = Vec::new();
    let mut ids = BTreeSet::new();
    let mut stack: Vec<&Value> =
        dashboard["panels"].as_array().into_iter().flatten().rev().collect();
    while let Some(panel) = stack.pop() {
        let title = panel["title"].as_str().unwrap_or("(untitled)");
        if let Some(id) = panel["id"].as_u64()
            && !ids.insert(id)
        {
            bail!("the dashboard's panel id {id} ({title}) is used twice");
        }
        for target in panel["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = target["expr"].as_str() {
                queries.push(expr.to_owned());
            }
        }
        stack.extend(panel["panels"].as_array().into_iter().flatten().rev());
    }
    ensure!(!queries.is_empty(), "the dashboard has no queries");
    Ok(queries)
}

/// `queries` as a rule file of recording rules, with Grafana's variables
/// replaced by values PromQL accepts.
fn recording_rules(queries: &[String]) -> String {
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (n, query) in queries.iter().enumerate() {
        let filled = fill_variables(query);
        rules.push_str(&format!(
            "      - record: dashboard:query_{n}\n        expr: {}\n",
            serde_json::to_string(&filled).unwrap_or_default()
        ));
    }
    rules
}

fn fill_variables(query: &str) -> String {
    [
        ("${__rate_interval}", "5m"),
        ("$__rate_interval", "5m"),
        ("${__interval}", "1m"),
        ("$__interval", "1m"),
        ("${__range}", "6h"),
        ("$__range", "6h"),
    ]
    .iter()
    .fold(query.to_owned(), |text, (variable, value)| text.replace(variable, value))
    // The dashboard's own variables stand in label matchers' regexes.
    .replace("${job}", ".*")
    .replace("$job", ".*")
    .replace("${pool}", ".*")
    .replace("$pool", ".*")
    .replace("${entry}", ".*")
    .replace("$entry", ".*")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grafana_variables_are_filled_in() {
        let query = r#"sum by (le) (rate(proxyfleet_gateway_added_seconds_bucket{job=~"$job",pool=~"$pool"}[$__rate_interval]))"#;
        assert_eq!(
            fill_variables(query),
            r#"sum by (le) (rate(proxyfleet_gateway_added_seconds_bucket{job=~".*",pool=~".*"}[5m]))"#
        );
    }

    #[test]
    fn a_panel_id_used_twice_is_refused() {
        let dashboard = serde_json::json!({ "panels": [
            { "id": 1, "title": "a", "targets": [{ "expr": "up" }] },
            { "id": 2, "title": "row", "panels": [{ "id": 1, "title": "b" }] },
        ]});
        let err = dashboard_queries(&dashboard).unwrap_err().to_string();
        assert!(err.contains("panel id 1 (b)"), "{err}");
    }

    #[test]
    fn the_shipped_dashboard_has_queries() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../deploy/helm/proxyfleet/files/grafana-dashboard.json");
        let dashboard: Value = serde_json::from_str(&fs::read_to_string(path).unwrap()).unwrap();
        assert!(dashboard_queries(&dashboard).unwrap().len() > 20);
    }
}
