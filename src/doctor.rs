//! `kodx doctor`: checks what kodx needs and says how to fix what is missing.
//!
//! One line per check: `ok    …`, `FAIL  … — how to fix`, `note  …` (worth knowing, not an
//! error) or `warn  …`. The exit code is non-zero when any check failed. Secrets (the private
//! key, the webhook secret, model API keys) are never printed: every line is scrubbed of
//! them and of token shapes before it is written.
//!
//! The checks of `kodx serve` (configuration, key, webhook secret, GitHub, database) run
//! when any of its variables is set; without them one note says serve is not configured, so
//! `kodx doctor` stays useful to `kodx run` users, who need only Docker and a model key.
//!
//! `kodx doctor --healthz URL` does nothing but GET the URL: exit 0 on `200`, else 1 with one
//! line saying why (a container `HEALTHCHECK` that needs no curl in the image).

mod egress;
mod healthz;

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use kodx::db::Db;
use kodx::github::{AppInfo, GitHubApp, GitHubError, RequestPolicy, USER_AGENT};
use kodx::sandbox::Engine;
use kodx::serve::config::{ServeConfig, DEFAULT_DATA_DIR};
use secrecy::ExposeSecret;

/// The sandbox image checked when neither `--image`, `KODX_IMAGE` nor the server config names
/// one.
const DEFAULT_IMAGE: &str = "python:3.12";

/// Webhook secrets shorter than this get a note.
const MIN_SECRET_CHARS: usize = 16;

/// What the App must be allowed (SPEC §2, docs/deploy.md): permission, least level.
const REQUIRED_PERMISSIONS: [(&str, &str); 4] = [
    ("contents", "write"),
    ("issues", "write"),
    ("pull_requests", "write"),
    ("metadata", "read"),
];

/// The webhook events kodx acts on.
const REQUIRED_EVENTS: [&str; 3] = ["issue_comment", "issues", "pull_request_review_comment"];

/// What kodx asks for besides and works without (SPEC §11): permission, least level, and
/// what it gives.
const OPTIONAL_PERMISSIONS: [(&str, &str, &str); 3] = [
    ("checks", "write", "the `kodx` Check Run; CI repair"),
    (
        "actions",
        "write",
        "job logs in CI repair reports; failed jobs re-run before a repair",
    ),
    ("statuses", "read", "commit statuses in CI repair"),
];

/// The events of the pull request's life, and what each gives.
const OPTIONAL_EVENTS: [(&str, &str); 4] = [
    ("pull_request_review", "commands in a review's body"),
    ("check_suite", "CI repair"),
    ("workflow_run", "CI repair"),
    ("push", "keeping kodx's pull requests mergeable"),
];

/// Variables whose presence means "this machine is meant to run `kodx serve`".
const APP_VARS: [&str; 4] = [
    "APP_ID",
    "PRIVATE_KEY",
    "PRIVATE_KEY_PATH",
    "WEBHOOK_SECRET",
];

/// Time allowed for one request to a model API.
const MODEL_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(clap::Args)]
pub struct DoctorArgs {
    /// The sandbox image to check for [default: the server config's, else python:3.12].
    #[arg(long, env = "KODX_IMAGE")]
    image: Option<String>,
    /// Only GET this URL (e.g. http://127.0.0.1:3000/healthz): exit 0 on 200, else 1 with one
    /// line saying why. For a container HEALTHCHECK; runs no other check.
    #[arg(long, value_name = "URL")]
    healthz: Option<String>,
}

pub async fn run(args: DoctorArgs) -> anyhow::Result<ExitCode> {
    // reqwest is built without a default TLS provider; GitHubApp installs the same one.
    let _ = rustls::crypto::ring::default_provider().install_default();
    if let Some(url) = &args.healthz {
        return Ok(healthz::healthz(url).await);
    }
    let mut out = Report::new(secrets_from_env());

    let data_dir = env_value("KODX_DATA_DIR").unwrap_or_else(|| DEFAULT_DATA_DIR.into());
    let serve_intended = APP_VARS.iter().any(|v| env_value(v).is_some())
        || kodx::serve::setup::store::path(std::path::Path::new(&data_dir)).exists();
    let config = check_config(&mut out, serve_intended);
    if let Some(config) = &config {
        let app = check_private_key(&mut out, config);
        check_webhook_secret(&mut out);
        if let Some(app) = app {
            check_github(&mut out, &app).await;
        }
    }
    let image = args
        .image
        .clone()
        .or_else(|| config.as_ref().map(|c| c.settings.image.clone()))
        .unwrap_or_else(|| DEFAULT_IMAGE.to_string());
    let engines = config
        .as_ref()
        .map(|c| c.settings.engines.clone())
        .unwrap_or_default();
    let warm = config.as_ref().map(|c| c.settings.warm_sandboxes);
    let repositories = config.as_ref().map(|c| c.settings.warm_repositories);
    if engines.is_empty() {
        let engine = Engine::connect().await;
        check_docker(&mut out, &image, engine, None, (warm, repositories)).await;
    }
    for e in &engines {
        let warm = (e.warm_sandboxes.or(warm), repositories);
        check_docker(&mut out, &image, Engine::connect_to(e).await, Some(e), warm).await;
    }
    if let Some(config) = &config {
        check_database(&mut out, &config.database_url, &config.data_dir).await;
    }
    check_model_keys(&mut out, serve_intended).await;

    Ok(if out.failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// The lines of the report; remembers whether anything failed.
struct Report {
    /// Values never to print (the webhook secrets, model keys).
    secrets: Vec<String>,
    failed: bool,
}

impl Report {
    fn new(mut secrets: Vec<String>) -> Report {
        // Longest first, so a secret that contains another is replaced whole.
        secrets.retain(|s| s.chars().count() >= 4);
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        Report {
            secrets,
            failed: false,
        }
    }

    fn scrub(&self, text: &str) -> String {
        let mut text = text.to_string();
        for s in &self.secrets {
            text = text.replace(s.as_str(), "[REDACTED]");
        }
        kodx::redact::redact(&text)
    }

    /// One line: a message with line breaks is joined.
    fn line(&self, tag: &str, text: &str) {
        let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
        println!("{tag:<6}{}", self.scrub(&text));
    }

    fn ok(&mut self, text: impl AsRef<str>) {
        self.line("ok", text.as_ref());
    }

    fn note(&mut self, text: impl AsRef<str>) {
        self.line("note", text.as_ref());
    }

    fn warn(&mut self, text: impl AsRef<str>) {
        self.line("warn", text.as_ref());
    }

    /// A failed check: what is wrong, then what to do about it.
    fn fail(&mut self, text: impl AsRef<str>, fix: impl AsRef<str>) {
        self.failed = true;
        let fix = fix.as_ref();
        if fix.is_empty() {
            self.line("FAIL", text.as_ref());
        } else {
            self.line("FAIL", &format!("{} — {fix}", text.as_ref()));
        }
    }
}

/// A variable's value when it is set and not blank.
fn env_value(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn secrets_from_env() -> Vec<String> {
    let mut secrets: Vec<String> = webhook_secrets();
    for name in ["ANTHROPIC_API_KEY", "OPENAI_API_KEY"] {
        if let Some(v) = env_value(name) {
            secrets.push(v.trim().to_string());
        }
    }
    // The PEM's body lines (also when given with literal `\n`).
    if let Some(pem) = env_value("PRIVATE_KEY") {
        secrets.extend(
            pem.replace("\\n", "\n")
                .lines()
                .map(str::trim)
                .filter(|l| !l.starts_with("-----") && l.len() >= 16)
                .map(String::from),
        );
    }
    secrets
}

/// The `WEBHOOK_SECRET` items, split as the server splits them.
fn webhook_secrets() -> Vec<String> {
    env_value("WEBHOOK_SECRET")
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

fn check_config(out: &mut Report, serve_intended: bool) -> Option<ServeConfig> {
    if !serve_intended {
        out.note(
            "kodx serve is not configured (APP_ID, PRIVATE_KEY or PRIVATE_KEY_PATH, \
             WEBHOOK_SECRET are not set, and no App was saved by setup): its checks are \
             skipped; `kodx serve` starts in setup mode; `kodx run` needs none of them",
        );
        return None;
    }
    match ServeConfig::from_env() {
        Ok(c) => {
            let settings = match &c.config_file {
                Some(p) => format!("settings from {}", p.display()),
                None => "built-in settings (no config/kodx.toml)".to_string(),
            };
            out.ok(format!(
                "configuration: App {}, listening on {}, {settings}",
                c.app_id, c.listen
            ));
            out.ok(format!("App credentials from: {}", c.credential_source));
            Some(c)
        }
        Err(e) => {
            out.fail(
                format!("configuration: {e}"),
                "set the variables `kodx serve` reads (see docs/deploy.md)",
            );
            None
        }
    }
}

fn check_private_key(out: &mut Report, config: &ServeConfig) -> Option<GitHubApp> {
    let policy = RequestPolicy {
        connect_timeout: Duration::from_secs(5),
        request_timeout: Duration::from_secs(10),
        max_attempts: 2,
        ..RequestPolicy::default()
    };
    match GitHubApp::with_policy(
        &config.github_api_url,
        config.app_id,
        config.private_key.expose_secret(),
        policy,
    ) {
        Ok(app) => {
            out.ok("private key: signs the App JWT (RS256)");
            Some(app)
        }
        Err(e) => {
            let e = e.to_string();
            // The key's own errors already say to download a new one.
            let fix = if e.contains("download") {
                ""
            } else {
                "give the PEM file downloaded from the App's settings (PRIVATE_KEY_PATH=app.pem)"
            };
            out.fail(format!("private key: {e}"), fix);
            None
        }
    }
}

fn check_webhook_secret(out: &mut Report) {
    let secrets = webhook_secrets();
    let short = secrets
        .iter()
        .filter(|s| s.chars().count() < MIN_SECRET_CHARS)
        .count();
    let n = secrets.len();
    let what = if n == 1 {
        "1 secret".to_string()
    } else {
        format!("{n} secrets, comma-separated for rotation")
    };
    if short > 0 {
        out.note(format!(
            "webhook secret: set ({what}), but {short} of them shorter than {MIN_SECRET_CHARS} \
             characters: use a long random one (`openssl rand -hex 32`) in WEBHOOK_SECRET and in \
             the App's webhook settings"
        ));
    } else {
        out.ok(format!("webhook secret: set ({what})"));
    }
}

async fn check_github(out: &mut Report, app: &GitHubApp) {
    let url = app.api_url().to_string();
    let info = match tokio::time::timeout(Duration::from_secs(30), app.app_info()).await {
        Ok(r) => r,
        Err(_) => Err(GitHubError::Network {
            what: "GET /app".into(),
            message: "no answer within 30 s".into(),
        }),
    };
    let info = match info {
        Ok(info) => info,
        Err(GitHubError::Unauthorized { message, .. }) => {
            return out.fail(
                format!(
                    "GitHub ({url}) refused the App JWT for APP_ID {} (401: {message})",
                    app.app_id()
                ),
                "the private key does not belong to APP_ID: check APP_ID (App settings → About) \
                 or generate a new private key there; check this machine's clock too",
            );
        }
        Err(GitHubError::Network { message, .. }) => {
            return out.fail(
                format!("GitHub: cannot reach GITHUB_API_URL={url}: {message}"),
                "check GITHUB_API_URL (https://api.github.com, or https://HOST/api/v3 for GitHub \
                 Enterprise Server) and that this machine can reach it (DNS, proxy, firewall)",
            );
        }
        Err(e @ (GitHubError::NotFound { .. } | GitHubError::Decode { .. })) => {
            return out.fail(
                format!("GitHub: {e}"),
                format!(
                    "GITHUB_API_URL={url} does not look like GitHub's REST API (GitHub \
                     Enterprise Server: https://HOST/api/v3)"
                ),
            );
        }
        Err(e) => {
            return out.fail(
                format!("GitHub: {e}"),
                format!("check GITHUB_API_URL={url} and the App's settings"),
            );
        }
    };
    if info.id != app.app_id() {
        return out.fail(
            format!(
                "GitHub: the key signs for App {} but GET /app names App {}",
                app.app_id(),
                info.id
            ),
            "set APP_ID to the id of the App the key belongs to",
        );
    }
    out.ok(format!(
        "GitHub at {url}: the key belongs to App \"{}\" (id {}); it comments as {}[bot]",
        info.slug, info.id, info.slug
    ));
    check_app_settings(out, &info);
}

/// The App's permissions and webhook events, from `GET /app`: a missing one is why commands
/// never arrive or fail with 403, and is fixed only in the App's settings.
fn check_app_settings(out: &mut Report, info: &AppInfo) {
    let level = |p: &str| match info.permissions.get(p).map(String::as_str) {
        Some("admin") => 3,
        Some("write") => 2,
        Some("read") => 1,
        _ => 0,
    };
    let missing_permissions: Vec<String> = REQUIRED_PERMISSIONS
        .iter()
        .filter(|(p, need)| level(p) < if *need == "write" { 2 } else { 1 })
        .map(|(p, need)| format!("{p}: {need}"))
        .collect();
    let missing_events: Vec<&str> = REQUIRED_EVENTS
        .iter()
        .copied()
        .filter(|e| !info.events.iter().any(|have| have == e))
        .collect();
    check_optional_grants(out, info, &level);
    if missing_permissions.is_empty() && missing_events.is_empty() {
        out.ok("GitHub App permissions and webhook events are what kodx needs");
        return;
    }
    let mut what = Vec::new();
    if !missing_permissions.is_empty() {
        what.push(format!("permissions {}", missing_permissions.join(", ")));
    }
    if !missing_events.is_empty() {
        what.push(format!("events {}", missing_events.join(", ")));
    }
    out.fail(
        format!("GitHub App lacks {}", what.join(" and ")),
        "add them under the App's settings → Permissions & events, then accept the new \
         permissions on each installation",
    );
}

/// The optional permissions and events the App lacks: what works without them, said as a
/// warning (kodx runs; those features do not).
fn check_optional_grants(out: &mut Report, info: &AppInfo, level: &dyn Fn(&str) -> u8) {
    let mut missing: Vec<String> = OPTIONAL_PERMISSIONS
        .iter()
        .filter(|(p, need, _)| level(p) < if *need == "write" { 2 } else { 1 })
        .map(|(p, need, gives)| format!("permission {p}: {need} ({gives})"))
        .collect();
    missing.extend(
        OPTIONAL_EVENTS
            .iter()
            .filter(|(e, _)| !info.events.iter().any(|have| have == e))
            .map(|(e, gives)| format!("event {e} ({gives})")),
    );
    if !missing.is_empty() {
        out.warn(format!(
            "GitHub App lacks the optional {}: kodx works without them, minus those; add \
             them under the App's settings → Permissions & events",
            missing.join(", ")
        ));
    }
}

/// The warm sandboxes waiting on `engine` (made by any kodx serve), against the settings:
/// `warm_sandboxes`, then `warm_repositories` (those holding a repository's checkout).
async fn warm_pool(out: &mut Report, engine: &Engine, (warm, repositories): Warm) {
    let waiting = match engine.unclaimed_warm_sandboxes().await {
        Ok(n) => n,
        Err(e) => return out.warn(format!("could not list the warm sandboxes: {e}")),
    };
    match warm {
        Some(0) if waiting == 0 => out.note(
            "warm sandboxes are off (warm_sandboxes = 0): every run starts its own container",
        ),
        Some(n) => out.ok(format!(
            "warm sandboxes: {waiting} waiting on this engine (warm_sandboxes = {n} per \
             server; `kodx serve` makes them at start, each an idle container with a run's \
             limits)"
        )),
        None if waiting > 0 => out.ok(format!("warm sandboxes: {waiting} waiting on this engine")),
        None => {}
    }
    let preloaded = match engine.unclaimed_preloaded_sandboxes().await {
        Ok(n) => n,
        Err(e) => return out.warn(format!("could not list the preloaded sandboxes: {e}")),
    };
    match repositories {
        Some(0) if preloaded == 0 => out.note(
            "preloaded sandboxes are off (warm_repositories = 0): a repository's next run copies its checkout in",
        ),
        Some(n) => out.ok(format!(
            "preloaded sandboxes: {preloaded} waiting on this engine (warm_repositories = {n} \
             per engine; `kodx serve` makes them after a repository's runs, each holding its \
             latest checkout for its runs alone)"
        )),
        None if preloaded > 0 => out.ok(format!(
            "preloaded sandboxes: {preloaded} waiting on this engine"
        )),
        None => {}
    }
}

/// The warm sandboxes a server keeps on an engine: `warm_sandboxes` and
/// `warm_repositories` (`None`: no server config).
type Warm = (Option<usize>, Option<usize>);

/// One engine: `listed` names it when it comes from the server config's `[[engines]]`;
/// `warm`, the warm sandboxes the server keeps there.
async fn check_docker(
    out: &mut Report,
    image: &str,
    connected: kodx::sandbox::Result<Engine>,
    listed: Option<&kodx::sandbox::EngineConfig>,
    warm: Warm,
) {
    let named = listed.map_or(String::new(), |e| {
        format!("`{}` (max_runs {}) ", e.name, e.max_runs)
    });
    match connected {
        Ok(engine) => {
            out.ok(format!(
                "Docker engine {named}at {} (API {})",
                engine.host(),
                engine.api_version()
            ));
            match engine.docker().inspect_image(image).await {
                Ok(_) => out.ok(format!("image {image} is present")),
                Err(_) => out.note(format!(
                    "image {image} is not present yet: it is pulled on first use \
                     (`docker pull {image}` to do it now)"
                )),
            }
            sandbox_limits(out, &engine).await;
            match egress::check(&engine, image).await {
                egress::Line::Ok(text) => out.ok(text),
                egress::Line::Note(text) => out.note(text),
                egress::Line::Warn(text) => out.warn(text),
                egress::Line::Fail(text, fix) => out.fail(text, fix),
            }
            match engine.sweep_dead_owners().await {
                Ok(0) => {}
                Ok(n) => out.ok(format!(
                    "removed {n} sandbox container(s) left by dead kodx processes"
                )),
                Err(e) => out.warn(format!("could not sweep old sandbox containers: {e}")),
            }
            match engine.remove_old_derived().await {
                Ok(0) => {}
                Ok(n) => out.ok(format!(
                    "removed {n} sandbox image(s) of other kodx builds ({}:…)",
                    kodx::sandbox::docker::DERIVED_REPO
                )),
                Err(e) => out.warn(format!("could not remove old sandbox images: {e}")),
            }
            warm_pool(out, &engine, warm).await;
        }
        // A refused engine's sentence says what to set already.
        Err(kodx::sandbox::SandboxError::EngineRefused(why)) => out.fail(why, ""),
        Err(e) => {
            // The engine's error is "what happened\nwhat to do": one line here.
            let message = e.to_string();
            let (what, fix) = message.split_once('\n').unwrap_or((
                message.as_str(),
                "start Docker, or point DOCKER_HOST at an engine (tcp://HOST:2376 with \
                 DOCKER_TLS_VERIFY=1 and DOCKER_CERT_PATH for a remote one)",
            ));
            let what = match listed {
                Some(_) => format!("Docker engine {}: {what}", named.trim_end()),
                None => what.to_string(),
            };
            let what = what.as_str();
            // (Its hint ends by pointing at this very command.)
            out.fail(
                what,
                fix.trim_end_matches("`kodx doctor` checks it.").trim_end(),
            );
        }
    }
}

/// How this engine's sandboxes are fenced and their disk bounded (docs/sandbox.md, *The sandbox
/// engine*): whether kodx's network helper can run there, and quota or watchdog.
async fn sandbox_limits(out: &mut Report, engine: &Engine) {
    let facts = match engine.facts().await {
        Ok(facts) => facts,
        Err(e) => {
            out.warn(format!(
                "could not read the engine's architecture and storage: {e}"
            ));
            return;
        }
    };
    match kodx::sandbox::net::check_arch(&facts.arch) {
        Ok(()) => out.ok(format!(
            "sandbox network: plugged in and fenced by kodx's helper for {} (host, \
             link-local and private ranges unreachable), through the engine's fencer \
             container {}",
            facts.arch,
            kodx::sandbox::net::fencer_name()
        )),
        Err(e) => out.fail(
            format!("sandbox network: {e}"),
            "runs with network = \"on\" or \"setup-only\" fail until then",
        ),
    }
    let storage = if facts.backing_fs.is_empty() {
        facts.storage_driver.clone()
    } else {
        format!("{} on {}", facts.storage_driver, facts.backing_fs)
    };
    // Only a local engine's data root is on this host's filesystems.
    let local = engine.host().starts_with("unix://");
    if let Some(device) = (local && !facts.root_dir.is_empty())
        .then(|| kodx::sandbox::hostfs::ext4_without_journal(Path::new(&facts.root_dir)))
        .flatten()
    {
        out.warn(format!(
            "the engine's data root {} is on ext4 without a journal ({device}): there, \
             files created in a container after another container's files were deleted \
             cost ~25 times more (20,000 files: ~15 s instead of ~0.6 s), so large \
             repositories are slow to copy in. Put the data root on a journaled filesystem \
             (`mkfs.ext4` makes one by default, `tune2fs -O has_journal` adds one to an \
             unmounted disk) or on xfs",
            facts.root_dir
        ));
    }
    if facts.may_have_quota() {
        out.ok(format!(
            "sandbox disk: {storage} may give a storage quota for max_disk_bytes; where the \
             engine refuses it (overlay2 needs xfs mounted with pquota), kodx's watchdog \
             stops a run past the limit"
        ));
    } else {
        out.ok(format!(
            "sandbox disk: {storage} has no storage quota, so kodx's watchdog stops a run \
             past max_disk_bytes (checked every 10 s at most)"
        ));
    }
}

async fn check_database(out: &mut Report, url: &str, data_dir: &std::path::Path) {
    // A URL other than SQLite's could hold a password: name the variable, not the value.
    let postgres = url.starts_with("postgres://") || url.starts_with("postgresql://");
    let shown = if url.starts_with("sqlite:") {
        format!("database {url}")
    } else if postgres {
        format!("database {}", kodx::db::shown_url(url))
    } else {
        "database (DATABASE_URL)".to_string()
    };
    let fix = if postgres {
        "check that the PostgreSQL server in DATABASE_URL answers and the user may create \
         tables in its database (postgres://USER:PASSWORD@HOST:PORT/DATABASE)"
    } else {
        "set DATABASE_URL to a SQLite file in a writable directory \
         (sqlite:///data/kodx.db, or sqlite://data/kodx.db relative to the working directory)"
    };
    let db = match tokio::time::timeout(Duration::from_secs(30), Db::open(url)).await {
        Ok(Ok(db)) => db,
        Ok(Err(e)) => return out.fail(format!("{shown}: {e}"), fix),
        Err(_) => return out.fail(format!("{shown}: did not open within 30 s"), fix),
    };
    match tokio::time::timeout(Duration::from_secs(10), db.ping()).await {
        Ok(Ok(())) => {
            out.ok(format!("{shown}: opens, schema up to date, answers"));
            check_secrets(out, &db, data_dir).await;
        }
        Ok(Err(e)) => out.fail(format!("{shown}: {e}"), fix),
        Err(_) => out.fail(format!("{shown}: no answer within 10 s"), fix),
    }
    db.close().await;
}

/// The secrets kept for repositories (names only), and whether this process's key opens
/// them.
async fn check_secrets(out: &mut Report, db: &Db, data_dir: &std::path::Path) {
    let (counts, ids) = match (db.secret_counts().await, db.secret_key_ids().await) {
        (Ok(c), Ok(i)) => (c, i),
        (Err(e), _) | (_, Err(e)) => return out.warn(format!("secrets: could not be read: {e}")),
    };
    if counts.is_empty() {
        return;
    }
    let mut shown = Vec::new();
    for (repo, n) in counts.iter().take(10) {
        let names: Vec<String> = match db.secret_names(repo).await {
            Ok(e) => e.into_iter().take(10).map(|e| e.name).collect(),
            Err(_) => Vec::new(),
        };
        shown.push(format!("{repo} {n} ({})", names.join(", ")));
    }
    if counts.len() > 10 {
        shown.push(format!("and {} more repositories", counts.len() - 10));
    }
    let key = match kodx::secrets::SecretsKey::load(data_dir, false) {
        Ok(k) => k,
        Err(e) => return out.fail(format!("secrets: {e}"), "fix or remove the key"),
    };
    let have = key.as_ref().map(|k| k.id().to_string());
    match ids.iter().find(|id| Some(id.as_str()) != have.as_deref()) {
        Some(other) => out.fail(
            format!(
                "secrets: stored under key {other}, and this process has {}",
                have.map_or_else(|| "no key".to_string(), |h| format!("key {h}"))
            ),
            "give every process of the deployment the same key (KODX_SECRETS_KEY, or the              same secrets.key in KODX_DATA_DIR)",
        ),
        None => out.ok(format!("secrets: {}", shown.join("; "))),
    }
}

/// A model API that lists models for free: where, and how the key is sent.
struct ModelApi {
    var: &'static str,
    base: String,
    models_url: String,
    keys_page: &'static str,
}

/// A missing key fails only where `kodx serve` is meant to run; `kodx run` users get a note.
async fn check_model_keys(out: &mut Report, serve_intended: bool) {
    let anthropic = env_value("ANTHROPIC_API_KEY");
    let openai = env_value("OPENAI_API_KEY");
    let openai_base = env_value("OPENAI_BASE_URL");
    if anthropic.is_none() && openai.is_none() && openai_base.is_none() {
        let text = "no model API key: ANTHROPIC_API_KEY and OPENAI_API_KEY are not set";
        let fix = "set ANTHROPIC_API_KEY (or OPENAI_API_KEY, or OPENAI_BASE_URL for a local \
                   OpenAI-compatible server)";
        if serve_intended {
            out.fail(text, fix);
        } else {
            out.note(format!("{text}: {fix} before `kodx run`"));
        }
        return;
    }
    let Ok(client) = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(5))
        .timeout(MODEL_TIMEOUT)
        .user_agent(USER_AGENT)
        .build()
    else {
        return out.note("cannot build an HTTP client; the model API keys were not checked");
    };
    if let Some(key) = anthropic {
        let base = env_value("ANTHROPIC_BASE_URL")
            .unwrap_or_else(|| kodx::providers::anthropic::DEFAULT_BASE_URL.to_string());
        let base = base.trim().trim_end_matches('/').to_string();
        let api = ModelApi {
            var: "ANTHROPIC_API_KEY",
            models_url: format!("{base}/v1/models"),
            base,
            keys_page: "https://console.anthropic.com/settings/keys",
        };
        let request = client
            .get(&api.models_url)
            .header("x-api-key", key.trim())
            .header("anthropic-version", "2023-06-01");
        check_model_key(out, &api, request).await;
    }
    match (openai, openai_base) {
        (Some(key), base) => {
            let base = base
                .unwrap_or_else(|| kodx::providers::openai::DEFAULT_BASE_URL.to_string())
                .trim()
                .trim_end_matches('/')
                .to_string();
            let api = ModelApi {
                var: "OPENAI_API_KEY",
                models_url: format!("{base}/models"),
                base,
                keys_page: "https://platform.openai.com/api-keys",
            };
            let request = client.get(&api.models_url).bearer_auth(key.trim());
            check_model_key(out, &api, request).await;
        }
        (None, Some(base)) => out.note(format!(
            "OPENAI_BASE_URL={} without OPENAI_API_KEY: fine for a local server that needs no key",
            base.trim()
        )),
        (None, None) => {}
    }
}

async fn check_model_key(out: &mut Report, api: &ModelApi, request: reqwest::RequestBuilder) {
    let var = api.var;
    let base = &api.base;
    match request.send().await {
        Ok(r) if r.status().is_success() => {
            out.ok(format!("{var}: accepted by {base} (GET models)"))
        }
        Ok(r) if r.status().as_u16() == 401 => out.fail(
            format!("{var}: the key is refused by {base} (401)"),
            format!("create a new key ({}) and set {var}", api.keys_page),
        ),
        Ok(r) => out.note(format!(
            "{var}: {base} answered {} to GET {}; the key was not checked",
            r.status().as_u16(),
            api.models_url
        )),
        Err(e) => out.note(format!(
            "{var}: cannot reach {base} ({}); the key is set but was not checked",
            healthz::error_chain(&e.without_url())
        )),
    }
}
