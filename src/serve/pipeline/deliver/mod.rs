//! A code run's delivery (SPEC §5): its change set committed in the run's clone, pushed
//! with a fresh token, and opened as a pull request (or found, and updated), or pushed onto
//! the pull request's own branch. [`words`] names the branch and writes the commit message
//! and the pull request's body.

mod words;

pub use words::{branch_name, Target};

use std::time::{Duration, Instant};

use secrecy::ExposeSecret;

use crate::git::GitError;
use crate::github::{GitHubError, Installation};
use crate::repo_config::OnLimit;
use crate::sandbox::{ChangeSet, RepoSource, SandboxError};
use crate::serve::texts::status::{self as comment, Done};
use crate::serve::texts::{
    self, commit_body, commit_subject, pull_body, title_from, trailers, Form, Readiness,
};

use super::workspace::Workspace;
use super::RunCtx;

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

/// What delivering a change came to: the commit pushed, when one was (also when opening
/// its pull request failed after the push: its checks are still reported on it), and where
/// the change went.
pub(in crate::serve) struct Shipped {
    pub commit: Option<String>,
    pub delivered: Result<Delivered, DeliveryError>,
}

impl Shipped {
    /// Nothing pushed: the delivery failed before.
    pub fn failed(error: DeliveryError) -> Shipped {
        Shipped {
            commit: None,
            delivered: Err(error),
        }
    }
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
    #[error("{}", texts::push_failure(.error, .branch))]
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

/// A change to deliver, and where.
pub(in crate::serve) struct Change<'a> {
    /// The request the commit and the pull request say (a continuation's is the first
    /// request of its chain).
    pub request: &'a str,
    pub workspace: &'a Workspace,
    pub target: &'a Target,
    pub draft: bool,
    /// Work a limit cut short, and what the repository wants done with it.
    pub partial: Option<OnLimit>,
    /// How the pull request body is shaped, and kodx's part of it beyond the usual
    /// (the checks table, what red checks made of it).
    pub form: Form,
}

/// The commit message and pull request texts of a change.
struct Texts {
    /// The request, marked incomplete for work a limit cut short.
    request: String,
    summary: String,
}

/// A pushed commit, and how long committing and pushing took.
struct Pushed {
    sha: String,
    committed: Duration,
    pushed: Duration,
}

/// Commits a code run's change set in the run's clone (applied to its files, or for a
/// clone from the repository cache onto its commit from the objects), pushes it and opens
/// (or finds) the pull request.
pub(in crate::serve) async fn deliver(
    cx: &RunCtx<'_>,
    change: Change<'_>,
    changes: ChangeSet,
    done: &Done,
) -> Shipped {
    let mut commit = None;
    let delivered = push_and_open(cx, change, changes, done, &mut commit).await;
    Shipped { commit, delivered }
}

/// [`deliver`]; `commit`: the commit pushed, set as soon as it is.
async fn push_and_open(
    cx: &RunCtx<'_>,
    change: Change<'_>,
    changes: ChangeSet,
    done: &Done,
    commit: &mut Option<String>,
) -> Result<Delivered, DeliveryError> {
    // A merge is committed even when the run changed nothing (its conflicts were all
    // files deleted on one side): the commit is the merge.
    if changes.is_empty() && !matches!(change.target, Target::Merge { .. }) {
        return Ok(Delivered::Nothing);
    }
    tracing::info!(changes = %changes.summary(), "delivering");
    // A fresh token: the run may have outlived the one it cloned with.
    let gh = cx.installation().await.map_err(DeliveryError::Token)?;
    // Work a limit cut short says so in its subject, commit and pull request.
    let texts = match change.partial {
        Some(_) => Texts {
            request: texts::incomplete_request(change.request),
            summary: texts::incomplete_summary(
                done.outcome
                    .detail
                    .as_deref()
                    .unwrap_or(done.outcome.stop_reason.as_str()),
                &done.outcome.last_message,
            ),
        },
        None => Texts {
            request: change.request.to_string(),
            summary: done.outcome.last_message.clone(),
        },
    };
    let Some(pushed) = commit_and_push(cx, &gh, &change, changes, &texts).await? else {
        return Ok(Delivered::Nothing);
    };
    cx.log.timings.add("commit", pushed.committed);
    cx.log.timings.add("push", pushed.pushed);
    *commit = Some(pushed.sha.clone());
    let branch = change.target.branch().to_string();
    let Target::NewPull { base, .. } = change.target else {
        return Ok(Delivered::Pushed {
            sha: pushed.sha,
            branch,
        });
    };
    if change.partial == Some(OnLimit::Branch) {
        return Ok(Delivered::Pushed {
            sha: pushed.sha,
            branch,
        });
    }
    let started = Instant::now();
    let opened = open_pull(cx, &gh, &change, base, &texts, done).await;
    cx.log.timings.add("pull_request", started.elapsed());
    opened
}

/// Commits the change in the clone and pushes it (`None`: nothing to commit). Nothing is
/// pushed for a run another process took back.
async fn commit_and_push(
    cx: &RunCtx<'_>,
    gh: &Installation,
    change: &Change<'_>,
    changes: ChangeSet,
    texts: &Texts,
) -> Result<Option<Pushed>, DeliveryError> {
    let run = cx.run;
    let bot = cx
        .svc
        .app
        .bot_identity(gh)
        .await
        .map_err(DeliveryError::Identity)?;
    let subject = commit_subject(&texts.request);
    let body = commit_body(
        &texts.summary,
        run.request.issue_number,
        run.request.is_pull_request,
        &run.id,
    );
    let trailers = trailers(&run.request.author, run.request.author_id, &run.id);
    // The push asks the lease once git has read the branch's refs, right before it sends
    // anything (from git's thread, which may block on the database).
    let lease = cx.lease.clone();
    let runtime = tokio::runtime::Handle::current();
    let max_file_bytes = cx.svc.settings.max_commit_file_bytes;
    let token = gh.token().expose_secret().to_string();
    let dest = change.workspace.dest.clone();
    let source = change.workspace.source;
    let url = run.request.clone_url.clone();
    let target = change.target.clone();
    // A merge's files that were given conflict markers: none may be left in them.
    let marked = matches!(target, Target::Merge { .. }).then(|| {
        change
            .workspace
            .merge
            .as_ref()
            .map(|m| m.marked())
            .unwrap_or_default()
    });
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
        let committed = match (source, &marked) {
            (RepoSource::Files, Some(marked)) => {
                crate::git::commit_merge(&dest, None, &request, marked).map(Some)
            }
            (_, Some(marked)) => {
                crate::git::commit_merge(&dest, Some(&changes), &request, marked).map(Some)
            }
            (RepoSource::Files, None) => crate::git::commit_all(&dest, &request),
            // The clone has no files: the change set goes onto the commit the container
            // was given, from the objects.
            (RepoSource::GitHead | RepoSource::GitTip, None) => {
                crate::git::commit_change_set(&dest, &changes, &request)
            }
        };
        let Some(commit) = committed.map_err(DeliveryError::Commit)? else {
            return Ok(None);
        };
        tracing::info!(sha = %commit.sha, files = commit.files_changed, "committed");
        let committed = started.elapsed();
        let started = Instant::now();
        let pushed = |error| match error {
            GitError::Withheld => DeliveryError::LeaseLost,
            error => DeliveryError::Push {
                branch: target.branch().to_string(),
                error,
            },
        };
        let still_held = || lease.holds_blocking(&runtime);
        let sha = match &target {
            // The run's own branch: created in one request when it is new (the usual
            // case); else (a re-run after a restart replaces what an earlier attempt
            // pushed there), or when the server says anything but yes, pushed through
            // libgit2 as before.
            Target::NewPull { branch, .. } => {
                let direct =
                    crate::git::push_new_branch(&dest, &url, &token, branch, &runtime, &still_held);
                match direct {
                    Ok(crate::git::Direct::Pushed { objects, .. }) => {
                        tracing::debug!(objects, "pushed the new branch in one request");
                    }
                    Err(GitError::Withheld) => return Err(DeliveryError::LeaseLost),
                    not_pushed => {
                        tracing::info!(?not_pushed, "pushing the branch through libgit2");
                        crate::git::push_checked(
                            &dest,
                            &url,
                            &token,
                            "HEAD",
                            branch,
                            true,
                            &still_held,
                        )
                        .map_err(pushed)?;
                    }
                }
                commit.sha
            }
            // A merge commit is pushed as it is: rebased, it would not be the merge.
            Target::Merge { branch, .. } => {
                crate::git::push_checked(&dest, &url, &token, "HEAD", branch, false, &still_held)
                    .map_err(pushed)?;
                commit.sha
            }
            Target::PullBranch { branch } => {
                crate::git::push_rebasing_checked(&dest, &url, &token, branch, 3, &still_held)
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
    .map_err(DeliveryError::Task)?
}

/// Opens the pull request of a pushed branch into `base`, or updates the one already open
/// (a continuation, a re-run after a restart).
async fn open_pull(
    cx: &RunCtx<'_>,
    gh: &Installation,
    change: &Change<'_>,
    base: &str,
    texts: &Texts,
    done: &Done,
) -> Result<Delivered, DeliveryError> {
    let (repo, run, partial) = (&cx.repo, cx.run, change.partial);
    let branch = change.target.branch().to_string();
    let cost = comment::cost_summary(
        &done.outcome,
        Some(run.since_acknowledged(crate::db::now_ms())),
    );
    let link = cx.svc.run_link(&run.id);
    let pull_body = pull_body(
        &texts.summary,
        change.target.mention(),
        &run.request.author,
        &cost,
        &run.id,
        link.as_deref(),
        change.form.clone(),
    );
    // No check of the lease here: the client asks the run's lease right before each write,
    // after this lookup however long GitHub takes to answer it.
    let existing =
        gh.find_open_pull(repo, &branch)
            .await
            .map_err(|error| DeliveryError::FindPull {
                branch: branch.clone(),
                error,
            })?;
    if let Some(pr) = existing {
        // A continuation that finished: the title no longer says incomplete.
        let title = partial.is_none().then(|| title_from(&texts.request, 100));
        let updated = gh
            .update_pull(repo, pr.number, title.as_deref(), &pull_body)
            .await;
        // Work that is finished now: the draft an earlier part opened becomes ready for
        // review, unless the repository wants its pull requests as drafts.
        let readiness = match updated {
            Err(GitHubError::Withheld { .. }) => return Err(DeliveryError::LeaseLost),
            Err(e) => {
                tracing::warn!("updating the pull request's title and body failed: {e}");
                Readiness::Unchanged
            }
            Ok(_) if partial.is_some() => Readiness::Unchanged,
            Ok(state) if !state.draft => Readiness::Ready,
            Ok(_) if change.draft => Readiness::StillDraft(None),
            Ok(state) => match gh.mark_ready_for_review(&state.node_id).await {
                Ok(()) => Readiness::Ready,
                Err(GitHubError::Withheld { .. }) => return Err(DeliveryError::LeaseLost),
                Err(e) => {
                    tracing::warn!("marking the pull request ready for review failed: {e}");
                    Readiness::StillDraft(Some(e.to_string()))
                }
            },
        };
        return Ok(Delivered::Pull(pr.html_url, readiness));
    }
    let new = crate::github::NewPull {
        title: title_from(&texts.request, 100),
        head: branch.clone(),
        base: base.to_string(),
        body: pull_body,
        draft: change.draft || partial.is_some(),
    };
    match gh.create_pull(repo, &new).await {
        Ok(pr) => Ok(Delivered::Pull(pr.html_url, Readiness::Unchanged)),
        Err(GitHubError::Withheld { .. }) => Err(DeliveryError::LeaseLost),
        Err(GitHubError::PullExists { .. }) => match gh.find_open_pull(repo, &branch).await {
            Ok(Some(pr)) => Ok(Delivered::Pull(pr.html_url, Readiness::Unchanged)),
            _ => Err(DeliveryError::PullMissing { branch }),
        },
        Err(error) => Err(DeliveryError::OpenPull { branch, error }),
    }
}

/// Whether a code run's work is delivered: a run that ended its turn, and one a limit
/// stopped unless the repository asks to discard its work (`pr.on_limit`); the latter is
/// delivered marked incomplete (`Some(partial)`).
pub(in crate::serve) fn deliverable(
    reason: crate::agent::StopReason,
    on_limit: OnLimit,
) -> (bool, Option<OnLimit>) {
    use crate::agent::StopReason;
    let partial = matches!(
        reason,
        StopReason::CostLimitExceeded | StopReason::MaxIterations | StopReason::Timeout
    )
    .then_some(on_limit)
    .filter(|o| *o != OnLimit::Discard);
    (reason == StopReason::EndTurn || partial.is_some(), partial)
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
