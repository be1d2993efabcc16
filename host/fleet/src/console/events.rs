//! The fleet's recent activity as a list: when, which proxy, what.

use maud::{Markup, html};

use super::format;
use crate::catalog::Activity;

/// `events`, newest first; each names its proxy with a link when
/// `with_proxy`.
pub(super) fn list(events: &[Activity], with_proxy: bool) -> Markup {
    html! {
        @if events.is_empty() {
            p { "Nothing happened yet." }
        } @else {
            ul.events {
                @for event in events {
                    li {
                        time { (format::ago(event.at)) }
                        @if with_proxy {
                            @if let (Some(id), Some(name)) = (&event.proxy_id, &event.proxy) {
                                a href={ "/ui/proxies/" (id) } { (name) } ": "
                            }
                        }
                        (event.what)
                    }
                }
            }
        }
    }
}
