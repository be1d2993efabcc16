//! The Providers page: each entry's plugin build, the one a rollback
//! would bring back, builds refused and why, the registry pull, the last
//! check, what the entry grants its plugin, the config schema, and the
//! rollback action.

use maud::{Markup, html};
use proxyfleet_core::revisions::{EntryRevisions, RevisionSummary};

use super::{Console, Viewer, format, page};

/// `GET /ui/providers`.
pub(super) fn render(console: &Console, viewer: Viewer) -> Markup {
    let (revisions, checks) =
        console.mode.as_ref().map(|mode| (mode.revisions(), mode.checks())).unwrap_or_default();
    let body = html! {
        @if revisions.is_empty() {
            p { "No provider entry." }
        }
        @for entry in &revisions {
            @let id = format!("entry-{}", entry.entry);
            section.entry aria-labelledby=(id) data-entry=(entry.entry) {
                h2 id=(id) { (entry.entry) " " span.subtle { "plugin " (entry.plugin) } }
                @if let Some(why) = &entry.unavailable {
                    p.problem role="alert" { "Serves nothing: " (why) }
                }
                @if let Some(check) = checks.iter().find(|c| c.entry == entry.entry) {
                    p {
                        "Last check: "
                        @if check.health.healthy {
                            span.verdict.verdict-healthy { "passed" }
                        } @else {
                            span.verdict.verdict-unhealthy { "failed" }
                        }
                        " " (format::ago(check.checked_at))
                        @for issue in &check.health.issues { " · " (issue.message) }
                    }
                }
                @if let Some(pin) = &entry.pin { p { "Pinned to " (pin.to_string()) "." } }
                dl.facts {
                    dt { "Serving" } dd.active { (revision(entry.active.as_ref())) }
                    @if let Some(at) = entry.activated_at { dt { "Since" } dd { (format::ago(at)) } }
                    dt { "Previous" } dd { (revision(entry.previous.as_ref())) }
                    dt { "Swaps, refusals" } dd { (entry.swaps) ", " (entry.rejections) }
                }
                (pull(entry))
                @if !entry.grants.is_empty() {
                    h3 { "Grants" }
                    ul.grants {
                        @for grant in &entry.grants {
                            li { strong { (grant.capability) } ": " (grant.detail) }
                        }
                    }
                }
                @if let Some(schema) = &entry.config_schema {
                    details.schema {
                        summary { "Config schema" }
                        pre tabindex="0" { code { (pretty(schema)) } }
                    }
                }
                @if !entry.rejected.is_empty() {
                    h3 { "Refused builds" }
                    ul.rejected {
                        @for rejected in &entry.rejected {
                            li {
                                strong { (rejected.kind.as_str()) } ": " (rejected.reason)
                                " " span.subtle {
                                    @if let Some(plugin) = &rejected.plugin {
                                        (plugin) " " (rejected.version.as_deref().unwrap_or("")) ", "
                                    }
                                    "sha256:" (short(&rejected.digest)) ", " (format::ago(rejected.loaded_at))
                                }
                            }
                        }
                    }
                }
                @if viewer.operates() && entry.previous.is_some() {
                    form.action method="post" action={ "/ui/providers/" (entry.entry) "/rollback" } {
                        input type="hidden" name="back" value="/ui/providers";
                        button type="submit" { "Roll back to the previous build" }
                    }
                }
            }
        }
    };
    // Builds come and go with the plugin directory and the registry, which
    // the catalog's change events do not cover.
    page::frame(viewer, "Providers", "Providers", Some(5), body)
}

fn revision(revision: Option<&RevisionSummary>) -> Markup {
    html! {
        @match revision {
            Some(r) => {
                (r.plugin) " " (r.version) ", contract " (r.contract_version) ", "
                code title=(r.digest) { "sha256:" (short(&r.digest)) } ", from "
                code { (r.source.display().to_string()) }
            }
            None => "—",
        }
    }
}

fn pull(entry: &EntryRevisions) -> Markup {
    html! {
        @if let Some(pull) = &entry.pull {
            p.pull {
                "Registry: " code { (pull.reference) }
                @if let Some(digest) = &pull.manifest_digest { ", manifest " code { (short(digest)) } }
                @if let Some(at) = pull.checked_at { ", checked " (format::ago(at)) }
                @if let Some(error) = &pull.error {
                    span.problem { " · last look failed (" (pull.failures) " in a row): " (error) }
                }
            }
        }
    }
}

/// A JSON Schema indented for reading; as it came when it is no JSON.
fn pretty(schema: &str) -> String {
    serde_json::from_str::<serde_json::Value>(schema)
        .and_then(|value| serde_json::to_string_pretty(&value))
        .unwrap_or_else(|_| schema.to_owned())
}

/// The first 12 hex digits of a digest.
fn short(digest: &str) -> &str {
    let digest = digest.strip_prefix("sha256:").unwrap_or(digest);
    digest.get(..12).unwrap_or(digest)
}
