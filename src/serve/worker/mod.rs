//! The workers of `kodx serve` (SPEC §4, §5, §9): they take what the webhook queued and do
//! the slow part — permission checks, the repository's config, the status comment, the
//! clone, the container and the agent — and say on GitHub how it went.
//!
//! Two kinds of work leave the queue: short control jobs (`help`, `cancel`, refusals), taken
//! at once, and runs (`ask`, `code`), at most `max_concurrent_runs` at a time and one per
//! issue. A run is acknowledged (`eyes`, the status comment) as soon as it is queued, even
//! while it waits for a free worker.

mod ending;
pub(in crate::serve) mod gate;
mod run;
mod status;
mod tasks;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::agent::{Outcome, StopReason};
use crate::comment::RunKind;
use crate::cost::Pricing;
use crate::db::{Db, Finish, RecoveryAction, Run, RunStatus};
use crate::github::{GitHubApp, GitHubError, Installation, RepoName, TokenScope};
use crate::model::{Provider, Usage};
use crate::program;
use crate::sandbox::{Engine, SandboxError};
use crate::serve::config::Settings;
use crate::serve::job::{JobKind, TriggerKind};
use crate::serve::metrics::Metrics;
use tasks::{Panicked, Tasks};

pub use ending::EndReason;
use ending::RunLog;
pub(in crate::serve) use ending::{Ending, RunFailure};
use gate::Admission;

/// Makes the model client of a run (from the environment in production).
pub trait ProviderFactory: Send + Sync {
    fn make(&self, provider: program::ProviderKind) -> Result<Box<dyn Provider>, String>;
}

/// Anthropic and OpenAI-compatible clients from `ANTHROPIC_*` / `OPENAI_*`.
pub struct EnvProviders;

impl ProviderFactory for EnvProviders {
    fn make(&self, provider: program::ProviderKind) -> Result<Box<dyn Provider>, String> {
        Ok(match provider {
            program::ProviderKind::Anthropic => {
                Box::new(crate::providers::AnthropicClient::from_env()?)
            }
            program::ProviderKind::OpenAi => Box::new(crate::providers::OpenAiClient::from_env()?),
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
    pub(in crate::serve) running: Mutex<HashMap<String, RunHandle>>,
    /// The acknowledgement of each run being acknowledged, or acknowledged and waiting for
    /// a slot: made once, by whichever task comes first, and taken by the run when it starts.
    acks: Mutex<HashMap<String, Arc<tokio::sync::OnceCell<Acked>>>>,
    /// How many runs this process has ended (see [`Admission::is_fresh`]).
    ended: AtomicU64,
    slots: Arc<Semaphore>,
}

/// What acknowledging a run came to.
#[derive(Clone)]
pub(in crate::serve) enum Acked {
    /// Admitted; `eyes` and the status comment (its id, unless creating it failed) are up.
    Admitted(Box<Admission>, Option<u64>),
    /// Refused, and finished.
    Refused,
    /// GitHub could not be asked; nothing was posted.
    Unreachable,
}

pub(in crate::serve) struct RunHandle {
    pub(in crate::serve) cancel: CancellationToken,
    /// Who cancelled it with `/kodx cancel` (none: shutdown).
    pub(in crate::serve) cancelled_by: Arc<Mutex<Option<String>>>,
}

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
            acks: Mutex::new(HashMap::new()),
            ended: AtomicU64::new(0),
            slots,
            settings,
        })
    }

    /// Runs left `running` by a dead process go back to the queue (once), and what it left
    /// behind goes: its containers and its clones. Old transcripts are pruned.
    pub async fn recover(self: &Arc<Self>) {
        let prefix = self.clone_prefix();
        let runs = self.repo_cache().map(|c| c.root().join(run::RUNS_DIR));
        match tokio::task::spawn_blocking(move || {
            remove_stale_clones(&std::env::temp_dir(), &prefix)
                + runs.map_or(0, |dir| remove_stale_clones(&dir, &prefix))
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
                        this.metrics.run_finished(run.kind().as_str(), EndReason::Internal.as_str(), 0.0, Duration::ZERO);
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
        let mut tasks = Tasks::default();
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
            for p in tasks.reap() {
                self.panicked(p).await;
            }
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
        let waited = tokio::time::timeout(grace, self.join_all(&mut tasks)).await;
        if waited.is_err() {
            for handle in self.running.lock().expect("lock").values() {
                handle.cancel.cancel();
            }
            self.join_all(&mut tasks).await;
        }
        pruner.abort();
        let n = crate::sandbox::docker::remove_all_live().await;
        if n > 0 {
            tracing::info!("removed {n} sandbox container(s) at shutdown");
        }
    }

    /// Waits for every task to end.
    async fn join_all(self: &Arc<Self>, tasks: &mut Tasks) {
        while let Some(ended) = tasks.join_next().await {
            if let Some(p) = ended {
                self.panicked(p).await;
            }
        }
    }

    /// A task that panicked: its run fails as an internal error (nothing else would ever
    /// finish it), with a log line and the status comment saying so.
    async fn panicked(self: &Arc<Self>, p: Panicked) {
        tracing::error!(run_id = %p.run_id, "a worker task panicked: {}", p.message);
        self.forget_ack(&p.run_id);
        if self
            .running
            .lock()
            .expect("lock")
            .remove(&p.run_id)
            .is_some()
        {
            self.metrics.run_ended();
        }
        self.wake.notify_one();
        let run = match self.db.get_run(&p.run_id).await {
            Ok(Some(run)) if !run.status.is_final() => run,
            Ok(_) => return,
            Err(e) => {
                tracing::error!(run_id = %p.run_id, "reading the run of a panicked task failed: {e}");
                return;
            }
        };
        let failure = RunFailure::Internal(anyhow::Error::new(p));
        self.conclude(&run, Err(failure), &RunLog::default(), Instant::now())
            .await;
    }

    async fn dispatch(self: &Arc<Self>, tasks: &mut Tasks) {
        // Control jobs first: they are quick and a cancel must not wait for a slot.
        loop {
            match self.db.claim_control(&self.worker_id).await {
                Ok(Some(job)) => {
                    let this = self.clone();
                    let span = run_span(&job);
                    let id = job.id.clone();
                    tasks.spawn(&id, async move { this.control(job).await }.instrument(span));
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
                        || self.acks.lock().expect("lock").contains_key(&run.id)
                    {
                        continue;
                    }
                    let this = self.clone();
                    let span = run_span(&run);
                    tasks.spawn(
                        &run.id.clone(),
                        async move {
                            this.ensure_acknowledged(&run).await;
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
                        &run.id.clone(),
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

    /// Acknowledges the run once, whoever asks first (the task acknowledging it while it
    /// waits, or the worker that claimed it); the other waits for the same outcome. `None`
    /// for a run an earlier process acknowledged (it has a status comment).
    async fn ensure_acknowledged(&self, run: &Run) -> Option<Acked> {
        let cell = {
            let mut acks = self.acks.lock().expect("lock");
            match acks.get(&run.id) {
                Some(cell) => cell.clone(),
                None if run.status_comment_id.is_some() => return None,
                None => acks.entry(run.id.clone()).or_default().clone(),
            }
        };
        let acked = cell.get_or_init(|| self.acknowledge(run)).await.clone();
        // Only an admitted run with its status comment waits here for its slot; the others
        // are over, or are acknowledged again on the next pass.
        if !matches!(acked, Acked::Admitted(_, Some(_))) {
            self.forget_ack(&run.id);
        }
        Some(acked)
    }

    /// Drops what acknowledging the run left for it (it started, or it is over).
    pub(in crate::serve) fn forget_ack(&self, run_id: &str) {
        self.acks.lock().expect("lock").remove(run_id);
    }

    /// How many runs this process has ended.
    pub(in crate::serve) fn ended(&self) -> u64 {
        self.ended.load(Ordering::SeqCst)
    }

    /// Records a run that ended without a model call: its row and its metrics.
    pub(in crate::serve) async fn finish_quietly(
        &self,
        run: &Run,
        status: RunStatus,
        reason: EndReason,
        result: serde_json::Value,
    ) {
        let fin = Finish::without_calls(status, reason.as_str(), result);
        if let Err(e) = self.db.finish(&run.id, &fin).await {
            tracing::error!("recording the end of the run failed: {e}");
        }
        self.metrics
            .run_finished(run.kind().as_str(), reason.as_str(), 0.0, Duration::ZERO);
    }

    /// The run's repository and a token for it ([`Workers::installation`]).
    pub(in crate::serve) async fn github(
        &self,
        run: &Run,
    ) -> anyhow::Result<(Installation, RepoName)> {
        use anyhow::Context as _;
        let repo = RepoName::parse(&run.request.repo)
            .with_context(|| format!("the repository name {:?} is not valid", run.request.repo))?;
        let gh = self
            .installation(run)
            .await
            .context("GitHub did not give kodx an installation token")?;
        Ok((gh, repo))
    }

    /// A token for this run's repository only, with the permissions its kind uses: a code
    /// run may push and open pull requests; an ask, help or cancel reads and comments.
    pub(in crate::serve) async fn installation(
        &self,
        run: &Run,
    ) -> Result<Installation, GitHubError> {
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

/// The work a run does (a control job's status comment reads as an `ask`'s).
pub(in crate::serve) fn run_kind(run: &Run) -> RunKind {
    run.kind().run_kind().unwrap_or(RunKind::Ask)
}

pub(in crate::serve) fn zero_outcome(
    reason: StopReason,
    cost_limit: f64,
    model: String,
) -> Outcome {
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

fn run_span(run: &Run) -> tracing::Span {
    tracing::info_span!("run", repo = %run.request.repo, issue = run.request.issue_number, run_id = %run.id, command = %run.kind())
}

fn hostname() -> String {
    std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "kodx".into())
}
