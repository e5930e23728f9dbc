//! What kodx remembers of the pull requests it made (SPEC §11): the commits it made their
//! head, and the repairs CI failures got. CI repair reads them to decide whether a failing
//! commit is kodx's to repair, and how many repairs the pull request had.

use super::{now_ms, Db, DbError, Lease};

/// A repair taken for a failing head commit ([`Db::take_repair`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repair {
    pub commit_sha: String,
    pub run_id: String,
    pub signature: String,
}

/// Why [`Db::take_repair`] did not take the commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RepairTaken {
    /// This run repairs the commit.
    Taken,
    /// Another run took this commit already.
    Already(String),
}

impl Db {
    /// Records that run `run_id` (running under `lease`) made `commit_sha` the head of pull
    /// request `pull`, by opening it (`opened`) or pushing to its branch. Recording the same
    /// commit again changes nothing; nor does a lease that no longer holds the run.
    #[allow(clippy::too_many_arguments)]
    pub async fn record_pull_commit(
        &self,
        repo: &str,
        pull: i64,
        commit_sha: &str,
        run_id: &str,
        lease: &Lease,
        kind: &str,
        opened: bool,
    ) -> Result<(), DbError> {
        let sql = format!(
            "INSERT INTO pull_commits (repo, pull, commit_sha, run_id, kind, opened, created_at) \
             SELECT $1, $2, $3, $4, $5, $6, $7 \
             WHERE EXISTS (SELECT 1 FROM runs WHERE id = $4 AND {}) ON CONFLICT DO NOTHING",
            super::queue::held(8, 9)
        );
        with_pool!(&self.pool, p => sqlx::query(&sql)
        .bind(repo)
        .bind(pull)
        .bind(commit_sha)
        .bind(run_id)
        .bind(kind)
        .bind(i64::from(opened))
        .bind(now_ms())
        .bind(&lease.worker)
        .bind(lease.epoch)
        .execute(p).await.map(|_| ()))?;
        Ok(())
    }

    /// The first of `pulls` kodx opened, with who asked for the run that opened it (login
    /// and id): a repair run works on their behalf.
    pub async fn pull_kodx_opened(
        &self,
        repo: &str,
        pulls: &[i64],
    ) -> Result<Option<(i64, String, i64)>, DbError> {
        for &pull in pulls.iter().take(20) {
            let found: Option<(String, i64)> = with_pool!(&self.pool, p => sqlx::query_as(
                "SELECT r.author, r.author_id FROM pull_commits c JOIN runs r ON r.id = c.run_id \
                 WHERE c.repo = $1 AND c.pull = $2 AND c.opened = 1 \
                 ORDER BY c.created_at LIMIT 1",
            )
            .bind(repo)
            .bind(pull)
            .fetch_optional(p).await)?;
            if let Some((author, author_id)) = found {
                return Ok(Some((pull, author, author_id)));
            }
        }
        Ok(None)
    }

    /// The run that made `commit_sha` the head of pull request `pull`, if kodx did.
    pub async fn kodx_commit_run(
        &self,
        repo: &str,
        pull: i64,
        commit_sha: &str,
    ) -> Result<Option<String>, DbError> {
        Ok(with_pool!(&self.pool, p => sqlx::query_scalar(
            "SELECT run_id FROM pull_commits WHERE repo = $1 AND pull = $2 AND commit_sha = $3",
        )
        .bind(repo)
        .bind(pull)
        .bind(commit_sha)
        .fetch_optional(p).await)?)
    }

    /// The failure report of the repair run `run_id` took ([`Db::take_repair`]).
    pub async fn repair_report(&self, run_id: &str) -> Result<Option<String>, DbError> {
        Ok(with_pool!(&self.pool, p => sqlx::query_scalar(
            "SELECT report FROM repairs WHERE run_id = $1 AND repaired = 1 LIMIT 1",
        )
        .bind(run_id)
        .fetch_optional(p).await)?)
    }

    /// The repairs of pull request `pull` since a maintainer's last run made a commit there
    /// (a `/kodx code` or `/kodx continue` starts the count over), newest first.
    pub async fn repairs_since_maintainer(
        &self,
        repo: &str,
        pull: i64,
    ) -> Result<Vec<Repair>, DbError> {
        let rows: Vec<(String, String, String)> = with_pool!(&self.pool, p => sqlx::query_as(
            "SELECT commit_sha, run_id, signature FROM repairs \
             WHERE repo = $1 AND pull = $2 AND repaired = 1 AND created_at >= COALESCE(( \
               SELECT MAX(created_at) FROM pull_commits \
               WHERE repo = $1 AND pull = $2 AND kind NOT IN ('repair', 'merge')), 0) \
             ORDER BY created_at DESC LIMIT 1000",
        )
        .bind(repo)
        .bind(pull)
        .fetch_all(p).await)?;
        Ok(rows
            .into_iter()
            .map(|(commit_sha, run_id, signature)| Repair {
                commit_sha,
                run_id,
                signature,
            })
            .collect())
    }

    /// Takes the decision about failing head `commit_sha` of `pull` for run `run_id`, at most
    /// once per commit whatever the number of events and processes: a repair with its
    /// `report` (`repaired`), or kodx's decision to stop.
    #[allow(clippy::too_many_arguments)]
    pub async fn take_repair(
        &self,
        repo: &str,
        pull: i64,
        commit_sha: &str,
        run_id: &str,
        signature: &str,
        repaired: bool,
        report: &str,
    ) -> Result<RepairTaken, DbError> {
        let inserted = with_pool!(&self.pool, p => sqlx::query(
            "INSERT INTO repairs (repo, pull, commit_sha, run_id, signature, repaired, report, \
             created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING",
        )
        .bind(repo)
        .bind(pull)
        .bind(commit_sha)
        .bind(run_id)
        .bind(signature)
        .bind(i64::from(repaired))
        .bind(report)
        .bind(now_ms())
        .execute(p).await.map(|r| r.rows_affected()))?;
        if inserted == 1 {
            return Ok(RepairTaken::Taken);
        }
        let holder: Option<String> = with_pool!(&self.pool, p => sqlx::query_scalar(
            "SELECT run_id FROM repairs WHERE repo = $1 AND pull = $2 AND commit_sha = $3",
        )
        .bind(repo)
        .bind(pull)
        .bind(commit_sha)
        .fetch_optional(p).await)?;
        match holder {
            Some(id) if id == run_id => Ok(RepairTaken::Taken),
            Some(id) => Ok(RepairTaken::Already(id)),
            None => Ok(RepairTaken::Already(String::new())),
        }
    }
}
