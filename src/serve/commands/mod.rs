//! One file per command, each a plain function over what the worker built for it. The agent
//! runs — [`ask`], [`code`] and [`continue_run`] — take the run's
//! [`RunCtx`](crate::serve::pipeline::RunCtx) through [`work`]; the short control jobs —
//! `help`, [`cancel`], [`go`], [`steer`] and refusals of commands that cannot run — are answered by
//! [`control`] at once, without waiting for a run slot. These are the two dispatch points
//! the worker calls; nothing here reaches back into it.

pub(in crate::serve) mod address_reviews;
pub(in crate::serve) mod ask;
pub(in crate::serve) mod cancel;
pub(in crate::serve) mod code;
pub(in crate::serve) mod continue_run;
pub(in crate::serve) mod go;
pub(in crate::serve) mod merge;
pub(in crate::serve) mod repair;
pub(in crate::serve) mod steer;
pub(in crate::serve) mod update;

use std::time::Instant;

use anyhow::Context as _;

use crate::db::{EndReason, Run};
use crate::job::Job;
use crate::repo_config::AskPermission;
use crate::serve::pipeline::gate::{needed_permission, Refusal};
use crate::serve::pipeline::{ending, Ending, RunCtx, RunFailure, Services};
use crate::serve::texts;

/// Runs an `ask`, `code` or `continue` run with its context, to its ending.
pub(in crate::serve) async fn work(cx: &RunCtx<'_>) -> Result<Ending, RunFailure> {
    match &cx.run.request.job {
        Job::Ask { .. } => ask::run(cx).await,
        Job::Code { .. } => code::run(cx).await,
        Job::Continue { more } => continue_run::run(cx, *more).await,
        Job::AddressReviews { .. } => address_reviews::run(cx).await,
        Job::Repair { .. } => repair::run(cx).await,
        Job::Merge { .. } => merge::run(cx).await,
        Job::Cancel
        | Job::Go { .. }
        | Job::Update
        | Job::Steer { .. }
        | Job::Help { .. }
        | Job::Refuse { .. } => Err(RunFailure::Internal(anyhow::anyhow!(
            "a {} job was claimed as a run",
            cx.run.kind()
        ))),
    }
}

/// Answers a control job (`help`, `cancel`, a command that cannot run) and writes down
/// how it ended.
pub(in crate::serve) async fn control(svc: &Services, job: Run) {
    let ended = answer(svc, &job).await;
    ending::conclude(svc, &job, ended, &Default::default(), Instant::now()).await;
}

async fn answer(svc: &Services, job: &Run) -> Result<Ending, RunFailure> {
    let (gh, repo) = svc.github(job).await?;
    let needed = needed_permission(job.kind(), AskPermission::Write);
    let has = gh
        .permission(&repo, &job.request.author)
        .await
        .context("the permission check failed")?;
    if has < needed {
        tracing::info!(permission = has.as_str(), "refused: not permitted");
        return Err(Refusal::NotPermitted { needed, has }.into());
    }
    match &job.request.job {
        Job::Help { unknown } => {
            let body = texts::help(unknown.as_deref().unwrap_or(""));
            if let Err(e) = gh
                .create_comment(&repo, job.request.issue_number as u64, &body)
                .await
            {
                tracing::warn!("posting the help failed: {e}");
            }
            Ok(Ending::Answered(EndReason::Help))
        }
        Job::Cancel => cancel::run(svc, &gh, &repo, job).await,
        Job::Go { cap } => go::run(svc, &gh, &repo, job, *cap).await,
        Job::Update => update::run(svc, &gh, &repo, job).await,
        Job::Steer { words } => steer::run(svc, &gh, &repo, job, words).await,
        // The request could not be read (empty, too long).
        Job::Ask { .. }
        | Job::Code { .. }
        | Job::Continue { .. }
        | Job::Refuse { .. }
        | Job::AddressReviews { .. }
        | Job::Repair { .. }
        | Job::Merge { .. } => {
            Err(Refusal::BadRequest(job.request.job.argument().to_string()).into())
        }
    }
}
