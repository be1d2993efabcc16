//! The Helm chart `deploy/helm/proxyfleet` is the one source of the
//! Kubernetes manifests; `deploy/kubernetes/` holds what it renders for
//! `kubectl apply` users and for the tests that bind the shipped RBAC.
//!
//! - `cargo xtask render`: renders them again after a chart change;
//! - `cargo xtask render --check` (part of `cargo xtask test`): lints the
//!   chart strictly and fails when a rendered file is stale.

use std::fs;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, ensure};

use crate::{Repo, helm, process};

const RELEASE: &str = "proxyfleet";
const NAMESPACE: &str = "proxyfleet-system";
/// The namespace the rendered kubernetes-plugin Role is written for.
const PROXY_NAMESPACE: &str = "proxyfleet-proxies";

fn header(what: &str) -> String {
    format!(
        "# {what}\n# Rendered from the chart deploy/helm/proxyfleet by `cargo xtask render`\n\
         # (release `{RELEASE}` in `{NAMESPACE}`); change the chart, not this file.\n"
    )
}

/// Each rendered file: its path, a line on what it is, and the
/// `helm template` arguments that make it (`None`: the chart's CRDs).
fn outputs() -> Vec<(&'static str, &'static str, Option<Vec<String>>)> {
    vec![
        ("crds.yaml", "The CustomResourceDefinitions (`proxyfleet crd` prints the same).", None),
        (
            "rbac.yaml",
            "The operator's ServiceAccount and what it may do, and no more.",
            Some(vec![
                "--show-only".into(),
                "templates/serviceaccount.yaml".into(),
                "--show-only".into(),
                "templates/rbac.yaml".into(),
            ]),
        ),
        (
            "plugin-kubernetes-rbac.yaml",
            "What an entry of the kubernetes provider needs in the namespace of its proxy pods \
             (here proxyfleet-proxies; the chart's kubernetesPlugin.namespaces makes one per namespace).",
            Some(vec![
                "--set".into(),
                format!("kubernetesPlugin.namespaces={{{PROXY_NAMESPACE}}}"),
                "--show-only".into(),
                "templates/plugin-kubernetes-rbac.yaml".into(),
            ]),
        ),
        (
            "console-ingress.yaml",
            "An Ingress for the web console only (the chart's console.ingress; here for any host, \
             without TLS).",
            Some(vec![
                "--set".into(),
                "console.ingress.enabled=true".into(),
                "--show-only".into(),
                "templates/ingress-console.yaml".into(),
            ]),
        ),
        (
            "proxyfleet.yaml",
            "The whole install with the chart's default values (apply crds.yaml first).",
            Some(Vec::new()),
        ),
    ]
}

fn chart(repo: &Repo) -> PathBuf {
    repo.root.join("deploy/helm/proxyfleet")
}

pub fn render(repo: &Repo, check: bool) -> Result<()> {
    let helm = helm::provide()?;
    if check {
        process::run(Command::new(&helm).args(["lint", "--strict"]).arg(chart(repo)))?;
    }
    let out_dir = repo.root.join("deploy/kubernetes");
    let mut stale = Vec::new();
    for (file, what, args) in outputs() {
        let body = match args {
            None => fs::read_to_string(chart(repo).join("crds/proxyfleet.io.yaml"))
                .context("reading the chart's CRDs")?,
            Some(args) => {
                let mut template = Command::new(&helm);
                template
                    .args(["template", RELEASE])
                    .arg(chart(repo))
                    .args(["--namespace", NAMESPACE])
                    .args(args);
                process::output(&mut template)
                    .with_context(|| format!("rendering {file}: `{}`", process::show(&template)))?
            }
        };
        let rendered = format!("{}{}", header(what), body.trim_start_matches('\n'));
        let path = out_dir.join(file);
        if fs::read_to_string(&path).ok().as_deref() != Some(rendered.as_str()) {
            stale.push(format!("deploy/kubernetes/{file}"));
            if !check {
                fs::write(&path, &rendered)
                    .with_context(|| format!("writing {}", path.display()))?;
            }
        }
    }
    if check {
        ensure!(
            stale.is_empty(),
            "rendered manifests differ from the chart (run `cargo xtask render`): {}",
            stale.join(", ")
        );
        eprintln!("xtask render: deploy/kubernetes matches the chart");
    } else {
        for file in &stale {
            eprintln!("xtask render: wrote {file}");
        }
    }
    Ok(())
}
