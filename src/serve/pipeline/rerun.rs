//! Failed GitHub Actions jobs re-run once before a CI repair is paid for (SPEC §12,
//! "Mergeable pull requests"). A flaky job made kodx pay for a repair that changed nothing
//! useful; now the first failure of a head commit re-runs its failed Actions jobs
//! (`rerun-failed-jobs`, Actions write) and the repair is dismissed. The re-run's jobs get
//! new ids, so when the next CI event finds failures, kodx tells the old results (the ids
//! it re-ran: still waiting) from the re-run's (failed again: repair, saying so). Other CI
//! (commit statuses, other Apps' check runs) cannot be re-run and goes straight to repair;
//! so does everything with `ci_rerun: 0`. Without the Actions write permission kodx
//! repairs as before and says so once on the pull request.

use crate::db::Run;
use crate::github::{CiState, GitHubError, Installation, RepoName, TokenScope};
use crate::repo_config::RepoConfig;
use crate::serve::texts;

use super::Services;

/// Failed jobs whose workflow runs are looked up and re-run at most (a run of a matrix of
/// 50 jobs is one workflow run: its failed jobs are re-run together).
const MAX_JOBS: usize = 20;

/// Before the repair of head `commit` of `run`'s pull request: `Ok(note)` when the repair
/// goes ahead (`note`: its failure survived a re-run), `Err(why)` when it is dismissed
/// because the failed jobs were re-run now, or are still being re-run.
pub(super) async fn before_repair(
    svc: &Services,
    gh: &Installation,
    repo: &RepoName,
    run: &Run,
    config: &RepoConfig,
    commit: &str,
    state: &CiState,
) -> Result<Option<String>, String> {
    let jobs: Vec<(u64, String)> = state
        .failed
        .iter()
        .filter_map(|f| f.job_id.map(|id| (id, f.name.clone())))
        .take(MAX_JOBS)
        .collect();
    if !config.ci_rerun() || jobs.is_empty() {
        return Ok(None);
    }
    let db = &svc.db;
    let (name, pull) = (&run.request.repo, run.request.issue_number);
    let unreadable = |e: crate::db::DbError| format!("reading the re-runs failed: {e}");
    let names: Vec<String> = jobs.iter().map(|(_, n)| n.clone()).collect();
    match db.rerun_of(name, pull, commit).await.map_err(unreadable)? {
        Some(r) if r.refused => return Ok(None),
        Some(r) if jobs.iter().any(|(id, _)| r.jobs.contains(id)) => {
            return Err("the failed GitHub Actions jobs are being re-run".into());
        }
        Some(_) => return Ok(Some(texts::rerun::failed_again(&names))),
        None => {}
    }
    let ids: Vec<u64> = jobs.iter().map(|(id, _)| *id).collect();
    if !db
        .take_rerun(name, pull, commit, &run.id, &ids)
        .await
        .map_err(unreadable)?
    {
        return Err("another run re-runs the failed GitHub Actions jobs".into());
    }
    match rerun(svc, run, repo, &ids).await {
        Ok(()) => {
            tracing::info!(
                jobs = ids.len(),
                "failed GitHub Actions jobs re-run before repairing"
            );
            Err(format!(
                "re-ran the failed GitHub Actions jobs ({}) before repairing",
                names.join(", ")
            ))
        }
        Err(Refused::Permission(why)) => {
            tracing::info!("re-running failed jobs refused: {why}");
            match db.refuse_rerun(name, pull, commit).await {
                Ok(true) => {
                    let text =
                        texts::with_run_id(&texts::rerun::cannot_rerun(commit, &why), &run.id);
                    if let Err(e) = gh.create_comment(repo, pull as u64, &text).await {
                        tracing::warn!("saying that jobs cannot be re-run failed: {e}");
                    }
                }
                Ok(false) => {}
                Err(e) => tracing::warn!("recording the refused re-run failed: {e}"),
            }
            Ok(None)
        }
        Err(Refused::Other(e)) => {
            tracing::warn!("re-running failed jobs did not work ({e}); repairing");
            if let Err(e) = db.give_up_rerun(name, pull, commit).await {
                tracing::warn!("recording the failed re-run failed: {e}");
            }
            Ok(None)
        }
    }
}

/// Why the jobs were not re-run.
enum Refused {
    /// The App may not (no Actions write permission): the words kodx says once.
    Permission(String),
    Other(GitHubError),
}

/// Re-runs the failed jobs of every workflow run the failed `jobs` belong to, with a token
/// that may.
async fn rerun(svc: &Services, run: &Run, repo: &RepoName, jobs: &[u64]) -> Result<(), Refused> {
    let permission = |e: &GitHubError| matches!(e.status(), Some(403 | 422));
    let token = svc
        .app
        .installation_for(
            run.request.installation_id as u64,
            &TokenScope::ci_rerun(repo),
        )
        .await
        .map_err(|e| match permission(&e) {
            true => Refused::Permission(
                "the App lacks the Actions write permission (GitHub gave no token that may \
                 re-run jobs)"
                    .into(),
            ),
            false => Refused::Other(e),
        })?;
    let mut runs = std::collections::BTreeSet::new();
    for job in jobs {
        runs.insert(
            token
                .workflow_run_of_job(repo, *job)
                .await
                .map_err(Refused::Other)?,
        );
    }
    for id in runs {
        token
            .rerun_failed_jobs(repo, id)
            .await
            .map_err(|e| match e.status() {
                Some(403) => Refused::Permission(format!(
                    "GitHub refused the re-run of workflow run {id} (403)"
                )),
                _ => Refused::Other(e),
            })?;
    }
    Ok(())
}
