//! The Gateway page: requests and errors per second, the time the gateway
//! adds, open sessions and per-site bans over the last hour, and errors
//! by kind over the last five minutes.

use std::time::Duration;

use maud::{Markup, html};

use super::chart::{self, Series};
use super::traffic::{self, EVERY};
use super::{Console, Viewer, format, page};

/// The window of the errors-by-kind table and the percentiles.
const RECENT: Duration = Duration::from_secs(300);

/// `GET /ui/gateway`.
pub(super) fn render(console: &Console, viewer: Viewer) -> Markup {
    let intervals = console.traffic.intervals();
    let rates = console.traffic.rates();
    let recent = console.traffic.recent(RECENT);
    let totals = console.traffic.totals();
    let sessions = console.fleet.session_count();
    let span = match intervals.first() {
        Some(first) => format!("the last {}", format::span(first.ago + EVERY.as_secs())),
        None => "no samples yet".to_owned(),
    };
    let p50 = traffic::percentile(&recent.added, 0.5);
    let p90 = traffic::percentile(&recent.added, 0.9);
    let p99 = traffic::percentile(&recent.added, 0.99);
    let ms = |value: Option<f64>| {
        value.map_or_else(|| "—".to_owned(), |v| format!("{} ms", chart::number(v)))
    };
    let bans = console.traffic.bans(5);
    let body = html! {
        ul.tiles aria-label="Gateway now" {
            li { span.figure #gateway-rate { (format::rate(rates.requests)) } " requests" }
            li { span.figure { (format::rate(rates.errors)) } " errors" }
            li { span.figure #gateway-sessions { (sessions) } " open sessions" }
            li { span.figure { (ms(p99)) } " added, 99th percentile (5 min)" }
        }
        (chart::lines(
            "Requests and errors per second",
            "/s",
            &span,
            &[
                Series { name: "requests", points: intervals.iter().map(|i| Some(i.requests)).collect() },
                Series { name: "errors", points: intervals.iter().map(|i| Some(i.errors)).collect() },
            ],
        ))
        (chart::lines(
            "Time the gateway adds",
            "ms",
            &span,
            &[
                Series { name: "median", points: intervals.iter().map(|i| i.added_ms.map(|(p50, _)| p50)).collect() },
                Series { name: "99th percentile", points: intervals.iter().map(|i| i.added_ms.map(|(_, p99)| p99)).collect() },
            ],
        ))
        (chart::lines(
            "Open sessions",
            "sessions",
            &span,
            &[Series {
                name: "sessions",
                #[expect(clippy::cast_precision_loss, reason = "a count on a chart")]
                points: intervals.iter().map(|i| Some(i.sessions as f64)).collect(),
            }],
        ))
        @if bans.is_empty() {
            p { "No proxy was banned for a site in " (span) "." }
        } @else {
            @let series: Vec<Series<'_>> = bans
                .iter()
                .map(|(site, counts)| Series {
                    name: site,
                    #[expect(clippy::cast_precision_loss, reason = "a count on a chart")]
                    points: counts.iter().map(|c| Some(*c as f64)).collect(),
                })
                .collect();
            (chart::lines("Proxies banned per site", "proxies", &span, &series))
        }
        section aria-labelledby="kinds" {
            h2 #kinds { "Errors by kind" }
            div.scroll {
                table {
                    thead {
                        tr {
                            th scope="col" { "Kind" }
                            th scope="col" { "Last 5 minutes" }
                            th scope="col" { "Since start" }
                        }
                    }
                    tbody {
                        tr {
                            th scope="row" { "upstream failed" }
                            td { (recent.upstream_errors) }
                            td { (totals.upstream_errors) }
                        }
                        @for (reason, count) in &totals.refused_by {
                            tr {
                                th scope="row" { "refused: " (reason) }
                                td { (recent.refused_by.get(reason).copied().unwrap_or(0)) }
                                td { (count) }
                            }
                        }
                    }
                }
            }
            p.hint {
                "Time added over the last 5 minutes: median " (ms(p50)) ", 90th percentile "
                (ms(p90)) ", 99th " (ms(p99)) " (bucket bounds). Since start: "
                (totals.requests) " requests."
            }
        }
    };
    page::frame(viewer, "Gateway", "Gateway", Some(5), body)
}
