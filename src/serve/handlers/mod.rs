//! One handler per command. The agent runs — `ask`, `code` and `continue` — are planned
//! ([`plan::prepare`], pure), then executed ([`execute`]: the clone, the container, the
//! agent) and finished by their own handler ([`ask`], [`code`]). The short control jobs —
//! `help`, `cancel` and refusals of commands that cannot run — are answered here at once,
//! without waiting for a run slot.

pub(in crate::serve) mod ask;
mod cancel;
pub(in crate::serve) mod code;
pub(in crate::serve) mod continue_run;
pub(in crate::serve) mod execute;
mod help;
pub(in crate::serve) mod plan;
pub(in crate::serve) mod workspace;

pub use help::help_text;

use std::sync::Arc;
use std::time::Instant;

use anyhow::Context as _;

use crate::db::EndReason;
use crate::db::Run;
use crate::repo_config::AskPermission;
use crate::serve::job::Job;
use crate::serve::worker::gate::{needed_permission, Refusal};
use crate::serve::worker::{Ending, RunFailure, Workers};

impl Workers {
    pub(in crate::serve) async fn control(self: Arc<Self>, job: Run) {
        let ended = self.answer(&job).await;
        self.conclude(&job, ended, &Default::default(), Instant::now())
            .await;
    }

    async fn answer(&self, job: &Run) -> Result<Ending, RunFailure> {
        let (gh, repo) = self.github(job).await?;
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
                let body = help_text(unknown.as_deref().unwrap_or(""));
                if let Err(e) = gh
                    .create_comment(&repo, job.request.issue_number as u64, &body)
                    .await
                {
                    tracing::warn!("posting the help failed: {e}");
                }
                Ok(Ending::Answered(EndReason::Help))
            }
            Job::Cancel => self.cancel(&gh, &repo, job).await,
            // The request could not be read (empty, too long).
            Job::Ask { .. } | Job::Code { .. } | Job::Continue { .. } | Job::Refuse { .. } => {
                Err(Refusal::BadRequest(job.request.job.argument().to_string()).into())
            }
        }
    }
}
