//! Failed GitHub Actions jobs re-run once per failing head commit before a CI repair
//! (SPEC §12, "Mergeable pull requests"; migration 0014). The first repair run to find
//! Actions jobs failed on a commit takes the re-run; every later look at the same commit
//! reads what was re-run.

use super::{now_ms, Db, DbError};

/// What was done about a commit's failed Actions jobs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rerun {
    /// The ids of the failed jobs that were re-run.
    pub jobs: Vec<u64>,
    /// Not re-run (the App may not, or GitHub did not take it): repaired as before.
    pub refused: bool,
    /// The repair run that took it.
    pub run_id: String,
}

impl Db {
    /// Takes the re-run of `commit_sha`'s failed `jobs` for run `run_id`: `true` when this
    /// call took it (no run, in any process, had), `false` when it was taken before.
    pub async fn take_rerun(
        &self,
        repo: &str,
        pull: i64,
        commit_sha: &str,
        run_id: &str,
        jobs: &[u64],
    ) -> Result<bool, DbError> {
        let jobs: Vec<String> = jobs.iter().map(u64::to_string).collect();
        let inserted = with_pool!(&self.pool, p => sqlx::query(
            "INSERT INTO ci_reruns (repo, pull, commit_sha, run_id, jobs, outcome, created_at) \
             VALUES ($1, $2, $3, $4, $5, 'rerun', $6) ON CONFLICT DO NOTHING",
        )
        .bind(repo)
        .bind(pull)
        .bind(commit_sha)
        .bind(run_id)
        .bind(jobs.join(","))
        .bind(now_ms())
        .execute(p).await.map(|r| r.rows_affected()))?;
        Ok(inserted == 1)
    }

    /// Records that the re-run of `commit_sha` was refused (no Actions write permission);
    /// whether it is the pull request's first refusal (the one kodx says something about).
    pub async fn refuse_rerun(
        &self,
        repo: &str,
        pull: i64,
        commit_sha: &str,
    ) -> Result<bool, DbError> {
        let (earlier, changed) = with_pool!(&self.pool, p => {
            let mut tx = p.begin().await?;
            let changed = sqlx::query(
                "UPDATE ci_reruns SET outcome = 'refused' \
                 WHERE repo = $1 AND pull = $2 AND commit_sha = $3 AND outcome = 'rerun'",
            )
            .bind(repo)
            .bind(pull)
            .bind(commit_sha)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            let earlier: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM ci_reruns WHERE repo = $1 AND pull = $2 \
                 AND outcome = 'refused'",
            )
            .bind(repo)
            .bind(pull)
            .fetch_one(&mut *tx)
            .await?;
            tx.commit().await?;
            (earlier, changed)
        });
        Ok(changed == 1 && earlier == 1)
    }

    /// Records that GitHub did not take the re-run of `commit_sha` for a reason other than
    /// a permission (repaired as before, nothing said).
    pub async fn give_up_rerun(
        &self,
        repo: &str,
        pull: i64,
        commit_sha: &str,
    ) -> Result<(), DbError> {
        with_pool!(&self.pool, p => sqlx::query(
            "UPDATE ci_reruns SET outcome = 'failed' \
             WHERE repo = $1 AND pull = $2 AND commit_sha = $3 AND outcome = 'rerun'",
        )
        .bind(repo)
        .bind(pull)
        .bind(commit_sha)
        .execute(p)
        .await
        .map(|_| ()))?;
        Ok(())
    }

    /// What was re-run of `commit_sha`'s failed jobs, if anything was.
    pub async fn rerun_of(
        &self,
        repo: &str,
        pull: i64,
        commit_sha: &str,
    ) -> Result<Option<Rerun>, DbError> {
        let row: Option<(String, String, String)> = with_pool!(&self.pool, p => sqlx::query_as(
            "SELECT jobs, outcome, run_id FROM ci_reruns \
             WHERE repo = $1 AND pull = $2 AND commit_sha = $3",
        )
        .bind(repo)
        .bind(pull)
        .bind(commit_sha)
        .fetch_optional(p).await)?;
        Ok(row.map(|(jobs, outcome, run_id)| Rerun {
            jobs: jobs.split(',').filter_map(|j| j.parse().ok()).collect(),
            refused: outcome != "rerun",
            run_id,
        }))
    }
}

#[cfg(test)]
mod tests {
    use crate::db::test_support::*;

    #[tokio::test]
    async fn a_commit_is_rerun_once_and_a_refusal_is_said_once_per_pull() {
        let dir = tempfile::tempdir().unwrap();
        for db in each_db(&dir).await {
            let (r, c1, c2) = ("o/r", "a".repeat(40), "b".repeat(40));
            assert_eq!(db.rerun_of(r, 8, &c1).await.unwrap(), None);
            assert!(db.take_rerun(r, 8, &c1, "run1", &[11, 12]).await.unwrap());
            assert!(!db.take_rerun(r, 8, &c1, "run2", &[13]).await.unwrap());
            let taken = db.rerun_of(r, 8, &c1).await.unwrap().unwrap();
            assert_eq!(
                (taken.jobs, taken.refused, taken.run_id.as_str()),
                (vec![11, 12], false, "run1")
            );
            // Another pull request's commit is its own.
            assert!(db.take_rerun(r, 10, &c1, "run3", &[14]).await.unwrap());
            // The first refusal on a pull request is said; the next one is not.
            assert!(db.refuse_rerun(r, 8, &c1).await.unwrap());
            assert!(db.rerun_of(r, 8, &c1).await.unwrap().unwrap().refused);
            assert!(
                !db.refuse_rerun(r, 8, &c1).await.unwrap(),
                "already refused"
            );
            assert!(db.take_rerun(r, 8, &c2, "run4", &[15]).await.unwrap());
            assert!(
                !db.refuse_rerun(r, 8, &c2).await.unwrap(),
                "said once per pull request"
            );
            assert!(db.refuse_rerun(r, 10, &c1).await.unwrap());
            let c3 = "c".repeat(40);
            assert!(db.take_rerun(r, 12, &c3, "run5", &[16]).await.unwrap());
            db.give_up_rerun(r, 12, &c3).await.unwrap();
            assert!(db.rerun_of(r, 12, &c3).await.unwrap().unwrap().refused);
        }
    }
}
