//! Charts as SVG written by the server: lines over time and bars per
//! minute. No script and no style attribute: the stylesheet colours the
//! series by class, so the page's policy stays strict. Each chart says
//! what it shows in its accessible name, with the latest and the highest
//! value, and its legend is text.

use std::fmt::Write as _;

use maud::{Markup, html};

const WIDTH: f64 = 640.0;
const HEIGHT: f64 = 150.0;
const PAD: f64 = 4.0;

/// One line of a chart: a value per point in time, `None` where unknown.
pub(super) struct Series<'a> {
    pub name: &'a str,
    pub points: Vec<Option<f64>>,
}

/// Lines over time: `span` says how far back the first point is.
pub(super) fn lines(title: &str, unit: &str, span: &str, series: &[Series<'_>]) -> Markup {
    let top =
        series.iter().flat_map(|s| s.points.iter().flatten()).copied().fold(0.0_f64, f64::max);
    let scale = if top > 0.0 { top } else { 1.0 };
    let summary = series
        .iter()
        .map(|s| {
            let latest = s.points.iter().rev().flatten().next();
            let peak = s.points.iter().flatten().copied().fold(f64::NAN, f64::max);
            match latest {
                Some(latest) => format!(
                    "{}: now {} {unit}, highest {} {unit}",
                    s.name,
                    number(*latest),
                    number(peak)
                ),
                None => format!("{}: no data", s.name),
            }
        })
        .collect::<Vec<_>>()
        .join("; ");
    html! {
        figure.chart {
            figcaption { (title) " " span.subtle { "(" (span) ", highest " (number(top)) " " (unit) ")" } }
            svg viewBox={ "0 0 " (WIDTH) " " (HEIGHT) } preserveAspectRatio="none" role="img"
                aria-label={ (title) ". " (summary) } {
                line.axis x1="0" y1=(HEIGHT - PAD) x2=(WIDTH) y2=(HEIGHT - PAD) {}
                @for (index, one) in series.iter().enumerate() {
                    @for segment in segments(&one.points, scale) {
                        polyline class={ "series series-" (index) } points=(segment) {}
                    }
                }
            }
            ul.legend {
                @for (index, one) in series.iter().enumerate() {
                    li { span class={ "swatch series-" (index) } {} (one.name) }
                }
            }
        }
    }
}

/// `points` as polyline coordinates, one run per stretch without a gap.
fn segments(points: &[Option<f64>], scale: f64) -> Vec<String> {
    let step = if points.len() > 1 { WIDTH / (points.len() - 1) as f64 } else { 0.0 };
    let mut runs = Vec::new();
    let mut run = String::new();
    for (i, point) in points.iter().enumerate() {
        match point {
            Some(value) => {
                let x = step * i as f64;
                let y = HEIGHT - PAD - (value / scale) * (HEIGHT - 2.0 * PAD);
                let _ = write!(run, "{x:.1},{y:.1} ");
            }
            None if !run.is_empty() => runs.push(std::mem::take(&mut run)),
            None => {}
        }
    }
    if !run.is_empty() {
        runs.push(run);
    }
    // A single point draws nothing as a line: give it a width.
    runs.into_iter()
        .map(|run| {
            if run.trim().contains(' ') {
                run.trim().to_owned()
            } else {
                let (x, y) = run.trim().split_once(',').unwrap_or(("0", "0"));
                let x: f64 = x.parse().unwrap_or(0.0);
                format!("{:.1},{y} {:.1},{y}", (x - 2.0).max(0.0), x + 2.0)
            }
        })
        .collect()
}

/// One bar per minute: the share of passing probes, `None` for a minute
/// without probes.
pub(super) fn pass_bars(title: &str, shares: &[Option<f64>]) -> Markup {
    let width = WIDTH / shares.len().max(1) as f64;
    let probed = shares.iter().flatten().count();
    let all_passed = shares.iter().flatten().filter(|share| **share >= 1.0).count();
    html! {
        figure.chart {
            figcaption { (title) }
            svg viewBox={ "0 0 " (WIDTH) " " (HEIGHT) } preserveAspectRatio="none" role="img"
                aria-label={ (title) ". " (all_passed) " of " (probed) " probed minutes passed every probe" } {
                @for (i, share) in shares.iter().enumerate() {
                    @if let Some(share) = share {
                        @let height = (HEIGHT - 2.0 * PAD) * share.max(0.03);
                        rect class={ "bar " (if *share >= 1.0 { "bar-pass" } else { "bar-fail" }) }
                            x=(format!("{:.1}", width * i as f64 + 1.0)) y=(format!("{:.1}", HEIGHT - PAD - height))
                            width=(format!("{:.1}", (width - 2.0).max(1.0))) height=(format!("{height:.1}")) {}
                    }
                }
                line.axis x1="0" y1=(HEIGHT - PAD) x2=(WIDTH) y2=(HEIGHT - PAD) {}
            }
            ul.legend {
                li { span.swatch.bar-pass {} "every probe passed" }
                li { span.swatch.bar-fail {} "some failed (height: the share that passed)" }
            }
        }
    }
}

/// A number for a caption: few digits.
pub(super) fn number(value: f64) -> String {
    if !value.is_finite() {
        "—".to_owned()
    } else if value >= 100.0 || value == value.trunc() {
        format!("{value:.0}")
    } else if value >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_split_lines_and_a_lone_point_is_drawn() {
        let runs = segments(&[Some(1.0), Some(2.0), None, Some(2.0), None], 2.0);
        assert_eq!(runs.len(), 2);
        assert_eq!(runs[0].split(' ').count(), 2);
        assert_eq!(runs[1].split(' ').count(), 2, "a lone point gets a width: {runs:?}");
        let chart = lines(
            "Requests",
            "/s",
            "last hour",
            &[Series { name: "requests", points: vec![Some(1.0), Some(3.0)] }],
        )
        .into_string();
        assert!(chart.contains("role=\"img\"") && chart.contains("now 3 /s"), "{chart}");
        assert!(!chart.contains("style="), "{chart}");
    }
}
