//! `/kodx update` on a pull request kodx opened (SPEC §12, "Mergeable pull requests"): its
//! base branch merged into its branch with a merge commit (first parent the branch's head,
//! second the base's tip), made with git2 on the host and pushed, without the model.
//!
//! kodx leaves the branch alone when it is in a fork (not kodx's to push) and when its
//! head is a commit kodx did not make (someone else pushed). When the merge conflicts, a
//! merge run resolves it ([`super::merge`]): queued here, with its own status comment.

use anyhow::Context as _;
use secrecy::ExposeSecret as _;

use crate::db::{EndReason, Run};
use crate::git::{merge_base_into, Identity, MergeRequest, Merged};
use crate::github::{Installation, Reaction, RepoName, TokenScope};
use crate::serve::pipeline::{status, Ending, RunFailure, Services};
use crate::serve::texts::update as says;

pub(in crate::serve) async fn run(
    svc: &Services,
    gh: &Installation,
    repo: &RepoName,
    job: &Run,
) -> Result<Ending, RunFailure> {
    let r = &job.request;
    let answer = |body: String| async move {
        if let Err(e) = gh.create_comment(repo, r.issue_number as u64, &body).await {
            tracing::warn!("answering /kodx update failed: {e}");
        }
    };
    let refuse = |why: &str| says::refused(&r.author, why);
    if !r.is_pull_request {
        answer(refuse(
            "`/kodx update` works on a pull request kodx opened, not on an issue",
        ))
        .await;
        return Ok(Ending::Answered(EndReason::Update));
    }
    let pull = r.issue_number;
    let pr = gh
        .pull_request(repo, pull as u64)
        .await
        .context("reading the pull request failed")?;
    // What GitHub said of it, for the run page (`None` while GitHub computes it).
    if let Some(state) = &pr.mergeable_state {
        if let Err(e) = svc.db.set_mergeable_state(&job.id, state).await {
            tracing::warn!("storing the mergeable state failed: {e}");
        }
    }
    let why = if pr.state != "open" {
        Some("it is not open".to_string())
    } else if pr.is_fork {
        Some("its branch is in a fork, which is not kodx's to push to".to_string())
    } else {
        match svc.db.kodx_commit_run(&r.repo, pull, &pr.head.sha).await {
            Ok(Some(_)) => None,
            Ok(None) => Some(
                "its branch's head is not a commit kodx made (someone else pushed to it, or \
                 kodx did not open it), and kodx leaves such a branch alone"
                    .to_string(),
            ),
            Err(e) => return Err(anyhow::anyhow!("reading kodx's commits failed: {e}").into()),
        }
    };
    if let Some(why) = why {
        answer(refuse(&why)).await;
        return Ok(Ending::Answered(EndReason::Update));
    }
    let lease = job
        .lease()
        .ok_or_else(|| anyhow::anyhow!("the update job is not running under a claim"))?;
    let bot = svc
        .app
        .bot_identity(gh)
        .await
        .context("reading kodx's own identity failed")?;
    let writer = svc
        .app
        .installation_for(r.installation_id as u64, &TokenScope::write(repo))
        .await
        .context("GitHub did not give kodx a token that may push")?;
    let (branch, base) = (pr.head.ref_name.clone(), pr.base.ref_name.clone());
    let message = format!(
        "Merge branch '{base}' into {branch}\n\nRequested by @{} with `/kodx update` on #{pull}.",
        r.author
    );
    let (url, token, head) = (
        r.clone_url.clone(),
        writer.token().expose_secret().to_string(),
        pr.head.sha.clone(),
    );
    let author = Identity {
        name: bot.login.clone(),
        email: bot.noreply_email.clone(),
    };
    let (b, base_name) = (branch.clone(), base.clone());
    let merged = tokio::task::spawn_blocking(move || {
        let dir = tempfile::Builder::new().prefix("kodx-update-").tempdir()?;
        let dest = dir.path().join("repo");
        let req = MergeRequest {
            url: &url,
            token: &token,
            branch: &b,
            head: &head,
            base: &base_name,
            author,
            message: &message,
        };
        let merged = merge_base_into(&dest, &req)?;
        if let Merged::Committed { .. } = &merged {
            crate::git::push(&dest, &url, &token, "HEAD", &b, false)?;
        }
        anyhow::Ok(merged)
    })
    .await
    .context("the merge task failed")?;
    let merged = match merged {
        Ok(m) => m,
        Err(e) => {
            answer(refuse(&format!("merging `{base}` failed: {e:#}"))).await;
            return Ok(Ending::Answered(EndReason::Update));
        }
    };
    match merged {
        Merged::UpToDate { .. } => answer(says::up_to_date(&r.author, &branch, &base)).await,
        Merged::Conflicts {
            paths,
            base: base_sha,
        } => {
            if let Err(why) =
                queue_merge(svc, gh, repo, job, (&pr.head.sha, &base), &base_sha).await
            {
                tracing::warn!("queueing the merge run failed: {why}");
                answer(says::conflicts(&r.author, &base, &paths)).await
            }
        }
        Merged::Committed {
            sha,
            base: base_sha,
        } => {
            // kodx's commit: CI repair and the next update recognise the branch as kodx's.
            if let Err(e) = svc
                .db
                .record_pull_commit(&r.repo, pull, &sha, &job.id, &lease, "update", false)
                .await
            {
                tracing::warn!("recording the merge commit failed: {e}");
            }
            tracing::info!(%sha, "merged the base into the pull request's branch");
            status::react(gh, repo, job, Reaction::PlusOne).await;
            answer(crate::serve::texts::with_run_id(
                &says::merged(&base, &base_sha, &branch, &sha),
                &job.id,
            ))
            .await;
        }
    }
    Ok(Ending::Answered(EndReason::Update))
}

/// Queues the merge run that resolves the conflicts of merging `base` (at `base_sha`) into
/// the pull request at `head` (an ordinary run with its own status comment and cost), and
/// marks the command seen; a second `/kodx update` on the same heads is told it runs.
async fn queue_merge(
    svc: &Services,
    gh: &Installation,
    repo: &RepoName,
    job: &Run,
    (head, base): (&str, &str),
    base_sha: &str,
) -> Result<(), crate::db::DbError> {
    let r = &job.request;
    let mut request = r.clone();
    request.job = crate::job::Job::Merge {
        base: base_sha.to_string(),
        asked: true,
    };
    request.trigger = crate::job::Trigger::merge(r.issue_number, head, base_sha);
    let record = crate::db::NewDelivery {
        id: format!("update/{}", job.id),
        event: "issue_comment".to_string(),
        action: Some("update".to_string()),
        installation_id: Some(r.installation_id),
        repo: Some(r.repo.clone()),
    };
    match svc.db.accept(&record, Some(&request)).await? {
        crate::db::Accepted::Queued { run_id } => {
            tracing::info!(%run_id, "merge run queued");
            status::react(gh, repo, job, Reaction::Eyes).await;
        }
        _ => {
            let body = says::merging_already(&r.author, base);
            if let Err(e) = gh.create_comment(repo, r.issue_number as u64, &body).await {
                tracing::warn!("answering /kodx update failed: {e}");
            }
        }
    }
    Ok(())
}
