//! What `ask` and `code` runs share once planned: the clone, the container, and the agent
//! working in it with the status comment following its progress and the transcript kept in
//! the database. [`ask`](super::ask) and [`code`](super::code) do what comes after.

use std::sync::Arc;
use std::time::Instant;

use secrecy::ExposeSecret;
use tokio_util::sync::CancellationToken;

use super::ending::zero_outcome;
use super::{status, workspace, Ending, Lease, RunCtx, RunFailure, RunLog, Services};
use crate::agent::{Agent, Outcome, Progress, Record, StopReason};
use crate::checks::verify::{FreshSandboxes, Verifier};
use crate::db::{Db, DbError, Run, RunStatus};
use crate::model::{Message, Provider, ProviderError, Request, Response};
use crate::program::Plan;
use crate::sandbox::{
    ChangeSet, DockerSandbox, Exported, FeedOutput, Sandbox, SandboxError, SandboxSpec,
};
use crate::serve::metrics::Metrics;
use crate::serve::pipeline::deliver::Target;
use crate::serve::pipeline::plan::RunPlan;
use crate::serve::pipeline::workspace::{CloneOf, Workspace};
use crate::serve::texts;
use crate::serve::texts::status::Done;

use anyhow::Context as _;

/// How far an execution got. (One per run, moved once: its size does not matter.)
#[allow(clippy::large_enum_variant)]
pub(in crate::serve) enum Executed {
    /// The agent ran; its container is still up (a code run's change is in it).
    Ran {
        workspace: Workspace,
        sandbox: DockerSandbox,
        outcome: Outcome,
        /// The change set the last checks ran on, when the agent did nothing after them:
        /// the one to deliver.
        verified: Option<ChangeSet>,
    },
    /// The run ended before the agent: cancelled, or the repository's setup failed.
    Over(Ending),
}

/// What a run that got as far as its agent has: its clone, its container, its outcome,
/// and the change set its last checks judged (when nothing changed after them).
pub(in crate::serve) type Ran = (Workspace, DockerSandbox, Outcome, Option<ChangeSet>);

impl Executed {
    /// The agent's run, or the ending of a run that stopped before it. (Once per run:
    /// the size of the error does not matter.)
    #[allow(clippy::result_large_err)]
    pub(in crate::serve) fn ran(self) -> Result<Ran, Ending> {
        match self {
            Executed::Ran {
                workspace,
                sandbox,
                outcome,
                verified,
            } => Ok((workspace, sandbox, outcome, verified)),
            Executed::Over(ending) => Err(ending),
        }
    }
}

/// A merge run's workspace: the base merged into the branch, conflicts left in, and the
/// files and both commits added to a new conversation's first message. Other runs'
/// messages come back as they are.
async fn merged_in(
    svc: &Services,
    gh: &crate::github::Installation,
    run: &Run,
    run_plan: &RunPlan,
    workspace: &mut Workspace,
    messages: Vec<Message>,
    timings: &super::Timings,
) -> Result<Vec<Message>, RunFailure> {
    let Some(Target::Merge { branch, base }) = &run_plan.target else {
        return Ok(messages);
    };
    let bot = svc
        .app
        .bot_identity(gh)
        .await
        .context("reading kodx's own identity failed")?;
    let author = crate::git::Identity {
        name: bot.login.clone(),
        email: bot.noreply_email.clone(),
    };
    let token = gh.token().expose_secret().to_string();
    let url = run.request.clone_url.clone();
    let prepared = workspace
        .prepare_merge(&url, token, branch, base, author, timings)
        .await?;
    if prepared.up_to_date {
        return Err(RunFailure::User(texts::merge::nothing_to_merge(base)));
    }
    if messages.len() != 1 {
        return Ok(messages);
    }
    let brief = texts::merge::conflicts_brief(prepared, branch, base);
    Ok(vec![Message::user_text(format!(
        "{}{brief}",
        run_plan.prompt
    ))])
}

/// Clones, starts the container and runs the agent to its end, from `messages` (the
/// prompt, or a stopped run's conversation).
pub(in crate::serve) async fn execute(
    cx: &RunCtx<'_>,
    run_plan: &RunPlan,
    messages: Vec<Message>,
) -> Result<Executed, RunFailure> {
    let RunCtx {
        svc,
        run,
        gh,
        status,
        cancel,
        lease,
        log,
        ..
    } = cx;
    let (run, cancel, lease, log) = (*run, *cancel, *lease, *log);
    let timings = &log.timings;
    let plan = &run_plan.plan;
    let provider = svc
        .providers
        .make(plan.program.model.provider)
        .map_err(anyhow::Error::msg)
        .context("the model API is not configured on this server")?;
    // The time from the webhook to the first model call, of a run's first attempt that
    // did not wait for `/kodx go` (the others measure a restart or a person).
    let since_webhook = (run.attempts == 1 && run.confirmed_by.is_none()).then_some(run.created_at);
    let provider = Timed {
        inner: provider,
        metrics: svc.metrics.clone(),
        lease: lease.clone(),
        since_webhook: parking_lot::Mutex::new(since_webhook),
    };
    let mut workspace = workspace::workspace(
        svc,
        run,
        CloneOf {
            url: &run.request.clone_url,
            token: gh.token().expose_secret().to_string(),
            checkout: &run_plan.checkout,
            depth: run_plan.depth,
            tip_only: run_plan.tip_only(),
        },
        timings,
    )
    .await?;
    let messages = merged_in(svc, gh, run, run_plan, &mut workspace, messages, timings).await?;
    if cancel.is_cancelled() {
        return Ok(Executed::Over(cancelled_early(run_plan)));
    }
    let (spec, egress) = run_spec(cx, run_plan, &workspace).await;
    let sandbox = match container(svc, run, lease, run_plan, (&spec, egress), cancel, log).await? {
        Ok(sandbox) => sandbox,
        Err(over) => return Ok(Executed::Over(over)),
    };
    // The checks run apart (SPEC §12), on the run's engine, the first while the agent works.
    let verifier = match (plan.agent.checks.is_empty(), log.engine()) {
        (false, Some(engine)) => Some(FreshSandboxes::new(engine, &spec)),
        _ => None,
    };
    // The agent, with the status comment following its progress. If the engine stops
    // answering meanwhile, the run is stopped.
    let (engine_name, lost) = log.placed_on().unzip();
    let link = lost.clone().map(|lost| {
        let cancel = cancel.clone();
        tokio::spawn(async move {
            lost.cancelled().await;
            cancel.cancel();
        })
    });
    status::set_phase(svc, run, lease, "working").await;
    let (progress_tx, progress_rx) = tokio::sync::watch::channel(None::<Progress>);
    let updater = {
        let (status, interval) = (status.clone(), svc.settings.status_interval());
        tokio::spawn(async move { status.follow(interval, progress_rx).await })
    };
    let (records_tx, records_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    // A new conversation (a continuation's already holds what it was given).
    if messages.len() == 1 {
        send_context(run_plan, &records_tx);
    }
    let writer = tokio::spawn(write_transcript(
        svc.db.clone(),
        run.id.clone(),
        lease.clone(),
        records_rx,
    ));
    let fenced = Fenced {
        inner: &sandbox,
        lease,
    };
    let steering = super::steering::RunSteering::new(svc, &run.id, (*status).clone());
    let agent = Agent {
        provider: &provider,
        sandbox: &fenced,
        verifier: verifier.as_ref().map(|v| v as &dyn Verifier),
        config: plan.agent.clone(),
        cancel: cancel.clone(),
        steering: Some(&steering),
    };
    let started = Instant::now();
    let work = agent.resume(
        messages,
        |p| {
            let _ = progress_tx.send(Some(p.clone()));
        },
        |r: &Record| {
            if let Ok(line) = serde_json::to_string(r) {
                let _ = records_tx.send(line);
            }
        },
    );
    let outcome = steering.announcing(work).await;
    // Out of the proxy before the container can go (its address may be another's next).
    super::egress::finish(svc, run, log).await;
    timings.add("agent", started.elapsed());
    drop(progress_tx);
    drop(records_tx);
    for (task, what) in [
        (updater, "following the progress"),
        (writer, "the transcript writer"),
    ] {
        if let Err(e) = task.await {
            tracing::error!("{what} failed: {e}");
        }
    }
    if let Some(link) = link {
        link.abort();
    }
    if let (Some(name), true) = (engine_name, lost.is_some_and(|l| l.is_cancelled())) {
        tracing::warn!(engine = %name, "the run's Docker engine stopped answering; the run is stopped");
        // The container goes when the engine is back; do not wait for a dead one.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(3), sandbox.destroy()).await;
        let mut outcome = outcome;
        outcome.stop_reason = StopReason::Error;
        outcome.detail = Some(format!("the Docker engine {name} stopped answering"));
        let mut done = Done::new(run_plan.kind, outcome);
        done.failure = Some(texts::engine_lost(&name));
        return Ok(Executed::Over(Ending::Work {
            status: RunStatus::Failed,
            done,
        }));
    }
    let verified = close_verifier(verifier, timings).await;
    Ok(Executed::Ran {
        workspace,
        sandbox,
        outcome,
        verified,
    })
}

/// The repository context given to a new conversation, as the transcript's first record.
fn send_context(run_plan: &RunPlan, records: &tokio::sync::mpsc::UnboundedSender<String>) {
    let Some(context) = run_plan.repo_context.as_ref() else {
        return;
    };
    let record = Record::Context {
        context: context.clone(),
    };
    if let Ok(line) = serde_json::to_string(&record) {
        let _ = records.send(line);
    }
}

/// Ends the checks' sandboxes: the change set the last checks judged (when nothing
/// changed after them), and what verification added, all passes together, in `timings`.
async fn close_verifier(
    verifier: Option<FreshSandboxes>,
    timings: &super::Timings,
) -> Option<ChangeSet> {
    let verifier = verifier?;
    let verified = verifier.take_verified();
    timings.add("verifier", verifier.overheads().into_iter().sum());
    verifier.close().await;
    verified
}

/// The run's sandbox spec with its clone, its setup secrets and (when its repository's
/// `network.allow` is used) what it may reach through the egress proxy.
async fn run_spec(
    cx: &RunCtx<'_>,
    run_plan: &RunPlan,
    workspace: &Workspace,
) -> (SandboxSpec, Option<super::egress::RunEgress>) {
    let (svc, config, log) = (cx.svc, &cx.admission.config, cx.log);
    let mut spec = sandbox_spec(cx.run, run_plan, workspace);
    let secrets = super::secrets::run_secrets(svc, cx.run, config, log).await;
    spec.setup_secrets = secrets.setup;
    let egress = super::egress::policy(svc, cx.run, config, &mut spec, secrets.injected, log);
    (spec, egress)
}

/// The run's sandbox spec, with its clone.
fn sandbox_spec(run: &Run, run_plan: &RunPlan, workspace: &Workspace) -> SandboxSpec {
    let mut spec = run_plan.plan.sandbox.clone();
    // Preloaded sandboxes are the installation's, for this repository alone, and hold a
    // tip-only checkout: a run with the history (a pull request's) starts from an empty one.
    if workspace.source == crate::sandbox::RepoSource::GitTip {
        spec.preload = Some(format!(
            "{}/{}",
            run.request.installation_id, run.request.repo
        ));
    }
    spec.repo_dir = Some(workspace.dest.clone());
    spec.repo_source = workspace.source;
    spec.ready = workspace.ready.clone();
    // A code run ends with its change set: the snapshot's exec starts ahead.
    spec.change_set_ahead = run_plan.target.is_some();
    spec
}

/// The run's container with the clone in it and the setup run. `Ok(Err(_))`: the run
/// is over (cancelled while it started, or the repository's setup failed).
async fn container(
    svc: &Services,
    run: &Run,
    lease: &Lease,
    run_plan: &RunPlan,
    (spec, egress): (&SandboxSpec, Option<super::egress::RunEgress>),
    cancel: &CancellationToken,
    log: &RunLog,
) -> Result<Result<DockerSandbox, Ending>, RunFailure> {
    let started = Instant::now();
    // An engine that fails while the container starts counts a missed answer and the run
    // is placed again (two in a row take an engine out, so this ends).
    let mut failures = Vec::new();
    loop {
        let placed = tokio::select! {
            p = svc.engine.place(&run.id, lease.lease(), &spec.image, &run.request.repo) => p,
            _ = cancel.cancelled() => return Ok(Err(cancelled_early(run_plan))),
        };
        let placement = match placed {
            Ok(p) => p,
            Err(e) => {
                failures.push(e.0);
                return Err(RunFailure::User(texts::no_engine(&failures.join("; "))));
            }
        };
        tracing::info!(engine = %placement.name, "placed the run on a Docker engine");
        let engine = placement.engine.clone();
        if run.attempts > 1 {
            // An earlier attempt's container (whoever made it) would hold the name.
            match engine.remove_run_containers(&spec.run_id).await {
                Ok(0) => {}
                Ok(n) => tracing::info!("removed {n} container(s) of an earlier attempt"),
                Err(e) => {
                    tracing::warn!("could not remove an earlier attempt's container: {e}")
                }
            }
        }
        // Narrowed to this engine's egress proxy after setup, when the repository says so.
        let (placed, proxy) = match &egress {
            Some(e) => super::egress::on_engine(svc, &placement, (spec, e), log).await,
            None => (spec.clone(), None),
        };
        let warm = placement.warm();
        // No warm sandbox is made on the engine while this one starts.
        let busy = warm.map(|w| w.busy_guard());
        let sandbox = tokio::select! {
            s = engine.start_from(
                &placed,
                warm.map(|w| w as &dyn crate::sandbox::WarmSource),
                |line| tracing::info!("{line}"),
            ) => s,
            _ = cancel.cancelled() => return Ok(Err(cancelled_early(run_plan))),
        };
        drop(busy);
        if let (Some(pool), Ok(s)) = (warm, &sandbox) {
            if let Some(want) = s.preload_want() {
                pool.want_preload(want);
            }
        }
        // A warm sandbox taken (or this run's shape or repository newly wanted): the pool
        // catches up once no run on the engine is starting or reading its change set.
        placement.refill();
        return match sandbox {
            Ok(s) => {
                if let (Some(proxy), Some(egress)) = (&proxy, &egress) {
                    super::egress::register(proxy, &s, egress, log);
                }
                if warm.is_some() {
                    svc.metrics.warm_start(&placement.name, s.warm_start());
                }
                if s.warm_start() {
                    *log.warm.lock() = warm.map(|w| w.in_use_guard());
                    *log.preloaded.lock() = s.preload_use();
                }
                let setup = s.setup_report();
                // The container phase is the whole start; the setup is its part.
                log.timings.add("container", started.elapsed());
                if let Some(took) = setup.took {
                    log.timings.add(setup.phase(), took);
                }
                *log.setup.lock() = Some(setup);
                *log.placement.lock() = Some(placement);
                Ok(Ok(s))
            }
            Err(e @ (SandboxError::SetupFailed { .. } | SandboxError::SetupTimedOut { .. })) => {
                let mut outcome = stopped(&run_plan.plan, StopReason::SetupFailed);
                outcome.duration = started.elapsed();
                outcome.detail = Some(e.to_string());
                Ok(Err(Ending::Work {
                    status: RunStatus::Failed,
                    done: Done::new(run_plan.kind, outcome),
                }))
            }
            Err(e) => {
                let answers =
                    tokio::time::timeout(std::time::Duration::from_secs(3), engine.docker().ping())
                        .await
                        .is_ok_and(|r| r.is_ok());
                if answers {
                    Err(RunFailure::User(texts::container_failed(&e.to_string())))
                } else {
                    tracing::warn!(engine = %placement.name, "the Docker engine failed while the container started: {e}");
                    svc.engine.report_failure(&placement.name, &e.to_string());
                    failures.push(format!("{}: {e}", placement.name));
                    continue;
                }
            }
        };
    }
}

/// A run cancelled before its agent started: nothing was spent.
pub(in crate::serve) fn cancelled_early(run_plan: &RunPlan) -> Ending {
    Ending::Work {
        status: RunStatus::Cancelled,
        done: Done::new(
            run_plan.kind,
            stopped(&run_plan.plan, StopReason::Cancelled),
        ),
    }
}

/// The outcome of a run that ended before its agent did anything.
fn stopped(plan: &Plan, reason: StopReason) -> Outcome {
    zero_outcome(
        reason,
        plan.agent.cost_limit,
        plan.program.model.name.clone(),
    )
}

/// Keeps the transcript in the database as records arrive.
async fn write_transcript(
    db: Db,
    run_id: String,
    lease: Lease,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    let mut seq = db.next_transcript_seq(&run_id).await.unwrap_or(0);
    while let Some(line) = rx.recv().await {
        match db
            .append_transcript(&run_id, lease.lease(), seq, &line)
            .await
        {
            Ok(()) => {}
            // Another process runs it now: its transcript is that process's.
            Err(DbError::NotHeld(_)) => lease.lose(),
            Err(e) => tracing::warn!("writing the transcript failed: {e}"),
        }
        seq += 1;
    }
}

/// Times model calls for `/metrics`; none is made once the run's lease is lost.
struct Timed {
    inner: Box<dyn Provider>,
    metrics: Arc<Metrics>,
    lease: Lease,
    /// When the run's webhook was taken in (unix milliseconds), until its first call.
    since_webhook: parking_lot::Mutex<Option<i64>>,
}

#[async_trait::async_trait]
impl Provider for Timed {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    async fn complete(&self, request: &Request) -> Result<Response, ProviderError> {
        if !self.lease.holds().await {
            return Err(lease_lost(self.inner.name()));
        }
        if let Some(at) = self.since_webhook.lock().take() {
            let ms = (crate::db::now_ms() - at).max(0) as u64;
            self.metrics
                .first_model_call(std::time::Duration::from_millis(ms));
        }
        let started = Instant::now();
        let r = self.inner.complete(request).await;
        self.metrics.model_call(&request.model, started.elapsed());
        r
    }

    async fn count_tokens(&self, request: &Request) -> Option<u64> {
        self.inner.count_tokens(request).await
    }
}

fn lease_lost(provider: &'static str) -> ProviderError {
    ProviderError::Api {
        provider,
        status: 409,
        message: "not called: this process lost the run's lease".into(),
    }
}

/// The run's container, refusing commands once the run's lease is lost.
struct Fenced<'a> {
    inner: &'a DockerSandbox,
    lease: &'a Lease,
}

impl Fenced<'_> {
    async fn check(&self) -> crate::sandbox::Result<()> {
        if self.lease.holds().await {
            Ok(())
        } else {
            Err(SandboxError::LeaseLost)
        }
    }
}

#[async_trait::async_trait]
impl Sandbox for Fenced<'_> {
    async fn create_new_shell(&self, name: &str) -> crate::sandbox::Result<String> {
        self.check().await?;
        self.inner.create_new_shell(name).await
    }

    async fn feed_chars(
        &self,
        name: &str,
        chars: &str,
        yield_time: std::time::Duration,
    ) -> crate::sandbox::Result<FeedOutput> {
        self.check().await?;
        self.inner.feed_chars(name, chars, yield_time).await
    }

    async fn run_to_end(
        &self,
        command: &str,
        timeout: std::time::Duration,
        cap: usize,
    ) -> crate::sandbox::Result<crate::sandbox::Finished> {
        self.check().await?;
        self.inner.run_to_end(command, timeout, cap).await
    }

    async fn run_all(
        &self,
        commands: &[(String, std::time::Duration)],
        within: std::time::Duration,
        cap: usize,
        reports: crate::sandbox::Reports,
    ) -> crate::sandbox::Result<()> {
        self.check().await?;
        self.inner.run_all(commands, within, cap, reports).await
    }

    async fn export_workspace(&self, dest: &std::path::Path) -> crate::sandbox::Result<Exported> {
        self.check().await?;
        self.inner.export_workspace(dest).await
    }

    async fn change_set(&self) -> crate::sandbox::Result<ChangeSet> {
        self.inner.change_set().await
    }

    fn workdir(&self) -> &str {
        self.inner.workdir()
    }

    async fn halted(&self) -> String {
        self.inner.halted().await
    }

    async fn destroy(&self) -> crate::sandbox::Result<()> {
        self.inner.destroy().await
    }
}
