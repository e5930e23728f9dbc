//! Run counts and spend, for `/metrics` and monthly budgets.

use super::models::{RunCounts, RunStatus};
use super::{Db, DbError};

impl Db {
    /// Runs by status and total spend, for `/metrics`.
    pub async fn counts(&self) -> Result<RunCounts, DbError> {
        let rows: Vec<(RunStatus, i64, f64)> = with_pool!(&self.pool, p => sqlx::query_as(
            "SELECT status, COUNT(*), COALESCE(SUM(cost_usd), 0.0) FROM runs GROUP BY status",
        )
        .fetch_all(p).await)?;
        let mut counts = RunCounts::default();
        for (status, n, spend) in rows {
            match status {
                RunStatus::Queued => counts.queued = n,
                RunStatus::Running => counts.running = n,
                RunStatus::Succeeded => counts.succeeded = n,
                RunStatus::Failed => counts.failed = n,
                RunStatus::Cancelled => counts.cancelled = n,
            }
            counts.spend_usd += spend;
        }
        Ok(counts)
    }

    /// What an installation's runs created at or after `since_ms` (unix milliseconds) have
    /// cost, for a monthly budget.
    pub async fn spend_since(&self, installation_id: i64, since_ms: i64) -> Result<f64, DbError> {
        let spend: f64 = with_pool!(&self.pool, p => sqlx::query_scalar(
            "SELECT COALESCE(SUM(cost_usd), 0.0) FROM runs \
             WHERE installation_id = $1 AND created_at >= $2",
        )
        .bind(installation_id)
        .bind(since_ms)
        .fetch_one(p).await)?;
        Ok(spend)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::test_support::*;
    use crate::db::{now_ms, Db, RunStatus};

    #[tokio::test]
    async fn counts_and_spend() {
        let db = Db::open("sqlite::memory:").await.unwrap();
        assert_eq!(db.counts().await.unwrap(), RunCounts::default());
        let mut ids = Vec::new();
        for issue in 1..=6 {
            ids.push(
                queue(
                    &db,
                    &format!("d-{issue}"),
                    &new_run("code", "octo/widgets", issue),
                )
                .await,
            );
        }
        for _ in 0..4 {
            db.claim_run("w").await.unwrap().unwrap();
        }
        db.finish(&ids[0], &finish(RunStatus::Succeeded, 0.25))
            .await
            .unwrap();
        db.finish(&ids[1], &finish(RunStatus::Succeeded, 0.5))
            .await
            .unwrap();
        db.finish(&ids[2], &finish(RunStatus::Failed, 1.0))
            .await
            .unwrap();
        db.cancel_issue("octo/widgets", 6, "bob").await.unwrap();
        let counts = db.counts().await.unwrap();
        assert_eq!(
            counts,
            RunCounts {
                queued: 1,
                running: 1,
                succeeded: 2,
                failed: 1,
                cancelled: 1,
                spend_usd: 1.75,
            }
        );
        assert_eq!(counts.get(RunStatus::Succeeded), 2);
        assert_eq!(db.spend_since(42, 0).await.unwrap(), 1.75);
        assert_eq!(db.spend_since(43, 0).await.unwrap(), 0.0);
        assert_eq!(db.spend_since(42, now_ms() + 60_000).await.unwrap(), 0.0);
    }
}
