//! The short control jobs — `help`, `cancel` and refusals of commands that cannot run —
//! answered at once, without waiting for a run slot.

mod cancel;
mod help;

pub use help::help_text;

use std::sync::Arc;

use crate::db::{Run, RunStatus};
use crate::github::RepoName;
use crate::repo_config::AskPermission;
use crate::serve::job::{Job, JobKind};
use crate::serve::worker::gate::{needed_permission, Refusal};
use crate::serve::worker::{EndReason, Workers};

impl Workers {
    pub(in crate::serve) async fn control(self: Arc<Self>, job: Run) {
        let internal = |what: String| {
            tracing::error!("{what}");
            serde_json::json!({ "error": what })
        };
        let gh = match self.installation(&job).await {
            Ok(gh) => gh,
            Err(e) => {
                let what = format!("GitHub is not reachable for a {} job: {e}", job.kind());
                self.finish_quietly(&job, RunStatus::Failed, EndReason::Internal, internal(what))
                    .await;
                return;
            }
        };
        let Ok(repo) = RepoName::parse(&job.request.repo) else {
            let what = format!("the repository name {:?} is not valid", job.request.repo);
            self.finish_quietly(&job, RunStatus::Failed, EndReason::Internal, internal(what))
                .await;
            return;
        };
        let needed = needed_permission(job.kind(), AskPermission::Write);
        let has = match gh.permission(&repo, &job.request.author).await {
            Ok(p) => p,
            Err(e) => {
                let what = format!("the permission check failed: {e}");
                self.finish_quietly(&job, RunStatus::Failed, EndReason::Internal, internal(what))
                    .await;
                return;
            }
        };
        if has < needed {
            let refusal = Refusal::NotPermitted { needed, has };
            if job.kind() == JobKind::Help {
                // Help for everyone who can read; nobody else is answered at all.
                self.finish_quietly(
                    &job,
                    RunStatus::Failed,
                    refusal.end_reason(),
                    refusal.to_json(),
                )
                .await;
            } else {
                self.refuse(&gh, &repo, &job, &refusal).await;
            }
            return;
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
                self.finish_quietly(
                    &job,
                    RunStatus::Succeeded,
                    EndReason::Help,
                    serde_json::json!({ "refused": EndReason::Help.as_str() }),
                )
                .await;
            }
            Job::Cancel => self.cancel(&gh, &repo, &job).await,
            Job::Ask { .. } | Job::Code { .. } | Job::Refuse { .. } => {
                // The request could not be read (empty, too long).
                let refusal = Refusal::BadRequest(job.request.job.argument().to_string());
                self.refuse(&gh, &repo, &job, &refusal).await;
            }
        }
    }
}
