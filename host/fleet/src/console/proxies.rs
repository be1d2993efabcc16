//! The Proxies page: every Proxy in a filtered, sorted, paged table, and
//! one Proxy in detail with its actions.

use std::cmp::Ordering;
use std::collections::BTreeSet;

use maud::{Markup, html};
use proxyfleet_core::clock::unix_now;

use super::query::{PER_PAGE, PHASES, ProxyQuery, Sort, verdict_str};
use super::{Console, Viewer, chart, events, format, page};
use crate::catalog::{ProxyView, Selector, Verdict};
use proxyfleet_metrics::UpstreamTotals;

/// A row: the catalog's view and the gateway's counts through it.
struct Row {
    view: ProxyView,
    traffic: UpstreamTotals,
}

impl Row {
    fn verdict(&self) -> Verdict {
        self.view.health.as_ref().map_or(Verdict::Unknown, |h| h.verdict)
    }

    fn latency(&self) -> Option<f64> {
        self.view.health.as_ref().and_then(|h| h.latency_ms)
    }

    fn failures(&self) -> u64 {
        self.view.health.as_ref().map_or(0, |h| h.failures)
    }

    fn qualified(&self) -> String {
        format!("{}/{}", self.view.namespace, self.view.name)
    }
}

fn rows(console: &Console) -> Vec<Row> {
    let gateway = console.fleet.metrics().gateway();
    console
        .fleet
        .list(&Selector::default(), None)
        .into_iter()
        .map(|view| {
            let traffic = gateway.upstream_totals(
                view.pool.as_deref(),
                &format!("{}/{}", view.namespace, view.name),
            );
            Row { view, traffic }
        })
        .collect()
}

fn keep(row: &Row, query: &ProxyQuery) -> bool {
    query.pool.as_deref().is_none_or(|pool| row.view.pool.as_deref() == Some(pool))
        && query.entry.as_deref().is_none_or(|entry| row.view.provider == entry)
        && query.phase.is_none_or(|phase| row.view.phase == phase)
        && query.health.is_none_or(|verdict| row.verdict() == verdict)
        && query
            .site
            .as_deref()
            .is_none_or(|site| row.view.banned_sites.iter().any(|ban| ban.site == site))
}

fn order(sort: Sort, a: &Row, b: &Row) -> Ordering {
    let by_name = || a.qualified().cmp(&b.qualified());
    match sort {
        Sort::Name => by_name(),
        Sort::Latency => match (a.latency(), b.latency()) {
            (Some(x), Some(y)) => x.total_cmp(&y),
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (None, None) => Ordering::Equal,
        }
        .then_with(by_name),
        Sort::Failures => b.failures().cmp(&a.failures()).then_with(by_name),
        Sort::Errors => b.traffic.errors.cmp(&a.traffic.errors).then_with(by_name),
        Sort::Age => match (a.view.created_at, b.view.created_at) {
            (Some(x), Some(y)) => x.cmp(&y),
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (None, None) => Ordering::Equal,
        }
        .then_with(by_name),
    }
}

/// `GET /ui/proxies`.
pub(super) fn list(console: &Console, viewer: Viewer, query: &ProxyQuery) -> Markup {
    let all = rows(console);
    let pools: BTreeSet<String> = all.iter().filter_map(|r| r.view.pool.clone()).collect();
    let entries: BTreeSet<String> = all.iter().map(|r| r.view.provider.clone()).collect();
    let mut shown: Vec<Row> = all.into_iter().filter(|row| keep(row, query)).collect();
    shown.sort_by(|a, b| order(query.sort, a, b));
    let total = shown.len();
    let pages = total.div_ceil(PER_PAGE).max(1);
    let page_number = query.page.min(pages);
    let start = (page_number - 1) * PER_PAGE;
    let body = html! {
        form.filters method="get" action="/ui/proxies" aria-label="Filter proxies" {
            (select("pool", "Pool", pools.iter().map(String::as_str), query.pool.as_deref()))
            (select("entry", "Provider entry", entries.iter().map(String::as_str), query.entry.as_deref()))
            (select("phase", "Phase", PHASES.iter().map(|p| p.as_str()), query.phase.map(|p| p.as_str())))
            (select("health", "Health", ["healthy", "unhealthy", "unknown"].into_iter(), query.health.map(verdict_str)))
            div.field {
                label for="filter-site" { "Banned for site" }
                input #filter-site type="text" name="site" value=[query.site.as_deref()] placeholder="example.com";
            }
            div.field {
                label for="filter-sort" { "Sort by" }
                select #filter-sort name="sort" {
                    @for sort in Sort::ALL {
                        option value=(sort.as_str()) selected[sort == query.sort] { (sort.label()) }
                    }
                }
            }
            button type="submit" { "Apply" }
        }
        p #proxy-count { (total) " proxies" @if pages > 1 { ", page " (page_number) " of " (pages) } }
        div.scroll {
            table #proxies {
                caption.visually-hidden { "Proxies" }
                thead {
                    tr {
                        th scope="col" { "Name" }
                        th scope="col" { "Pool" }
                        th scope="col" { "Entry" }
                        th scope="col" { "Phase" }
                        th scope="col" { "Age" }
                        th scope="col" { "Address" }
                        th scope="col" { "Health" }
                        th scope="col" { "Exit IP" }
                        th scope="col" { "Gateway" }
                        th scope="col" { "Held" }
                    }
                }
                tbody {
                    @for row in shown.iter().skip(start).take(PER_PAGE) {
                        (table_row(row))
                    }
                }
            }
        }
        @if pages > 1 {
            nav.pages aria-label="Pages" {
                @if page_number > 1 {
                    a rel="prev" href={ "/ui/proxies?" (query.on_page(page_number - 1)) } { "Previous" }
                }
                @if page_number < pages {
                    a rel="next" href={ "/ui/proxies?" (query.on_page(page_number + 1)) } { "Next" }
                }
            }
        }
    };
    page::frame(viewer, "Proxies", "Proxies", None, body)
}

fn select<'a>(
    name: &str,
    label: &str,
    options: impl Iterator<Item = &'a str>,
    selected: Option<&str>,
) -> Markup {
    let id = format!("filter-{name}");
    html! {
        div.field {
            label for=(id) { (label) }
            select id=(id) name=(name) {
                option value="" { "any" }
                @for option in options {
                    option value=(option) selected[Some(option) == selected] { (option) }
                }
            }
        }
    }
}

fn table_row(row: &Row) -> Markup {
    let view = &row.view;
    let verdict = row.verdict();
    html! {
        tr data-proxy=(view.id) {
            th scope="row" { a href={ "/ui/proxies/" (view.id) } { (row.qualified()) } }
            td { (view.pool.as_deref().unwrap_or("—")) }
            td { (view.provider) }
            td {
                span class={ "phase phase-" (view.phase.as_str().to_ascii_lowercase()) } { (view.phase.as_str()) }
                @if let Some(reason) = &view.phase_reason { br; span.reason { (reason) } }
            }
            td { (view.created_at.map_or_else(|| "—".to_owned(), |at| format::span(unix_now().saturating_sub(at)))) }
            td { code { (view.url.as_deref().unwrap_or("—")) } }
            td.health data-verdict=(verdict_str(verdict)) {
                span class={ "verdict verdict-" (verdict_str(verdict)) } { (verdict_str(verdict)) }
                @if let Some(ms) = row.latency() { " " span.latency { (format!("{ms:.0} ms")) } }
            }
            td { (view.health.as_ref().and_then(|h| h.exit_ip.as_deref()).unwrap_or("—")) }
            td.numbers {
                (row.traffic.requests) " req · " (format::bytes(row.traffic.bytes)) " · "
                (row.traffic.errors) " err"
            }
            td.held {
                @if let Some(until) = view.quarantined_until {
                    span.tag { "quarantined " (format::until(until)) }
                }
                @for ban in &view.banned_sites {
                    span.tag { "banned for " (ban.site) }
                }
                @if view.leases > 0 { span.tag { (view.leases) " leases" } }
            }
        }
    }
}

/// `GET /ui/proxies/{id}`: `None` when there is no such proxy.
pub(super) fn detail(console: &Console, viewer: Viewer, id: &str) -> Option<Markup> {
    let view = console.fleet.get(id).ok()?;
    let qualified = format!("{}/{}", view.namespace, view.name);
    let traffic =
        console.fleet.metrics().gateway().upstream_totals(view.pool.as_deref(), &qualified);
    let leases: Vec<_> = if viewer.role.is_some() || !viewer.tokens {
        console.fleet.leases().into_iter().filter(|lease| lease.proxy_id == view.id).collect()
    } else {
        Vec::new()
    };
    let back = format!("/ui/proxies/{}", view.id);
    let health = view.health.as_ref();
    let verdict = health.map_or(Verdict::Unknown, |h| h.verdict);
    let quarantine_minutes = console.fleet.settings().quarantine.as_secs().div_ceil(60);
    let history = console.fleet.health_history(&view.id);
    let shares: Vec<Option<f64>> = history
        .iter()
        .map(|m| {
            let probes = m.passes + m.failures;
            (probes > 0).then(|| f64::from(m.passes) / f64::from(probes))
        })
        .collect();
    let activity = console.fleet.activity(Some(&view.id), 30);
    let body = html! {
        dl.facts {
            dt { "ID" } dd { code { (view.id) } }
            dt { "Pool" } dd { (view.pool.as_deref().unwrap_or("—")) }
            dt { "Provider entry" } dd { (view.provider) }
            dt { "Phase" } dd {
                (view.phase.as_str())
                @if let Some(reason) = &view.phase_reason { " — " (reason) }
            }
            @if let Some(at) = view.created_at { dt { "Age" } dd { (format::span(unix_now().saturating_sub(at))) } }
            dt { "Address" } dd { code { (view.url.as_deref().unwrap_or("—")) } }
            dt { "Asks for a credential" } dd { (if view.authenticated { "yes" } else { "no" }) }
            dt { "Health" } dd.health data-verdict=(verdict_str(verdict)) { (verdict_str(verdict)) }
            @if let Some(h) = health {
                dt { "Probes" } dd { (h.passes) " passed, " (h.failures) " failed" }
                @if let Some(ms) = h.latency_ms { dt { "Last latency" } dd { (format!("{ms:.0} ms")) } }
                @if let Some(ip) = &h.exit_ip { dt { "Exit IP" } dd { (ip) } }
                @if let Some(error) = &h.last_error { dt { "Last failure" } dd { (error) } }
                @if let Some(at) = h.checked_at { dt { "Last probe" } dd { (format::ago(at)) } }
            }
            dt { "Available to crawlers" } dd { (if view.available { "yes" } else { "no" }) }
            dt { "Crawler reports" } dd { (view.reports) }
            dt { "Gateway" } dd {
                (traffic.requests) " requests, " (format::bytes(traffic.bytes)) ", " (traffic.errors) " errors"
            }
            @if !view.labels.is_empty() {
                dt { "Labels" } dd {
                    @for (key, value) in &view.labels { code { (key) "=" (value) } " " }
                }
            }
        }
        @if viewer.operates() && console.mode.is_some() {
            section aria-labelledby="instance" {
                h2 #instance { "Instance" }
                p.hint {
                    "Replacing deletes this Proxy's instance, waits until it is gone and makes a new one, "
                    "as a change of its spec would. The Proxy keeps its name; crawlers holding it lose their connections."
                }
                form.action method="post" action={ "/ui/proxies/" (view.id) "/replace" } aria-label="Replace the instance" {
                    input type="hidden" name="back" value=(back);
                    button type="submit" { "Replace instance" }
                }
            }
        }
        section aria-labelledby="conditions" {
            h2 #conditions { "Conditions" }
            @if view.conditions.is_empty() {
                p { "None recorded yet." }
            } @else {
                div.scroll {
                    table {
                        caption.visually-hidden { "Conditions" }
                        thead { tr {
                            th scope="col" { "Type" }
                            th scope="col" { "Status" }
                            th scope="col" { "Reason" }
                            th scope="col" { "Message" }
                            th scope="col" { "Since" }
                        } }
                        tbody {
                            @for condition in &view.conditions {
                                tr {
                                    th scope="row" { (format!("{:?}", condition.kind)) }
                                    td { (format!("{:?}", condition.status)) }
                                    td { (condition.reason) }
                                    td { (condition.message) }
                                    td { (format::ago(condition.last_transition_time)) }
                                }
                            }
                        }
                    }
                }
            }
        }
        section aria-labelledby="history" {
            h2 #history { "Health, last hour" }
            @if history.is_empty() {
                p { "Not probed yet." }
            } @else {
                (chart::pass_bars("Probes per minute", &shares))
                (chart::lines(
                    "Probe latency",
                    "ms",
                    "the last hour, by minute",
                    &[chart::Series { name: "mean latency", points: history.iter().map(|m| m.latency_ms).collect() }],
                ))
            }
        }
        section aria-labelledby="held" {
            h2 #held { "Quarantine and bans" }
            @if view.quarantined_until.is_none() && view.banned_sites.is_empty() {
                p { "Nothing keeps this proxy out." }
            }
            ul {
                @if let Some(until) = view.quarantined_until {
                    li { "Quarantined for every site " (format::until(until)) }
                }
                @for ban in &view.banned_sites {
                    li {
                        "Banned for " strong { (ban.site) } " " (format::until(ban.until))
                        @if viewer.operates() {
                            form.inline method="post" action={ "/ui/proxies/" (view.id) "/lift" } {
                                input type="hidden" name="site" value=(ban.site);
                                input type="hidden" name="back" value=(back);
                                button type="submit" { "Put back for " (ban.site) }
                            }
                        }
                    }
                }
            }
            @if viewer.operates() {
                form.action method="post" action={ "/ui/proxies/" (view.id) "/quarantine" } aria-label="Quarantine" {
                    div.field {
                        label for="quarantine-site" { "Site (empty: every site)" }
                        input #quarantine-site type="text" name="site" placeholder="example.com";
                    }
                    div.field {
                        label for="quarantine-minutes" { "Minutes" }
                        input #quarantine-minutes type="number" name="minutes" min="1" max="10080"
                            value=(quarantine_minutes);
                    }
                    input type="hidden" name="back" value=(back);
                    button type="submit" { "Quarantine" }
                }
                @if view.quarantined_until.is_some() || !view.banned_sites.is_empty() {
                    form.action method="post" action={ "/ui/proxies/" (view.id) "/lift" } {
                        input type="hidden" name="back" value=(back);
                        button type="submit" { "Put back everywhere" }
                    }
                }
            }
        }
        @if !leases.is_empty() {
            section aria-labelledby="leases" {
                h2 #leases { "Leases" }
                ul {
                    @for lease in &leases {
                        li {
                            code { (lease.id) } " "
                            (if lease.exclusive { "exclusive" } else { "shared" }) ", ends "
                            (format::until(lease.expires_at))
                            @if viewer.operates() {
                                form.inline method="post" action={ "/ui/leases/" (lease.id) "/release" } {
                                    input type="hidden" name="back" value=(back);
                                    input type="hidden" name="proxy" value=(view.id);
                                    button type="submit" { "Release" }
                                }
                            }
                        }
                    }
                }
            }
        }
        section aria-labelledby="events" {
            h2 #events { "Events" }
            (events::list(&activity, false))
        }
    };
    Some(page::frame(viewer, "Proxies", &qualified, None, body))
}
