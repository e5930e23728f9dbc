//! Setup mode (issue 13) against the real `kodx serve` binary and the fake GitHub's web
//! side: no App configured → the setup page behind a one-time token, the manifest posted
//! as GitHub's form expects, the callback's conversion, credentials saved 0600, and the
//! same server then takes webhooks signed with the NEW secret and acts as the NEW App.

use std::os::unix::fs::PermissionsExt as _;
use std::time::Duration;

use crate::common;
use crate::common::serve::{delivery_id, sign, Options, Served};

fn enc(pairs: &[(&str, &str)]) -> String {
    let e = |v: &str| {
        percent_encoding::utf8_percent_encode(v, percent_encoding::NON_ALPHANUMERIC).to_string()
    };
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", e(k), e(v)))
        .collect::<Vec<_>>()
        .join("&")
}

fn unescape(s: &str) -> String {
    s.replace("&quot;", "\"")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
}

/// The value of the first `attr="…"` after `marker` in `html`.
fn attr_after(html: &str, marker: &str, attr: &str) -> String {
    let at = html
        .find(marker)
        .unwrap_or_else(|| panic!("{marker} in {html}"));
    let rest = &html[at..];
    let start = rest.find(&format!("{attr}=\"")).unwrap() + attr.len() + 2;
    let end = rest[start..].find('"').unwrap();
    unescape(&rest[start..start + end])
}

/// The one-time URL kodx serve printed.
/// `POST /setup/import` with `token`, `app_id` and `webhook_secret` (the fake's key):
/// the status and the answer's text.
async fn import(s: &Served, token: &str, app_id: &str, secret: &str) -> (u16, String) {
    let answer = reqwest::Client::new()
        .post(format!("{}/setup/import", s.url))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(enc(&[
            ("token", token),
            ("app_id", app_id),
            ("private_key", common::fake_github::TEST_APP_KEY),
            ("webhook_secret", secret),
        ]))
        .send()
        .await
        .unwrap();
    (answer.status().as_u16(), answer.text().await.unwrap())
}

/// The message of a setup page's error card (the page around it is the same for every
/// error).
fn error_card(page: &str) -> &str {
    page.split_once("<div class=\"card error\">")
        .and_then(|(_, rest)| rest.split_once("</div></main></body></html>"))
        .map(|(card, _)| card)
        .unwrap_or_else(|| panic!("no error card in {page}"))
}

pub async fn setup_url(s: &Served) -> String {
    let mut url = None;
    s.wait_for("the setup URL", Duration::from_secs(10), || {
        url = s
            .log()
            .lines()
            .find(|l| l.trim_start().starts_with("http") && l.contains("/?token="))
            .map(|l| l.trim().to_string());
        url.is_some()
    })
    .await;
    url.unwrap()
}

pub async fn start_in_setup_mode() -> Served {
    let data = tempfile::tempdir().unwrap().keep();
    Served::start(Options {
        workers: true,
        setup_mode: true,
        extra_env: vec![(
            "KODX_DATA_DIR".into(),
            data.join("data").display().to_string(),
        )],
        ..Options::default()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_creates_the_app_and_serves_it_without_a_restart() {
    let s = start_in_setup_mode().await;
    let old_app = s.github.app_id();
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::limited(5))
        .build()
        .unwrap();

    // Webhooks: 503 with one line saying why.
    let (status, answer) = s
        .deliver("ping", &delivery_id(), &serde_json::json!({}))
        .await;
    assert_eq!(status, 503, "{answer}");
    insta::assert_snapshot!(answer["error"].as_str().unwrap(), @"kodx is in setup mode: no GitHub App is configured yet; open the setup URL printed by kodx serve");

    // Without the token: nothing.
    let (status, body) = s.get("/").await;
    assert_eq!(status, 403, "{body}");
    assert!(!body.contains("<form"), "{body}");
    let (status, _) = s.get("/?token=0000").await;
    assert_eq!(status, 403);

    let url = setup_url(&s).await;
    let token = url.split("token=").nth(1).unwrap().to_string();
    let page = http.get(&url).send().await.unwrap();
    assert_eq!(page.status(), 200);
    let page = page.text().await.unwrap();
    assert!(
        page.contains("Create the App on GitHub") && page.contains("Import"),
        "{page}"
    );
    let name = attr_after(&page, "id=\"name\"", "value");
    assert!(name.starts_with("kodx-"), "{name}");

    // A bad organization name comes back on the form.
    let bad = http
        .post(format!("{}/setup/create", s.url))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(enc(&[
            ("token", token.as_str()),
            ("name", "x"),
            ("owner", "organization"),
            ("org", "a/b"),
            ("public_url", "https://kodx.example.com"),
        ]))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 422);

    let to_github = http
        .post(format!("{}/setup/create", s.url))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(enc(&[
            ("token", token.as_str()),
            ("name", name.as_str()),
            ("owner", "organization"),
            ("org", "acme"),
            ("public_url", "https://kodx.example.com/"),
        ]))
        .send()
        .await
        .unwrap();
    assert_eq!(to_github.status(), 200);
    let html = to_github.text().await.unwrap();
    let action = attr_after(&html, "id=\"manifest-form\"", "action");
    assert!(
        action.starts_with(&format!(
            "{}/organizations/acme/settings/apps/new?state=",
            s.github.root()
        )),
        "{action}"
    );
    let manifest_text = attr_after(&html, "name=\"manifest\"", "value");
    let manifest: serde_json::Value = serde_json::from_str(&manifest_text).unwrap();
    assert_eq!(
        manifest["hook_attributes"]["url"],
        "https://kodx.example.com/webhook"
    );
    assert_eq!(common::fake_github::manifest_problem(&manifest), None);

    // A forged state is refused before GitHub is asked anything.
    let forged = http
        .get(format!("{}/setup/callback?code=abc&state=0123.4567", s.url))
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), 403);

    // The browser posts the form to GitHub, which redirects back to the callback.
    let done = http
        .post(&action)
        .header("user-agent", "Mozilla/5.0 (test)")
        .header("content-type", "application/x-www-form-urlencoded")
        .body(enc(&[("manifest", manifest_text.as_str())]))
        .send()
        .await
        .unwrap();
    let done_status = done.status();
    let done = done.text().await.unwrap();
    assert_eq!(done_status, 200, "{done}\n{}", s.log());
    let new_app = s.github.app_id();
    assert_ne!(new_app, old_app);
    let slug = s.github.slug();
    assert!(
        done.contains(&format!(
            "{}/apps/{slug}/installations/new",
            s.github.root()
        )),
        "{done}"
    );
    assert!(
        done.contains("accepts the App JWT")
            && done.contains("permissions and webhook events are what kodx needs"),
        "{done}"
    );

    // Saved 0600; nothing secret in the log.
    let data = s.log();
    let saved_line = done
        .split("saved in <code>")
        .nth(1)
        .and_then(|r| r.split("</code>").next())
        .unwrap()
        .to_string();
    let meta = std::fs::metadata(&saved_line).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&saved_line).unwrap()).unwrap();
    assert_eq!(saved["app_id"], new_app);
    let new_secret = saved["webhook_secret"].as_str().unwrap().to_string();
    assert!(
        !data.contains(&new_secret) && !data.contains("PRIVATE KEY"),
        "{data}"
    );

    // A second callback is refused: the setup is done.
    let again = http
        .get(format!("{}/setup/callback?code=abc&state=0123.4567", s.url))
        .send()
        .await
        .unwrap();
    assert_ne!(again.status(), 200);

    // Now the same server takes webhooks signed with the NEW secret, acting as the NEW App.
    common::serve::new_app_takes_webhooks(&s, &new_secret).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_checks_the_key_with_github_before_saving() {
    let s = start_in_setup_mode().await;
    let url = setup_url(&s).await;
    let token = url.split("token=").nth(1).unwrap().to_string();
    let (status, _) = import(&s, &token, "99", "imported-secret-1").await;
    assert_eq!(status, 422);
    let (status, _) = import(&s, "x", "4242", "imported-secret-1").await;
    assert_eq!(status, 403);
    // A comma inside: one secret, not a rotation list (issue 26).
    let app_id = s.github.app_id().to_string();
    let (status, text) = import(&s, &token, &app_id, "imported-secret-1,x").await;
    assert_eq!(status, 200, "{text}\n{}", s.log());
    assert!(text.contains("installations/new"), "{text}");
    // Normal mode: a delivery signed with the imported secret is taken.
    let body = serde_json::json!({"zen": "hi", "hook_id": 1})
        .to_string()
        .into_bytes();
    let (status, answer) = s
        .post_raw(
            "ping",
            Some(&delivery_id()),
            Some(&sign("imported-secret-1,x", &body)),
            body.clone(),
        )
        .await;
    assert!(status < 300, "{status} {answer}");
    // A part of it is no key.
    for part in ["x", "imported-secret-1"] {
        let (status, answer) = s
            .post_raw(
                "ping",
                Some(&delivery_id()),
                Some(&sign(part, &body)),
                body.clone(),
            )
            .await;
        assert_eq!(status, 401, "{part}: {answer}");
    }
}

/// The manifest and the form's action, as the setup page answers a create form posted
/// with `host` as the request's Host header.
async fn create_form(s: &Served, token: &str, host: Option<&str>) -> (serde_json::Value, String) {
    let mut req = reqwest::Client::new()
        .post(format!("{}/setup/create", s.url))
        .header("content-type", "application/x-www-form-urlencoded");
    if let Some(host) = host {
        req = req.header("host", host);
    }
    let html = req
        .body(enc(&[
            ("token", token),
            ("name", "kodx-edges"),
            ("owner", "personal"),
            ("org", ""),
            ("public_url", "https://kodx.example.com"),
        ]))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let manifest = attr_after(&html, "name=\"manifest\"", "value");
    let action = attr_after(&html, "id=\"manifest-form\"", "action");
    (serde_json::from_str(&manifest).unwrap(), action)
}

/// Issue 26 (4): behind a TLS proxy (`KODX_PUBLIC_URL=https://…`, reached by that host),
/// GitHub sends the browser back over https; a local setup keeps its own address. A
/// `state` is taken once: the same callback again is refused before GitHub is asked.
#[tokio::test]
async fn the_callback_is_https_behind_a_public_url_and_its_state_is_used_once() {
    let data = tempfile::tempdir().unwrap().keep();
    let s = Served::start(Options {
        setup_mode: true,
        extra_env: vec![
            (
                "KODX_DATA_DIR".into(),
                data.join("data").display().to_string(),
            ),
            ("KODX_PUBLIC_URL".into(), "https://kodx.example.com/".into()),
        ],
        ..Options::default()
    })
    .await;
    let url = setup_url(&s).await;
    let token = url.split("token=").nth(1).unwrap().to_string();
    let (manifest, _) = create_form(&s, &token, Some("kodx.example.com")).await;
    assert_eq!(
        manifest["redirect_url"],
        "https://kodx.example.com/setup/callback"
    );
    let local = s.url.trim_start_matches("http://").to_string();
    let (manifest, action) = create_form(&s, &token, None).await;
    assert_eq!(
        manifest["redirect_url"],
        format!("http://{local}/setup/callback")
    );

    // The state handed out is good once: a callback that fails at GitHub (an unknown
    // code) spends it, and the same URL again is refused here.
    let state = action.split("state=").nth(1).unwrap();
    let state = percent_encoding::percent_decode_str(state)
        .decode_utf8()
        .unwrap()
        .to_string();
    let callback = format!(
        "{}/setup/callback?code=unknown&state={}",
        s.url,
        percent_encoding::utf8_percent_encode(&state, percent_encoding::NON_ALPHANUMERIC)
    );
    let first = reqwest::get(&callback).await.unwrap();
    assert_eq!(first.status(), 502, "{}", first.text().await.unwrap());
    let again = reqwest::get(&callback).await.unwrap();
    assert_eq!(again.status(), 403);
    let text = again.text().await.unwrap();
    let said = error_card(&text);
    common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(said, @"the state GitHub sent back was used already, is older than an hour, or kodx restarted since it was made: start again from the one-time URL"));
}

/// Issue 26 (7): an activation that fails (here: a damaged run-pages key in the data
/// directory) leaves nothing of normal mode running: no worker, no proxy subscription.
/// Once the cause is fixed, the next activation starts normal mode once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_activation_leaves_nothing_running() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let connections = std::sync::Arc::new(AtomicUsize::new(0));
    let c = connections.clone();
    let relay = axum::Router::new().route(
        "/AbCdEf123",
        axum::routing::get(move || {
            c.fetch_add(1, Ordering::SeqCst);
            async { ([("content-type", "text/event-stream")], "") }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let relay_url = format!("http://{}/AbCdEf123", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, relay).await.unwrap() });
    let data = tempfile::tempdir().unwrap().keep().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let key = data.join("run-pages.key");
    std::fs::write(&key, "not a key").unwrap();
    let s = Served::start(Options {
        workers: true,
        setup_mode: true,
        extra_env: vec![
            ("KODX_DATA_DIR".into(), data.display().to_string()),
            ("WEBHOOK_PROXY_URL".into(), relay_url),
        ],
        ..Options::default()
    })
    .await;
    let url = setup_url(&s).await;
    let token = url.split("token=").nth(1).unwrap().to_string();
    let app_id = s.github.app_id().to_string();
    let try_import = || import(&s, &token, &app_id, "imported-secret-1");
    let (status, text) = try_import().await;
    assert_eq!(status, 500, "{text}");
    let said = error_card(&text);
    common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(said, @"the credentials are saved in [tmp] but the server could not start with them: the run pages' key in KODX_DATA_DIR=[tmp] (set run_pages = false to do without): [tmp] is not a 32-byte key; delete it to make a new one (the links made with it stop working) (fix it and restart kodx serve)"));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(connections.load(Ordering::SeqCst), 0, "{}", s.log());
    assert!(!s.log().contains("kodx serve is listening"), "{}", s.log());
    let (status, _) = s.get("/healthz").await;
    assert_eq!(status, 503, "still in setup mode");

    std::fs::remove_file(&key).unwrap();
    let (status, text) = try_import().await;
    assert_eq!(status, 200, "{text}\n{}", s.log());
    s.wait_for("the proxy subscription", Duration::from_secs(30), || {
        connections.load(Ordering::SeqCst) >= 1
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        s.log()
            .matches("receiving webhooks from the proxy channel")
            .count(),
        1,
        "{}",
        s.log()
    );
}

/// With `WEBHOOK_PROXY_URL`, the App the setup page creates sends its webhooks to the
/// proxy channel kodx listens to, not to the public URL.
#[tokio::test]
async fn with_a_proxy_channel_the_manifest_hooks_the_channel() {
    let data = tempfile::tempdir().unwrap().keep();
    let s = Served::start(Options {
        workers: true,
        setup_mode: true,
        extra_env: vec![
            (
                "KODX_DATA_DIR".into(),
                data.join("data").display().to_string(),
            ),
            (
                "WEBHOOK_PROXY_URL".into(),
                "https://smee.io/AbCdEf123".into(),
            ),
        ],
        ..Options::default()
    })
    .await;
    let url = setup_url(&s).await;
    let token = url.split("token=").nth(1).unwrap().to_string();
    let html = reqwest::Client::new()
        .post(format!("{}/setup/create", s.url))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(enc(&[
            ("token", token.as_str()),
            ("name", "kodx-proxy"),
            ("owner", "personal"),
            ("org", ""),
            ("public_url", "http://127.0.0.1:3000"),
        ]))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let manifest_text = attr_after(&html, "name=\"manifest\"", "value");
    let manifest: serde_json::Value = serde_json::from_str(&manifest_text).unwrap();
    assert_eq!(
        manifest["hook_attributes"]["url"],
        "https://smee.io/AbCdEf123"
    );
    assert_eq!(common::fake_github::manifest_problem(&manifest), None);
}
