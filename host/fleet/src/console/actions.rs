//! The console's actions: quarantine a proxy (for one site or all), put
//! it back, replace its instance, release a lease, roll an entry back.
//! Each needs a signed-in token with the `operate` role and a same-origin
//! POST; each is logged and recorded by the mode (an Event, or the state
//! log), and answers `303` back to the page.

use std::time::Duration;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;

use super::session::read_form;
use super::{Body, Console, Viewer, origin, page};
use crate::action::{Action, ProxyRef};
use crate::catalog::CatalogError;

/// The longest quarantine an operator may set from the console: a week.
const MAX_MINUTES: u64 = 7 * 24 * 60;

/// A POST under `/ui/`.
pub(super) async fn handle(
    console: &Console,
    viewer: Viewer,
    segments: &[&str],
    request: Request<Incoming>,
) -> Response<Body> {
    if let Some(refusal) = origin::refusal(request.headers()) {
        return refusal;
    }
    if !viewer.operates() {
        let (status, message) = match (viewer.tokens, viewer.role) {
            (false, _) => (
                StatusCode::FORBIDDEN,
                "this operator has no API tokens, so the console is read-only; start it with \
                 --api-token-file and sign in with a token of role operate",
            ),
            (true, None) => (StatusCode::UNAUTHORIZED, "sign in with a token of role operate"),
            (true, Some(_)) => {
                (StatusCode::FORBIDDEN, "this token's role is read; acting needs role operate")
            }
        };
        return page::plain(status, format!("{message}\n"));
    }
    let form = match read_form(request).await {
        Ok(form) => form,
        Err(message) => return page::plain(StatusCode::BAD_REQUEST, format!("{message}\n")),
    };
    let fields: Vec<(String, String)> =
        form_urlencoded::parse(&form).map(|(k, v)| (k.into_owned(), v.trim().to_owned())).collect();
    let field = |name: &str| {
        fields
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, v)| v.as_str())
            .filter(|v| !v.is_empty())
    };
    let outcome = match segments {
        ["proxies", id, "quarantine"] => {
            quarantine(console, id, field("site"), field("minutes")).map(Some)
        }
        ["proxies", id, "lift"] => proxy_ref(console, id).and_then(|proxy| {
            let site = field("site").map(str::to_owned);
            console.fleet.lift(id, site.as_deref()).map_err(|err| catalog_refusal(&err))?;
            Ok(Some(Action::PutBack { proxy, site }))
        }),
        ["proxies", id, "replace"] => match (&console.mode, proxy_ref(console, id)) {
            (_, Err(refusal)) => Err(refusal),
            (None, Ok(_)) => Err((
                StatusCode::NOT_FOUND,
                "this console serves no mode that makes instances".to_owned(),
            )),
            (Some(mode), Ok(proxy)) => match mode.replace(&proxy).await {
                Ok(()) => Ok(Some(Action::Replace { proxy })),
                Err(refusal) => Err(refusal.into_answer()),
            },
        },
        ["leases", id, "release"] => match console.fleet.release(id).await {
            Ok(()) => Ok(Some(Action::ReleaseLease {
                lease: (*id).to_owned(),
                proxy: field("proxy").and_then(|proxy| proxy_ref(console, proxy).ok()),
            })),
            Err(err) => Err(catalog_refusal(&err)),
        },
        ["providers", entry, "rollback"] => match &console.mode {
            None => Err((StatusCode::NOT_FOUND, format!("no provider entry {entry:?}"))),
            Some(mode) => match mode.rollback(entry) {
                Ok(_) => Ok(Some(Action::Rollback { entry: (*entry).to_owned() })),
                Err(refusal) => Err(refusal.into_answer()),
            },
        },
        _ => Err((StatusCode::NOT_FOUND, "no such console action".to_owned())),
    };
    match outcome {
        Ok(action) => {
            if let Some(action) = action {
                record(console, &action).await;
            }
            page::see_other(back(field("back")))
        }
        Err((status, message)) => page::plain(status, format!("{message}\n")),
    }
}

/// Records a done action: in the operator's log, in the console's
/// activity, and where the mode keeps operators' actions.
async fn record(console: &Console, action: &Action) {
    let note = action.note();
    tracing::info!(reason = action.reason(), "console action: {note}");
    // A quarantine is in the activity already: the catalog logs its holds.
    if !matches!(action, Action::Quarantine { .. } | Action::PutBack { .. }) {
        console.fleet.record_activity(action.proxy().map(|p| p.id.as_str()), note);
    }
    if let Some(mode) = &console.mode {
        mode.record(action).await;
    }
}

fn proxy_ref(console: &Console, id: &str) -> Result<ProxyRef, (StatusCode, String)> {
    let view = console.fleet.get(id).map_err(|err| catalog_refusal(&err))?;
    Ok(ProxyRef { id: view.id, namespace: view.namespace, name: view.name })
}

fn quarantine(
    console: &Console,
    id: &str,
    site: Option<&str>,
    minutes: Option<&str>,
) -> Result<Action, (StatusCode, String)> {
    let minutes = match minutes {
        None => console.fleet.settings().quarantine.as_secs().div_ceil(60),
        Some(text) => {
            text.parse().ok().filter(|m| (1..=MAX_MINUTES).contains(m)).ok_or_else(|| {
                (
                    StatusCode::BAD_REQUEST,
                    format!("minutes: {text:?} is not a number of minutes from 1 to {MAX_MINUTES}"),
                )
            })?
        }
    };
    let proxy = proxy_ref(console, id)?;
    console
        .fleet
        .quarantine(id, site, Duration::from_secs(minutes * 60))
        .map_err(|err| catalog_refusal(&err))?;
    Ok(Action::Quarantine { proxy, site: site.map(str::to_owned), minutes })
}

fn catalog_refusal(err: &CatalogError) -> (StatusCode, String) {
    (err.status(), err.to_string())
}

/// Where to go after an action: the page it came from, when that is a
/// console page; the overview otherwise (never another site).
fn back(field: Option<&str>) -> &str {
    field
        .filter(|path| {
            path.starts_with("/ui/")
                && !path.starts_with("//")
                && !path.contains(['\\', '\r', '\n'])
        })
        .unwrap_or("/ui/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_action_leads_back_only_to_a_console_page() {
        assert_eq!(back(Some("/ui/proxies/abc")), "/ui/proxies/abc");
        assert_eq!(back(Some("https://evil.example/")), "/ui/");
        assert_eq!(back(Some("//evil.example/ui/")), "/ui/");
        assert_eq!(back(Some("/ui/\r\nSet-Cookie: x")), "/ui/");
        assert_eq!(back(None), "/ui/");
    }
}
