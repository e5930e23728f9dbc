//! A claimed `ask`, `code` or `continue` run, from its claim to its end: acknowledged (if
//! it was not yet), its budget reserved, its [`RunCtx`] built once — the typed repository,
//! the token, the kind, the admission, the status comment, the lease, cancellation and the
//! run's log — then handed to its command ([`commands::work`]), and its ending concluded,
//! cancellations and shutdowns included.

use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use crate::agent::StopReason;
use crate::db::{Run, RunStatus};
use crate::github::TOKEN_REFRESH_MARGIN;
use crate::repo_config::RepoConfig;
use crate::serve::commands;
use crate::serve::pipeline::gate::{Admission, Refusal};
use crate::serve::pipeline::{
    ending, gate, repo_of, run_kind, status, Acked, Ending, Lease, RunCtx, RunFailure, RunHandle,
    RunLog, StatusComment,
};
use crate::serve::texts;

use super::Workers;
use anyhow::Context as _;

impl Workers {
    /// Runs `run`, claimed here by a claim asked at `claimed_at`.
    pub(super) async fn work(self: &Arc<Self>, run: Run, claimed_at: Instant) {
        self.svc.metrics.run_started();
        let started = Instant::now();
        let cancel = CancellationToken::new();
        let cancelled_by = Arc::new(Mutex::new(None));
        let lease = Lease::new(
            self.svc.db.clone(),
            &run,
            &self.svc.worker_id,
            cancel.clone(),
            claimed_at,
            self.svc.settings.lease_margin(),
        );
        self.svc.running.lock().insert(
            run.id.clone(),
            RunHandle {
                cancel: cancel.clone(),
                cancelled_by: cancelled_by.clone(),
                lease: lease.clone(),
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
        self.svc.forget_ack(&run.id);
        let mut run = run;
        let admitted = match acked {
            // Refused (and over), or held for `/kodx go` (back in the queue).
            Some(Acked::Refused | Acked::Held) => None,
            Some(Acked::Admitted(admitted)) => {
                let (admission, status) = *admitted;
                run.status_comment_id = run.status_comment_id.or(status.id().map(|id| id as i64));
                Some(Some((admission, status)))
            }
            Some(Acked::Posted(id)) => {
                run.status_comment_id = run.status_comment_id.or(Some(id as i64));
                Some(None)
            }
            Some(Acked::Unreachable | Acked::Elsewhere) | None => Some(None),
        };
        let ended = match admitted {
            Some(admitted) => {
                let mut status = None;
                let ended = self
                    .work_inner(&run, admitted, &cancel, &lease, &log, &mut status)
                    .await;
                Some((ended, status))
            }
            None => None,
        };
        self.svc.running.lock().remove(&run.id);
        self.svc.metrics.run_ended();
        let Some((mut ended, comment)) = ended else {
            return;
        };
        if lease.is_lost() {
            // Another process runs it now: nothing of it is written or posted from here.
            tracing::warn!("run given up here: another process holds it now");
            return;
        }
        if let Ok(Ending::Work { status, done }) = &mut ended {
            if done.outcome.stop_reason == StopReason::Cancelled {
                let by = cancelled_by.lock().clone();
                match by {
                    Some(who) => {
                        *status = RunStatus::Cancelled;
                        done.failure = Some(texts::cancelled_by(&who));
                    }
                    None if self.shutdown.is_cancelled() => {
                        // Stopped by a shutdown: left `running`, queued again at the next
                        // start.
                        tracing::warn!(
                            "run stopped by shutdown; it resumes when kodx starts again"
                        );
                        // Still this process's run (under its lease): the note is fenced.
                        status::edit_status(
                            &self.svc,
                            &run,
                            texts::PAUSED_BY_RESTART,
                            Some(&lease),
                        )
                        .await;
                        return;
                    }
                    None => {}
                }
            }
        }
        ending::conclude_with(&self.svc, &run, ended, &log, started, comment.as_ref()).await;
    }

    /// Builds the run's context — from what acknowledging it here gave (`admitted`), or,
    /// for a run acknowledged by another process, read now — and hands it to its command.
    /// `status`: the run's status comment, once there is one, for its final edit.
    async fn work_inner(
        &self,
        run: &Run,
        admitted: Option<(Admission, StatusComment)>,
        cancel: &CancellationToken,
        lease: &Lease,
        log: &RunLog,
        final_status: &mut Option<StatusComment>,
    ) -> Result<Ending, RunFailure> {
        let started = Instant::now();
        let kind = run_kind(run);
        let (admission, status) = match admitted {
            // The token the acknowledgement used, unless the run waited long enough for it
            // to be near its end.
            Some((admission, status)) if status.gh().valid_for(TOKEN_REFRESH_MARGIN) => {
                (admission, status)
            }
            Some((admission, status)) => {
                let gh = self
                    .svc
                    .installation(run, status.repo())
                    .await
                    .context("GitHub did not give kodx an installation token")?;
                (admission, status.with_token(gh))
            }
            None => {
                let repo = repo_of(run)?;
                let gh = self
                    .svc
                    .installation(run, &repo)
                    .await
                    .context("GitHub did not give kodx an installation token")?;
                // Acknowledged by an earlier process: who asked keeps the permission it
                // checked; the config and the budget are read here.
                let admission = match gate::readmit(&self.svc, &gh, &repo, run, None).await {
                    Ok(a) => a.capped(run.confirmed_cap_usd),
                    Err(refusal) => return self.refused_after_wait(run, refusal),
                };
                // The estimate line is read again: the comment is rebuilt here, and its
                // edits would otherwise drop what the acknowledgement showed.
                let status = status::status_comment(&self.svc, &gh, &repo, run)
                    .await
                    .estimated(self.estimate_line(run, &admission).await);
                (admission, status)
            }
        };
        // `/kodx go $N`: the cap is at most what its writer asked.
        let mut admission = admission.capped(run.confirmed_cap_usd);
        // The final edit comes after the run's row is final, when the lease no longer
        // holds: it goes through an unfenced copy (nothing is posted for a run lost to
        // another process: `work` returns before).
        *final_status = Some(status.clone());
        // Its cost cap is reserved against the monthly budget now, so runs starting
        // together (here or in other processes) cannot spend the same dollars twice.
        if let Some(refusal) =
            gate::reserve(&self.svc, run, lease.lease(), &mut admission, kind).await?
        {
            return self.refused_after_wait(run, refusal);
        }
        *log.admission.lock() = Some(admission.record(kind, &self.svc.settings.maxima()));
        // From here every GitHub write of the run asks its lease first, right before it is
        // sent: the status comment's, and those of every client the stages take
        // (`RunCtx::installation`).
        let status = status.under_lease(lease.clone());
        let cx = RunCtx {
            svc: &self.svc,
            run,
            repo: status.repo().clone(),
            kind,
            gh: status.gh().clone(),
            admission,
            status,
            cancel,
            lease,
            log,
            started,
        };
        commands::work(&cx).await
    }

    /// A run whose config or budget does not allow it when it starts: it ends as a failed
    /// run (its status comment is up), not as a refusal.
    fn refused_after_wait(&self, run: &Run, refusal: Refusal) -> Result<Ending, RunFailure> {
        match refusal {
            Refusal::InvalidConfig(e) => Err(RunFailure::User(texts::config_became_invalid(
                &e.to_string(),
            ))),
            Refusal::BudgetSpent(_) => Ok(Ending::Work {
                status: RunStatus::Failed,
                done: ending::failed_done(
                    run,
                    StopReason::CostLimitExceeded,
                    texts::BUDGET_SPENT_WHILE_WAITING.into(),
                ),
            }),
            Refusal::UnknownBase(branch) => Err(RunFailure::User(texts::unknown_base(
                &branch,
                &run.request.repo,
            ))),
            Refusal::ConfigUnreadable(e) => Err(RunFailure::Internal(anyhow::anyhow!(
                "reading {} failed: {e}",
                RepoConfig::PATH
            ))),
            other => Err(RunFailure::Internal(anyhow::anyhow!(
                "the run was refused after it waited: {other:?}"
            ))),
        }
    }
}
