//! The console's actions: quarantine a proxy (for one site or all), put
//! it back, release a lease, roll an entry back. Each needs a signed-in
//! token with the `operate` role and a same-origin POST; each is logged
//! with the role that made it, and answers `303` back to the page.

use std::time::Duration;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;

use super::session::read_form;
use super::{Body, Console, Viewer, origin, page};
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
        ["proxies", id, "quarantine"] => quarantine(console, id, field("site"), field("minutes")),
        ["proxies", id, "lift"] => console
            .fleet
            .lift(id, field("site"))
            .map(|lifted| {
                tracing::info!(action = "put back", proxy = %id, site = field("site").unwrap_or("*"), lifted, "console action");
            })
            .map_err(|err| catalog_refusal(&err)),
        ["leases", id, "release"] => match console.fleet.release(id).await {
            Ok(()) => {
                tracing::info!(action = "release lease", lease = %id, "console action");
                console.fleet.record_activity(field("proxy"), format!("lease {id} released by an operator"));
                Ok(())
            }
            Err(err) => Err(catalog_refusal(&err)),
        },
        ["providers", entry, "rollback"] => match &console.mode {
            None => Err((StatusCode::NOT_FOUND, format!("no provider entry {entry:?}"))),
            Some(mode) => match mode.rollback(entry) {
                Ok(_) => {
                    tracing::info!(action = "roll back", entry = %entry, "console action");
                    console.fleet.record_activity(
                        None,
                        format!("provider entry {entry} rolled back to its previous build by an operator"),
                    );
                    Ok(())
                }
                Err(refusal) => Err(refusal.into_answer()),
            },
        },
        _ => Err((StatusCode::NOT_FOUND, "no such console action".to_owned())),
    };
    match outcome {
        Ok(()) => page::see_other(back(field("back"))),
        Err((status, message)) => page::plain(status, format!("{message}\n")),
    }
}

fn quarantine(
    console: &Console,
    id: &str,
    site: Option<&str>,
    minutes: Option<&str>,
) -> Result<(), (StatusCode, String)> {
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
    let until = console
        .fleet
        .quarantine(id, site, Duration::from_secs(minutes * 60))
        .map_err(|err| catalog_refusal(&err))?;
    tracing::info!(action = "quarantine", proxy = %id, site = site.unwrap_or("*"), minutes, until, "console action");
    Ok(())
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
