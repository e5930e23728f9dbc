//! `/kodx cancel`: stops the queued and running runs on the issue.

use crate::agent::StopReason;
use crate::comment::{self, Done};
use crate::db::{Run, RunStatus};
use crate::github::{Installation, Reaction, RepoName};
use crate::serve::worker::{run_kind, zero_outcome, EndReason, Workers};

impl Workers {
    pub(in crate::serve) async fn cancel(&self, gh: &Installation, repo: &RepoName, job: &Run) {
        let touched = match self
            .db
            .cancel_issue(
                &job.request.repo,
                job.request.issue_number,
                &job.request.author,
            )
            .await
        {
            Ok(t) => t,
            Err(e) => {
                tracing::error!("cancelling failed: {e}");
                self.finish_quietly(
                    job,
                    RunStatus::Failed,
                    EndReason::Internal,
                    serde_json::json!({ "error": format!("cancelling failed: {e}") }),
                )
                .await;
                return;
            }
        };
        let mut n = 0;
        for t in &touched {
            n += 1;
            if t.was_running {
                if let Some(h) = self.running.lock().expect("lock").get(&t.run.id) {
                    *h.cancelled_by.lock().expect("lock") = Some(job.request.author.clone());
                    h.cancel.cancel();
                }
            } else {
                self.forget_ack(&t.run.id);
                let done = Done {
                    kind: run_kind(&t.run),
                    outcome: zero_outcome(StopReason::Cancelled, 0.0, String::new()),
                    text: String::new(),
                    pr_url: None,
                    pushed: None,
                    failure: Some(format!(
                        "Cancelled by @{} before it started.",
                        job.request.author
                    )),
                };
                self.post_done(&t.run, &done).await;
            }
        }
        if n == 0 {
            let _ = gh
                .create_comment(
                    repo,
                    job.request.issue_number as u64,
                    &format!(
                        "@{} there is no kodx run to cancel here.",
                        comment::redact(&job.request.author)
                    ),
                )
                .await;
        } else {
            self.react(gh, repo, job, Reaction::PlusOne).await;
        }
        self.finish_quietly(
            job,
            RunStatus::Succeeded,
            EndReason::Cancel,
            serde_json::json!({ "refused": EndReason::Cancel.as_str() }),
        )
        .await;
    }
}
