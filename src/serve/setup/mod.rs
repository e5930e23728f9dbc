//! Setup mode (issue 13): `kodx serve` without a GitHub App serves a page that creates one
//! through GitHub's App manifest flow, or imports an existing one, saves its credentials
//! ([`store`]) and switches the server to normal mode without a restart.
//!
//! - Only the holder of the one-time token printed on the terminal can use it: every form
//!   carries the token, and the `state` sent to GitHub is bound to it ([`manifest`]).
//! - Webhooks get `503` with a one-line reason; the database and the queue are not used.
//! - The callback's answer is the `done` page: the checks `kodx doctor` makes of the new
//!   App (GitHub, permissions and events, database, Docker) and the install link.

pub mod manifest;
pub mod page;
pub mod store;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

use crate::db::Db;
use crate::github::{convert_manifest, GitHubApp};
use crate::serve::config::{CredentialSource, ServeConfig, SetupConfig};
use crate::serve::pipeline::engines::Engines;
use manifest::Owner;
use page::CheckLine;
use store::SavedApp;

/// Forms are small; a private key is ~1.7 KB.
const MAX_FORM_BYTES: usize = 64 * 1024;

/// The secret in the one-time setup URL.
pub struct SetupToken(SecretString);

impl SetupToken {
    pub fn new() -> SetupToken {
        SetupToken(hex::encode(rand::random::<[u8; 32]>()).into())
    }

    fn matches(&self, given: &str) -> bool {
        let mine = self.0.expose_secret().as_bytes();
        let given = given.as_bytes();
        mine.len() == given.len() && mine.iter().zip(given).fold(0u8, |a, (x, y)| a | (x ^ y)) == 0
    }
}

impl Default for SetupToken {
    fn default() -> Self {
        Self::new()
    }
}

/// The one-time URL to print: the listener's address (`127.0.0.1` for a wildcard).
pub fn local_url(addr: Option<SocketAddr>, token: &SetupToken) -> String {
    let addr = match addr {
        Some(mut a) if a.ip().is_unspecified() => {
            a.set_ip(std::net::IpAddr::from([127, 0, 0, 1]));
            a.to_string()
        }
        Some(a) => a.to_string(),
        None => "127.0.0.1:3000".into(),
    };
    format!("http://{addr}/?token={}", token.0.expose_secret())
}

/// Turns the server into normal mode with `config`; returns the checks' lines.
#[async_trait::async_trait]
pub trait Activate: Send + Sync {
    async fn activate(&self, config: ServeConfig) -> anyhow::Result<Vec<CheckLine>>;
}

/// The checks of `kodx doctor` that concern a new App: GitHub takes its JWT, it has the
/// permissions and events kodx needs, the database opened, the Docker engine answers.
pub async fn checks(app: &GitHubApp, db: &Db, engine: &Engines) -> Vec<CheckLine> {
    let _ = db;
    let mut lines = Vec::new();
    let mut line = |tag, text: String| lines.push(CheckLine { tag, text });
    match app.app_info().await {
        Ok(info) => {
            line(
                "ok",
                format!(
                    "GitHub ({}) accepts the App JWT: App {} ({})",
                    app.api_url(),
                    info.id,
                    info.slug
                ),
            );
            let (permissions, events) = manifest::missing_grants(&info);
            if permissions.is_empty() && events.is_empty() {
                line(
                    "ok",
                    "GitHub App permissions and webhook events are what kodx needs".into(),
                );
            } else {
                line(
                    "fail",
                    format!(
                        "GitHub App lacks permissions [{}] events [{}]: add them under the App's settings → Permissions & events",
                        permissions.join(", "),
                        events.join(", ")
                    ),
                );
            }
        }
        Err(e) => line("fail", format!("GitHub: {e}")),
    }
    line("ok", "database opened".into());
    match engine.ping().await {
        Ok(()) => line("ok", "Docker engine answers".into()),
        Err(e) => line("fail", format!("Docker: {e}")),
    }
    lines
}

/// Setup mode's state.
#[derive(Clone)]
pub struct SetupMode {
    inner: Arc<Inner>,
}

struct Inner {
    config: SetupConfig,
    token: SetupToken,
    activate: Arc<dyn Activate>,
    /// The `state`s handed out to GitHub and not yet used.
    states: parking_lot::Mutex<manifest::States>,
    /// Held while credentials are saved and the server switches; `true` once it has.
    finished: tokio::sync::Mutex<bool>,
}

impl SetupMode {
    pub fn new(config: SetupConfig, token: SetupToken, activate: Arc<dyn Activate>) -> SetupMode {
        SetupMode {
            inner: Arc::new(Inner {
                config,
                token,
                activate,
                states: Default::default(),
                finished: tokio::sync::Mutex::new(false),
            }),
        }
    }
}

/// Setup mode's routes.
pub fn router(state: SetupMode) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/setup/create", post(create))
        .route("/setup/callback", get(callback))
        .route("/setup/import", post(import))
        .route("/webhook", post(webhook))
        .route("/api/github/webhooks", post(webhook))
        .route("/healthz", get(healthz))
        .layer(DefaultBodyLimit::max(MAX_FORM_BYTES))
        .with_state(state)
}

fn page(status: StatusCode, markup: maud::Markup) -> Response {
    (
        status,
        page::page_headers("default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; form-action *; base-uri 'none'"),
        Html(markup.into_string()),
    )
        .into_response()
}

fn refused(status: StatusCode, title: &str, text: &str) -> Response {
    page(status, page::message(title, text))
}

fn wrong_token() -> Response {
    refused(
        StatusCode::FORBIDDEN,
        "Setup link needed",
        "Open the one-time URL kodx serve printed on its terminal (it carries the setup token).",
    )
}

const WEBHOOK_503: &str = "kodx is in setup mode: no GitHub App is configured yet; open the setup URL printed by kodx serve";

async fn webhook() -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        axum::Json(serde_json::json!({ "error": WEBHOOK_503 })),
    )
        .into_response()
}

async fn healthz() -> Response {
    (StatusCode::SERVICE_UNAVAILABLE, format!("{WEBHOOK_503}\n")).into_response()
}

/// The request's `Host`, when it is a plain host and port.
fn host(headers: &HeaderMap) -> Option<&str> {
    let host = headers.get("host")?.to_str().ok()?;
    let ok = !host.is_empty()
        && host.len() <= 255
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-.:[]".contains(&b));
    ok.then_some(host)
}

/// `http://HOST` of the request, as the browser reached it.
fn origin(headers: &HeaderMap) -> Option<String> {
    host(headers).map(|h| format!("http://{h}"))
}

/// Where GitHub sends the browser back to after creating the App. When the browser
/// reached kodx by the host of a public URL (`KODX_PUBLIC_URL` first, then the one in
/// the form), that URL, with its scheme: behind a TLS proxy the browser must come back
/// over `https`, and the code in the query must not cross the network in clear. Else the
/// address the browser used (`http://127.0.0.1:3000` of a local setup).
fn callback_base(public_urls: &[&str], headers: &HeaderMap) -> Option<String> {
    let host = host(headers)?;
    let same_host = |public: &str| {
        let public = reqwest::Url::parse(public).ok()?;
        let reached = reqwest::Url::parse(&format!("{}://{host}", public.scheme())).ok()?;
        let same = public.host() == reached.host()
            && public.port_or_known_default() == reached.port_or_known_default();
        same.then(|| public.as_str().trim_end_matches('/').to_string())
    };
    public_urls
        .iter()
        .find_map(|u| same_host(u))
        .or_else(|| Some(format!("http://{host}")))
}

#[derive(Deserialize)]
struct TokenQuery {
    token: Option<String>,
}

async fn index(
    State(s): State<SetupMode>,
    headers: HeaderMap,
    Query(q): Query<TokenQuery>,
) -> Response {
    let Some(token) = q.token.filter(|t| s.inner.token.matches(t)) else {
        return wrong_token();
    };
    let public_url = s
        .inner
        .config
        .public_url
        .clone()
        .or_else(|| origin(&headers))
        .unwrap_or_default();
    let name = manifest::default_app_name();
    page(
        StatusCode::OK,
        page::setup(&page::SetupForm {
            token: &token,
            name: &name,
            public_url: &public_url,
            org: "",
            github_url: &s.inner.config.github_url,
            error: None,
        }),
    )
}

#[derive(Deserialize)]
struct CreateForm {
    token: String,
    name: String,
    owner: String,
    #[serde(default)]
    org: String,
    public_url: String,
}

async fn create(
    State(s): State<SetupMode>,
    headers: HeaderMap,
    Form(f): Form<CreateForm>,
) -> Response {
    if !s.inner.token.matches(&f.token) {
        return wrong_token();
    }
    if host(&headers).is_none() {
        return refused(
            StatusCode::BAD_REQUEST,
            "Setup failed",
            "the request has no usable Host header",
        );
    }
    let checked = (|| {
        let name = manifest::check_name(&f.name)?;
        let owner = match f.owner.as_str() {
            "organization" => Owner::Organization(manifest::check_org(&f.org)?),
            _ => Owner::Personal,
        };
        let public_url = manifest::check_public_url(&f.public_url)?;
        Ok::<_, String>((name, owner, public_url))
    })();
    let (name, owner, public_url) = match checked {
        Ok(v) => v,
        Err(e) => {
            return page(
                StatusCode::UNPROCESSABLE_ENTITY,
                page::setup(&page::SetupForm {
                    token: &f.token,
                    name: &f.name,
                    public_url: &f.public_url,
                    org: &f.org,
                    github_url: &s.inner.config.github_url,
                    error: Some(&e),
                }),
            )
        }
    };
    // GitHub sends webhooks to kodx, or to the proxy channel kodx listens to.
    let hook_url = match &s.inner.config.webhook_proxy_url {
        Some(channel) => channel.clone(),
        None => format!("{public_url}/webhook"),
    };
    let publics: Vec<&str> = s
        .inner
        .config
        .public_url
        .iter()
        .map(String::as_str)
        .chain([public_url.as_str()])
        .collect();
    let back = callback_base(&publics, &headers).unwrap_or_default();
    let manifest = manifest::manifest(
        &name,
        &public_url,
        &hook_url,
        &format!("{back}/setup/callback"),
    );
    let state = s
        .inner
        .states
        .lock()
        .issue(s.inner.token.0.expose_secret().as_bytes(), Instant::now());
    let action = manifest::new_app_url(&s.inner.config.github_url, &owner, &state);
    page(
        StatusCode::OK,
        page::to_github(&action, &manifest.to_string()),
    )
}

#[derive(Deserialize)]
struct CallbackQuery {
    code: Option<String>,
    state: Option<String>,
}

async fn callback(State(s): State<SetupMode>, Query(q): Query<CallbackQuery>) -> Response {
    let token = s.inner.token.0.expose_secret().as_bytes();
    let state = q.state.as_deref().unwrap_or("");
    if let Err(e) = s.inner.states.lock().redeem(token, state, Instant::now()) {
        return refused(
            StatusCode::FORBIDDEN,
            "Setup refused",
            &format!("{e}: start again from the one-time URL"),
        );
    }
    let Some(code) = q.code else {
        return refused(
            StatusCode::BAD_REQUEST,
            "Setup failed",
            "GitHub sent no code back: start again from the setup page",
        );
    };
    let mut finished = s.inner.finished.lock().await;
    if *finished {
        return already_done();
    }
    let app = match convert_manifest(&s.inner.config.github_api_url, &code).await {
        Ok(app) => app,
        Err(e) => {
            tracing::warn!("setup: the manifest conversion failed: {e}");
            return refused(
                StatusCode::BAD_GATEWAY,
                "Setup failed",
                &format!("{e} (the code is valid for one hour and one use: start again from the setup page)"),
            );
        }
    };
    let install_url = format!("{}/installations/new", app.html_url);
    let saved = SavedApp {
        app_id: app.id,
        private_key: app.pem,
        webhook_secret: app.webhook_secret,
        slug: Some(app.slug.clone()),
        html_url: Some(app.html_url),
    };
    finish(&s, &mut finished, saved, &app.slug, Some(&install_url)).await
}

#[derive(Deserialize)]
struct ImportForm {
    token: String,
    app_id: String,
    private_key: String,
    webhook_secret: String,
}

async fn import(State(s): State<SetupMode>, Form(f): Form<ImportForm>) -> Response {
    if !s.inner.token.matches(&f.token) {
        return wrong_token();
    }
    let bad = |text: String| refused(StatusCode::UNPROCESSABLE_ENTITY, "Import failed", &text);
    let Some(app_id) = f.app_id.trim().parse::<u64>().ok().filter(|&id| id > 0) else {
        return bad("the App ID is the number under the App's settings → About → App ID".into());
    };
    if f.webhook_secret.trim().is_empty() {
        return bad("the webhook secret is empty".into());
    }
    let pem = f.private_key.replace("\r\n", "\n");
    // The key and the id must belong together: GitHub says so before anything is saved.
    let info = match GitHubApp::new(&s.inner.config.github_api_url, app_id, &pem) {
        Ok(app) => app.app_info().await,
        Err(e) => return bad(e.to_string()),
    };
    let info = match info {
        Ok(info) if info.id == app_id => info,
        Ok(info) => {
            return bad(format!(
                "GitHub says this key belongs to App {}, not {app_id}",
                info.id
            ))
        }
        Err(e) => {
            return bad(format!(
                "{e} (check the App ID and that the key is the App's)"
            ))
        }
    };
    let mut finished = s.inner.finished.lock().await;
    if *finished {
        return already_done();
    }
    let html_url = format!("{}/apps/{}", s.inner.config.github_url, info.slug);
    let install_url = format!("{html_url}/installations/new");
    let saved = SavedApp {
        app_id,
        private_key: pem.into(),
        webhook_secret: f.webhook_secret.trim().to_string().into(),
        slug: Some(info.slug.clone()),
        html_url: Some(html_url),
    };
    finish(&s, &mut finished, saved, &info.slug, Some(&install_url)).await
}

fn already_done() -> Response {
    refused(
        StatusCode::GONE,
        "Already set up",
        "this server already has its GitHub App",
    )
}

/// Saves the credentials and switches to normal mode; answers the `done` page.
async fn finish(
    s: &SetupMode,
    finished: &mut bool,
    saved: SavedApp,
    name: &str,
    install_url: Option<&str>,
) -> Response {
    let failed = |text: String| refused(StatusCode::INTERNAL_SERVER_ERROR, "Setup failed", &text);
    let credentials = match saved.credentials() {
        Ok(c) => c,
        Err(e) => return failed(e),
    };
    let path = match store::save(&s.inner.config.data_dir, &saved) {
        Ok(p) => p,
        Err(e) => return failed(e.to_string()),
    };
    tracing::info!(app_id = saved.app_id, file = %path.display(), "setup: saved the GitHub App's credentials");
    let config = s
        .inner
        .config
        .clone()
        .with_credentials(credentials, CredentialSource::Saved(path.clone()));
    match s.inner.activate.activate(config).await {
        Ok(lines) => {
            *finished = true;
            tracing::info!(app_id = saved.app_id, "setup done: kodx serve now takes webhooks");
            page(StatusCode::OK, page::done(name, install_url, &path.display().to_string(), &lines))
        }
        Err(e) => failed(format!(
            "the credentials are saved in {}, but the server could not start with them: {e:#} (fix it and restart kodx serve)",
            path.display()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_matches_only_itself() {
        let t = SetupToken::new();
        let s = t.0.expose_secret().to_string();
        assert_eq!(s.len(), 64);
        assert!(t.matches(&s));
        assert!(!t.matches(&s[..63]));
        assert!(!t.matches(""));
        assert!(!SetupToken::new().matches(&s));
        let url = local_url(Some("0.0.0.0:3000".parse().unwrap()), &t);
        assert_eq!(url, format!("http://127.0.0.1:3000/?token={s}"));
    }

    #[test]
    fn origin_is_the_host_the_browser_used() {
        let mut h = HeaderMap::new();
        h.insert("host", "127.0.0.1:3000".parse().unwrap());
        assert_eq!(origin(&h).as_deref(), Some("http://127.0.0.1:3000"));
        h.insert("host", "evil.com/\"<x>".parse().unwrap());
        assert_eq!(origin(&h), None);
    }

    #[test]
    fn github_sends_the_browser_back_the_way_it_came() {
        let mut h = HeaderMap::new();
        let public = ["https://kodx.example.com"];
        h.insert("host", "kodx.example.com".parse().unwrap());
        let back = |p: &[&str], h: &HeaderMap| callback_base(p, h).unwrap();
        assert_eq!(back(&public, &h), "https://kodx.example.com");
        h.insert("host", "KODX.example.com:443".parse().unwrap());
        assert_eq!(back(&public, &h), "https://kodx.example.com");
        // A path prefix stays, as in the webhook's URL.
        assert_eq!(
            back(&["https://example.com/kodx"], &{
                let mut h = HeaderMap::new();
                h.insert("host", "example.com".parse().unwrap());
                h
            }),
            "https://example.com/kodx"
        );
        // Another host or port: the address the browser used (a local setup).
        h.insert("host", "127.0.0.1:3000".parse().unwrap());
        assert_eq!(back(&public, &h), "http://127.0.0.1:3000");
        h.insert("host", "kodx.example.com:8443".parse().unwrap());
        assert_eq!(back(&public, &h), "http://kodx.example.com:8443");
        assert_eq!(back(&[], &h), "http://kodx.example.com:8443");
        h.insert("host", "evil.com/x".parse().unwrap());
        assert_eq!(callback_base(&public, &h), None);
    }
}
