//! `/kodx go [$N]`: starts the run on the issue that waits for confirmation (SPEC §12,
//! "Quote and confirmation"), with a lower cap when one is given. Who may say it is
//! checked before ([`super::control`]: write permission, like `code`).

use anyhow::Context as _;

use crate::command::Usd;
use crate::db::{EndReason, Run};
use crate::github::{Installation, Reaction, RepoName};
use crate::serve::pipeline::{status, Ending, RunFailure, Services};
use crate::serve::texts;

pub(in crate::serve) async fn run(
    svc: &Services,
    gh: &Installation,
    repo: &RepoName,
    job: &Run,
    cap: Option<Usd>,
) -> Result<Ending, RunFailure> {
    let who = &job.request.author;
    let confirmed = svc
        .db
        .confirm_held(
            &job.request.repo,
            job.request.issue_number,
            who,
            cap.map(|c| c.0),
        )
        .await
        .context("starting the waiting run failed")?;
    let Some(run) = confirmed else {
        let body = texts::confirm::nothing_to_confirm(who);
        if let Err(e) = gh
            .create_comment(repo, job.request.issue_number as u64, &body)
            .await
        {
            tracing::warn!("answering the go failed: {e}");
        }
        return Ok(Ending::Answered(EndReason::Go));
    };
    tracing::info!(run_id = %run.id, by = %who, "waiting run started with /kodx go");
    status::react(gh, repo, job, Reaction::PlusOne).await;
    status::edit_status(svc, &run, &texts::confirm::started_by(who, cap), None).await;
    Ok(Ending::Answered(EndReason::Go))
}
