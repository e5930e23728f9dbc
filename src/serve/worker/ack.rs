//! Acknowledging a run: admitted (who asked, the config, the budget), `eyes` on the
//! command and the status comment posted — once, by whichever task comes first, as soon as
//! the run is queued, even while it waits for a slot; or refused, with one short comment.

use std::time::Instant;

use crate::db::Run;
use crate::github::Reaction;
use crate::job::Job;
use crate::serve::commands::continue_run;
use crate::serve::pipeline::gate::{Admission, CannotContinue, Refusal};
use crate::serve::pipeline::{
    ending, gate, repo_of, status, Acked, RunFailure, RunLog, StatusComment,
};
use crate::serve::texts;
use crate::serve::texts::confirm;
use crate::serve::texts::status::Phase;

use super::Workers;

/// How long a run claimed here waits for the process acknowledging it to post its status
/// comment before taking that process to be gone.
const ACK_ELSEWHERE_WAIT: std::time::Duration = std::time::Duration::from_secs(15);

impl Workers {
    /// Acknowledges the run once, whoever asks first (the task acknowledging it while it
    /// waits, or the worker that claimed it); the other waits for the same outcome. `None`
    /// for a run an earlier process acknowledged (it has a status comment).
    pub(super) async fn ensure_acknowledged(&self, run: &Run) -> Option<Acked> {
        let cell = {
            let mut acks = self.svc.acks.lock();
            match acks.get(&run.id) {
                Some(cell) => cell.clone(),
                None if run.status_comment_id.is_some() => return None,
                None => acks.entry(run.id.clone()).or_default().clone(),
            }
        };
        let acked = cell.get_or_init(|| self.acknowledge(run)).await.clone();
        // Only an admitted run with its status comment waits here for its slot; the others
        // are over, or are acknowledged again on the next pass.
        if !matches!(&acked, Acked::Admitted(a) if a.1.id().is_some()) {
            self.svc.forget_ack(&run.id);
        }
        Some(acked)
    }

    /// Admits the run (who asked, the repository's config, the budget), reacts `eyes` and
    /// creates the status comment; or refuses it (and finishes it).
    pub(in crate::serve) async fn acknowledge(&self, run: &Run) -> Acked {
        // On a shared queue, once: the first process to take it.
        if self.svc.db.is_shared() {
            match self
                .svc
                .db
                .take_acknowledgement(&run.id, &self.svc.worker_id, false)
                .await
            {
                Ok(true) => {}
                Ok(false) => return Acked::Elsewhere,
                Err(e) => {
                    tracing::warn!("taking the run's acknowledgement failed: {e}");
                    return Acked::Unreachable;
                }
            }
        }
        self.acknowledge_now(run).await
    }

    /// A run claimed here that another process is acknowledging: its status comment, once
    /// that process posted it; `None` when that process refused the run (it is over). A
    /// process that does not finish within a while is taken to be gone, and the run is
    /// acknowledged here.
    pub(in crate::serve) async fn acknowledged_elsewhere(&self, run: &Run) -> Acked {
        let deadline = Instant::now() + ACK_ELSEWHERE_WAIT;
        while Instant::now() < deadline {
            match self.svc.db.get_run(&run.id).await {
                Ok(Some(r)) if r.status.is_final() => return Acked::Refused,
                // Held for `/kodx go` (the hold is written before the status comment).
                Ok(Some(r)) if r.held_until.is_some() => return Acked::Held,
                Ok(Some(r)) => {
                    if let Some(id) = r.status_comment_id {
                        return Acked::Posted(id as u64);
                    }
                }
                Ok(None) => return Acked::Refused,
                Err(e) => tracing::warn!("reading the run failed: {e}"),
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        tracing::warn!("the process acknowledging this run did not finish; acknowledging it here");
        if let Err(e) = self
            .svc
            .db
            .take_acknowledgement(&run.id, &self.svc.worker_id, true)
            .await
        {
            tracing::warn!("taking the run's acknowledgement failed: {e}");
        }
        self.acknowledge_now(run).await
    }

    async fn acknowledge_now(&self, run: &Run) -> Acked {
        let repo = match repo_of(run) {
            Ok(repo) => repo,
            Err(e) => {
                ending::conclude(
                    &self.svc,
                    run,
                    Err(RunFailure::Internal(e)),
                    &RunLog::default(),
                    Instant::now(),
                )
                .await;
                return Acked::Refused;
            }
        };
        let gh = match self.svc.installation(run, &repo).await {
            Ok(gh) => gh,
            Err(e) => {
                tracing::warn!("GitHub is not reachable to acknowledge the run: {e}");
                return Acked::Unreachable;
            }
        };
        // Who may: checked before anything is posted, so a refusal is one short comment.
        let admission = match gate::admit(&self.svc, &gh, &repo, run).await {
            Ok(a) => a,
            Err(refusal) => {
                ending::conclude(
                    &self.svc,
                    run,
                    Err(refusal.into()),
                    &RunLog::default(),
                    Instant::now(),
                )
                .await;
                return Acked::Refused;
            }
        };
        let is_continue = matches!(run.request.job, Job::Continue { .. });
        // `/kodx continue` while the run it would continue has not ended: refused at once
        // (what to continue is known only when that run stops).
        if is_continue {
            match self.svc.db.unfinished_code_run_before(&run.id).await {
                Ok(Some(id)) => {
                    let refusal = Refusal::CannotContinue(CannotContinue::StillRunning { id });
                    ending::conclude(
                        &self.svc,
                        run,
                        Err(refusal.into()),
                        &RunLog::default(),
                        Instant::now(),
                    )
                    .await;
                    return Acked::Refused;
                }
                Ok(None) => {}
                Err(e) => tracing::warn!("looking for an unfinished run on the issue failed: {e}"),
            }
        }
        status::react(&gh, &repo, run, Reaction::Eyes).await;
        let quote = self.quote(run, &admission).await;
        let line = quote.as_ref().map(|q| q.line.clone());
        let mut status = StatusComment::new(gh, repo, run, None)
            .linked(self.svc.run_link(&run.id))
            .estimated(line.clone());
        // Above the repository's `confirm_above_usd`: held, before the status comment is
        // there (a claim elsewhere waits for it, then sees the hold).
        let judged = quote.as_ref().and_then(|q| {
            let threshold = admission.config.confirm_above_usd;
            confirm::needs_confirmation(threshold, q.p90, q.cap)
        });
        if let (Some(judged), None) = (judged, &run.confirmed_by) {
            let wait = self.svc.settings.confirm_wait();
            let until = crate::db::now_ms() + wait.as_millis() as i64;
            match self.svc.db.hold(&run.id, until, line.as_deref()).await {
                Ok(true) => {
                    let threshold = admission.config.confirm_above_usd.unwrap_or_default();
                    let why = confirm::awaiting(judged, threshold, until, wait);
                    tracing::info!(above = threshold, "run held for /kodx go");
                    self.post_status(run, &mut status, &Phase::Awaiting(why), false)
                        .await;
                    return Acked::Held;
                }
                Ok(false) => tracing::warn!("the run to hold for confirmation was gone"),
                Err(e) => tracing::warn!("holding the run for confirmation failed: {e}"),
            }
        } else if let Some(line) = &line {
            // Kept with the run: every later edit of the comment shows it again.
            if let Err(e) = self.svc.db.set_estimate(&run.id, line).await {
                tracing::warn!("storing the estimate failed: {e}");
            }
        }
        self.post_status(run, &mut status, &Phase::Queued, is_continue)
            .await;
        Acked::Admitted(Box::new((admission, status)))
    }

    /// Posts the run's first status comment in `phase` and stores its id. `/kodx continue`
    /// goes on in the status comment of the run it continues; a comment this run posted
    /// before a crash is found by its hidden metadata.
    async fn post_status(
        &self,
        run: &Run,
        status: &mut StatusComment,
        phase: &Phase,
        is_continue: bool,
    ) {
        let existing = match is_continue {
            true => continue_run::continued_status_comment(&self.svc.db, run).await,
            false => None,
        };
        let existing = match existing {
            Some(id) => {
                status.set_id(id);
                status.edit(phase).await;
                Some(id)
            }
            None => {
                let found = status::find_status_comment(status.gh(), status.repo(), run).await;
                found.inspect(|id| status.set_id(*id))
            }
        };
        let id = match existing {
            Some(id) => Some(id),
            None => match status.create(phase).await {
                Ok(id) => Some(id),
                Err(e) => {
                    tracing::warn!("creating the status comment failed: {e}");
                    None
                }
            },
        };
        if let Some(id) = id {
            if let Err(e) = self.svc.db.set_status_comment(&run.id, id as i64).await {
                tracing::error!("storing the status comment id failed: {e}");
            }
        }
    }

    /// The status comment's cost estimate line for an agent run: the repository's last
    /// runs of the same kind beside the run's cap. `None` for a control job, or when the
    /// database could not be read (logged; the run goes on without it).
    pub(super) async fn estimate_line(&self, run: &Run, admission: &Admission) -> Option<String> {
        self.quote(run, admission).await.map(|q| q.line)
    }

    /// The run's estimate: its line, the 90th percentile it is judged by (none without
    /// history) and its cap.
    async fn quote(&self, run: &Run, admission: &Admission) -> Option<Quote> {
        let kind = run.kind();
        let cap = admission.cost_limit(kind.run_kind()?, &self.svc.settings.maxima());
        match self
            .svc
            .db
            .cost_estimate(&run.request.repo, kind.as_str())
            .await
        {
            Ok(estimate) => Some(Quote {
                line: texts::estimate_line(estimate.as_ref(), kind, cap),
                p90: estimate.map(|e| e.p90_usd()),
                cap,
            }),
            Err(e) => {
                tracing::warn!("reading the cost estimate failed: {e}");
                None
            }
        }
    }
}

/// What a run is expected to cost, as its acknowledgement reads it.
struct Quote {
    line: String,
    p90: Option<f64>,
    cap: f64,
}
