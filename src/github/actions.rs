//! Re-running failed GitHub Actions jobs (SPEC §12, "Mergeable pull requests"): before a CI
//! repair is paid for, the failed jobs of the pull request's head get one more try.
//!
//! A failed Actions check run's id is its job id; the job names its workflow run
//! (`GET /repos/{o}/{r}/actions/jobs/{job_id}`, `actions: read`), and
//! `POST /repos/{o}/{r}/actions/runs/{run_id}/rerun-failed-jobs` (`actions: write`, `201`)
//! starts its failed jobs (and what depends on them) again, each as a new job with a new
//! id. Both answers are read as `@octokit/openapi` describes them (`job`, `empty-object`).

use axum::http; // the `http` crate, which octocrab's raw request API speaks
use serde::Deserialize;
use serde_json::json;

use super::error::GitHubError;
use super::installation::repo_path;
use super::transport::JSON;
use super::types::RepoName;
use super::{wire, Installation};

/// `job`, the fields read.
#[derive(Deserialize)]
struct Job {
    run_id: u64,
}

impl Installation {
    /// The workflow run GitHub Actions job `job_id` belongs to.
    pub async fn workflow_run_of_job(
        &self,
        repo: &RepoName,
        job_id: u64,
    ) -> Result<u64, GitHubError> {
        let path = format!("{}/actions/jobs/{job_id}", repo_path(repo));
        let what = format!("GET {path}");
        let raw = self
            .request(http::Method::GET, &path, None, JSON, None)
            .await?;
        Ok(wire::decode::<Job>(&raw.json(&what)?, &what)?.run_id)
    }

    /// Starts the failed jobs of workflow run `run_id` again. Without the App's Actions
    /// write permission GitHub answers `403` ([`GitHubError::Forbidden`]).
    pub async fn rerun_failed_jobs(&self, repo: &RepoName, run_id: u64) -> Result<(), GitHubError> {
        let path = format!(
            "{}/actions/runs/{run_id}/rerun-failed-jobs",
            repo_path(repo)
        );
        self.request(http::Method::POST, &path, None, JSON, Some(&json!({})))
            .await?;
        Ok(())
    }
}
