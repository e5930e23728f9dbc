//! A merge run's admission (SPEC §12, "Mergeable pull requests"): whether the pull request
//! kodx opened, whose base moved on, gets a run that resolves its conflicts.
//!
//! A run started by a push to the base goes ahead only when the repository asks for it
//! (`pr.keep_mergeable`), the pull request is open, its branch is not a fork's and its head
//! is a commit kodx made, and GitHub says it does not merge cleanly. GitHub computes that
//! lazily after a push (`mergeable` is `null` until then): kodx asks again with backoff
//! from 1 s, for at most `mergeable_wait_secs`. A run `/kodx update` started found the
//! conflicts itself, on the host, and does not wait for GitHub. Anything else is dismissed
//! quietly: a pull request that is only behind is left alone.

use std::time::{Duration, Instant};

use crate::db::Run;
use crate::github::{Installation, RepoName};
use crate::repo_config::RepoConfig;

use super::Services;

/// The longest pause between two questions to GitHub.
const MAX_POLL_DELAY: Duration = Duration::from_secs(16);

fn dismissed(why: impl Into<String>) -> String {
    format!("merge run: {}", why.into())
}

/// Decides whether the merge run `run` goes ahead: `Ok` with GitHub's `mergeable_state`
/// (also stored with the run for its page), or `Err` with why it is dismissed.
pub(super) async fn admit_merge(
    svc: &Services,
    gh: &Installation,
    repo: &RepoName,
    run: &Run,
    config: &RepoConfig,
    asked: bool,
) -> Result<Option<String>, String> {
    let (db, name, pull) = (&svc.db, &run.request.repo, run.request.issue_number);
    if !asked && !config.pr.keep_mergeable {
        return Err(dismissed(
            "`pr.keep_mergeable` is off (a push to the base leaves the pull request as it is)",
        ));
    }
    let read_failed = |e: &dyn std::fmt::Display| dismissed(format!("reading it failed: {e}"));
    let deadline = Instant::now() + svc.settings.mergeable_wait();
    let mut delay = Duration::from_secs(1);
    let pr = loop {
        let pr = gh
            .pull_request(repo, pull as u64)
            .await
            .map_err(|e| read_failed(&e))?;
        if pr.state != "open" {
            if let Err(e) = db.pull_closed(name, pull).await {
                tracing::warn!("remembering the closed pull request failed: {e}");
            }
            return Err(dismissed("the pull request is not open"));
        }
        if asked || pr.mergeable.is_some() || Instant::now() + delay > deadline {
            break pr;
        }
        tracing::info!(
            delay_ms = delay.as_millis() as u64,
            "GitHub has not computed whether the pull request merges yet"
        );
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(MAX_POLL_DELAY);
    };
    if pr.is_fork {
        return Err(dismissed(
            "its branch is in a fork, which is not kodx's to push to",
        ));
    }
    match db.kodx_commit_run(name, pull, &pr.head.sha).await {
        Ok(Some(_)) => {}
        Ok(None) => {
            return Err(dismissed(
                "the head commit is not kodx's (someone else pushed to the branch)",
            ))
        }
        Err(e) => return Err(read_failed(&e)),
    }
    let state = pr.mergeable_state.clone().or_else(|| {
        pr.mergeable
            .map(|m| if m { "clean" } else { "dirty" }.to_string())
    });
    if let Some(s) = &state {
        if let Err(e) = db.set_mergeable_state(&run.id, s).await {
            tracing::warn!("storing the mergeable state failed: {e}");
        }
    }
    if asked {
        return Ok(state);
    }
    match pr.mergeable {
        Some(false) => Ok(state),
        Some(true) => Err(dismissed(format!(
            "GitHub says it merges cleanly (`{}`): left alone",
            state.as_deref().unwrap_or("clean")
        ))),
        None => Err(dismissed(format!(
            "GitHub had not computed whether it merges after {} s; the next push looks again",
            svc.settings.mergeable_wait_secs
        ))),
    }
}
