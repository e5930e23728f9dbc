//! The workers of `kodx serve` (SPEC §4, §5, §9): they take what the webhook queued and do
//! the slow part — permission checks, the repository's config, the status comment, the
//! clone, the container and the agent — and say on GitHub how it went.
//!
//! Two kinds of work leave the queue: short control jobs (`help`, `cancel`, refusals), taken
//! at once, and runs (`ask`, `code`), at most `max_concurrent_runs` at a time and one per
//! issue. A run is acknowledged (`eyes`, the status comment) as soon as it is queued, even
//! while it waits for a free worker.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::PermissionsExt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::agent::{Agent, Outcome, Progress, Record, StopReason};
use crate::comment::{self, Done, Phase, RunKind};
use crate::cost::Pricing;
use crate::db::{Db, Finish, RecoveryAction, Run, RunStatus};
use crate::github::{
    GitHubApp, GitHubError, Installation, Permission, PullInfo, Reaction, RepoName, TokenScope,
};
use crate::model::{Provider, ProviderError, Request, Response, Usage};
use crate::program::{self, Overrides, Plan, Program};
use crate::repo_config::{AskPermission, RepoConfig};
use crate::sandbox::{Engine, Sandbox, SandboxError};
use crate::serve::config::Settings;
use crate::serve::context::{strip_hidden, ContextComment, RunContext};
use crate::serve::deliver::{self, Target};
use crate::serve::job::{Job, JobKind, TriggerKind};
use crate::serve::metrics::Metrics;

/// Makes the model client of a run (from the environment in production).
pub trait ProviderFactory: Send + Sync {
    fn make(&self, provider: program::Provider) -> Result<Box<dyn Provider>, String>;
}

/// Anthropic and OpenAI-compatible clients from `ANTHROPIC_*` / `OPENAI_*`.
pub struct EnvProviders;

impl ProviderFactory for EnvProviders {
    fn make(&self, provider: program::Provider) -> Result<Box<dyn Provider>, String> {
        Ok(match provider {
            program::Provider::Anthropic => {
                Box::new(crate::providers::AnthropicClient::from_env()?)
            }
            program::Provider::OpenAi => Box::new(crate::providers::OpenAiClient::from_env()?),
        })
    }
}

/// The Docker engine, connected on first use (the server starts without one and says so in
/// `/healthz`).
#[derive(Default)]
pub struct EngineSlot {
    engine: tokio::sync::Mutex<Option<Engine>>,
    /// The installation's id: labels its containers, names its clones.
    instance: Option<String>,
}

impl EngineSlot {
    /// The engine of installation `instance` ([`crate::db::Db::instance_id`]): its
    /// containers carry the id, and those an earlier process of it left are its orphans.
    pub fn for_instance(instance: impl Into<String>) -> EngineSlot {
        EngineSlot {
            engine: Default::default(),
            instance: Some(instance.into()),
        }
    }

    pub fn instance(&self) -> Option<&str> {
        self.instance.as_deref()
    }

    pub async fn get(&self) -> Result<Engine, SandboxError> {
        let mut slot = self.engine.lock().await;
        if let Some(e) = slot.as_ref() {
            return Ok(e.clone());
        }
        let mut engine = Engine::connect().await?;
        if let Some(instance) = &self.instance {
            engine = engine.with_instance(instance.clone());
        }
        *slot = Some(engine.clone());
        Ok(engine)
    }

    pub async fn ping(&self) -> Result<(), String> {
        let engine = self.get().await.map_err(|e| e.to_string())?;
        engine.docker().ping().await.map(|_| ()).map_err(|e| {
            format!(
                "the Docker engine at {} does not answer: {e}",
                engine.host()
            )
        })
    }
}

/// Everything the workers share.
pub struct Workers {
    pub db: Db,
    pub app: GitHubApp,
    pub engine: Arc<EngineSlot>,
    pub settings: Settings,
    pub metrics: Arc<Metrics>,
    pub wake: Arc<Notify>,
    pub providers: Arc<dyn ProviderFactory>,
    pub pricing: Pricing,
    /// Identifies this process's claims.
    pub worker_id: String,
    /// Stops claiming; running runs get `shutdown_grace_secs`, then are stopped.
    pub shutdown: CancellationToken,
    running: Mutex<HashMap<String, RunHandle>>,
    acknowledging: Mutex<HashSet<String>>,
    slots: Arc<Semaphore>,
}

struct RunHandle {
    cancel: CancellationToken,
    /// Who cancelled it with `/kodx cancel` (none: shutdown).
    cancelled_by: Arc<Mutex<Option<String>>>,
}

/// How a run's work ended before it is written down.
struct Ending {
    status: RunStatus,
    done: Done,
}

/// How long each phase of a run took (stored with its result, logged, and read by
/// `bench/pr-latency.sh`).
#[derive(Default)]
struct Timings(Mutex<Vec<(&'static str, Duration)>>);

impl Timings {
    fn add(&self, phase: &'static str, took: Duration) {
        self.0.lock().expect("lock").push((phase, took));
    }

    fn to_json(&self) -> serde_json::Value {
        let phases = self.0.lock().expect("lock");
        serde_json::Value::Object(
            phases
                .iter()
                .map(|(k, d)| (k.to_string(), serde_json::json!(d.as_millis() as u64)))
                .collect(),
        )
    }
}

/// A short word for the reason a run was refused, stored as its stop reason.
const NOT_PERMITTED: &str = "not_permitted";
const INVALID_CONFIG: &str = "invalid_config";
/// Runs are capped at what is left of the monthly budget, so spend approaches it without
/// reaching it: with less than this left, the budget counts as spent.
const MIN_RUN_BUDGET_USD: f64 = 0.01;

impl Workers {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        db: Db,
        app: GitHubApp,
        engine: Arc<EngineSlot>,
        settings: Settings,
        metrics: Arc<Metrics>,
        wake: Arc<Notify>,
        providers: Arc<dyn ProviderFactory>,
        pricing: Pricing,
        shutdown: CancellationToken,
    ) -> Arc<Workers> {
        let slots = Arc::new(Semaphore::new(settings.max_concurrent_runs));
        Arc::new(Workers {
            db,
            app,
            engine,
            metrics,
            wake,
            providers,
            pricing,
            worker_id: format!(
                "{}-{}-{:08x}",
                hostname(),
                std::process::id(),
                rand::random::<u32>()
            ),
            shutdown,
            running: Mutex::new(HashMap::new()),
            acknowledging: Mutex::new(HashSet::new()),
            slots,
            settings,
        })
    }

    /// Runs left `running` by a dead process go back to the queue (once), and what it left
    /// behind goes: its containers and its clones. Old transcripts are pruned.
    pub async fn recover(self: &Arc<Self>) {
        let prefix = self.clone_prefix();
        match tokio::task::spawn_blocking(move || {
            remove_stale_clones(&std::env::temp_dir(), &prefix)
        })
        .await
        {
            Ok(0) => {}
            Ok(n) => tracing::info!("removed {n} clone director(ies) an earlier kodx process left"),
            Err(e) => tracing::warn!("could not remove old clones: {e}"),
        }
        if let Ok(engine) = self.engine.get().await {
            // Every container of this installation is an orphan now: no run has started
            // yet. Its earlier process may have had the same pid (PID 1 in a container).
            match engine.sweep_instance_orphans().await {
                Ok(0) => {}
                Ok(n) => tracing::info!(
                    "removed {n} container(s) an earlier kodx process of this installation left"
                ),
                Err(e) => tracing::warn!("could not sweep old containers: {e}"),
            }
            match engine.sweep_dead_owners().await {
                Ok(0) => {}
                Ok(n) => tracing::info!("removed {n} container(s) left by a dead kodx process"),
                Err(e) => tracing::warn!("could not sweep old containers: {e}"),
            }
        }
        self.prune_transcripts().await;
        let recovered = match self
            .db
            .recover(&self.worker_id, i64::from(self.settings.max_attempts))
            .await
        {
            Ok(r) => r,
            Err(e) => {
                tracing::error!("recovering runs failed: {e}");
                return;
            }
        };
        for r in recovered {
            let run = r.run;
            let span = run_span(&run);
            let this = self.clone();
            async move {
                match r.action {
                    RecoveryAction::Requeued => {
                        tracing::warn!("run was interrupted by a restart; queued again");
                        this.edit_status(&run, "⏳ queued again — kodx restarted while this run was working")
                            .await;
                    }
                    RecoveryAction::Failed => {
                        tracing::error!("run was interrupted by restarts too often; failed");
                        let done = this.failed_done(
                            &run,
                            StopReason::Error,
                            "kodx restarted while this run was working, more than once; it was not started again. Run the command again to retry.".into(),
                        );
                        this.post_done(&run, &done).await;
                        this.metrics.run_finished(run.kind().as_str(), "internal_error", 0.0, Duration::ZERO);
                    }
                }
            }
            .instrument(span)
            .await;
        }
    }

    /// Where this installation's clones go: `$TMPDIR/kodx-run-<instance>-<run id>-XXXXXX`.
    fn clone_prefix(&self) -> String {
        format!("kodx-run-{}-", self.engine.instance().unwrap_or("local"))
    }

    /// Deletes the transcripts of runs finished more than `transcript_days` ago.
    async fn prune_transcripts(&self) {
        let age = i64::from(self.settings.transcript_days) * 86_400_000;
        match self.db.prune_transcripts(crate::db::now_ms() - age).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                "deleted {n} transcript record(s) of runs finished over {} days ago",
                self.settings.transcript_days
            ),
            Err(e) => tracing::warn!("pruning old transcripts failed: {e}"),
        }
    }

    /// Claims and starts work until shutdown; returns when the last run has ended.
    pub async fn run(self: Arc<Self>) {
        let mut tasks = tokio::task::JoinSet::new();
        // Old transcripts go daily (and at start, in `recover`).
        let pruner = {
            let this = self.clone();
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(86_400)) => {}
                        _ = this.shutdown.cancelled() => return,
                    }
                    this.prune_transcripts().await;
                }
            })
        };
        loop {
            if self.shutdown.is_cancelled() {
                break;
            }
            self.dispatch(&mut tasks).await;
            while tasks.try_join_next().is_some() {}
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = self.shutdown.cancelled() => {}
            }
        }
        // Shutdown: no new work. Runs get the grace period, then are stopped; a stopped run
        // stays `running` in the database and is queued again when kodx starts.
        let grace = Duration::from_secs(self.settings.shutdown_grace_secs);
        if !tasks.is_empty() {
            tracing::info!(
                "shutting down: waiting up to {}s for {} task(s)",
                grace.as_secs(),
                tasks.len()
            );
        }
        let waited =
            tokio::time::timeout(grace, async { while tasks.join_next().await.is_some() {} }).await;
        if waited.is_err() {
            for handle in self.running.lock().expect("lock").values() {
                handle.cancel.cancel();
            }
            while tasks.join_next().await.is_some() {}
        }
        pruner.abort();
        let n = crate::sandbox::docker::remove_all_live().await;
        if n > 0 {
            tracing::info!("removed {n} sandbox container(s) at shutdown");
        }
    }

    async fn dispatch(self: &Arc<Self>, tasks: &mut tokio::task::JoinSet<()>) {
        // Control jobs first: they are quick and a cancel must not wait for a slot.
        loop {
            match self.db.claim_control(&self.worker_id).await {
                Ok(Some(job)) => {
                    let this = self.clone();
                    let span = run_span(&job);
                    tasks.spawn(async move { this.control(job).await }.instrument(span));
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::error!("claiming a job failed: {e}");
                    break;
                }
            }
        }
        // Acknowledge queued runs (eyes, status comment) even while they wait.
        match self.db.runs_with_status(RunStatus::Queued).await {
            Ok(queued) => {
                self.metrics.set_queued(queued.len() as i64);
                for run in queued.into_iter().filter(|r| r.is_work()) {
                    if run.status_comment_id.is_some()
                        || self.acknowledging.lock().expect("lock").contains(&run.id)
                    {
                        continue;
                    }
                    let this = self.clone();
                    let span = run_span(&run);
                    tasks.spawn(
                        async move {
                            this.ensure_acknowledged(&run.id).await;
                        }
                        .instrument(span),
                    );
                }
            }
            Err(e) => tracing::error!("listing queued runs failed: {e}"),
        }
        // Runs, while there are free slots.
        loop {
            let Ok(permit) = self.slots.clone().try_acquire_owned() else {
                break;
            };
            match self.db.claim_run(&self.worker_id).await {
                Ok(Some(run)) => {
                    let this = self.clone();
                    let span = run_span(&run);
                    tasks.spawn(
                        async move {
                            this.work(run).await;
                            drop(permit);
                            this.wake.notify_one();
                        }
                        .instrument(span),
                    );
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::error!("claiming a run failed: {e}");
                    break;
                }
            }
        }
    }

    // -----------------------------------------------------------------------------------
    // Acknowledging a run: permission, repository config, eyes, status comment
    // -----------------------------------------------------------------------------------

    /// Acknowledges the run once, whoever asks first (the intake or the worker that claimed
    /// it); the other waits. The run as it is afterwards, or `None` when it is over (refused).
    async fn ensure_acknowledged(&self, run_id: &str) -> Option<Run> {
        loop {
            if self
                .acknowledging
                .lock()
                .expect("lock")
                .insert(run_id.to_string())
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let result = async {
            let run = self.db.get_run(run_id).await.ok().flatten()?;
            if run.status.is_final() {
                return None;
            }
            if run.status_comment_id.is_none() {
                self.acknowledge(&run).await;
            }
            self.db
                .get_run(run_id)
                .await
                .ok()
                .flatten()
                .filter(|r| !r.status.is_final())
        }
        .await;
        self.acknowledging.lock().expect("lock").remove(run_id);
        result
    }

    /// Checks who asked and the repository's config, reacts `eyes` and creates the status
    /// comment. `false` when the run was refused (and finished) instead.
    async fn acknowledge(&self, run: &Run) -> bool {
        let gh = match self.installation(run).await {
            Ok(gh) => gh,
            Err(e) => {
                tracing::warn!("GitHub is not reachable to acknowledge the run: {e}");
                return false;
            }
        };
        let Ok(repo) = RepoName::parse(&run.request.repo) else {
            self.finish_quietly(run, RunStatus::Failed, "internal_error")
                .await;
            return false;
        };
        // Who may: checked before anything is posted, so a refusal is one short comment.
        if self
            .check_permission_and_config(&gh, &repo, run)
            .await
            .is_err()
        {
            return false;
        }
        self.react(&gh, &repo, run, Reaction::Eyes).await;
        // A comment this run posted before a crash is found by its hidden metadata.
        if let Some(existing) = self.find_status_comment(&gh, &repo, run).await {
            let _ = self.db.set_status_comment(&run.id, existing as i64).await;
            return true;
        }
        let body = comment::render(&run.id, &command_line(run), &Phase::Queued);
        match gh
            .create_comment(&repo, run.request.issue_number as u64, &body)
            .await
        {
            Ok(c) => {
                if let Err(e) = self.db.set_status_comment(&run.id, c.id as i64).await {
                    tracing::error!("storing the status comment id failed: {e}");
                }
                true
            }
            Err(e) => {
                tracing::warn!("creating the status comment failed: {e}");
                false
            }
        }
    }

    async fn find_status_comment(
        &self,
        gh: &Installation,
        repo: &RepoName,
        run: &Run,
    ) -> Option<u64> {
        // Only worth a listing when this run may have posted before (a restart, or a
        // webhook handled a while ago).
        let age = crate::db::now_ms() - run.created_at;
        if !(run.recovered || run.attempts > 0 || age > 30_000) {
            return None;
        }
        let comments = gh
            .issue_comments(repo, run.request.issue_number as u64, 100)
            .await
            .ok()?;
        comments
            .iter()
            .rev()
            .find(|c| {
                c.author_is_bot && comment::find_run_id(&c.body).as_deref() == Some(run.id.as_str())
            })
            .map(|c| c.id)
    }

    /// The permission check and `.github/kodx.yml`. On refusal the run is finished and the
    /// person told why; `Err(())` then.
    async fn check_permission_and_config(
        &self,
        gh: &Installation,
        repo: &RepoName,
        run: &Run,
    ) -> Result<RepoConfig, ()> {
        let config_text = gh.file_on_default_branch(repo, RepoConfig::PATH).await;
        let (config, config_error) = match config_text {
            Ok(None) => (RepoConfig::default(), None),
            Ok(Some(text)) => match RepoConfig::parse(&text) {
                Ok(c) => (c, None),
                Err(e) => (RepoConfig::default(), Some(e.to_string())),
            },
            Err(e) => {
                tracing::warn!("reading {} failed: {e}", RepoConfig::PATH);
                self.refuse(gh, repo, run, "internal_error", &format!(
                    "kodx could not read `{}` from the default branch ({e}). Run the command again in a moment.",
                    RepoConfig::PATH
                ))
                .await;
                return Err(());
            }
        };
        let needed = match (run.kind(), config.ask_permission) {
            (JobKind::Ask, AskPermission::Read) => Permission::Read,
            (JobKind::Help, _) => Permission::Read,
            _ => Permission::Write,
        };
        let has = match gh.permission(repo, &run.request.author).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!("permission check failed: {e}");
                self.refuse(gh, repo, run, "internal_error", &format!(
                    "kodx could not check @{}'s permission on this repository ({e}). Run the command again in a moment.",
                    run.request.author
                ))
                .await;
                return Err(());
            }
        };
        if has < needed {
            tracing::info!(permission = has.as_str(), "refused: not permitted");
            let body = not_permitted(&run.request.author, run.kind(), needed, has);
            let _ = gh
                .create_comment(repo, run.request.issue_number as u64, &body)
                .await;
            self.finish_quietly(run, RunStatus::Failed, NOT_PERMITTED)
                .await;
            return Err(());
        }
        if let Some(note) = self.budget_spent(run).await {
            tracing::info!("refused: monthly budget spent");
            self.refuse(gh, repo, run, "budget_exceeded", &note).await;
            return Err(());
        }
        if let Some(error) = config_error {
            tracing::info!("refused: invalid repository config");
            self.refuse(gh, repo, run, INVALID_CONFIG, &format!(
                "kodx cannot run because the repository's configuration is invalid:\n\n```\n{error}\n```\n\nFix `{}` on the default branch and run the command again.",
                RepoConfig::PATH
            ))
            .await;
            return Err(());
        }
        Ok(config)
    }

    /// What is left of the installation's monthly budget, if the server has one.
    async fn budget_left(&self, run: &Run) -> Option<(f64, f64)> {
        let budget = self.settings.monthly_budget_usd?;
        let since = month_start_ms(crate::db::now_ms());
        let spent = match self
            .db
            .spend_since(run.request.installation_id, since)
            .await
        {
            Ok(s) => s,
            Err(e) => {
                tracing::error!("reading the month's spend failed: {e}");
                return Some((budget, 0.0));
            }
        };
        Some((budget, spent))
    }

    /// The refusal text when the installation's monthly budget is spent.
    async fn budget_spent(&self, run: &Run) -> Option<String> {
        if !run.is_work() {
            return None;
        }
        let (budget, spent) = self.budget_left(run).await?;
        (budget - spent < MIN_RUN_BUDGET_USD).then(|| {
            format!(
                "kodx did not start: this installation's monthly budget of {} is spent ({} used since the 1st, UTC; runs need at least $0.01 of it left). Runs start again next month, or when the server's operator raises `monthly_budget_usd`.",
                crate::cost::format_usd(budget),
                crate::cost::format_usd(spent)
            )
        })
    }

    /// Answers with one comment, reacts `confused` and finishes the run as failed.
    async fn refuse(
        &self,
        gh: &Installation,
        repo: &RepoName,
        run: &Run,
        reason: &str,
        text: &str,
    ) {
        let body = format!(
            "{}\n\n<sub>kodx run <code>{}</code></sub>",
            comment::redact(text),
            run.id
        );
        let body = match run.status_comment_id {
            Some(id) => match gh.update_comment(repo, id as u64, &body).await {
                Ok(()) => None,
                Err(_) => Some(body),
            },
            None => Some(body),
        };
        if let Some(body) = body {
            let _ = gh
                .create_comment(repo, run.request.issue_number as u64, &body)
                .await;
        }
        self.react(gh, repo, run, Reaction::Confused).await;
        self.finish_quietly(run, RunStatus::Failed, reason).await;
    }

    async fn finish_quietly(&self, run: &Run, status: RunStatus, reason: &str) {
        let fin = Finish {
            status,
            stop_reason: reason.to_string(),
            cost_usd: 0.0,
            input_tokens: 0,
            output_tokens: 0,
            cache_read_tokens: 0,
            cache_write_tokens: 0,
            api_calls: 0,
            result: serde_json::json!({ "refused": reason }).to_string(),
            pr_url: None,
        };
        if let Err(e) = self.db.finish(&run.id, &fin).await {
            tracing::error!("finishing the run failed: {e}");
        }
        self.metrics
            .run_finished(run.kind().as_str(), reason, 0.0, Duration::ZERO);
    }

    async fn react(&self, gh: &Installation, repo: &RepoName, run: &Run, reaction: Reaction) {
        let target = run.request.trigger.reaction_target();
        if let Err(e) = gh.react(repo, target, reaction).await {
            tracing::warn!("reacting {} failed: {e}", reaction.as_str());
        }
    }

    /// A token for this run's repository only, with the permissions its kind uses: a code
    /// run may push and open pull requests; an ask, help or cancel reads and comments.
    async fn installation(&self, run: &Run) -> Result<Installation, GitHubError> {
        let repo =
            RepoName::parse(&run.request.repo).map_err(|e| GitHubError::Config(e.to_string()))?;
        let scope = if run.kind() == JobKind::Code {
            TokenScope::write(&repo)
        } else {
            let review = run.request.trigger.kind() == TriggerKind::ReviewComment;
            TokenScope::read(&repo, review)
        };
        self.app
            .installation_for(run.request.installation_id as u64, &scope)
            .await
    }

    // -----------------------------------------------------------------------------------
    // Control jobs
    // -----------------------------------------------------------------------------------

    async fn control(self: Arc<Self>, job: Run) {
        let gh = match self.installation(&job).await {
            Ok(gh) => gh,
            Err(e) => {
                tracing::error!("GitHub is not reachable for a {} job: {e}", job.kind());
                self.finish_quietly(&job, RunStatus::Failed, "internal_error")
                    .await;
                return;
            }
        };
        let Ok(repo) = RepoName::parse(&job.request.repo) else {
            self.finish_quietly(&job, RunStatus::Failed, "internal_error")
                .await;
            return;
        };
        let needed = if job.kind() == JobKind::Help {
            Permission::Read
        } else {
            Permission::Write
        };
        let has = match gh.permission(&repo, &job.request.author).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!("permission check failed: {e}");
                self.finish_quietly(&job, RunStatus::Failed, "internal_error")
                    .await;
                return;
            }
        };
        if has < needed {
            if job.kind() != JobKind::Help {
                let body = not_permitted(&job.request.author, job.kind(), needed, has);
                let _ = gh
                    .create_comment(&repo, job.request.issue_number as u64, &body)
                    .await;
            }
            self.finish_quietly(&job, RunStatus::Failed, NOT_PERMITTED)
                .await;
            return;
        }
        match &job.request.job {
            Job::Help { unknown } => {
                let body = help_text(unknown.as_deref().unwrap_or(""));
                let _ = gh
                    .create_comment(&repo, job.request.issue_number as u64, &body)
                    .await;
                self.finish_quietly(&job, RunStatus::Succeeded, "help")
                    .await;
            }
            Job::Cancel => self.cancel(&gh, &repo, &job).await,
            Job::Ask { .. } | Job::Code { .. } | Job::Refuse { .. } => {
                // "refuse": the request could not be read (empty, too long).
                let body = format!(
                    "@{} kodx did not start: {}.",
                    comment::redact(&job.request.author),
                    comment::redact(job.request.job.argument())
                );
                let _ = gh
                    .create_comment(&repo, job.request.issue_number as u64, &body)
                    .await;
                self.react(&gh, &repo, &job, Reaction::Confused).await;
                self.finish_quietly(&job, RunStatus::Failed, "refused")
                    .await;
            }
        }
    }

    async fn cancel(&self, gh: &Installation, repo: &RepoName, job: &Run) {
        let touched = match self
            .db
            .cancel_issue(
                &job.request.repo,
                job.request.issue_number,
                &job.request.author,
            )
            .await
        {
            Ok(t) => t,
            Err(e) => {
                tracing::error!("cancelling failed: {e}");
                self.finish_quietly(job, RunStatus::Failed, "internal_error")
                    .await;
                return;
            }
        };
        let mut n = 0;
        for t in &touched {
            n += 1;
            if t.was_running {
                if let Some(h) = self.running.lock().expect("lock").get(&t.run.id) {
                    *h.cancelled_by.lock().expect("lock") = Some(job.request.author.clone());
                    h.cancel.cancel();
                }
            } else {
                let done = Done {
                    kind: run_kind(&t.run),
                    outcome: zero_outcome(StopReason::Cancelled, 0.0, String::new()),
                    text: String::new(),
                    pr_url: None,
                    pushed: None,
                    failure: Some(format!(
                        "Cancelled by @{} before it started.",
                        job.request.author
                    )),
                };
                self.post_done(&t.run, &done).await;
            }
        }
        if n == 0 {
            let _ = gh
                .create_comment(
                    repo,
                    job.request.issue_number as u64,
                    &format!(
                        "@{} there is no kodx run to cancel here.",
                        comment::redact(&job.request.author)
                    ),
                )
                .await;
        } else {
            self.react(gh, repo, job, Reaction::PlusOne).await;
        }
        self.finish_quietly(job, RunStatus::Succeeded, "cancel")
            .await;
    }

    // -----------------------------------------------------------------------------------
    // Runs
    // -----------------------------------------------------------------------------------

    async fn work(self: &Arc<Self>, run: Run) {
        self.metrics.run_started();
        let started = Instant::now();
        let cancel = CancellationToken::new();
        let cancelled_by = Arc::new(Mutex::new(None));
        self.running.lock().expect("lock").insert(
            run.id.clone(),
            RunHandle {
                cancel: cancel.clone(),
                cancelled_by: cancelled_by.clone(),
            },
        );
        tracing::info!(attempt = run.attempts, "run started");
        let timings = Timings::default();
        let ending = self.work_inner(&run, &cancel, &timings).await;
        self.running.lock().expect("lock").remove(&run.id);
        self.metrics.run_ended();
        let Some(mut ending) = ending else {
            return;
        };
        if ending.done.outcome.stop_reason == StopReason::Cancelled {
            let by = cancelled_by.lock().expect("lock").clone();
            match by {
                Some(who) => {
                    ending.status = RunStatus::Cancelled;
                    ending.done.failure = Some(format!("Cancelled by @{who}."));
                }
                None if self.shutdown.is_cancelled() => {
                    // Stopped by a shutdown: left `running`, queued again at the next start.
                    tracing::warn!("run stopped by shutdown; it resumes when kodx starts again");
                    self.edit_status(
                        &run,
                        "⏳ paused — kodx is restarting; this run starts again when it is back",
                    )
                    .await;
                    return;
                }
                None => {}
            }
        }
        let o = &ending.done.outcome;
        let fin = Finish {
            status: ending.status,
            stop_reason: o.stop_reason.as_str().to_string(),
            cost_usd: o.usd_cost,
            input_tokens: o.usage.input_tokens as i64,
            output_tokens: o.usage.output_tokens as i64,
            cache_read_tokens: o.usage.cache_read_tokens as i64,
            cache_write_tokens: o.usage.cache_write_tokens as i64,
            api_calls: i64::from(o.api_calls),
            result: serde_json::json!({
                "last_message": comment::redact(&o.last_message),
                "detail": ending.done.failure.as_deref().or(o.detail.as_deref()).map(comment::redact),
                "model": o.model,
                "timings_ms": timings.to_json(),
            })
            .to_string(),
            pr_url: ending.done.pr_url.clone(),
        };
        if let Err(e) = self.db.finish(&run.id, &fin).await {
            tracing::error!("recording the end of the run failed: {e}");
        }
        self.metrics.run_finished(
            run.kind().as_str(),
            o.stop_reason.as_str(),
            o.usd_cost,
            started.elapsed(),
        );
        tracing::info!(
            stop_reason = o.stop_reason.as_str(),
            cost_usd = o.usd_cost,
            api_calls = o.api_calls,
            timings_ms = %timings.to_json(),
            "run finished"
        );
        self.post_done(&run, &ending.done).await;
    }

    /// The run itself. `None` when it was refused (and finished) while being acknowledged.
    async fn work_inner(
        self: &Arc<Self>,
        run: &Run,
        cancel: &CancellationToken,
        timings: &Timings,
    ) -> Option<Ending> {
        let prepare_started = Instant::now();
        let kind = run_kind(run);
        let internal = |what: String| {
            tracing::error!("{what}");
            Some(Ending {
                status: RunStatus::Failed,
                done: self.failed_done(
                    run,
                    StopReason::Error,
                    format!("kodx hit an internal error ({what}). Run id `{}`.", run.id),
                ),
            })
        };
        // A run claimed before it was acknowledged is acknowledged now (or refused).
        let run = self.ensure_acknowledged(&run.id).await?;
        let run = &run;
        let gh = match self.installation(run).await {
            Ok(gh) => gh,
            Err(e) => {
                return internal(format!(
                    "GitHub did not give kodx an installation token: {e}"
                ))
            }
        };
        let Ok(repo) = RepoName::parse(&run.request.repo) else {
            return internal(format!(
                "the repository name {:?} is not valid",
                run.request.repo
            ));
        };
        // The config again: it may have changed since the run was queued.
        let config = match gh.file_on_default_branch(&repo, RepoConfig::PATH).await {
            Ok(Some(text)) => match RepoConfig::parse(&text) {
                Ok(c) => c,
                Err(e) => {
                    return Some(Ending {
                        status: RunStatus::Failed,
                        done: self.failed_done(run, StopReason::Error, format!(
                            "The repository's configuration became invalid: {e}. Fix it on the default branch and run the command again."
                        )),
                    })
                }
            },
            Ok(None) => RepoConfig::default(),
            Err(e) => return internal(format!("reading {} failed: {e}", RepoConfig::PATH)),
        };
        self.edit_phase(&gh, &repo, run, &Phase::SettingUp).await;
        let _ = self.db.set_phase(&run.id, "setting_up").await;

        // The program, its limits and its model.
        let program = Program::builtin(kind.program()).expect("built-in ask and code programs");
        let maxima = self.settings.maxima();
        let mut cost_limit = config.cost_limit_for(kind, &maxima);
        if let Some((budget, spent)) = self.budget_left(run).await {
            if budget - spent < MIN_RUN_BUDGET_USD {
                return Some(Ending {
                    status: RunStatus::Failed,
                    done: self.failed_done(
                        run,
                        StopReason::CostLimitExceeded,
                        "This installation's monthly budget was spent while the run waited; nothing was started.".into(),
                    ),
                });
            }
            // A run never spends past the budget.
            cost_limit = cost_limit.min(budget - spent);
        }
        let overrides = Overrides {
            model: config.model.clone().or_else(|| self.settings.model.clone()),
            image: config.image.clone(),
            setup_script: config.setup_script.clone(),
            disable_network_after_setup: config.disable_network_after_setup,
            cost_limit: Some(cost_limit),
            max_iterations: Some(config.max_iterations(&maxima)),
            command_timeout: None,
        };
        let defaults = program::Defaults {
            image: self.settings.image.clone(),
            cost_limit,
            max_iterations: config.max_iterations(&maxima),
            command_timeout: Duration::from_secs(self.settings.command_timeout_secs),
            run_timeout: Duration::from_secs(self.settings.run_timeout_secs),
            network: self.settings.network,
            network_allow: self.settings.network_allow.clone(),
            max_disk_bytes: self.settings.max_disk_bytes,
        };
        let plan = match Plan::new(
            format!("kodx-{}", run.id),
            program,
            &overrides,
            &defaults,
            &self.pricing,
        ) {
            Ok(p) => p,
            Err(e) => {
                return Some(Ending {
                    status: RunStatus::Failed,
                    done: self.failed_done(run, StopReason::Error, format!(
                        "{e}. Choose a model kodx knows in `{}` (`model:`), or ask the server's operator to add its price.",
                        RepoConfig::PATH
                    )),
                })
            }
        };
        let program = &plan.program;
        let provider = match self.providers.make(program.model.provider) {
            Ok(p) => p,
            Err(e) => {
                return internal(format!(
                    "the model API is not configured on this server: {e}"
                ))
            }
        };
        let provider = Timed {
            inner: provider,
            metrics: self.metrics.clone(),
        };

        // The context and the clone.
        let (context, checkout, clone_url, pull) = match self.context(&gh, &repo, run).await {
            Ok(c) => c,
            Err(e) => return internal(format!("reading the issue from GitHub failed: {e}")),
        };
        // Where a code run's change goes; for pull requests, the branch to work on.
        let (checkout, target) = match (kind, &pull) {
            (RunKind::Ask, _) => (checkout, None),
            (RunKind::Code, None) => (
                checkout,
                Some(Target::NewPull {
                    branch: deliver::branch_name(
                        &config.pr.branch_prefix,
                        false,
                        run.request.issue_number,
                        &run.id,
                    ),
                    base: run.request.default_branch.clone(),
                    closes: Some(run.request.issue_number),
                    original: None,
                }),
            ),
            (RunKind::Code, Some(pr)) if !pr.is_fork => (
                crate::git::Checkout::Branch(pr.head.ref_name.clone()),
                Some(Target::PullBranch {
                    branch: pr.head.ref_name.clone(),
                }),
            ),
            (RunKind::Code, Some(pr)) => (
                checkout,
                Some(Target::NewPull {
                    branch: deliver::branch_name(
                        &config.pr.branch_prefix,
                        true,
                        run.request.issue_number,
                        &run.id,
                    ),
                    base: pr.base.ref_name.clone(),
                    closes: None,
                    original: Some(run.request.issue_number),
                }),
            ),
        };
        let prompt = context.prompt(run.kind());
        // Readable by this user alone: it holds a private repository.
        let workdir = match tempfile::Builder::new()
            .prefix(&format!("{}{}-", self.clone_prefix(), run.id))
            .permissions(std::fs::Permissions::from_mode(0o700))
            .tempdir()
        {
            Ok(d) => d,
            Err(e) => return internal(format!("no temporary directory for the clone: {e}")),
        };
        let dest = workdir.path().join("repo");
        let token = gh.token().expose().to_string();
        timings.add("prepare", prepare_started.elapsed());
        let clone_started = Instant::now();
        let cloned = {
            let dest = dest.clone();
            let url = clone_url.clone();
            let depth = if kind == RunKind::Ask { Some(1) } else { None };
            tokio::task::spawn_blocking(move || {
                crate::git::clone(&url, &token, &dest, &checkout, depth)
            })
            .await
        };
        match cloned {
            Ok(Ok(c)) => {
                timings.add("clone", clone_started.elapsed());
                tracing::info!(head = %c.head_sha, "cloned")
            }
            Ok(Err(e)) => {
                return Some(Ending {
                    status: RunStatus::Failed,
                    done: self.failed_done(
                        run,
                        StopReason::Error,
                        format!("Cloning the repository failed: {e}"),
                    ),
                })
            }
            Err(e) => return internal(format!("the clone task failed: {e}")),
        }
        if cancel.is_cancelled() {
            return Some(self.cancelled_early(run, cost_limit, program));
        }

        // The container.
        let engine = match self.engine.get().await {
            Ok(e) => e,
            Err(e) => return internal(format!("no Docker engine: {e}")),
        };
        let mut spec = plan.sandbox.clone();
        spec.repo_dir = Some(dest.clone());
        if run.attempts > 1 {
            // An earlier attempt's container (whoever made it) would hold the name.
            match engine.remove_run_containers(&spec.run_id).await {
                Ok(0) => {}
                Ok(n) => tracing::info!("removed {n} container(s) of an earlier attempt"),
                Err(e) => tracing::warn!("could not remove an earlier attempt's container: {e}"),
            }
        }
        let setup_started = Instant::now();
        let sandbox = tokio::select! {
            s = engine.start_with_progress(&spec, |line| tracing::info!("{line}")) => s,
            _ = cancel.cancelled() => return Some(self.cancelled_early(run, cost_limit, program)),
        };
        let sandbox = match sandbox {
            Ok(s) => {
                timings.add("container", setup_started.elapsed());
                s
            }
            Err(e @ (SandboxError::SetupFailed { .. } | SandboxError::SetupTimedOut { .. })) => {
                let mut outcome = zero_outcome(
                    StopReason::SetupFailed,
                    cost_limit,
                    program.model.name.clone(),
                );
                outcome.duration = setup_started.elapsed();
                outcome.detail = Some(e.to_string());
                return Some(Ending {
                    status: RunStatus::Failed,
                    done: Done {
                        kind,
                        outcome,
                        text: String::new(),
                        pr_url: None,
                        pushed: None,
                        failure: None,
                    },
                });
            }
            Err(e) => {
                return Some(Ending {
                    status: RunStatus::Failed,
                    done: self.failed_done(
                        run,
                        StopReason::Error,
                        format!("The container could not be started: {e}"),
                    ),
                })
            }
        };

        // The agent, with the status comment following its progress.
        let _ = self.db.set_phase(&run.id, "working").await;
        let agent_config = plan.agent.clone();
        let (progress_tx, progress_rx) = tokio::sync::watch::channel(None::<Progress>);
        let updater = tokio::spawn(self.clone().follow_progress(
            gh.clone(),
            repo.clone(),
            run.clone(),
            progress_rx,
        ));
        let (records_tx, records_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        let writer = tokio::spawn(write_transcript(
            self.db.clone(),
            run.id.clone(),
            records_rx,
        ));
        let agent = Agent {
            provider: &provider,
            sandbox: &sandbox,
            config: agent_config,
            cancel: cancel.clone(),
        };
        let agent_started = Instant::now();
        let outcome = agent
            .run(
                &prompt,
                |p| {
                    let _ = progress_tx.send(Some(p.clone()));
                },
                |r: &Record| {
                    if let Ok(line) = serde_json::to_string(r) {
                        let _ = records_tx.send(line);
                    }
                },
            )
            .await;
        timings.add("agent", agent_started.elapsed());
        drop(progress_tx);
        drop(records_tx);
        let _ = updater.await;
        let _ = writer.await;
        // A code run that ended its turn: its exact change set leaves the container.
        let changes = match (&target, outcome.stop_reason) {
            (Some(_), StopReason::EndTurn) => {
                let started = Instant::now();
                let changes = sandbox.change_set().await;
                timings.add("export", started.elapsed());
                Some(changes)
            }
            _ => None,
        };
        // The container goes while the change is delivered (it is not needed any more).
        drop(agent);
        let teardown = tokio::spawn(async move { sandbox.destroy().await });
        let mut done = Done {
            kind,
            text: outcome.last_message.clone(),
            outcome,
            pr_url: None,
            pushed: None,
            failure: None,
        };
        if let (Some(target), Some(changes)) = (target, changes) {
            let delivered = match changes {
                Ok(changes) => {
                    self.deliver(
                        run,
                        &repo,
                        &dest,
                        &clone_url,
                        &target,
                        changes,
                        &done,
                        config.pr.draft,
                        timings,
                    )
                    .await
                }
                Err(e) => Err(format!(
                    "The changes could not be taken out of the container: {e}"
                )),
            };
            match delivered {
                Ok(Delivered::Pull(url)) => done.pr_url = Some(url),
                Ok(Delivered::Pushed { sha, branch }) => done.pushed = Some((sha, branch)),
                Ok(Delivered::Nothing) => {}
                Err(failure) => done.failure = Some(failure),
            }
        }
        match teardown.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!("removing the container failed: {e}"),
            Err(e) => tracing::warn!("removing the container failed: {e}"),
        }
        // The clone (and for ask runs, the container's changes) go with `workdir`.
        drop(workdir);
        let status = if done.succeeded() {
            RunStatus::Succeeded
        } else {
            RunStatus::Failed
        };
        Some(Ending { status, done })
    }

    /// Applies a code run's change set to the host clone, commits it, pushes it and opens
    /// (or finds) the pull request. `Err` is the sentence the status comment shows.
    #[allow(clippy::too_many_arguments)]
    async fn deliver(
        &self,
        run: &Run,
        repo: &RepoName,
        dest: &std::path::Path,
        clone_url: &str,
        target: &Target,
        changes: crate::sandbox::archive::ChangeSet,
        done: &Done,
        draft: bool,
        timings: &Timings,
    ) -> Result<Delivered, String> {
        if changes.is_empty() {
            return Ok(Delivered::Nothing);
        }
        tracing::info!(changes = %changes.summary(), "delivering");
        // A fresh token: the run may have outlived the one it cloned with.
        let gh = self
            .installation(run)
            .await
            .map_err(|e| format!("GitHub did not give kodx a token to push with: {e}"))?;
        let bot = self
            .app
            .bot_identity(&gh)
            .await
            .map_err(|e| format!("kodx could not read its own GitHub identity: {e}"))?;
        let summary = done.outcome.last_message.clone();
        let subject = deliver::commit_subject(run.request.job.argument());
        let body = deliver::commit_body(
            &summary,
            run.request.issue_number,
            run.request.is_pull_request,
            &run.id,
        );
        let trailers = deliver::trailers(&run.request.author, run.request.author_id, &run.id);
        let max_file_bytes = self.settings.max_commit_file_bytes;
        let token = gh.token().expose().to_string();
        let committed = {
            let dest = dest.to_path_buf();
            let url = clone_url.to_string();
            let target = target.clone();
            let token = token.clone();
            let identity_name = bot.login.clone();
            let identity_email = bot.noreply_email.clone();
            type Pushed = Option<(String, String, Duration, Duration)>;
            tokio::task::spawn_blocking(move || -> Result<Pushed, String> {
                let started = Instant::now();
                changes
                    .apply(&dest)
                    .map_err(|e| format!("The changes could not be applied to the clone: {e}"))?;
                let request = crate::git::CommitRequest {
                    author: crate::git::Identity {
                        name: identity_name,
                        email: identity_email,
                    },
                    subject: &subject,
                    body: &body,
                    trailers: &trailers,
                    max_file_bytes,
                };
                let Some(commit) = crate::git::commit_all(&dest, &request)
                    .map_err(|e| format!("The change could not be committed: {e}"))?
                else {
                    return Ok(None);
                };
                tracing::info!(sha = %commit.sha, files = commit.files_changed, "committed");
                let committed = started.elapsed();
                let started = Instant::now();
                match &target {
                    Target::NewPull { branch, .. } => {
                        // The run's own branch: a re-run after a restart replaces what an
                        // earlier attempt pushed there.
                        crate::git::push(&dest, &url, &token, "HEAD", branch, true)
                            .map_err(|e| push_failure(&e, branch))?;
                        Ok(Some((
                            commit.sha,
                            branch.clone(),
                            committed,
                            started.elapsed(),
                        )))
                    }
                    Target::PullBranch { branch } => {
                        let pushed = crate::git::push_rebasing(&dest, &url, &token, branch, 3)
                            .map_err(|e| push_failure(&e, branch))?;
                        Ok(Some((
                            pushed.sha,
                            branch.clone(),
                            committed,
                            started.elapsed(),
                        )))
                    }
                }
            })
            .await
            .map_err(|e| format!("kodx hit an internal error while committing: {e}"))??
        };
        let Some((sha, branch, commit_took, push_took)) = committed else {
            return Ok(Delivered::Nothing);
        };
        timings.add("commit", commit_took);
        timings.add("push", push_took);
        let pr_started = Instant::now();
        let Target::NewPull { base, .. } = target else {
            return Ok(Delivered::Pushed { sha, branch });
        };
        let cost = comment::cost_summary(&done.outcome);
        let pull_body = deliver::pull_body(&summary, target, &run.request.author, &cost, &run.id);
        let existing = gh.find_open_pull(repo, &branch).await.map_err(|e| {
            format!("Pushed `{branch}`, but GitHub could not be asked for its pull request: {e}")
        })?;
        if let Some(pr) = existing {
            let _ = gh.update_pull_body(repo, pr.number, &pull_body).await;
            timings.add("pull_request", pr_started.elapsed());
            return Ok(Delivered::Pull(pr.html_url));
        }
        let new = crate::github::NewPull {
            title: deliver::title_from(run.request.job.argument(), 100),
            head: branch.clone(),
            base: base.clone(),
            body: pull_body,
            draft,
        };
        let created = gh.create_pull(repo, &new).await;
        timings.add("pull_request", pr_started.elapsed());
        match created {
            Ok(pr) => Ok(Delivered::Pull(pr.html_url)),
            Err(GitHubError::PullExists { .. }) => match gh.find_open_pull(repo, &branch).await {
                Ok(Some(pr)) => Ok(Delivered::Pull(pr.html_url)),
                _ => Err(format!(
                    "Pushed `{branch}`, but its pull request could not be found."
                )),
            },
            Err(e) => Err(format!(
                "Pushed the change to branch `{branch}`, but opening the pull request failed: {e}"
            )),
        }
    }

    fn cancelled_early(&self, run: &Run, cost_limit: f64, program: &Program) -> Ending {
        Ending {
            status: RunStatus::Cancelled,
            done: Done {
                kind: run_kind(run),
                outcome: zero_outcome(
                    StopReason::Cancelled,
                    cost_limit,
                    program.model.name.clone(),
                ),
                text: String::new(),
                pr_url: None,
                pushed: None,
                failure: None,
            },
        }
    }

    /// What the model is told, which commit to clone, and from where.
    async fn context(
        &self,
        gh: &Installation,
        repo: &RepoName,
        run: &Run,
    ) -> Result<(RunContext, crate::git::Checkout, String, Option<PullInfo>), GitHubError> {
        let number = run.request.issue_number as u64;
        let mut ctx = RunContext {
            repo: run.request.repo.clone(),
            number: run.request.issue_number,
            is_pull_request: run.request.is_pull_request,
            author: run.request.author.clone(),
            request: run.request.job.argument().to_string(),
            ..Default::default()
        };
        ctx.review = run.request.trigger.review().cloned();
        if run.request.is_pull_request {
            let pr = gh.pull_request(repo, number).await?;
            ctx.title = pr.title.clone();
            ctx.body = pr.body.clone();
            ctx.branches = Some((pr.head.ref_name.clone(), pr.base.ref_name.clone()));
            ctx.diff = Some(
                gh.pull_request_diff(repo, number, self.settings.max_diff_bytes)
                    .await?,
            );
            ctx.comments = self.comments(gh, repo, number).await?;
            // The PR head: from the base repository (refs/pull/N/head) — a fork is never
            // cloned with the App's token, and works the same as a same-repo branch.
            Ok((
                ctx,
                crate::git::Checkout::PullHead(number),
                run.request.clone_url.clone(),
                Some(pr),
            ))
        } else {
            let issue = gh.issue(repo, number).await?;
            ctx.title = issue.title;
            ctx.body = issue.body;
            ctx.comments = self.comments(gh, repo, number).await?;
            Ok((
                ctx,
                crate::git::Checkout::DefaultBranch,
                run.request.clone_url.clone(),
                None,
            ))
        }
    }

    async fn comments(
        &self,
        gh: &Installation,
        repo: &RepoName,
        number: u64,
    ) -> Result<Vec<ContextComment>, GitHubError> {
        if self.settings.context_comments == 0 {
            return Ok(Vec::new());
        }
        let comments = gh
            .issue_comments(repo, number, self.settings.context_comments)
            .await?;
        Ok(comments
            .into_iter()
            .filter(|c| !c.author_is_bot)
            .map(|c| ContextComment {
                author: c.author,
                body: strip_hidden(&c.body),
            })
            .collect())
    }

    /// Edits the status comment as the run moves, at most once per `status_interval`.
    async fn follow_progress(
        self: Arc<Self>,
        gh: Installation,
        repo: RepoName,
        run: Run,
        mut rx: tokio::sync::watch::Receiver<Option<Progress>>,
    ) {
        let interval = self.settings.status_interval();
        let mut last_edit: Option<Instant> = None;
        let mut shown_step = 0;
        loop {
            if rx.changed().await.is_err() {
                return;
            }
            if let Some(at) = last_edit {
                let wait = interval.saturating_sub(at.elapsed());
                if !wait.is_zero() {
                    tokio::time::sleep(wait).await;
                }
            }
            let p = rx.borrow_and_update().clone();
            let Some(p) = p else { continue };
            if p.step == shown_step {
                continue;
            }
            shown_step = p.step;
            self.edit_phase(
                &gh,
                &repo,
                &run,
                &Phase::Working {
                    step: p.step,
                    spent: p.spent,
                    limit: p.limit,
                },
            )
            .await;
            last_edit = Some(Instant::now());
        }
    }

    async fn edit_phase(&self, gh: &Installation, repo: &RepoName, run: &Run, phase: &Phase) {
        let Some(id) = self.status_comment_id(run).await else {
            return;
        };
        let body = comment::render(&run.id, &command_line(run), phase);
        if let Err(e) = gh.update_comment(repo, id, &body).await {
            tracing::warn!("editing the status comment failed: {e}");
        }
    }

    async fn status_comment_id(&self, run: &Run) -> Option<u64> {
        if let Some(id) = run.status_comment_id {
            return Some(id as u64);
        }
        match self.db.get_run(&run.id).await {
            Ok(Some(r)) => r.status_comment_id.map(|id| id as u64),
            _ => None,
        }
    }

    /// Replaces the status comment's header line with `note` (restarts, shutdown).
    async fn edit_status(&self, run: &Run, note: &str) {
        let Ok(gh) = self.installation(run).await else {
            return;
        };
        let Ok(repo) = RepoName::parse(&run.request.repo) else {
            return;
        };
        let Some(id) = self.status_comment_id(run).await else {
            return;
        };
        let body = comment::render(&run.id, &command_line(run), &Phase::Note(note.into()));
        if let Err(e) = gh.update_comment(&repo, id, &body).await {
            tracing::warn!("editing the status comment failed: {e}");
        }
    }

    /// The final status comment and the `rocket` / `confused` reaction.
    async fn post_done(&self, run: &Run, done: &Done) {
        let gh = match self.installation(run).await {
            Ok(gh) => gh,
            Err(e) => {
                tracing::error!("GitHub unreachable; the outcome was not posted: {e}");
                return;
            }
        };
        let Ok(repo) = RepoName::parse(&run.request.repo) else {
            return;
        };
        let body = comment::render(
            &run.id,
            &command_line(run),
            &Phase::Done(Box::new(done.clone())),
        );
        let posted = match self.status_comment_id(run).await {
            Some(id) => gh.update_comment(&repo, id, &body).await,
            None => gh
                .create_comment(&repo, run.request.issue_number as u64, &body)
                .await
                .map(|_| ()),
        };
        if let Err(e) = posted {
            tracing::error!("posting the outcome failed: {e}");
        }
        let reaction = if done.succeeded() {
            Reaction::Rocket
        } else {
            Reaction::Confused
        };
        self.react(&gh, &repo, run, reaction).await;
    }

    fn failed_done(&self, run: &Run, reason: StopReason, failure: String) -> Done {
        Done {
            kind: run_kind(run),
            outcome: zero_outcome(reason, 0.0, String::new()),
            text: String::new(),
            pr_url: None,
            pushed: None,
            failure: Some(failure),
        }
    }
}

/// Where a code run's change went.
enum Delivered {
    Pull(String),
    Pushed { sha: String, branch: String },
    Nothing,
}

/// A push the server refused, in words a maintainer can act on.
fn push_failure(e: &crate::git::GitError, branch: &str) -> String {
    match e {
        crate::git::GitError::Rejected { reason } => format!(
            "GitHub refused the push to `{branch}`: {}",
            crate::git::explain_rejection(reason)
        ),
        crate::git::GitError::Conflict { paths } => format!(
            "The branch `{branch}` moved while kodx worked, and kodx's change conflicts with it in {}. Nothing was pushed; run the command again on the new head.",
            paths.iter().map(|p| format!("`{p}`")).collect::<Vec<_>>().join(", ")
        ),
        other => format!("Pushing to `{branch}` failed: {other}"),
    }
}

/// Removes the directories in `dir` whose name starts with `prefix` (the clones an earlier
/// process of this installation left there); returns how many. Symbolic links are removed,
/// never followed.
fn remove_stale_clones(dir: &std::path::Path, prefix: &str) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        if !entry.file_name().to_string_lossy().starts_with(prefix) {
            continue;
        }
        let path = entry.path();
        let gone = match entry.file_type() {
            Ok(t) if t.is_dir() => std::fs::remove_dir_all(&path),
            _ => std::fs::remove_file(&path),
        };
        match gone {
            Ok(()) => removed += 1,
            Err(e) => tracing::warn!("could not remove the old clone {}: {e}", path.display()),
        }
    }
    removed
}

/// Keeps the transcript in the database as records arrive.
async fn write_transcript(
    db: Db,
    run_id: String,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    let mut seq = db.next_transcript_seq(&run_id).await.unwrap_or(0);
    while let Some(line) = rx.recv().await {
        if let Err(e) = db.append_transcript(&run_id, seq, &line).await {
            tracing::warn!("writing the transcript failed: {e}");
        }
        seq += 1;
    }
}

/// Times model calls for `/metrics`.
struct Timed {
    inner: Box<dyn Provider>,
    metrics: Arc<Metrics>,
}

#[async_trait::async_trait]
impl Provider for Timed {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    async fn complete(&self, request: &Request) -> Result<Response, ProviderError> {
        let started = Instant::now();
        let r = self.inner.complete(request).await;
        self.metrics.model_call(&request.model, started.elapsed());
        r
    }
}

/// The work a run does (a control job's status comment reads as an `ask`'s).
fn run_kind(run: &Run) -> RunKind {
    run.kind().run_kind().unwrap_or(RunKind::Ask)
}

fn zero_outcome(reason: StopReason, cost_limit: f64, model: String) -> Outcome {
    Outcome {
        stop_reason: reason,
        last_message: String::new(),
        api_calls: 0,
        usage: Usage::default(),
        usd_cost: 0.0,
        cost_limit,
        duration: Duration::ZERO,
        model,
        detail: None,
    }
}

/// The command as the status comment quotes it.
fn command_line(run: &Run) -> String {
    run.request.job.command_line()
}

fn run_span(run: &Run) -> tracing::Span {
    tracing::info_span!("run", repo = %run.request.repo, issue = run.request.issue_number, run_id = %run.id, command = %run.kind())
}

/// The first millisecond of the current month (UTC) for `now_ms`.
fn month_start_ms(now_ms: i64) -> i64 {
    use chrono::{DateTime, Datelike, NaiveTime};
    // Out of chrono's range (±262,000 years) only for a clock that is badly wrong.
    let Some(now) = DateTime::from_timestamp_millis(now_ms) else {
        return now_ms;
    };
    let first = now
        .date_naive()
        .with_day(1)
        .expect("every month has a first day");
    first.and_time(NaiveTime::MIN).and_utc().timestamp_millis()
}

fn hostname() -> String {
    std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "kodx".into())
}

/// The one short comment a person without permission gets.
fn not_permitted(author: &str, kind: JobKind, needed: Permission, has: Permission) -> String {
    let who = match needed {
        Permission::Read => "people with read access to this repository",
        _ => "people with write, maintain or admin access to this repository",
    };
    let what = match kind {
        JobKind::Ask | JobKind::Code | JobKind::Cancel => format!("`/kodx {kind}`"),
        _ => "kodx".to_string(),
    };
    format!(
        "@{} {what} can only be run by {who}; your permission here is `{}`.",
        comment::redact(author),
        has.as_str()
    )
}

/// The answer to `/kodx help` (and to an unknown subcommand).
pub fn help_text(unknown: &str) -> String {
    let mut out = String::new();
    if !unknown.is_empty() {
        out.push_str(&format!(
            "kodx does not know `/kodx {}`.\n\n",
            comment::redact(unknown).replace('`', "'")
        ));
    }
    out.push_str(
        "**kodx** runs an AI agent in a sandboxed container on a copy of this repository.\n\n\
         | command | what happens | who may |\n\
         | --- | --- | --- |\n\
         | `/kodx ask <question>` | the agent reads the code and answers here | write access (or read, if the repository allows it) |\n\
         | `/kodx code <request>` | the agent makes the change and opens a pull request | write access |\n\
         | `/kodx cancel` | stops the runs on this issue or pull request | write access |\n\
         | `/kodx help` | this message | everyone |\n\n\
         The command must start a line, outside code blocks and quotes; everything after it is the request. \
         Limits and the model are set in `.github/kodx.yml`.",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn month_start() {
        // 2026-11-22T10:00:00Z → 2026-11-01T00:00:00Z
        assert_eq!(month_start_ms(1_795_341_600_000), 1_793_491_200_000);
        // 2024-03-01T00:00:00Z is its own month start; a leap February before it.
        assert_eq!(month_start_ms(1_709_251_200_000), 1_709_251_200_000);
        assert_eq!(month_start_ms(1_709_251_199_999), 1_706_745_600_000);
        assert_eq!(month_start_ms(0), 0);
    }
}
