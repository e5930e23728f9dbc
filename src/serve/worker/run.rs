//! A claimed `ask`, `code` or `continue` run, from its claim to its end: acknowledged (or
//! re-admitted after a wait), its budget reserved, its plan prepared from what GitHub says,
//! then handed to its handler ([`crate::serve::handlers`]), and its ending concluded —
//! cancellations and shutdowns included.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use crate::agent::StopReason;
use crate::comment::RunKind;
use crate::db::{Run, RunStatus};
use crate::github::{GitHubError, Installation, PullInfo, RepoName};
use crate::model::Message;
use crate::repo_config::RepoConfig;
use crate::serve::context::{strip_hidden, ContextComment, RunContext};
use crate::serve::handlers::code::CodeRun;
use crate::serve::handlers::continue_run;
use crate::serve::handlers::execute::Execution;
use crate::serve::handlers::plan::prepare;
use crate::serve::job::Job;
use crate::serve::messages;

use super::ending::RunLog;
use super::gate::{Admission, Refusal};
use super::{run_kind, Acked, Ending, Fence, RunFailure, RunHandle, Workers};
use anyhow::Context as _;

impl Workers {
    pub(super) async fn work(self: &Arc<Self>, run: Run) {
        self.metrics.run_started();
        let started = Instant::now();
        let cancel = CancellationToken::new();
        let cancelled_by = Arc::new(Mutex::new(None));
        let fence = Fence::new(self.db.clone(), &run.id, &self.worker_id, cancel.clone());
        self.running.lock().expect("lock").insert(
            run.id.clone(),
            RunHandle {
                cancel: cancel.clone(),
                cancelled_by: cancelled_by.clone(),
                fence: fence.clone(),
            },
        );
        tracing::info!(attempt = run.attempts, "run started");
        let log = RunLog::default();
        // A run claimed before it was acknowledged is acknowledged now (or refused, and
        // then over).
        let mut acked = self.ensure_acknowledged(&run).await;
        if matches!(acked, Some(Acked::Elsewhere)) {
            acked = Some(self.acknowledged_elsewhere(&run).await);
        }
        let (admission, comment_id) = match acked {
            Some(Acked::Refused) => (None, None),
            Some(Acked::Admitted(admission, id)) => (Some(Ok(*admission)), id),
            Some(Acked::Posted(id)) => (Some(Err(())), Some(id)),
            Some(Acked::Unreachable | Acked::Elsewhere) | None => (Some(Err(())), None),
        };
        self.forget_ack(&run.id);
        let mut run = run;
        run.status_comment_id = run.status_comment_id.or(comment_id.map(|id| id as i64));
        let ended = match admission {
            Some(admission) => Some(
                self.work_inner(&run, admission.ok(), &cancel, &fence, &log)
                    .await,
            ),
            None => None,
        };
        self.running.lock().expect("lock").remove(&run.id);
        self.metrics.run_ended();
        self.ended.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let Some(mut ended) = ended else {
            return;
        };
        if fence.is_lost() {
            // Another process runs it now: nothing of it is written or posted from here.
            tracing::warn!("run given up here: another process holds it now");
            return;
        }
        if let Ok(Ending::Work { status, done }) = &mut ended {
            if done.outcome.stop_reason == StopReason::Cancelled {
                let by = cancelled_by.lock().expect("lock").clone();
                match by {
                    Some(who) => {
                        *status = RunStatus::Cancelled;
                        done.failure = Some(messages::cancelled_by(&who));
                    }
                    None if self.shutdown.is_cancelled() => {
                        // Stopped by a shutdown: left `running`, queued again at the next
                        // start.
                        tracing::warn!(
                            "run stopped by shutdown; it resumes when kodx starts again"
                        );
                        self.edit_status(&run, messages::PAUSED_BY_RESTART).await;
                        return;
                    }
                    None => {}
                }
            }
        }
        self.conclude(&run, ended, &log, started).await;
    }

    /// The run itself, admitted by `admission` when it was acknowledged (`None`: it was
    /// not, here).
    async fn work_inner(
        self: &Arc<Self>,
        run: &Run,
        admission: Option<Admission>,
        cancel: &CancellationToken,
        fence: &Fence,
        log: &RunLog,
    ) -> Result<Ending, RunFailure> {
        let prepare_started = Instant::now();
        let kind = run_kind(run);
        let gh = self
            .installation(run)
            .await
            .context("GitHub did not give kodx an installation token")?;
        let repo = RepoName::parse(&run.request.repo)
            .with_context(|| format!("the repository name {:?} is not valid", run.request.repo))?;
        // The admission made when the run was acknowledged, unless the run waited since (or
        // an earlier process acknowledged it): then its config and budget are read again.
        let mut admission = match admission {
            Some(a) if a.is_fresh(self.ended()) => a,
            earlier => {
                let permission = earlier.and_then(|a| a.permission);
                match self.readmit(&gh, &repo, run, permission).await {
                    Ok(a) => a,
                    Err(refusal) => return self.refused_after_wait(run, refusal),
                }
            }
        };
        // Its cost cap is reserved against the monthly budget now, so runs starting
        // together (here or in other processes) cannot spend the same dollars twice.
        if let Some(refusal) = self.reserve(run, &mut admission, kind).await? {
            return self.refused_after_wait(run, refusal);
        }
        let maxima = self.settings.maxima();
        *log.admission.lock().expect("lock") = Some(admission.to_json(kind, &maxima));
        // `/kodx continue`: the stopped run it goes on with, checked before anything shows.
        let resumption = match &run.request.job {
            Job::Continue { more } => {
                let limits = continue_run::limits(*more, &admission, &maxima)
                    .map_err(Refusal::CannotContinue)?;
                let resumption = self
                    .resumption(run)
                    .await
                    .context("reading the stopped run from the database failed")?
                    .map_err(Refusal::CannotContinue)?;
                let earlier = &resumption.earlier;
                *log.branch.lock().expect("lock") = Some(earlier.branch.clone());
                *log.continues.lock().expect("lock") = Some(serde_json::json!({
                    "run": earlier.id,
                    "request": earlier.request,
                    "cost_usd": earlier.cost,
                }));
                Some((resumption, limits))
            }
            _ => None,
        };
        let status = self
            .status_comment(&gh, &repo, run)
            .await
            .fenced(fence.clone());
        self.setting_up(run, &status).await;

        // What GitHub says about the issue, then what the run will do.
        let (context, pull) = self
            .context(&gh, &repo, run)
            .await
            .context("reading the issue from GitHub failed")?;
        let mut run_plan = prepare(
            &run.id,
            &run.request,
            &admission,
            &context,
            pull.as_ref(),
            &self.settings,
            &self.pricing,
        )?;
        if let Some((resumption, (cost, steps))) = &resumption {
            continue_run::resume_plan(&mut run_plan, &resumption.earlier, *cost, *steps);
        }
        log.timings.add("prepare", prepare_started.elapsed());
        let (messages, earlier) = match resumption {
            Some((r, _)) => (r.messages, Some(r.earlier)),
            None => (vec![Message::user_text(&run_plan.prompt)], None),
        };
        let exec = Execution {
            run,
            gh: &gh,
            plan: &run_plan,
            status: &status,
            messages,
            cancel,
            fence,
            log,
        };
        match run_plan.kind {
            RunKind::Ask => self.ask(exec).await,
            RunKind::Code => {
                let code = CodeRun {
                    repo: &repo,
                    earlier,
                };
                self.code(exec, code).await
            }
        }
    }

    /// A run whose config or budget changed while it waited: it ends as it did before
    /// the admission was one check (a failed run, not a refusal).
    fn refused_after_wait(&self, run: &Run, refusal: Refusal) -> Result<Ending, RunFailure> {
        match refusal {
            Refusal::InvalidConfig(e) => Err(RunFailure::User(messages::config_became_invalid(
                &e.to_string(),
            ))),
            Refusal::BudgetSpent(_) => Ok(Ending::Work {
                status: RunStatus::Failed,
                done: self.failed_done(
                    run,
                    StopReason::CostLimitExceeded,
                    messages::BUDGET_SPENT_WHILE_WAITING.into(),
                ),
            }),
            Refusal::ConfigUnreadable(e) => Err(RunFailure::Internal(anyhow::anyhow!(
                "reading {} failed: {e}",
                RepoConfig::PATH
            ))),
            other => Err(RunFailure::Internal(anyhow::anyhow!(
                "the run was refused after it waited: {other:?}"
            ))),
        }
    }

    /// What the model is told, and for a pull request, the pull request.
    pub(super) async fn context(
        &self,
        gh: &Installation,
        repo: &RepoName,
        run: &Run,
    ) -> Result<(RunContext, Option<PullInfo>), GitHubError> {
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
            Ok((ctx, Some(pr)))
        } else {
            let issue = gh.issue(repo, number).await?;
            ctx.title = issue.title;
            ctx.body = issue.body;
            ctx.comments = self.comments(gh, repo, number).await?;
            Ok((ctx, None))
        }
    }

    pub(super) async fn comments(
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
}
