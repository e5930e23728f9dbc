//! What kodx remembers to keep its pull requests mergeable (SPEC §12, "Mergeable pull
//! requests"; migration 0015): the base branch of each pull request it opened, so a `push`
//! to a branch finds the pull requests it may have made conflicted, and GitHub's
//! `mergeable_state` a run decided on, for its page; and what the egress proxy refused for a
//! run (migration 0019), for its page too.

use super::{now_ms, Db, DbError};

/// The most pull requests one push looks at (the most recently opened first).
pub const MAX_PULLS_PER_PUSH: i64 = 10;

/// A pull request kodx opened on a base branch, with who asked for the run that opened it
/// (a merge run works on their behalf, as a repair does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullOnBase {
    pub pull: i64,
    pub author: String,
    pub author_id: i64,
}

impl Db {
    /// Remembers that kodx opened pull request `pull` into `base` (again: nothing changes).
    pub async fn record_pull_base(&self, repo: &str, pull: i64, base: &str) -> Result<(), DbError> {
        with_pool!(&self.pool, p => sqlx::query(
            "INSERT INTO pull_bases (repo, pull, base, created_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT DO NOTHING",
        )
        .bind(repo)
        .bind(pull)
        .bind(base)
        .bind(now_ms())
        .execute(p).await.map(|_| ()))?;
        Ok(())
    }

    /// The pull requests kodx opened into `base` and has not found closed, the most recently
    /// opened first (at most [`MAX_PULLS_PER_PUSH`]).
    pub async fn pulls_on_base(&self, repo: &str, base: &str) -> Result<Vec<PullOnBase>, DbError> {
        let rows: Vec<(i64, String, i64)> = with_pool!(&self.pool, p => sqlx::query_as(
            "SELECT b.pull, r.author, r.author_id FROM pull_bases b \
             JOIN pull_commits c ON c.repo = b.repo AND c.pull = b.pull AND c.opened = 1 \
             JOIN runs r ON r.id = c.run_id \
             WHERE b.repo = $1 AND b.base = $2 AND b.closed_at IS NULL \
             ORDER BY b.created_at DESC, b.pull DESC LIMIT $3",
        )
        .bind(repo)
        .bind(base)
        .bind(MAX_PULLS_PER_PUSH)
        .fetch_all(p).await)?;
        let mut seen = std::collections::HashSet::new();
        Ok(rows
            .into_iter()
            .filter(|(pull, _, _)| seen.insert(*pull))
            .map(|(pull, author, author_id)| PullOnBase {
                pull,
                author,
                author_id,
            })
            .collect())
    }

    /// Remembers that pull request `pull` is closed: a push to its base no longer looks at it.
    pub async fn pull_closed(&self, repo: &str, pull: i64) -> Result<(), DbError> {
        with_pool!(&self.pool, p => sqlx::query(
            "UPDATE pull_bases SET closed_at = $3 WHERE repo = $1 AND pull = $2 AND closed_at IS NULL",
        )
        .bind(repo)
        .bind(pull)
        .bind(now_ms())
        .execute(p).await.map(|_| ()))?;
        Ok(())
    }

    /// Keeps GitHub's `mergeable_state` with run `run_id` (its page shows it).
    pub async fn set_mergeable_state(&self, run_id: &str, state: &str) -> Result<(), DbError> {
        // GitHub's words are short; anything else is cut rather than stored whole.
        let state: String = state.chars().take(40).collect();
        with_pool!(&self.pool, p => sqlx::query("UPDATE runs SET mergeable_state = $2 WHERE id = $1")
        .bind(run_id)
        .bind(state)
        .execute(p).await.map(|_| ()))?;
        Ok(())
    }

    /// Keeps what the egress proxy refused for run `run_id` (its page shows it).
    pub async fn set_egress_blocked(
        &self,
        run_id: &str,
        blocked: &[crate::egress::Blocked],
    ) -> Result<(), DbError> {
        let json = serde_json::to_string(blocked).unwrap_or_else(|_| "[]".to_string());
        with_pool!(&self.pool, p => sqlx::query("UPDATE runs SET egress_blocked = $2 WHERE id = $1")
        .bind(run_id)
        .bind(json)
        .execute(p).await.map(|_| ()))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::db::test_support::*;

    #[tokio::test]
    async fn a_push_finds_the_open_pull_requests_kodx_opened_on_its_branch() {
        let dir = tempfile::tempdir().unwrap();
        for db in each_db(&dir).await {
            let opener = queue(&db, "m-1", &new_run("code", "o/r", 1)).await;
            let claimed = db.claim_run("w1").await.unwrap().unwrap();
            assert_eq!(claimed.id, opener);
            let lease = claimed.lease().unwrap();
            for (pull, base) in [(10, "main"), (11, "main"), (12, "release")] {
                db.record_pull_commit(
                    "o/r",
                    pull,
                    &format!("{pull:040}"),
                    &opener,
                    &lease,
                    "code",
                    true,
                )
                .await
                .unwrap();
                db.record_pull_base("o/r", pull, base).await.unwrap();
            }
            // Recorded twice: still once.
            db.record_pull_base("o/r", 10, "main").await.unwrap();
            let on_main = db.pulls_on_base("o/r", "main").await.unwrap();
            let pulls: Vec<i64> = on_main.iter().map(|p| p.pull).collect();
            assert_eq!(pulls, vec![11, 10]);
            assert_eq!(on_main[0].author, claimed.request.author);
            assert!(db
                .pulls_on_base("o/other", "main")
                .await
                .unwrap()
                .is_empty());
            assert!(db.pulls_on_base("o/r", "dev").await.unwrap().is_empty());
            db.pull_closed("o/r", 11).await.unwrap();
            let left: Vec<i64> = db
                .pulls_on_base("o/r", "main")
                .await
                .unwrap()
                .iter()
                .map(|p| p.pull)
                .collect();
            assert_eq!(left, vec![10]);
            db.set_mergeable_state(&opener, "dirty").await.unwrap();
            let run = db.get_run(&opener).await.unwrap().unwrap();
            assert_eq!(run.mergeable_state.as_deref(), Some("dirty"));
            assert_eq!(run.egress_blocked, None);
            let refused = crate::egress::Blocked {
                host: "evil.example".into(),
                port: 443,
                count: 2,
                first_ms: 5,
                why: "not in network.allow".into(),
                suggestion: Some("evil.example".into()),
            };
            db.set_egress_blocked(&opener, std::slice::from_ref(&refused))
                .await
                .unwrap();
            let run = db.get_run(&opener).await.unwrap().unwrap();
            let stored: Vec<crate::egress::Blocked> =
                serde_json::from_str(run.egress_blocked.as_deref().unwrap()).unwrap();
            assert_eq!(stored, vec![refused]);
        }
    }
}
