//! `/kodx cancel`: stops the queued and running runs on the issue.

use anyhow::Context as _;

use crate::agent::StopReason;
use crate::db::EndReason;
use crate::db::Run;
use crate::github::{Installation, Reaction, RepoName};
use crate::serve::pipeline::{ending, status, Ending, RunFailure, Services};
use crate::serve::texts;

/// Runs `/kodx cancel`: the issue's queued runs end at once, its running runs (here, or
/// through the database in another process) are stopped.
pub(in crate::serve) async fn run(
    svc: &Services,
    gh: &Installation,
    repo: &RepoName,
    job: &Run,
) -> Result<Ending, RunFailure> {
    let touched = svc
        .db
        .cancel_issue(
            &job.request.repo,
            job.request.issue_number,
            &job.request.author,
        )
        .await
        .context("cancelling failed")?;
    for t in &touched {
        if t.was_running {
            if let Some(h) = svc.running.lock().get(&t.run.id) {
                *h.cancelled_by.lock() = Some(job.request.author.clone());
                h.cancel.cancel();
            }
        } else {
            svc.forget_ack(&t.run.id);
            let done = ending::failed_done(
                &t.run,
                StopReason::Cancelled,
                texts::cancelled_before_it_started(&job.request.author),
            );
            status::post_done(svc, &t.run, &done).await;
        }
    }
    if touched.is_empty() {
        let body = texts::nothing_to_cancel(&job.request.author);
        if let Err(e) = gh
            .create_comment(repo, job.request.issue_number as u64, &body)
            .await
        {
            tracing::warn!("answering the cancel failed: {e}");
        }
    } else {
        status::react(gh, repo, job, Reaction::PlusOne).await;
    }
    Ok(Ending::Answered(EndReason::Cancel))
}

/// Stops this process's runs that someone asked to cancel through another process
/// (a shared PostgreSQL queue: the `/kodx cancel` may have been claimed anywhere).
pub(in crate::serve) async fn apply_requests(svc: &Services) {
    let requests = match svc.db.cancel_requests(&svc.worker_id).await {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!("reading cancel requests failed: {e}");
            return;
        }
    };
    for (run_id, by) in requests {
        if let Some(h) = svc.running.lock().get(&run_id) {
            if !h.cancel.is_cancelled() {
                tracing::info!(run_id = %run_id, by = %by, "run cancelled by a request another process took");
                *h.cancelled_by.lock() = Some(by);
                h.cancel.cancel();
            }
        }
    }
}
