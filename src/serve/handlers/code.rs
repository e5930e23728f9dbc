//! `/kodx code` (and `/kodx continue`, which goes on with one): the agent changes the
//! repository in its container; the exact change set comes out, is committed from the
//! clone, pushed, and becomes a pull request (or a commit on the pull request's branch).
//! Work a limit cut short is delivered marked incomplete, as `pr.on_limit` says.

use std::sync::Arc;
use std::time::{Duration, Instant};

use secrecy::ExposeSecret;

use crate::agent::StopReason;
use crate::comment::{self, Done};
use crate::db::{Run, RunStatus};
use crate::git::GitError;
use crate::github::{GitHubError, RepoName};
use crate::repo_config::OnLimit;
use crate::sandbox::{ChangeSet, RepoSource, Sandbox as _, SandboxError};
use crate::serve::deliver::{self, Target};
use crate::serve::handlers::continue_run::{self, Earlier, Readiness};
use crate::serve::handlers::execute::Execution;
use crate::serve::handlers::workspace::Workspace;
use crate::serve::job::Job;
use crate::serve::messages;
use crate::serve::worker::{Ending, Fence, RunFailure, Timings, Workers};

/// Where a code run's change went.
pub(in crate::serve) enum Delivered {
    /// Its pull request, and what became of its draft state when an earlier part's draft
    /// was finished.
    Pull(String, Readiness),
    Pushed {
        sha: String,
        branch: String,
    },
    Nothing,
}

/// Why a change could not be delivered; its `Display` is the sentence the status comment
/// shows. Nothing here is a failure of the run's work: the agent's outcome stands.
#[derive(Debug, thiserror::Error)]
pub(in crate::serve) enum DeliveryError {
    #[error("The changes could not be taken out of the container: {0}")]
    Export(SandboxError),
    #[error("GitHub did not give kodx a token to push with: {0}")]
    Token(GitHubError),
    #[error("kodx could not read its own GitHub identity: {0}")]
    Identity(GitHubError),
    #[error("The changes could not be applied to the clone: {0}")]
    Apply(SandboxError),
    #[error("The change could not be committed: {0}")]
    Commit(GitError),
    #[error("{}", push_failure(.error, .branch))]
    Push { branch: String, error: GitError },
    #[error("kodx hit an internal error while committing: {0}")]
    Task(tokio::task::JoinError),
    #[error("Pushed `{branch}`, but GitHub could not be asked for its pull request: {error}")]
    FindPull { branch: String, error: GitHubError },
    #[error("Pushed `{branch}`, but its pull request could not be found.")]
    PullMissing { branch: String },
    #[error(
        "Pushed the change to branch `{branch}`, but opening the pull request failed: {error}"
    )]
    OpenPull { branch: String, error: GitHubError },
    #[error("This process lost the run's lease; another process delivers it.")]
    LeaseLost,
}

/// What a code run is given besides its execution.
pub(in crate::serve) struct CodeRun<'a> {
    pub repo: &'a RepoName,
    /// The stopped run a `/kodx continue` goes on with.
    pub earlier: Option<Earlier>,
}

impl Workers {
    /// Executes a code run and delivers its change.
    pub(in crate::serve) async fn code(
        self: &Arc<Self>,
        exec: Execution<'_>,
        code: CodeRun<'_>,
    ) -> Result<Ending, RunFailure> {
        let (run, run_plan, log, fence) = (exec.run, exec.plan, exec.log, exec.fence);
        let timings = &log.timings;
        let (workspace, sandbox, outcome) = match self.execute(exec).await?.ran() {
            Ok(ran) => ran,
            Err(ending) => return Ok(ending),
        };
        // A run that ended its turn: its exact change set leaves the container. So does one
        // a limit stopped, unless the repository asks to discard its work (`pr.on_limit`):
        // it is delivered marked incomplete.
        let partial = matches!(
            outcome.stop_reason,
            StopReason::CostLimitExceeded | StopReason::MaxIterations | StopReason::Timeout
        )
        .then_some(run_plan.on_limit)
        .filter(|o| *o != OnLimit::Discard);
        let deliverable = outcome.stop_reason == StopReason::EndTurn || partial.is_some();
        let target = run_plan
            .target
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("a code run was planned without a target"))?;
        let changes = if deliverable {
            let started = Instant::now();
            let changes = sandbox.change_set().await;
            timings.add("export", started.elapsed());
            Some(changes)
        } else {
            None
        };
        // The container goes while the change is delivered (it is not needed any more).
        let teardown = tokio::spawn(async move { sandbox.destroy().await });
        let mut done = Done::new(run_plan.kind, outcome);
        let mut readiness = Readiness::Unchanged;
        done.text = done.outcome.last_message.clone();
        done.setup = *log.setup.lock().expect("lock");
        if let Some(changes) = changes {
            // A continuation's commit and pull request say the request it continues.
            let asked = match &code.earlier {
                Some(earlier) => {
                    let mut r = run.clone();
                    r.request.job = Job::Code {
                        request: earlier.request.clone(),
                    };
                    std::borrow::Cow::Owned(r)
                }
                None => std::borrow::Cow::Borrowed(run),
            };
            let delivered = match changes {
                Ok(changes) => {
                    let change = Change {
                        run: &asked,
                        repo: code.repo,
                        workspace: &workspace,
                        target,
                        draft: run_plan.draft,
                        partial,
                        fence,
                    };
                    self.deliver(change, changes, &done, timings).await
                }
                Err(e) => Err(DeliveryError::Export(e)),
            };
            match delivered {
                Ok(Delivered::Pull(url, ready)) => {
                    done.pr_url = Some(url);
                    readiness = ready;
                }
                Ok(Delivered::Pushed { sha, branch }) => done.pushed = Some((sha, branch)),
                Ok(Delivered::Nothing) => {}
                Err(failure) => done.failure = Some(failure.to_string()),
            }
            if done.pr_url.is_some() || done.pushed.is_some() {
                *log.branch.lock().expect("lock") = Some(target.branch().to_string());
            }
        }
        match teardown.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!("removing the container failed: {e}"),
            Err(e) => tracing::warn!("removing the container failed: {e}"),
        }
        // The clone goes with its workspace.
        drop(workspace);
        if let Some(earlier) = &code.earlier {
            done.text =
                continue_run::both_parts(&done.text, earlier, done.outcome.usd_cost, &readiness);
        }
        let status = if done.succeeded() {
            RunStatus::Succeeded
        } else {
            RunStatus::Failed
        };
        Ok(Ending::Work { status, done })
    }

    /// Commits a code run's change set in the run's clone (applied to its files, or for a
    /// clone from the repository cache onto its commit from the objects), pushes it and
    /// opens (or finds) the pull request.
    async fn deliver(
        &self,
        change: Change<'_>,
        changes: ChangeSet,
        done: &Done,
        timings: &Timings,
    ) -> Result<Delivered, DeliveryError> {
        if changes.is_empty() {
            return Ok(Delivered::Nothing);
        }
        let Change {
            run,
            repo,
            workspace,
            target,
            draft,
            partial,
            fence,
        } = change;
        tracing::info!(changes = %changes.summary(), "delivering");
        // A fresh token: the run may have outlived the one it cloned with.
        let gh = self.installation(run).await.map_err(DeliveryError::Token)?;
        let bot = self
            .app
            .bot_identity(&gh)
            .await
            .map_err(DeliveryError::Identity)?;
        // Work a limit cut short says so in its subject, commit and pull request.
        let request_text = match partial {
            Some(_) => messages::incomplete_request(&run.request.job.argument()),
            None => run.request.job.argument().to_string(),
        };
        let summary = match partial {
            Some(_) => messages::incomplete_summary(
                done.outcome
                    .detail
                    .as_deref()
                    .unwrap_or(done.outcome.stop_reason.as_str()),
                &done.outcome.last_message,
            ),
            None => done.outcome.last_message.clone(),
        };
        let subject = deliver::commit_subject(&request_text);
        let body = deliver::commit_body(
            &summary,
            run.request.issue_number,
            run.request.is_pull_request,
            &run.id,
        );
        let trailers = deliver::trailers(&run.request.author, run.request.author_id, &run.id);
        // Nothing is pushed for a run another process took back.
        if !fence.holds().await {
            return Err(DeliveryError::LeaseLost);
        }
        let max_file_bytes = self.settings.max_commit_file_bytes;
        let token = gh.token().expose_secret().to_string();
        let committed = {
            let dest = workspace.dest.clone();
            let source = workspace.source;
            let url = run.request.clone_url.clone();
            let target = target.clone();
            let identity = crate::git::Identity {
                name: bot.login.clone(),
                email: bot.noreply_email.clone(),
            };
            tokio::task::spawn_blocking(move || {
                let started = Instant::now();
                if source == RepoSource::Files {
                    changes.apply(&dest).map_err(DeliveryError::Apply)?;
                }
                let request = crate::git::CommitRequest {
                    author: identity,
                    subject: &subject,
                    body: &body,
                    trailers: &trailers,
                    max_file_bytes,
                };
                let committed = match source {
                    RepoSource::Files => crate::git::commit_all(&dest, &request),
                    // The clone has no files: the change set goes onto the commit the
                    // container was given, from the objects.
                    RepoSource::GitHead | RepoSource::GitTip => {
                        crate::git::commit_change_set(&dest, &changes, &request)
                    }
                };
                let Some(commit) = committed.map_err(DeliveryError::Commit)? else {
                    return Ok(None);
                };
                tracing::info!(sha = %commit.sha, files = commit.files_changed, "committed");
                let committed = started.elapsed();
                let started = Instant::now();
                let pushed = |error| DeliveryError::Push {
                    branch: target.branch().to_string(),
                    error,
                };
                let sha = match &target {
                    // The run's own branch: a re-run after a restart replaces what an
                    // earlier attempt pushed there.
                    Target::NewPull { branch, .. } => {
                        crate::git::push(&dest, &url, &token, "HEAD", branch, true)
                            .map_err(pushed)?;
                        commit.sha
                    }
                    Target::PullBranch { branch } => {
                        crate::git::push_rebasing(&dest, &url, &token, branch, 3)
                            .map_err(pushed)?
                            .sha
                    }
                };
                Ok(Some(Pushed {
                    sha,
                    committed,
                    pushed: started.elapsed(),
                }))
            })
            .await
            .map_err(DeliveryError::Task)??
        };
        let Some(Pushed {
            sha,
            committed,
            pushed,
        }) = committed
        else {
            return Ok(Delivered::Nothing);
        };
        timings.add("commit", committed);
        timings.add("push", pushed);
        let branch = target.branch().to_string();
        let pr_started = Instant::now();
        let Target::NewPull { base, .. } = target else {
            return Ok(Delivered::Pushed { sha, branch });
        };
        if partial == Some(OnLimit::Branch) {
            return Ok(Delivered::Pushed { sha, branch });
        }
        let cost = comment::cost_summary(&done.outcome);
        let link = self.run_link(&run.id);
        let pull_body = deliver::pull_body(
            &summary,
            target,
            &run.request.author,
            &cost,
            &run.id,
            link.as_deref(),
        );
        if !fence.holds().await {
            return Err(DeliveryError::LeaseLost);
        }
        let existing =
            gh.find_open_pull(repo, &branch)
                .await
                .map_err(|error| DeliveryError::FindPull {
                    branch: branch.clone(),
                    error,
                })?;
        if let Some(pr) = existing {
            // A continuation that finished: the title no longer says incomplete.
            let title = partial
                .is_none()
                .then(|| deliver::title_from(&request_text, 100));
            let updated = gh
                .update_pull(repo, pr.number, title.as_deref(), &pull_body)
                .await;
            // Work that is finished now: the draft an earlier part opened becomes ready for
            // review, unless the repository wants its pull requests as drafts.
            let readiness = match updated {
                Err(e) => {
                    tracing::warn!("updating the pull request's title and body failed: {e}");
                    Readiness::Unchanged
                }
                Ok(_) if partial.is_some() => Readiness::Unchanged,
                Ok(state) if !state.draft => Readiness::Ready,
                Ok(_) if draft => Readiness::StillDraft(None),
                Ok(state) => match gh.mark_ready_for_review(&state.node_id).await {
                    Ok(()) => Readiness::Ready,
                    Err(e) => {
                        tracing::warn!("marking the pull request ready for review failed: {e}");
                        Readiness::StillDraft(Some(e.to_string()))
                    }
                },
            };
            timings.add("pull_request", pr_started.elapsed());
            return Ok(Delivered::Pull(pr.html_url, readiness));
        }
        let new = crate::github::NewPull {
            title: deliver::title_from(&request_text, 100),
            head: branch.clone(),
            base: base.clone(),
            body: pull_body,
            draft: draft || partial.is_some(),
        };
        let created = gh.create_pull(repo, &new).await;
        timings.add("pull_request", pr_started.elapsed());
        match created {
            Ok(pr) => Ok(Delivered::Pull(pr.html_url, Readiness::Unchanged)),
            Err(GitHubError::PullExists { .. }) => match gh.find_open_pull(repo, &branch).await {
                Ok(Some(pr)) => Ok(Delivered::Pull(pr.html_url, Readiness::Unchanged)),
                _ => Err(DeliveryError::PullMissing { branch }),
            },
            Err(error) => Err(DeliveryError::OpenPull { branch, error }),
        }
    }
}

/// A change to deliver, and where.
struct Change<'a> {
    run: &'a Run,
    repo: &'a RepoName,
    workspace: &'a Workspace,
    target: &'a Target,
    draft: bool,
    /// Work a limit cut short, and what the repository wants done with it.
    partial: Option<OnLimit>,
    fence: &'a Fence,
}

/// A pushed commit, and how long committing and pushing took.
struct Pushed {
    sha: String,
    committed: Duration,
    pushed: Duration,
}

/// A push the server refused, in words a maintainer can act on.
fn push_failure(e: &GitError, branch: &str) -> String {
    match e {
        GitError::Rejected { reason } => format!(
            "GitHub refused the push to `{branch}`: {}",
            crate::git::explain_rejection(reason)
        ),
        GitError::Conflict { paths } => format!(
            "The branch `{branch}` moved while kodx worked, and kodx's change conflicts with it in {}. Nothing was pushed; run the command again on the new head.",
            paths.iter().map(|p| format!("`{p}`")).collect::<Vec<_>>().join(", ")
        ),
        other => format!("Pushing to `{branch}` failed: {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delivery_failures_read_as_before() {
        let push = DeliveryError::Push {
            branch: "kodx/issue-7-ab12".into(),
            error: GitError::Conflict {
                paths: vec!["src/a.rs".into(), "b.md".into()],
            },
        };
        assert_eq!(
            push.to_string(),
            "The branch `kodx/issue-7-ab12` moved while kodx worked, and kodx's change conflicts with it in `src/a.rs`, `b.md`. Nothing was pushed; run the command again on the new head."
        );
        let rejected = DeliveryError::Push {
            branch: "main".into(),
            error: GitError::Rejected {
                reason: "protected branch hook declined".into(),
            },
        };
        assert!(rejected
            .to_string()
            .starts_with("GitHub refused the push to `main`: "));
        let other = DeliveryError::Push {
            branch: "b".into(),
            error: GitError::Auth,
        };
        assert!(other
            .to_string()
            .starts_with("Pushing to `b` failed: the git server refused"));
        assert_eq!(
            DeliveryError::PullMissing { branch: "b".into() }.to_string(),
            "Pushed `b`, but its pull request could not be found."
        );
    }
}
