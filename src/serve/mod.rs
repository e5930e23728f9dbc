//! `kodx serve`: the GitHub App (SPEC §3–§5, §9, §10).
//!
//! The webhook handler ([`http`]) verifies, reads ([`event`]) and stores each command in the
//! database queue; the [`worker`]s take it from there. `serve` binds nothing itself: it is
//! given a listener, so tests bind port 0; [`listen`] holds its connections and [`body`]
//! reads webhook bodies under a memory budget.

pub mod body;
pub mod config;
pub mod context;
pub mod deliver;
pub mod event;
pub mod handlers;
pub mod http;
pub mod job;
pub mod listen;
pub mod messages;
pub mod metrics;
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
use config::ServeConfig;
use worker::{EngineSlot, EnvProviders, ProviderFactory, Workers};

/// How `serve` runs beyond its configuration.
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
impl http::HealthCheck for EngineSlot {
    async fn docker(&self) -> Result<(), String> {
        self.ping().await
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
    let db = Db::open(&config.database_url).await.with_context(|| {
        format!(
            "DATABASE_URL={}",
            crate::db::shown_url(&config.database_url)
        )
    })?;
    let app = GitHubApp::new(
        &config.github_api_url,
        config.app_id,
        config.private_key.expose_secret(),
    )
    .context("the GitHub App's key (PRIVATE_KEY / PRIVATE_KEY_PATH)")?;
    let metrics = Arc::new(metrics::Metrics::new());
    let wake = Arc::new(Notify::new());
    let instance = db.instance_id().await.with_context(|| {
        format!(
            "reading this installation's id from DATABASE_URL={}",
            config.database_url
        )
    })?;
    let engine = Arc::new(EngineSlot::for_instance(instance));
    let workers = Workers::new(
        db.clone(),
        app,
        engine.clone(),
        config.settings.clone(),
        metrics.clone(),
        wake.clone(),
        options.providers,
        options.pricing,
        shutdown.clone(),
    );
    let worker_task = options.workers.then(|| {
        let workers = workers.clone();
        tokio::spawn(async move {
            workers.recover().await;
            workers.run().await;
        })
    });
    let settings = &config.settings;
    let state = http::HttpState {
        secrets: config.webhook_secrets.clone(),
        db: db.clone(),
        metrics: metrics.clone(),
        wake,
        health: engine,
        budget: body::BodyBudget::new(
            settings.unverified_body_bytes,
            metrics.unverified_bytes.clone(),
        ),
        body_timeout: settings.body_timeout(),
    };
    let addr = listener.local_addr().ok();
    tracing::info!(
        address = ?addr,
        github = %config.github_api_url,
        database = %crate::db::shown_url(&config.database_url),
        workers = options.workers,
        intake = options.intake,
        max_concurrent_runs = config.settings.max_concurrent_runs,
        "kodx serve is listening"
    );
    let limits = listen::ConnectionLimits {
        max_connections: settings.max_connections,
        header_timeout: settings.header_timeout(),
        // Requests in progress end within their body deadline, and answer quickly then.
        shutdown_wait: settings.body_timeout() + std::time::Duration::from_secs(5),
    };
    listen::serve_http(
        listener,
        http::router(state, options.intake),
        limits,
        metrics.connections.clone(),
        shutdown.clone(),
    )
    .await;
    if let Some(task) = worker_task {
        let _ = task.await;
    }
    db.close().await;
    tracing::info!("kodx serve stopped");
    Ok(())
}
