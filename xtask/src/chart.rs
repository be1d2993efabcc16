//! The Helm chart `deploy/helm/proxyfleet` is the one source of the
//! Kubernetes manifests; `deploy/kubernetes/` holds what it renders for
//! `kubectl apply` users and for the tests that bind the shipped RBAC.
//!
//! - `cargo xtask render`: renders them again after a chart change;
//! - `cargo xtask render --check` (part of `cargo xtask test`): lints the
//!   chart strictly and fails when a rendered file is stale; the alerts and
//!   the dashboard are checked too ([`crate::monitoring`]), and the
//!   discovery API's page ([`crate::api_doc`]).

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
            "The whole install with the chart's default values but the CRDs (apply crds.yaml \
             first, server-side).",
            // The CRDs apart: applied server-side on their own, with no
            // last-applied copy of their schemas in an annotation.
            Some(vec!["--set".into(), "crds.enabled=false".into()]),
        ),
    ]
}

/// One way of installing the chart: the values set, and what the rendered
/// manifests must hold (`Ok`) or how `helm template` must refuse (`Err`).
struct Case {
    what: &'static str,
    /// `helm template --kube-version`; `None`: Helm's default (current).
    kube: Option<&'static str>,
    set: &'static [&'static str],
    expect: std::result::Result<&'static [(&'static str, bool)], &'static str>,
}

/// What the knobs do, checked on `helm template` output: each case's
/// texts present (`true`) or absent (`false`), or its refusal.
const CASES: &[Case] = &[
    Case {
        what: "defaults: two replicas, a budget, spread over nodes",
        kube: None,
        set: &[],
        expect: Ok(&[
            ("kind: PodDisruptionBudget", true),
            ("podAntiAffinity:", true),
            ("topologyKey: kubernetes.io/hostname", true),
            ("\nkind: ServiceAccount\n", true),
            ("sizeLimit: 1Gi", true),
            ("type: ClusterIP", true),
            // The CRDs are the release's, so `helm upgrade` updates them,
            // and `helm uninstall` leaves them (and so every Proxy).
            ("\nkind: CustomResourceDefinition\n", true),
            ("helm.sh/resource-policy: keep", true),
            ("    app.kubernetes.io/part-of: proxyfleet\n", true),
            ("    helm.sh/chart: proxyfleet-", true),
        ]),
    },
    Case {
        what: "CRDs for a server before 1.25, which refuses CEL rules",
        kube: Some("1.20.2"),
        set: &[],
        expect: Ok(&[
            ("\nkind: CustomResourceDefinition\n", true),
            ("x-kubernetes-validations", false),
            ("x-kubernetes-list-map-keys", true),
        ]),
    },
    Case {
        what: "CRDs for a current server carry their CEL rules",
        kube: Some("1.36.4"),
        set: &[],
        expect: Ok(&[("x-kubernetes-validations", true)]),
    },
    Case {
        what: "CRDs left to the user (another installation has them, or kubectl applies them)",
        kube: None,
        set: &["crds.enabled=false"],
        expect: Ok(&[("kind: CustomResourceDefinition", false)]),
    },
    Case {
        what: "CRDs that go with the release",
        kube: None,
        set: &["crds.keep=false", "commonLabels.team=crawl"],
        expect: Ok(&[
            ("\nkind: CustomResourceDefinition\n", true),
            ("helm.sh/resource-policy", false),
            ("    team: crawl\n", true),
        ]),
    },
    Case {
        what: "one replica: no budget, which would block every node drain",
        kube: None,
        set: &["replicaCount=1"],
        expect: Ok(&[("kind: PodDisruptionBudget", false)]),
    },
    Case {
        what: "a ServiceAccount of the user's, with workload identity on the chart's",
        kube: None,
        set: &["serviceAccount.create=false", "serviceAccount.name=ops-made"],
        expect: Ok(&[
            ("\nkind: ServiceAccount\n", false),
            ("serviceAccountName: ops-made", true),
            ("    name: ops-made\n    namespace: proxyfleet-system", true),
        ]),
    },
    Case {
        what: "serviceAccount.create=false needs a name",
        kube: None,
        set: &["serviceAccount.create=false"],
        expect: Err("name the ServiceAccount to run as in serviceAccount.name"),
    },
    Case {
        what: "names, labels, priority, environment, volumes, service type",
        kube: None,
        set: &[
            "fullnameOverride=fleet",
            "commonLabels.team=crawl",
            "priorityClassName=system-cluster-critical",
            "extraEnv[0].name=HTTPS_PROXY",
            "extraEnv[0].value=http://egress:3128",
            "extraVolumes[0].name=ca",
            "extraVolumes[0].configMap.name=corp-ca",
            "extraVolumeMounts[0].name=ca",
            "extraVolumeMounts[0].mountPath=/etc/corp-ca",
            "service.type=LoadBalancer",
            "cache.sizeLimit=2Gi",
        ],
        expect: Ok(&[
            ("--lease-name=fleet-leader", true),
            ("team: crawl", true),
            ("priorityClassName: system-cluster-critical", true),
            ("- name: HTTPS_PROXY\n              value: http://egress:3128", true),
            ("mountPath: /etc/corp-ca", true),
            ("configMap:\n            name: corp-ca", true),
            ("type: LoadBalancer", true),
            ("sizeLimit: 2Gi", true),
        ]),
    },
    Case {
        what: "an affinity of the user's replaces the default",
        kube: None,
        set: &[
            "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=pool",
        ],
        expect: Ok(&[("podAntiAffinity:", false), ("nodeAffinity:", true)]),
    },
    Case {
        what: "the alerts and the dashboard, with the runbooks where the user serves the docs",
        kube: None,
        set: &[
            "metrics.prometheusRule.enabled=true",
            "metrics.prometheusRule.runbookBaseURL=https://docs.example.test/runbooks.html",
            "metrics.dashboard.enabled=true",
            "metrics.gatewayUpstreams=true",
            "gateway.enabled=true",
            "gateway.open=true",
        ],
        expect: Ok(&[
            ("kind: PrometheusRule", true),
            ("alert: ProxyfleetNoLeader", true),
            (
                "runbook_url: https://docs.example.test/runbooks.html#proxyfleetpoolbelowdesired",
                true,
            ),
            ("github.com", false),
            ("grafana_dashboard: \"1\"", true),
            ("\"uid\": \"proxyfleet\"", true),
            ("--gateway-upstream-metrics", true),
        ]),
    },
    Case {
        what: "no alerts, dashboard or per-upstream series unless asked for",
        kube: None,
        set: &[],
        expect: Ok(&[
            ("kind: PrometheusRule", false),
            ("grafana_dashboard", false),
            ("--gateway-upstream-metrics", false),
            ("- --stall-after=5m", true),
            ("path: /livez", true),
        ]),
    },
    Case {
        what: "a NetworkPolicy: the API from one namespace, the gateway from anywhere, egress \
               to DNS, the API server and a provider",
        kube: None,
        set: &[
            "networkPolicy.enabled=true",
            "networkPolicy.apiFrom[0].namespaceSelector.matchLabels.team=crawl",
            "networkPolicy.apiServer.cidrs={10.0.0.5/32}",
            "networkPolicy.egress[0].to[0].ipBlock.cidr=192.0.2.10/32",
            "networkPolicy.egress[0].ports[0].port=8006",
            "gateway.enabled=true",
            "gateway.open=true",
        ],
        expect: Ok(&[
            ("kind: NetworkPolicy", true),
            ("policyTypes: [Ingress, Egress]", true),
            (
                "- ports:\n        - { port: api, protocol: TCP }\n      from:\n        - namespaceSelector:\n            matchLabels:\n              team: crawl",
                true,
            ),
            ("- ports:\n        - { port: gateway, protocol: TCP }\n    - ports:", true),
            ("- ipBlock: { cidr: \"10.0.0.5/32\" }", true),
            ("- { port: 6443, protocol: TCP }", true),
            ("- { port: 53, protocol: UDP }", true),
            ("cidr: 192.0.2.10/32", true),
            ("port: 8006", true),
        ]),
    },
    Case {
        what: "no NetworkPolicy unless asked for",
        kube: None,
        set: &[],
        expect: Ok(&[("kind: NetworkPolicy", false)]),
    },
    Case {
        what: "a NetworkPolicy needs the API server's addresses",
        kube: None,
        set: &["networkPolicy.enabled=true"],
        expect: Err("networkPolicy.apiServer.cidrs"),
    },
    Case {
        what: "the helm test hook: the API Service's /readyz and proxy list, with a token \
               when the API has tokens",
        kube: None,
        set: &["api.tokens.values={crawler-token}"],
        expect: Ok(&[
            ("helm.sh/hook: test", true),
            ("- --api=http://$(PROXYFLEET_SERVICE_HOST):$(PROXYFLEET_SERVICE_PORT_API)", true),
            ("- --api-token-file=/etc/proxyfleet/api-tokens/tokens", true),
            ("app.kubernetes.io/component: helm-test", true),
        ]),
    },
    Case {
        what: "a misspelt key of a provider entry is refused at helm template, not in a \
               crash-looping pod (the schema is the providers file's own)",
        kube: None,
        set: &[
            "providers.providers[0].name=lab",
            "providers.providers[0].plugin=static",
            "providers.providers[0].limts.timeout=30s",
        ],
        expect: Err("limts"),
    },
    Case {
        what: "a provider entry the operator reads renders",
        kube: None,
        set: &[
            "providers.providers[0].name=lab",
            "providers.providers[0].plugin=static",
            "providers.providers[0].limits.timeout=30s",
            "providers.providers[0].grants.http[0].url=https://pve.example.test:8006",
        ],
        expect: Ok(&[("url: https://pve.example.test:8006", true)]),
    },
    Case {
        what: "a misspelt knob is refused by the schema",
        kube: None,
        set: &["serviceAcount.create=false"],
        expect: Err("serviceAcount"),
    },
];

/// Renders the chart for each of [`CASES`] and checks it.
fn cases(repo: &Repo, helm: &std::path::Path) -> Result<()> {
    for case in CASES {
        let mut template = Command::new(helm);
        template.args(["template", RELEASE]).arg(chart(repo)).args(["--namespace", NAMESPACE]);
        if let Some(version) = case.kube {
            template.args(["--kube-version", version]);
        }
        for set in case.set {
            template.args(["--set", set]);
        }
        let output = template.output().context("running helm template")?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        match case.expect {
            Ok(texts) => {
                ensure!(
                    output.status.success(),
                    "chart case `{}`: helm template failed: {stderr}",
                    case.what
                );
                for (text, present) in texts {
                    ensure!(
                        stdout.contains(text) == *present,
                        "chart case `{}`: {text:?} should{} be in the rendered manifests",
                        case.what,
                        if *present { "" } else { " not" }
                    );
                }
            }
            Err(refusal) => ensure!(
                !output.status.success() && stderr.contains(refusal),
                "chart case `{}`: helm template should refuse naming {refusal:?}; it said: {stderr}",
                case.what
            ),
        }
    }
    eprintln!("xtask render: {} chart cases hold", CASES.len());
    Ok(())
}

fn chart(repo: &Repo) -> PathBuf {
    repo.root.join("deploy/helm/proxyfleet")
}

pub fn render(repo: &Repo, check: bool) -> Result<()> {
    let helm = helm::provide()?;
    if check {
        process::run(Command::new(&helm).args(["lint", "--strict"]).arg(chart(repo)))?;
        cases(repo, &helm)?;
    }
    crate::monitoring::sync(repo, check)?;
    crate::api_doc::sync(repo, check)?;
    if check {
        crate::monitoring::check(repo)?;
    }
    let out_dir = repo.root.join("deploy/kubernetes");
    let mut stale = Vec::new();
    for (file, what, args) in outputs() {
        let body = match args {
            None => fs::read_to_string(chart(repo).join("files/crds.yaml"))
                .context("reading the chart's CRDs")?,
            Some(args) => {
                let mut template = Command::new(&helm);
                // `helm test`'s pod is Helm's to run; applied with
                // kubectl it would run once at install and stay.
                template
                    .args(["template", RELEASE, "--skip-tests"])
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
