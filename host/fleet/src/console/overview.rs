//! The Overview page: pools and provider entries with their counts, the
//! gateway's rates, and the catalog at a glance.

use std::collections::BTreeMap;

use maud::{Markup, html};
use proxyfleet_core::proxy::Phase;

use super::{Console, Viewer, events, format, page};
use crate::catalog::Selector;

/// Counts of a group of proxies.
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    members: usize,
    running: usize,
    healthy: usize,
    available: usize,
    failed: usize,
}

/// `GET /ui/`.
pub(super) fn render(console: &Console, viewer: Viewer) -> Markup {
    let views = console.fleet.list(&Selector::default(), None);
    let mut all = Counts::default();
    let mut pools: BTreeMap<String, Counts> = BTreeMap::new();
    let mut entries: BTreeMap<String, Counts> = BTreeMap::new();
    for view in &views {
        let groups = [Some(&mut all), Some(entries.entry(view.provider.clone()).or_default())];
        let pool = view.pool.clone().map(|pool| pools.entry(pool).or_default());
        for counts in groups.into_iter().chain([pool]).flatten() {
            counts.members += 1;
            counts.running += usize::from(view.phase == Phase::Running);
            counts.healthy += usize::from(view.healthy);
            counts.available += usize::from(view.available);
            counts.failed += usize::from(view.phase == Phase::Failed);
        }
    }
    let checks: BTreeMap<String, _> = console
        .mode
        .as_ref()
        .map(|mode| mode.checks())
        .unwrap_or_default()
        .into_iter()
        .map(|check| (check.entry.clone(), check))
        .collect();
    let rates = console.traffic.rates();
    let totals = console.traffic.totals();
    let mode = console.mode.as_ref().map_or("", |mode| mode.name());
    let replica = console.mode.as_ref().and_then(|mode| mode.replica());
    let body = html! {
        ul.tiles aria-label="Fleet" {
            li { span.figure #count-proxies { (all.members) } " proxies" }
            li { span.figure #count-running { (all.running) } " running" }
            li { span.figure #count-healthy { (all.healthy) } " healthy" }
            li { span.figure #count-available { (all.available) } " available" }
            li { span.figure #gateway-rate { (format::rate(rates.requests)) } " gateway requests" }
            li { span.figure #gateway-errors { (format::rate(rates.errors)) } " gateway errors" }
        }
        p.hint #replica {
            @if !mode.is_empty() { "Mode: " (mode) ". " }
            @if let Some(replica) = &replica {
                "Served by replica " strong { (replica.identity) }
                @if replica.leading { ", the leader. " } @else { ", a follower: it serves crawlers, the leader reconciles. " }
            }
            "Gateway since start: " (totals.requests) " requests, "
            (totals.upstream_errors) " upstream errors, " (totals.refused) " refused"
            @if !rates.over.is_zero() { "; rates over the last " (format::span(rates.over.as_secs())) }
            "."
        }
        section aria-labelledby="pools" {
            h2 #pools { "Pools" }
            @if pools.is_empty() {
                p { "No ProxyPool has members." }
            } @else {
                (counts_table("Pool", "pool", &pools))
            }
        }
        section aria-labelledby="events" {
            h2 #events { "Last events" }
            (events::list(&console.fleet.activity(None, 15), true))
        }
        section aria-labelledby="entries" {
            h2 #entries { "Provider entries" }
            @if entries.is_empty() && checks.is_empty() {
                p { "No Proxy yet." }
            } @else {
                div.scroll {
                    table {
                        thead {
                            tr {
                                th scope="col" { "Entry" }
                                th scope="col" { "Proxies" }
                                th scope="col" { "Running" }
                                th scope="col" { "Healthy" }
                                th scope="col" { "Last check" }
                            }
                        }
                        tbody {
                            @for name in entries.keys().chain(checks.keys().filter(|k| !entries.contains_key(*k))) {
                                @let counts = entries.get(name).copied().unwrap_or_default();
                                tr {
                                    th scope="row" {
                                        a href={ "/ui/proxies?entry=" (format::encoded(name)) } { (name) }
                                    }
                                    td { (counts.members) }
                                    td { (counts.running) }
                                    td { (counts.healthy) }
                                    td {
                                        @match checks.get(name) {
                                            Some(check) if check.health.healthy => {
                                                span.verdict.verdict-healthy { "passed" } " " (format::ago(check.checked_at))
                                            }
                                            Some(check) => {
                                                span.verdict.verdict-unhealthy { "failed" } " " (format::ago(check.checked_at))
                                                @for issue in &check.health.issues { " · " (issue.message) }
                                            }
                                            None => "—",
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    page::frame(viewer, "Overview", "Overview", Some(5), body)
}

fn counts_table(what: &str, key: &str, groups: &BTreeMap<String, Counts>) -> Markup {
    html! {
        div.scroll {
            table {
                thead {
                    tr {
                        th scope="col" { (what) }
                        th scope="col" { "Members" }
                        th scope="col" { "Running" }
                        th scope="col" { "Healthy" }
                        th scope="col" { "Available" }
                        th scope="col" { "Failed" }
                    }
                }
                tbody {
                    @for (name, counts) in groups {
                        tr {
                            th scope="row" { a href={ "/ui/proxies?" (key) "=" (format::encoded(name)) } { (name) } }
                            td { (counts.members) }
                            td { (counts.running) }
                            td { (counts.healthy) }
                            td { (counts.available) }
                            td { (counts.failed) }
                        }
                    }
                }
            }
        }
    }
}
