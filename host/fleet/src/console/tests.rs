//! The console served by the API on loopback, driven over HTTP as a
//! browser would (cookies, Origin) and as a forger would (without).

use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use reqwest::header::{HeaderMap, HeaderValue};

use crate::auth::ApiAuth;
use crate::server::ConnectionLimits;

use super::Console;
use crate::action::{Action, ProxyRef};
use crate::catalog::tests::{MemberBuilder, fleet_with};
use crate::catalog::{Fleet, FleetSettings};
use crate::mode::{ModeStatus, Refusal};

struct Served {
    base: String,
    fleet: Arc<Fleet>,
    _dir: tempfile::TempDir,
    stop: tokio::sync::oneshot::Sender<()>,
}

/// The API with the console on loopback, over two proxies, with `tokens`
/// as the token file (none when empty).
async fn serve(tokens: &str) -> Served {
    serve_with(tokens, None).await
}

/// A mode that carries out nothing itself and keeps what it was asked.
#[derive(Default)]
struct RecordingMode {
    replaced: std::sync::Mutex<Vec<ProxyRef>>,
    recorded: std::sync::Mutex<Vec<Action>>,
    session_key: Option<[u8; 32]>,
}

#[async_trait::async_trait]
impl ModeStatus for RecordingMode {
    fn providers(&self) -> serde_json::Value {
        serde_json::json!({ "items": [] })
    }
    fn rollback(&self, entry: &str) -> Result<serde_json::Value, Refusal> {
        Err(Refusal::Conflict(format!("entry {entry} has no previous build")))
    }
    fn name(&self) -> &'static str {
        "test"
    }
    fn revisions(&self) -> Vec<proxyfleet_core::revisions::EntryRevisions> {
        Vec::new()
    }
    fn session_key(&self) -> Option<[u8; 32]> {
        self.session_key
    }
    async fn replace(&self, proxy: &ProxyRef) -> Result<(), Refusal> {
        if proxy.id == "uid-2" {
            return Err(Refusal::Unavailable("the store is full".into()));
        }
        self.replaced.lock().unwrap().push(proxy.clone());
        Ok(())
    }
    async fn record(&self, action: &Action) {
        self.recorded.lock().unwrap().push(action.clone());
    }
}

async fn serve_with(tokens: &str, mode: Option<Arc<dyn ModeStatus>>) -> Served {
    let fleet = Arc::new(fleet_with(
        vec![MemberBuilder::new(1).pool("default/web").build(), MemberBuilder::new(2).build()],
        FleetSettings::default(),
    ));
    let dir = tempfile::tempdir().unwrap();
    let auth = if tokens.is_empty() {
        ApiAuth::reads_only()
    } else {
        let file = dir.path().join("tokens");
        std::fs::write(&file, tokens).unwrap();
        ApiAuth::from_file(file, false).unwrap()
    };
    let console = Arc::new(Console::new(Arc::clone(&fleet), Arc::new(auth), mode));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    // As the API serves it, without the API's routes.
    let service = move |_peer, _slot| {
        let console = Arc::clone(&console);
        hyper::service::service_fn(move |request| {
            let console = Arc::clone(&console);
            async move { Ok::<_, std::convert::Infallible>(console.handle(request).await) }
        })
    };
    tokio::spawn(crate::server::serve(
        listener,
        "console",
        ConnectionLimits::default(),
        service,
        async {
            let _ = stopped.await;
        },
    ));
    Served { base, fleet, _dir: dir, stop }
}

/// A browser: keeps cookies, follows no redirect, sends its Origin.
fn browser(base: &str) -> reqwest::Client {
    let mut headers = HeaderMap::new();
    headers.insert("origin", HeaderValue::from_str(base).unwrap());
    reqwest::Client::builder()
        .cookie_store(true)
        .redirect(reqwest::redirect::Policy::none())
        .default_headers(headers)
        .build()
        .unwrap()
}

/// A client that is no browser: no Origin, no cookies of its own.
fn script() -> reqwest::Client {
    reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap()
}

async fn sign_in(client: &reqwest::Client, base: &str, token: &str) -> StatusCode {
    client.post(format!("{base}/ui/login")).form(&[("token", token)]).send().await.unwrap().status()
}

async fn page(client: &reqwest::Client, url: &str) -> (StatusCode, HeaderMap, String) {
    let response = client.get(url).send().await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    (status, headers, response.text().await.unwrap())
}

#[tokio::test]
async fn pages_are_read_only_without_tokens_and_carry_a_strict_policy() {
    let served = serve("").await;
    let client = browser(&served.base);
    for path in ["/ui/", "/ui/proxies", "/ui/proxies/uid-1", "/ui/providers"] {
        let (status, headers, body) = page(&client, &format!("{}{path}", served.base)).await;
        assert_eq!(status, StatusCode::OK, "{path}: {body}");
        let csp = headers["content-security-policy"].to_str().unwrap();
        assert!(csp.contains("script-src 'self'") && !csp.contains("unsafe"), "{csp}");
        assert!(!body.contains("style=") && !body.contains("<script>"), "{path}: inline code");
        assert!(!body.contains("method=\"post\" action=\"/ui/proxies"), "{path}: an action form");
        assert!(body.contains("Read-only"), "{path}");
    }
    let (_, _, list) = page(&client, &format!("{}/ui/proxies", served.base)).await;
    assert!(list.contains("default/proxy-1") && list.contains("default/proxy-2"), "{list}");
    // A POST from the console's own origin is still refused, and changes nothing.
    let response = client
        .post(format!("{}/ui/proxies/uid-1/quarantine", served.base))
        .form(&[("site", "")])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    assert!(served.fleet.get("uid-1").unwrap().quarantined_until.is_none());
    let _ = served.stop.send(());
}

#[tokio::test]
async fn an_operate_token_acts_a_read_token_and_forgers_do_not() {
    let served = serve("viewer role=read\noperator role=operate\n").await;
    let base = &served.base;
    // Nobody signed in: to the sign-in page.
    let anonymous = browser(base);
    let (status, headers, _) = page(&anonymous, &format!("{base}/ui/proxies")).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert_eq!(headers["location"], "/ui/login");
    assert_eq!(sign_in(&anonymous, base, "wrong").await, StatusCode::UNAUTHORIZED);

    // A reader sees, without the action controls, and may not act.
    let reader = browser(base);
    assert_eq!(sign_in(&reader, base, "viewer").await, StatusCode::SEE_OTHER);
    let (status, _, body) = page(&reader, &format!("{base}/ui/proxies/uid-1")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("Signed in: read") && !body.contains("Quarantine</button>"), "{body}");
    let refused = reader
        .post(format!("{base}/ui/proxies/uid-1/quarantine"))
        .form(&[("site", "")])
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);

    // An operator quarantines for one site, then for all, then puts it back.
    let operator = browser(base);
    let login = operator
        .post(format!("{base}/ui/login"))
        .form(&[("token", "operator")])
        .send()
        .await
        .unwrap();
    let cookie = login.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(
        cookie.contains("HttpOnly")
            && cookie.contains("SameSite=Strict")
            && !cookie.contains("operator"),
        "{cookie}"
    );
    let (_, _, body) = page(&operator, &format!("{base}/ui/proxies/uid-1")).await;
    assert!(body.contains("Quarantine</button>"), "{body}");
    let done = operator
        .post(format!("{base}/ui/proxies/uid-1/quarantine"))
        .form(&[("site", "Example.COM"), ("minutes", "5"), ("back", "/ui/proxies/uid-1")])
        .send()
        .await
        .unwrap();
    assert_eq!(done.status(), StatusCode::SEE_OTHER);
    assert_eq!(done.headers()["location"], "/ui/proxies/uid-1");
    let view = served.fleet.get("uid-1").unwrap();
    assert_eq!(view.banned_sites.len(), 1);
    assert_eq!(view.banned_sites[0].site, "example.com");
    assert!(view.quarantined_until.is_none(), "other sites still get it");
    let (_, _, list) = page(&operator, &format!("{base}/ui/proxies?site=example.com")).await;
    assert!(list.contains("1 proxies") && list.contains("banned for example.com"), "{list}");

    // Forged: the session cookie without the console's origin, from
    // another site, or no cookie at all.
    let session = cookie.split(';').next().unwrap().to_owned();
    for (origin, with_cookie) in [(None, true), (Some("http://evil.example"), true), (None, false)]
    {
        let mut request =
            script().post(format!("{base}/ui/proxies/uid-2/quarantine")).form(&[("site", "")]);
        if let Some(origin) = origin {
            request = request.header("origin", origin);
        }
        if with_cookie {
            request = request.header("cookie", &session);
        }
        let status = request.send().await.unwrap().status();
        assert!(matches!(status.as_u16(), 401 | 403), "{origin:?} {with_cookie}: {status}");
    }
    assert!(served.fleet.get("uid-2").unwrap().quarantined_until.is_none());
    assert!(served.fleet.get("uid-2").unwrap().banned_sites.is_empty());

    let lifted = operator
        .post(format!("{base}/ui/proxies/uid-1/lift"))
        .form(&[("back", "/ui/proxies/uid-1")])
        .send()
        .await
        .unwrap();
    assert_eq!(lifted.status(), StatusCode::SEE_OTHER);
    assert!(served.fleet.get("uid-1").unwrap().banned_sites.is_empty());

    // A bad value is named with its fix.
    let bad = operator
        .post(format!("{base}/ui/proxies/uid-1/quarantine"))
        .form(&[("minutes", "forever")])
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    assert!(bad.text().await.unwrap().contains("minutes: \"forever\""));
    let _ = served.stop.send(());
}

#[tokio::test]
async fn open_pages_hear_of_changes_within_the_spacing() {
    use futures::StreamExt as _;
    let served = serve("").await;
    let response = script().get(format!("{}/ui/live", served.base)).send().await.unwrap();
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut events = response.bytes_stream();
    let first = events.next().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("event: hello"));
    served.fleet.quarantine("uid-2", None, Duration::from_secs(60)).unwrap();
    let next = tokio::time::timeout(Duration::from_secs(10), events.next())
        .await
        .expect("a change event")
        .unwrap()
        .unwrap();
    assert!(String::from_utf8_lossy(&next).contains("event: change"), "{next:?}");
    let _ = served.stop.send(());
}

#[tokio::test]
async fn a_bad_filter_is_named_with_its_fix() {
    let served = serve("").await;
    let (status, _, body) =
        page(&script(), &format!("{}/ui/proxies?phase=running", served.base)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.contains("phase: &quot;running&quot; is not a phase"), "{body}");
    let _ = served.stop.send(());
}

#[tokio::test]
async fn every_action_is_recorded_by_the_mode_and_a_replacement_goes_to_it() {
    let mode = Arc::new(RecordingMode::default());
    let served = serve_with("operator role=operate\n", Some(Arc::clone(&mode) as _)).await;
    let base = &served.base;
    let operator = browser(base);
    assert_eq!(sign_in(&operator, base, "operator").await, StatusCode::SEE_OTHER);
    let (_, _, body) = page(&operator, &format!("{base}/ui/proxies/uid-1")).await;
    assert!(body.contains("Replace instance</button>"), "{body}");
    let post = |path: &str, form: &[(&str, &str)]| {
        operator.post(format!("{base}{path}")).form(form).send()
    };
    let replaced =
        post("/ui/proxies/uid-1/replace", &[("back", "/ui/proxies/uid-1")]).await.unwrap();
    assert_eq!(replaced.status(), StatusCode::SEE_OTHER);
    let proxy =
        ProxyRef { id: "uid-1".into(), namespace: "default".into(), name: "proxy-1".into() };
    assert_eq!(*mode.replaced.lock().unwrap(), std::slice::from_ref(&proxy));
    let done = post("/ui/proxies/uid-1/quarantine", &[("site", "example.com"), ("minutes", "5")]);
    assert_eq!(done.await.unwrap().status(), StatusCode::SEE_OTHER);
    let done = post("/ui/proxies/uid-1/lift", &[("site", "example.com")]);
    assert_eq!(done.await.unwrap().status(), StatusCode::SEE_OTHER);
    // Refused actions are answered with the mode's reason and recorded nowhere.
    let failed = post("/ui/proxies/uid-2/replace", &[]).await.unwrap();
    assert_eq!(failed.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(failed.text().await.unwrap().contains("the store is full"));
    let refused = post("/ui/providers/lab/rollback", &[]).await.unwrap();
    assert_eq!(refused.status(), StatusCode::CONFLICT);
    let gone = post("/ui/proxies/uid-9/replace", &[]).await.unwrap();
    assert_eq!(gone.status(), StatusCode::NOT_FOUND);
    assert_eq!(
        *mode.recorded.lock().unwrap(),
        [
            Action::Replace { proxy: proxy.clone() },
            Action::Quarantine {
                proxy: proxy.clone(),
                site: Some("example.com".into()),
                minutes: 5
            },
            Action::PutBack { proxy, site: Some("example.com".into()) },
        ]
    );
    // The console's own activity says it too.
    let activity = served.fleet.activity(Some("uid-1"), 10);
    assert!(activity.iter().any(|a| a.what.contains("new instance")), "{activity:?}");
    let _ = served.stop.send(());
}

/// Two replicas (or a process and the next after a restart) that share
/// the mode's session key accept each other's sessions; without it, a
/// session ends with its process.
#[tokio::test]
async fn a_session_under_the_modes_key_outlives_its_process() {
    const TOKENS: &str = "operator role=operate\n";
    let keyed =
        || Arc::new(RecordingMode { session_key: Some([7; 32]), ..RecordingMode::default() });
    let first = serve_with(TOKENS, Some(keyed() as _)).await;
    let client = browser(&first.base);
    assert_eq!(sign_in(&client, &first.base, "operator").await, StatusCode::SEE_OTHER);
    let login = client
        .post(format!("{}/ui/login", first.base))
        .form(&[("token", "operator")])
        .send()
        .await
        .unwrap();
    let cookie =
        login.headers()["set-cookie"].to_str().unwrap().split(';').next().unwrap().to_owned();
    let _ = first.stop.send(());

    let signed_in = |base: String, cookie: String| async move {
        let response = script()
            .get(format!("{base}/ui/proxies"))
            .header("cookie", cookie)
            .send()
            .await
            .unwrap();
        response.status()
    };
    let second = serve_with(TOKENS, Some(keyed() as _)).await;
    assert_eq!(signed_in(second.base.clone(), cookie.clone()).await, StatusCode::OK);
    let unkeyed = serve_with(TOKENS, None).await;
    assert_eq!(
        signed_in(unkeyed.base.clone(), cookie).await,
        StatusCode::SEE_OTHER,
        "another key: to the sign-in page"
    );
    let _ = second.stop.send(());
    let _ = unkeyed.stop.send(());
}
