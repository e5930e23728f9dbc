//! `kodx serve`: the GitHub App (SPEC §3–§5, §9, §10).
//!
//! The folders read as the walk of one command, top to bottom:
//! - [`intake`]: the webhook is verified, read into a typed request and stored in the
//!   database queue ([`intake::http`], [`intake::event`]); connections and bodies are bounded
//!   ([`intake::listen`], [`intake::body`]); [`intake::proxy`] forwards from a relay.
//! - [`worker`]: the queue's loop — claims, acknowledges, builds each run's context once
//!   ([`worker::run`]) and calls the command's handler through one dispatch point.
//! - [`commands`]: one file per command (`ask`, `code`, `continue`, `cancel`, `help`), each
//!   a plain function over the run's context.
//! - [`pipeline`]: the stages a run goes through and what they share — admission
//!   ([`pipeline::gate`]), the plan, the workspace, the execution, the delivery, the status
//!   comment and the run's ending.
//! - [`texts`]: every sentence kodx posts.
//!
//! Imports go one way: `worker` → `commands` → `pipeline` → `texts`. `serve` binds nothing
//! itself: it is given a listener, so tests bind port 0.

mod commands;
pub mod config;
pub mod intake;
pub mod keys;
pub mod metrics;
pub(crate) mod pipeline;
pub mod runpage;
pub mod settings;
pub mod setup;
pub mod texts;
pub mod worker;

use std::sync::Arc;

use anyhow::Context as _;
use secrecy::ExposeSecret;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::cost::Pricing;
use crate::db::Db;
use crate::github::GitHubApp;
use config::{ServeConfig, Startup};
use pipeline::engines::{EngineStatus, Engines};
use pipeline::resources::{EnvProviders, ProviderFactory};
use worker::Workers;

/// How `serve` runs beyond its configuration.
#[derive(Clone)]
pub struct ServeOptions {
    /// Start workers. Without them webhooks are only verified and queued (for a separate
    /// worker process, or to measure the webhook path alone).
    pub workers: bool,
    /// Receive webhooks (`--role all|intake`). A worker-only process (`--role worker`)
    /// answers webhooks with `404`, saying where they belong, and serves health and
    /// metrics.
    pub intake: bool,
    /// Makes the model clients.
    pub providers: Arc<dyn ProviderFactory>,
    pub pricing: Pricing,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            workers: true,
            intake: true,
            providers: Arc::new(EnvProviders),
            pricing: Pricing::builtin(),
        }
    }
}

#[async_trait::async_trait]
impl intake::http::HealthCheck for Engines {
    async fn docker(&self) -> Result<(), String> {
        self.ping().await
    }

    fn engines(&self) -> Vec<EngineStatus> {
        self.statuses()
    }
}

/// Serves webhooks on `listener` until `shutdown`, then lets the runs end (see
/// `shutdown_grace_secs`) and returns.
pub async fn serve(
    config: ServeConfig,
    listener: TcpListener,
    shutdown: CancellationToken,
    options: ServeOptions,
) -> anyhow::Result<()> {
    serve_startup(Startup::Ready(config), listener, shutdown, options).await
}

/// [`serve`], or setup mode when no App is configured yet: the setup page ([`setup`])
/// until it has an App, then the same server as [`serve`] on the same listener, without a
/// restart.
pub async fn serve_startup(
    startup: Startup,
    listener: TcpListener,
    shutdown: CancellationToken,
    options: ServeOptions,
) -> anyhow::Result<()> {
    let metrics = Arc::new(metrics::Metrics::new());
    let slot = RouterSlot::default();
    let running: Arc<parking_lot::Mutex<Option<Running>>> = Default::default();
    let settings = match &startup {
        Startup::Ready(c) => c.settings.clone(),
        Startup::Setup(s) => s.settings.clone(),
    };
    let addr = listener.local_addr().ok();
    match startup {
        Startup::Ready(config) => {
            let normal = start(config, options, metrics.clone(), shutdown.clone()).await?;
            slot.set(normal.router.clone());
            *running.lock() = Some(normal);
        }
        Startup::Setup(config) => {
            let token = setup::SetupToken::new();
            let url = setup::local_url(addr, &token);
            let activator = Activator {
                options: tokio::sync::Mutex::new(Some(options)),
                metrics: metrics.clone(),
                shutdown: shutdown.clone(),
                slot: slot.clone(),
                running: running.clone(),
            };
            slot.set(setup::router(setup::SetupMode::new(
                config,
                token,
                Arc::new(activator),
            )));
            tracing::info!(address = ?addr, "kodx serve is in setup mode: no GitHub App is configured");
            // The one place the token is shown: to whoever started the server.
            eprintln!(
                "kodx serve: setup mode (no GitHub App configured yet). Open this one-time URL in a browser to create or import the App:\n  {url}"
            );
        }
    }
    let limits = intake::listen::ConnectionLimits {
        max_connections: settings.max_connections,
        header_timeout: settings.header_timeout(),
        write_timeout: settings.write_timeout(),
        // Requests in progress end within their body deadline, and answer quickly then.
        shutdown_wait: settings.body_timeout() + std::time::Duration::from_secs(5),
    };
    intake::listen::serve_http(
        listener,
        slot.router(),
        limits,
        metrics.connections.clone(),
        shutdown.clone(),
    )
    .await;
    let normal = running.lock().take();
    if let Some(normal) = normal {
        if let Some(task) = normal.worker_task {
            let _ = task.await;
        }
        normal.db.close().await;
    }
    tracing::info!("kodx serve stopped");
    Ok(())
}

/// The router the listener serves, swapped once when setup ends.
#[derive(Clone, Default)]
struct RouterSlot(Arc<parking_lot::RwLock<axum::Router>>);

impl RouterSlot {
    fn set(&self, router: axum::Router) {
        *self.0.write() = router;
    }

    /// A router that hands each request to the one in the slot at that moment.
    fn router(&self) -> axum::Router {
        let slot = self.clone();
        axum::Router::new().fallback_service(tower::service_fn(
            move |req: axum::extract::Request| {
                let router = slot.0.read().clone();
                tower::ServiceExt::oneshot(router, req)
            },
        ))
    }
}

/// The server in normal mode: its router, database and workers.
struct Running {
    router: axum::Router,
    db: Db,
    app: GitHubApp,
    engine: Arc<Engines>,
    worker_task: Option<tokio::task::JoinHandle<()>>,
}

/// Turns setup mode into normal mode (see [`setup::Activate`]).
struct Activator {
    /// Taken by the one activation.
    options: tokio::sync::Mutex<Option<ServeOptions>>,
    metrics: Arc<metrics::Metrics>,
    shutdown: CancellationToken,
    slot: RouterSlot,
    running: Arc<parking_lot::Mutex<Option<Running>>>,
}

#[async_trait::async_trait]
impl setup::Activate for Activator {
    async fn activate(&self, config: ServeConfig) -> anyhow::Result<Vec<setup::page::CheckLine>> {
        let mut options = self.options.lock().await;
        let Some(opts) = options.clone() else {
            anyhow::bail!("this server already has a GitHub App");
        };
        // On an error nothing was swapped: setup mode goes on.
        let normal = start(config, opts, self.metrics.clone(), self.shutdown.clone()).await?;
        *options = None;
        let lines = setup::checks(&normal.app, &normal.db, &normal.engine).await;
        self.slot.set(normal.router.clone());
        *self.running.lock() = Some(normal);
        Ok(lines)
    }
}

/// Opens the database, makes the App, starts the workers: normal mode. Everything that
/// can fail is done before anything is started, so a failed start (a failed activation
/// in setup mode, which goes on) leaves no worker, watcher or proxy task running.
async fn start(
    config: ServeConfig,
    options: ServeOptions,
    metrics: Arc<metrics::Metrics>,
    shutdown: CancellationToken,
) -> anyhow::Result<Running> {
    let db = Db::open(&config.database_url)
        .await
        .with_context(|| {
            format!(
                "DATABASE_URL={}",
                crate::db::shown_url(&config.database_url)
            )
        })?
        .with_lease(config.settings.lease());
    let app = GitHubApp::with_policy(
        &config.github_api_url,
        config.app_id,
        config.private_key.expose_secret(),
        config.settings.github_policy(),
    )
    .context("the GitHub App's key (PRIVATE_KEY / PRIVATE_KEY_PATH)")?;
    let instance = db.instance_id().await.with_context(|| {
        format!(
            "reading this installation's id from DATABASE_URL={}",
            crate::db::shown_url(&config.database_url)
        )
    })?;
    let operator = Arc::new(keys::OperatorKey::open(&config.data_dir).with_context(|| {
        format!(
            "the operator's key in KODX_DATA_DIR={}",
            config.data_dir.display()
        )
    })?);
    let pages = match config.settings.run_pages {
        true => Some(
            runpage::RunPages::open(&config.data_dir, db.clone(), operator.clone())
                .with_context(|| {
                    format!(
                    "the run pages' key in KODX_DATA_DIR={} (set run_pages = false to do without)",
                    config.data_dir.display()
                )
                })?
                .with_budget(config.settings.monthly_budget_usd),
        ),
        false => None,
    };
    // What is started from here on stops with `started`, which a return before the end
    // cancels (nothing below fails today; this keeps it so).
    let started = shutdown.child_token();
    let unwind = started.clone().drop_guard();
    let wake = Arc::new(Notify::new());
    let engine = Arc::new(
        Engines::new(
            Some(instance),
            &config.settings.engines,
            config.settings.max_concurrent_runs,
        )
        .shared_through(db.clone())
        .with_warm(&warm_settings(&config.settings)),
    );
    let workers = Workers::new(
        db.clone(),
        app.clone(),
        engine.clone(),
        config.settings.clone(),
        metrics.clone(),
        wake.clone(),
        options.providers,
        options.pricing,
        started.clone(),
    );
    let worker_task = options.workers.then(|| {
        tokio::spawn(
            engine
                .clone()
                .watch(config.settings.engine_check_interval(), started.clone()),
        );
        let workers = workers.clone();
        tokio::spawn(async move {
            workers.recover().await;
            workers.run().await;
        })
    });
    let settings = &config.settings;
    let state = intake::http::HttpState {
        secrets: config.webhook_secrets.clone(),
        db: db.clone(),
        metrics: metrics.clone(),
        wake,
        health: engine.clone(),
        app_id: config.app_id,
        operator,
        budget: intake::body::BodyBudget::new(
            settings.unverified_body_bytes,
            metrics.unverified_bytes.clone(),
        ),
        body_timeout: settings.body_timeout(),
    };
    // Webhooks through a proxy channel go through the same intake (ended by `started`).
    if let (true, Some(url)) = (options.intake, config.webhook_proxy_url.clone()) {
        tokio::spawn(intake::proxy::forward(url, state.clone(), started.clone()));
    }
    tracing::info!(
        app_id = config.app_id,
        credentials = %config.credential_source,
        github = %config.github_api_url,
        database = %crate::db::shown_url(&config.database_url),
        workers = options.workers,
        intake = options.intake,
        max_concurrent_runs = config.settings.max_concurrent_runs,
        "kodx serve is listening"
    );
    let _ = workers.svc.github_web.set(config.github_url.clone());
    // The run pages, and links to them once the server knows its public address.
    let mut router = intake::http::router(state, options.intake);
    if let Some(pages) = pages {
        if let Some(public_url) = &config.public_url {
            let _ = workers
                .svc
                .run_links
                .set((public_url.clone(), pages.key().clone()));
        }
        router = router.merge(runpage::routes(std::sync::Arc::new(pages)));
    }
    // The operator's links are made on demand, never printed where logs keep them.
    eprintln!(
        "kodx serve: `kodx operator-link` prints a link to the list of runs and /healthz's details (valid 24 h by default)"
    );
    unwind.disarm();
    Ok(Running {
        router,
        db,
        app,
        engine,
        worker_task,
    })
}

/// The warm pools' settings: the server's `warm_sandboxes`, `warm_repositories` and
/// `warm_idle_secs`, and the shape of a run with the server's defaults (its image, network,
/// disk limit).
fn warm_settings(settings: &config::Settings) -> pipeline::WarmSettings {
    let mut spec = crate::sandbox::SandboxSpec::new("warm", settings.image.clone());
    spec.repo_dir = Some(std::path::PathBuf::from("."));
    settings.network.apply(&mut spec, false);
    spec.allowed_cidrs = settings.network_allow.clone();
    spec.max_disk_bytes = Some(settings.max_disk_bytes);
    pipeline::WarmSettings {
        per_engine: settings.warm_sandboxes,
        repositories: settings.warm_repositories,
        idle: std::time::Duration::from_secs(settings.warm_idle_secs),
        default: Some(crate::sandbox::Shape::of(&spec, &settings.image)),
    }
}
