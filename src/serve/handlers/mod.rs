//! The short control jobs — `help`, `cancel` and refusals of commands that cannot run —
//! answered at once, without waiting for a run slot.

mod cancel;
mod help;

pub use help::help_text;

use std::sync::Arc;

use crate::comment;
use crate::db::{Run, RunStatus};
use crate::github::{Permission, Reaction, RepoName};
use crate::serve::job::{Job, JobKind};
use crate::serve::worker::gate::{not_permitted, NOT_PERMITTED};
use crate::serve::worker::Workers;

impl Workers {
    pub(in crate::serve) async fn control(self: Arc<Self>, job: Run) {
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
}
