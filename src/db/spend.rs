//! Run counts and spend, for `/metrics` and monthly budgets.

use super::models::{RunCounts, RunStatus};
use super::{Db, DbError, Lease, Pool};

/// What a run counts against its installation's monthly budget, in micro-dollars: its
/// reservation while it is queued or running, its cost once it ended (runs written before
/// costs were kept in micro-dollars: their `cost_usd`).
macro_rules! counted_micros {
    ($alias:literal) => {
        concat!(
            "CASE WHEN ",
            $alias,
            ".status IN ('queued', 'running') \
               THEN COALESCE(",
            $alias,
            ".reserved_micros, 0) \
               ELSE COALESCE(",
            $alias,
            ".cost_micros, \
                 CAST(ROUND(COALESCE(",
            $alias,
            ".cost_usd, 0) * 1000000) AS BIGINT)) END"
        )
    };
}

/// US dollars to micro-dollars, rounded up (a cost is never under-counted).
pub fn to_micros(usd: f64) -> i64 {
    (usd * 1_000_000.0).ceil() as i64
}

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
    ///
    /// Queued and running runs count what they reserved ([`Db::reserve_budget`]).
    pub async fn spend_since(&self, installation_id: i64, since_ms: i64) -> Result<f64, DbError> {
        let micros: i64 = with_pool!(&self.pool, p => sqlx::query_scalar(concat!(
            "SELECT CAST(COALESCE(SUM(", counted_micros!("r"), "), 0) AS BIGINT) FROM runs r \
             WHERE r.installation_id = $1 AND r.created_at >= $2",
        ))
        .bind(installation_id)
        .bind(since_ms)
        .fetch_one(p).await)?;
        Ok(micros as f64 / 1_000_000.0)
    }

    /// Reserves up to `want_micros` of the installation's monthly budget (`budget_micros`,
    /// spent since `since_ms`) for the running run `run_id`: what is left, at most what it
    /// asks for, never below zero. Atomic across processes: on SQLite one statement under
    /// the one write lock, on PostgreSQL a transaction holding the installation's advisory
    /// lock, so two runs starting together never both get the same last dollars. Returns
    /// the micro-dollars reserved; [`DbError::NotHeld`] when `lease` no longer holds the run.
    pub async fn reserve_budget(
        &self,
        run_id: &str,
        lease: &Lease,
        installation_id: i64,
        since_ms: i64,
        want_micros: i64,
        budget_micros: i64,
    ) -> Result<i64, DbError> {
        macro_rules! reserve_sql {
            ($least:literal, $greatest:literal) => {
                concat!(
                    "UPDATE runs SET reserved_micros = ",
                    $least,
                    "($1, ",
                    $greatest,
                    "(0, $2 - (\
                       SELECT CAST(COALESCE(SUM(",
                    counted_micros!("o"),
                    "), 0) AS BIGINT) \
                       FROM runs o WHERE o.installation_id = $3 AND o.created_at >= $4 \
                       AND o.id <> $5))) \
                     WHERE id = $5 AND status = 'running' AND worker = $6 AND attempts = $7 \
                     RETURNING reserved_micros"
                )
            };
        }
        let granted: Option<i64> = match &self.pool {
            Pool::Sqlite(p) => {
                sqlx::query_scalar(reserve_sql!("MIN", "MAX"))
                    .bind(want_micros)
                    .bind(budget_micros)
                    .bind(installation_id)
                    .bind(since_ms)
                    .bind(run_id)
                    .bind(&lease.worker)
                    .bind(lease.epoch)
                    .fetch_optional(p)
                    .await?
            }
            Pool::Postgres(p) => {
                let mut tx = p.begin().await?;
                // One installation's reservations one at a time, across processes.
                sqlx::query("SELECT pg_advisory_xact_lock($1)")
                    .bind(BUDGET_LOCK ^ installation_id)
                    .execute(&mut *tx)
                    .await?;
                let granted = sqlx::query_scalar(reserve_sql!("LEAST", "GREATEST"))
                    .bind(want_micros)
                    .bind(budget_micros)
                    .bind(installation_id)
                    .bind(since_ms)
                    .bind(run_id)
                    .bind(&lease.worker)
                    .bind(lease.epoch)
                    .fetch_optional(&mut *tx)
                    .await?;
                tx.commit().await?;
                granted
            }
        };
        match granted {
            Some(granted) => Ok(granted),
            None => Err(self.not_held(run_id).await),
        }
    }
}

/// The advisory lock key space of budget reservations (xor the installation id).
const BUDGET_LOCK: i64 = 0x4b4f_4458_0000_0000;

impl Db {
    /// Places run `run_id` (running under `lease`) on the engine `engine` if fewer than
    /// `max_runs` running runs are placed there; whether it was (never when `lease` no
    /// longer holds the run). Atomic across processes: SQLite's one writer, PostgreSQL an
    /// advisory lock per engine name.
    pub async fn take_engine_slot(
        &self,
        run_id: &str,
        lease: &Lease,
        engine: &str,
        max_runs: usize,
    ) -> Result<bool, DbError> {
        const SQL: &str = "UPDATE runs SET engine = $1 WHERE id = $2 AND status = 'running' \
             AND worker = $4 AND attempts = $5 \
             AND (SELECT COUNT(*) FROM runs WHERE engine = $1 AND status = 'running' \
             AND id <> $2) < $3";
        let max = max_runs as i64;
        let taken = match &self.pool {
            Pool::Sqlite(p) => sqlx::query(SQL)
                .bind(engine)
                .bind(run_id)
                .bind(max)
                .bind(&lease.worker)
                .bind(lease.epoch)
                .execute(p)
                .await?
                .rows_affected(),
            Pool::Postgres(p) => {
                let mut tx = p.begin().await?;
                sqlx::query("SELECT pg_advisory_xact_lock($1)")
                    .bind(ENGINE_LOCK ^ name_key(engine))
                    .execute(&mut *tx)
                    .await?;
                let n = sqlx::query(SQL)
                    .bind(engine)
                    .bind(run_id)
                    .bind(max)
                    .bind(&lease.worker)
                    .bind(lease.epoch)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                tx.commit().await?;
                n
            }
        };
        Ok(taken == 1)
    }
}

/// The advisory lock key space of engine placements (xor a hash of the engine's name).
const ENGINE_LOCK: i64 = 0x4b4f_4458_454e_0000;

/// A stable 32-bit hash of `name` (FNV-1a), the same in every process.
fn name_key(name: &str) -> i64 {
    let mut h: u32 = 0x811c_9dc5;
    for b in name.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    i64::from(h)
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
        db.finish(
            &ids[0],
            &db.holder_now(&ids[0]).await,
            &finish(RunStatus::Succeeded, 0.25),
        )
        .await
        .unwrap();
        db.finish(
            &ids[1],
            &db.holder_now(&ids[1]).await,
            &finish(RunStatus::Succeeded, 0.5),
        )
        .await
        .unwrap();
        db.finish(
            &ids[2],
            &db.holder_now(&ids[2]).await,
            &finish(RunStatus::Failed, 1.0),
        )
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
