//! The run queue: claiming (FIFO, one agent run per issue), phases, finishing, `/kodx
//! cancel`, and recovery after a process died.

use super::models::{
    CancelledRun, EndReason, Finish, Holder, Lease, Recovered, RecoveryAction, Run, RunStatus,
};
use super::{now_ms, Db, DbError, Pool};
use crate::agent::StopReason;

/// Tells every process (PostgreSQL) that a run was queued.
pub(super) const NOTIFY_QUEUED: &str = "SELECT pg_notify('kodx', 'queued')";

/// Tells the other processes (PostgreSQL) that a running run was asked to stop.
pub(super) const NOTIFY_CANCEL: &str = "SELECT pg_notify('kodx', 'cancel')";

/// The agent runs a worker may start: the oldest queued one of an issue with none running.
/// A run waiting for `/kodx go` (`held_until` set) is never one, and does not hold back the
/// issue's later runs.
const AGENT_RUN_CANDIDATES: &str = "q.kind IN ('ask', 'code', 'continue', 'address_reviews', 'repair', 'merge') \
    AND q.held_until IS NULL \
    AND NOT EXISTS (SELECT 1 FROM runs r \
      WHERE r.repo = q.repo AND r.issue_number = q.issue_number \
      AND r.status = 'running' AND r.kind IN ('ask', 'code', 'continue', 'address_reviews', 'repair', 'merge')) \
    AND NOT EXISTS (SELECT 1 FROM runs o \
      WHERE o.repo = q.repo AND o.issue_number = q.issue_number \
      AND o.status = 'queued' AND o.held_until IS NULL \
      AND o.kind IN ('ask', 'code', 'continue', 'address_reviews', 'repair', 'merge') AND o.seq < q.seq)";

/// Control jobs: every kind that is not agent work.
const CONTROL_CANDIDATES: &str =
    "q.kind NOT IN ('ask', 'code', 'continue', 'address_reviews', 'repair', 'merge')";

/// How long a claimed run stays its worker's without a renewal, unless the server's
/// settings say otherwise (`lease_secs`, [`Db::with_lease`]).
pub const DEFAULT_LEASE: std::time::Duration = std::time::Duration::from_secs(60);

impl Pool {
    /// Now, in unix milliseconds, by the database's clock: leases are set and compared
    /// with it, so processes whose clocks disagree still agree on when a lease runs out
    /// (a process whose clock runs ahead does not take live runs back). PostgreSQL: the
    /// server's clock at the start of the statement; SQLite: the host's (one process).
    pub(super) fn now_sql(&self) -> &'static str {
        match self {
            Pool::Sqlite(_) => "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)",
            Pool::Postgres(_) => "CAST(EXTRACT(EPOCH FROM statement_timestamp()) * 1000 AS BIGINT)",
        }
    }
}

/// The `WHERE` of a write that carries a [`Lease`] (worker `$w`, epoch `$e`): the run is
/// still running under that claim.
pub(super) fn held(w: u8, e: u8) -> String {
    format!("status = 'running' AND worker = ${w} AND attempts = ${e}")
}

impl Db {
    /// Takes the oldest queued `ask`/`code` run whose issue has no `ask`/`code` run running,
    /// marks it running for `worker` and returns it. One statement, so concurrent claimers
    /// never take the same run and never start two runs on one issue: on SQLite the
    /// statement holds the one write lock; on PostgreSQL the candidate row is locked `FOR
    /// UPDATE SKIP LOCKED` (another process's candidate is skipped, not waited for), only
    /// the oldest queued run of an issue is a candidate (so skipping never reorders an
    /// issue's runs), and a unique index allows one running agent run per issue.
    pub async fn claim_run(&self, worker: &str) -> Result<Option<Run>, DbError> {
        self.claim(worker, AGENT_RUN_CANDIDATES).await
    }

    /// Takes the oldest queued control run (any kind but `ask`/`code`/`continue`: `help`,
    /// `cancel`, `refuse` …), with no per-issue exclusivity.
    pub async fn claim_control(&self, worker: &str) -> Result<Option<Run>, DbError> {
        self.claim(worker, CONTROL_CANDIDATES).await
    }

    /// Marks the first queued run `candidates` (a `WHERE` over `runs q`) picks as running for
    /// `worker`, with a fresh lease, and returns it. On PostgreSQL the candidate is locked
    /// `FOR UPDATE SKIP LOCKED`.
    async fn claim(&self, worker: &str, candidates: &str) -> Result<Option<Run>, DbError> {
        let lock = match self.pool {
            Pool::Sqlite(_) => "",
            Pool::Postgres(_) => " FOR UPDATE SKIP LOCKED",
        };
        let sql = format!(
            "UPDATE runs SET status = 'running', worker = $1, started_at = $2, \
             lease_expires_at = {} + $3, attempts = attempts + 1, phase = NULL \
             WHERE status = 'queued' AND id = (\
               SELECT q.id FROM runs q WHERE q.status = 'queued' AND {candidates} \
               ORDER BY q.seq LIMIT 1{lock}) RETURNING {}",
            self.pool.now_sql(),
            run_columns!()
        );
        let row = with_pool!(&self.pool, p => sqlx::query_as::<_, Run>(&sql)
            .bind(worker)
            .bind(now_ms())
            .bind(self.lease_ms)
            .fetch_optional(p)
            .await);
        match row {
            Ok(row) => Ok(row),
            // Another process started a run on the issue between the check and the write
            // (the index refused it): nothing is claimed now; the next pass tries again.
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Extends the leases of the runs `worker` is running to a lease from now (the
    /// database's now); returns how many it holds. Called by the worker every third of a
    /// lease.
    pub async fn renew_leases(&self, worker: &str) -> Result<u64, DbError> {
        let sql = format!(
            "UPDATE runs SET lease_expires_at = {} + $1 WHERE worker = $2 AND status = 'running'",
            self.pool.now_sql()
        );
        let renewed = with_pool!(&self.pool, p => sqlx::query(&sql)
        .bind(self.lease_ms)
        .bind(worker)
        .execute(p)
        .await
        .map(|done| done.rows_affected()))?;
        Ok(renewed)
    }

    /// Whether `lease` still holds run `run_id` (nobody took it back: it is still running
    /// under that claim); if so, the lease is extended to a whole lease from now. The check
    /// immediately before each side effect of a run that no `WHERE` can fence (a model
    /// call, a command, a comment, a push).
    pub async fn hold_lease(&self, run_id: &str, lease: &Lease) -> Result<bool, DbError> {
        let sql = format!(
            "UPDATE runs SET lease_expires_at = {} + $1 WHERE id = $2 AND {}",
            self.pool.now_sql(),
            held(3, 4)
        );
        let held = with_pool!(&self.pool, p => sqlx::query(&sql)
        .bind(self.lease_ms)
        .bind(run_id)
        .bind(&lease.worker)
        .bind(lease.epoch)
        .execute(p)
        .await
        .map(|done| done.rows_affected()))?;
        Ok(held == 1)
    }

    /// Whether `lease` holds run `run_id` (reads only).
    pub(super) async fn is_held(&self, run_id: &str, lease: &Lease) -> Result<bool, DbError> {
        let sql = format!("SELECT COUNT(*) FROM runs WHERE id = $1 AND {}", held(2, 3));
        let n: i64 = with_pool!(&self.pool, p => sqlx::query_scalar(&sql)
            .bind(run_id)
            .bind(&lease.worker)
            .bind(lease.epoch)
            .fetch_one(p)
            .await)?;
        Ok(n == 1)
    }

    /// Why a write carrying a lease on `run_id` changed nothing: there is no such run, or
    /// the lease no longer holds it.
    pub(super) async fn not_held(&self, run_id: &str) -> DbError {
        match self.get_run(run_id).await {
            Ok(None) => DbError::NotFound(run_id.to_owned()),
            Ok(Some(_)) => DbError::NotHeld(run_id.to_owned()),
            Err(e) => e,
        }
    }

    /// The runs `worker` is running that someone asked to cancel, with who asked — for a
    /// `/kodx cancel` another process received.
    pub async fn cancel_requests(&self, worker: &str) -> Result<Vec<(String, String)>, DbError> {
        let rows = with_pool!(&self.pool, p => sqlx::query_as(
            "SELECT id, cancelled_by FROM runs WHERE worker = $1 AND status = 'running' \
             AND cancelled_by IS NOT NULL",
        )
        .bind(worker)
        .fetch_all(p)
        .await)?;
        Ok(rows)
    }

    /// Whether several processes may share this queue (PostgreSQL): then recovery goes by
    /// leases, and nothing may be swept just because this process starts.
    pub fn is_shared(&self) -> bool {
        matches!(self.pool, Pool::Postgres(_))
    }

    /// The run with this id, if any.
    pub async fn get_run(&self, run_id: &str) -> Result<Option<Run>, DbError> {
        let row = with_pool!(&self.pool, p => sqlx::query_as::<_, Run>(concat!(
            "SELECT ",
            run_columns!(),
            " FROM runs WHERE id = $1"
        ))
        .bind(run_id)
        .fetch_optional(p).await)?;
        Ok(row)
    }

    /// Every run in `status`, oldest first (e.g. the running ones, whose containers are live).
    pub async fn runs_with_status(&self, status: RunStatus) -> Result<Vec<Run>, DbError> {
        let rows = with_pool!(&self.pool, p => sqlx::query_as::<_, Run>(concat!(
            "SELECT ",
            run_columns!(),
            " FROM runs WHERE status = $1 ORDER BY seq"
        ))
        .bind(status)
        .fetch_all(p).await)?;
        Ok(rows)
    }

    /// The newest `limit` runs, newest first (the operator's view).
    pub async fn recent_runs(&self, limit: i64) -> Result<Vec<Run>, DbError> {
        let rows = with_pool!(&self.pool, p => sqlx::query_as::<_, Run>(concat!(
            "SELECT ",
            run_columns!(),
            " FROM runs ORDER BY seq DESC LIMIT $1"
        ))
        .bind(limit)
        .fetch_all(p).await)?;
        Ok(rows)
    }

    /// Remembers the id of the run's status comment.
    pub async fn set_status_comment(&self, run_id: &str, comment_id: i64) -> Result<(), DbError> {
        let changed = with_pool!(&self.pool, p => sqlx::query("UPDATE runs SET status_comment_id = $1 WHERE id = $2")
            .bind(comment_id)
            .bind(run_id)
            .execute(p).await.map(|done| done.rows_affected()))?;
        super::found(changed, run_id)
    }

    /// Takes the acknowledgement of run `run_id` (its `eyes` and status comment) for
    /// `worker`: `true` when it is now `worker`'s (or already was), `false` when another
    /// process took it first. `force` takes it whoever had it (that process is gone).
    pub async fn take_acknowledgement(
        &self,
        run_id: &str,
        worker: &str,
        force: bool,
    ) -> Result<bool, DbError> {
        let taken = with_pool!(&self.pool, p => sqlx::query(
            "UPDATE runs SET acked_by = $2 \
             WHERE id = $1 AND (acked_by IS NULL OR acked_by = $2 OR $3)",
        )
        .bind(run_id)
        .bind(worker)
        .bind(force)
        .execute(p)
        .await
        .map(|done| done.rows_affected()))?;
        Ok(taken == 1)
    }

    /// Sets the free-text phase (`setting_up`, `working` …) shown for observability, while
    /// `lease` holds the run; whether it did.
    pub async fn set_phase(
        &self,
        run_id: &str,
        lease: &Lease,
        phase: &str,
    ) -> Result<bool, DbError> {
        let sql = format!(
            "UPDATE runs SET phase = $1 WHERE id = $2 AND {}",
            held(3, 4)
        );
        let changed = with_pool!(&self.pool, p => sqlx::query(&sql)
            .bind(phase)
            .bind(run_id)
            .bind(&lease.worker)
            .bind(lease.epoch)
            .execute(p).await.map(|done| done.rows_affected()))?;
        Ok(changed == 1)
    }

    /// Records how a run ended, if it is still `by`'s to end: running under `by`'s lease,
    /// or (a run `by` has not claimed) still queued or claimed by that worker since.
    /// Returns `false` (and changes nothing) if it is not — it had already finished, or
    /// another process took it over; [`DbError::NotFound`] if there is no such run.
    pub async fn finish(&self, run_id: &str, by: &Holder, fin: &Finish) -> Result<bool, DbError> {
        if !fin.status.is_final() {
            return Err(DbError::Invalid(format!(
                "a run cannot finish as {}; use succeeded, failed or cancelled",
                fin.status
            )));
        }
        // A claim's epoch (its attempt, at least 1), or -1 for a run not claimed by `by`.
        let (worker, epoch) = match by {
            Holder::Lease(lease) => (lease.worker.as_str(), lease.epoch),
            Holder::Waiting(worker) => (worker.as_str(), -1),
        };
        let changed = with_pool!(&self.pool, p => sqlx::query(
            "UPDATE runs SET status = $1, stop_reason = $2, cost_usd = $3, input_tokens = $4, \
             output_tokens = $5, cache_read_tokens = $6, cache_write_tokens = $7, \
             api_calls = $8, result = $9, pr_url = $10, finished_at = $11, cost_micros = $13 \
             WHERE id = $12 AND CASE WHEN $15 >= 0 \
               THEN status = 'running' AND worker = $14 AND attempts = $15 \
               ELSE status = 'queued' OR (status = 'running' AND worker = $14) END",
        )
        .bind(fin.status)
        .bind(&fin.stop_reason)
        .bind(fin.cost_usd)
        .bind(fin.input_tokens)
        .bind(fin.output_tokens)
        .bind(fin.cache_read_tokens)
        .bind(fin.cache_write_tokens)
        .bind(fin.api_calls)
        .bind(&fin.result)
        .bind(&fin.pr_url)
        .bind(now_ms())
        .bind(run_id)
        .bind(super::to_micros(fin.cost_usd))
        .bind(worker)
        .bind(epoch)
        .execute(p).await.map(|done| done.rows_affected()))?;
        if changed == 1 {
            return Ok(true);
        }
        match self.get_run(run_id).await? {
            Some(_) => Ok(false),
            None => Err(DbError::NotFound(run_id.to_owned())),
        }
    }

    /// `/kodx cancel` on `repo`#`issue_number`: every queued `ask`/`code` run of the issue
    /// becomes `cancelled` (stop reason `cancelled`, `cancelled_by = by`); the running ones
    /// get `cancelled_by = by` (the request to stop, for whichever process runs them: see
    /// [`Db::cancel_requests`]) and are returned with `was_running` so the caller can stop
    /// them if they are its own. Oldest first, cancelled ones before running ones. On
    /// PostgreSQL the other processes are told at once (`NOTIFY`).
    pub async fn cancel_issue(
        &self,
        repo: &str,
        issue_number: i64,
        by: &str,
    ) -> Result<Vec<CancelledRun>, DbError> {
        let notify = self.is_shared();
        let (order, mut cancelled, running) = with_pool!(&self.pool, pool => {
            let mut tx = pool.begin().await?;
            // A write first, as every transaction here: SQLite takes its write lock now
            // (waiting up to the busy timeout) instead of failing with a stale snapshot
            // when another connection writes between this transaction's read and write.
            let mut running = sqlx::query_as::<_, Run>(concat!(
                "UPDATE runs SET cancelled_by = COALESCE(cancelled_by, $1) \
                 WHERE repo = $2 AND issue_number = $3 AND status = 'running' \
                 AND kind IN ('ask', 'code', 'continue', 'address_reviews', 'repair', 'merge') RETURNING ",
                run_columns!()
            ))
            .bind(by)
            .bind(repo)
            .bind(issue_number)
            .fetch_all(&mut *tx)
            .await?;
            // The queue's order (RETURNING gives none, and two runs may share a millisecond).
            let order: Vec<String> = sqlx::query_scalar(
                "SELECT id FROM runs WHERE repo = $1 AND issue_number = $2 AND status = 'queued' \
                 AND kind IN ('ask', 'code', 'continue', 'address_reviews', 'repair', 'merge') ORDER BY seq",
            )
            .bind(repo)
            .bind(issue_number)
            .fetch_all(&mut *tx)
            .await?;
            let cancelled = sqlx::query_as::<_, Run>(concat!(
                "UPDATE runs SET status = 'cancelled', stop_reason = $5, \
                 cancelled_by = $1, finished_at = $2 \
                 WHERE repo = $3 AND issue_number = $4 AND status = 'queued' \
                 AND kind IN ('ask', 'code', 'continue', 'address_reviews', 'repair', 'merge') RETURNING ",
                run_columns!()
            ))
            .bind(by)
            .bind(now_ms())
            .bind(repo)
            .bind(issue_number)
            .bind(EndReason::Agent(StopReason::Cancelled))
            .fetch_all(&mut *tx)
            .await?;
            running.sort_by_key(|run| run.created_at);
            if notify && !running.is_empty() {
                sqlx::query(NOTIFY_CANCEL).execute(&mut *tx).await?;
            }
            tx.commit().await?;
            (order, cancelled, running)
        });

        cancelled.sort_by_key(|run| order.iter().position(|id| *id == run.id));
        let mut out: Vec<CancelledRun> = cancelled
            .into_iter()
            .map(|run| CancelledRun {
                run,
                was_running: false,
            })
            .collect();
        out.extend(running.into_iter().map(|run| CancelledRun {
            run,
            was_running: true,
        }));
        Ok(out)
    }

    /// Runs whose process is gone go back to the queue with `recovered` set if they have had
    /// fewer than `max_attempts` attempts, else fail with stop reason `internal_error`.
    /// Which runs those are depends on the backend: on SQLite (one process per database
    /// file) every `running` run, so it must only be called at start-up, before any worker
    /// claims; on PostgreSQL (processes share the queue) only the runs whose lease expired,
    /// so any process may call it at any time. `worker` names the recovering process in
    /// the log.
    pub async fn recover(
        &self,
        worker: &str,
        max_attempts: i64,
    ) -> Result<Vec<Recovered>, DbError> {
        let now = now_ms();
        // On PostgreSQL a run is another process's until its lease expires.
        // ($1, now, is bound to both statements; on SQLite it only has to be used.)
        // (By the database's clock: see `Pool::now_sql`.)
        let orphaned = match self.pool {
            Pool::Sqlite(_) => "$1 IS NOT NULL".to_string(),
            Pool::Postgres(_) => format!(
                "$1 IS NOT NULL AND (lease_expires_at IS NULL OR lease_expires_at < {})",
                self.pool.now_sql()
            ),
        };
        let failed_sql = format!(
            "UPDATE runs SET status = 'failed', stop_reason = $3, \
             result = CASE WHEN attempts = 2 \
               THEN '{{\"error\": \"kodx restarted twice during this run\"}}' \
               ELSE '{{\"error\": \"kodx restarted ' || attempts || ' times during this run\"}}' \
             END, \
             finished_at = $1, lease_expires_at = NULL, \
             cost_micros = COALESCE(reserved_micros, 0) \
             WHERE status = 'running' AND attempts >= $2 AND {orphaned} RETURNING {}",
            run_columns!()
        );
        let requeued_sql = format!(
            "UPDATE runs SET status = 'queued', recovered = 1, worker = NULL, phase = NULL, \
             lease_expires_at = NULL \
             WHERE status = 'running' AND {orphaned} RETURNING {}",
            run_columns!()
        );
        let (failed, requeued) = with_pool!(&self.pool, pool => {
            let mut tx = pool.begin().await?;
            let failed = sqlx::query_as::<_, Run>(&failed_sql)
                .bind(now)
                .bind(max_attempts)
                .bind(EndReason::InternalError)
                .fetch_all(&mut *tx)
                .await?;
            let requeued = sqlx::query_as::<_, Run>(&requeued_sql)
                .bind(now)
                .fetch_all(&mut *tx)
                .await?;
            tx.commit().await?;
            (failed, requeued)
        });

        let mut out = Vec::with_capacity(failed.len() + requeued.len());
        for (runs, action) in [
            (requeued, RecoveryAction::Requeued),
            (failed, RecoveryAction::Failed),
        ] {
            for run in runs {
                tracing::warn!(
                    run_id = %run.id,
                    repo = %run.request.repo,
                    issue = run.request.issue_number,
                    attempts = run.attempts,
                    action = ?action,
                    worker,
                    "run left running by a dead process"
                );
                out.push(Recovered { run, action });
            }
        }
        out.sort_by_key(|r| (r.run.created_at, r.run.id.clone()));
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::test_support::*;
    use crate::db::{Db, DbError, RunStatus};
    use crate::job::JobKind;

    #[tokio::test]
    async fn claims_are_first_in_first_out() {
        let dir = tempfile::tempdir().unwrap();
        for db in each_db(&dir).await {
            let mut ids = Vec::new();
            for issue in 1..=5 {
                ids.push(
                    queue(
                        &db,
                        &format!("d-{issue}"),
                        &new_run("ask", "octo/widgets", issue),
                    )
                    .await,
                );
            }
            for expected in &ids {
                let run = db.claim_run("w1").await.unwrap().expect("a run to claim");
                assert_eq!(&run.id, expected);
                assert_eq!(run.status, RunStatus::Running);
                assert_eq!(run.worker.as_deref(), Some("w1"));
                assert_eq!(run.attempts, 1);
                assert!(run.started_at.is_some());
            }
            assert_eq!(db.claim_run("w1").await.unwrap(), None);
        }
    }

    #[tokio::test]
    async fn one_agent_run_per_issue_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        for db in each_db(&dir).await {
            let first = queue(&db, "d-1", &new_run("code", "octo/widgets", 7)).await;
            let second = queue(&db, "d-2", &new_run("ask", "octo/widgets", 7)).await;
            let other_issue = queue(&db, "d-3", &new_run("code", "octo/widgets", 8)).await;
            let other_repo = queue(&db, "d-4", &new_run("code", "octo/gadgets", 7)).await;

            assert_eq!(db.claim_run("w").await.unwrap().unwrap().id, first);
            // The second run on issue 7 waits; the others are free.
            assert_eq!(db.claim_run("w").await.unwrap().unwrap().id, other_issue);
            assert_eq!(db.claim_run("w").await.unwrap().unwrap().id, other_repo);
            assert_eq!(db.claim_run("w").await.unwrap(), None);

            assert!(db
                .finish(
                    &first,
                    &db.holder_now(&first).await,
                    &finish(RunStatus::Succeeded, 0.1)
                )
                .await
                .unwrap());
            let next = db.claim_run("w").await.unwrap().unwrap();
            assert_eq!(next.id, second);
        }
    }

    #[tokio::test]
    async fn control_runs_are_claimed_apart_and_ignore_issue_exclusivity() {
        let dir = tempfile::tempdir().unwrap();
        for db in each_db(&dir).await {
            let work = queue(&db, "d-1", &new_run("code", "octo/widgets", 7)).await;
            let help = queue(&db, "d-2", &new_run("help", "octo/widgets", 7)).await;
            let cancel = queue(&db, "d-3", &new_run("cancel", "octo/widgets", 7)).await;

            assert_eq!(db.claim_run("w").await.unwrap().unwrap().id, work);
            assert_eq!(
                db.claim_run("w").await.unwrap(),
                None,
                "claim_run never takes control runs"
            );
            // Both control runs on issue 7 go while its code run is running, and together.
            let a = db.claim_control("c").await.unwrap().unwrap();
            let b = db.claim_control("c").await.unwrap().unwrap();
            assert_eq!(
                (a.id.as_str(), b.id.as_str()),
                (help.as_str(), cancel.as_str())
            );
            assert_eq!(a.status, RunStatus::Running);
            assert_eq!(db.claim_control("c").await.unwrap(), None);
            // A running control run does not block agent work on its issue.
            let later = queue(&db, "d-4", &new_run("ask", "octo/widgets", 9)).await;
            let _ = queue(&db, "d-5", &new_run("refuse", "octo/widgets", 9)).await;
            assert_eq!(
                db.claim_control("c").await.unwrap().unwrap().kind(),
                JobKind::Refuse
            );
            assert_eq!(db.claim_run("w").await.unwrap().unwrap().id, later);
        }
    }

    #[tokio::test]
    async fn finish_records_the_outcome_once() {
        let dir = tempfile::tempdir().unwrap();
        for db in each_db(&dir).await {
            let run_id = queue(&db, "d-1", &new_run("code", "octo/widgets", 1)).await;
            let lease = db.claim_run("w").await.unwrap().unwrap().lease().unwrap();
            db.set_status_comment(&run_id, 5_000_000_001).await.unwrap();
            assert!(db.set_phase(&run_id, &lease, "working").await.unwrap());

            let fin = finish(RunStatus::Succeeded, 0.0234);
            let by = Holder::Lease(lease);
            assert!(db.finish(&run_id, &by, &fin).await.unwrap());
            let run = db.get_run(&run_id).await.unwrap().unwrap();
            assert_eq!(run.status, RunStatus::Succeeded);
            assert_eq!(run.stop_reason.as_deref(), Some("end_turn"));
            assert_eq!(run.cost_usd, Some(0.0234));
            assert_eq!(
                (
                    run.input_tokens,
                    run.output_tokens,
                    run.cache_read_tokens,
                    run.cache_write_tokens
                ),
                (1200, 340, 50, 60)
            );
            assert_eq!(run.api_calls, 3);
            assert_eq!(run.result.as_deref(), Some(r#"{"summary":"done"}"#));
            assert_eq!(run.pr_url, fin.pr_url);
            assert_eq!(run.status_comment_id, Some(5_000_000_001));
            assert_eq!(run.phase.as_deref(), Some("working"));
            let finished_at = run.finished_at.expect("finished_at set");
            assert!(finished_at >= run.started_at.unwrap());

            // Never re-finished.
            let mut again = finish(RunStatus::Failed, 9.0);
            again.stop_reason = "error".into();
            assert!(!db.finish(&run_id, &by, &again).await.unwrap());
            let run = db.get_run(&run_id).await.unwrap().unwrap();
            assert_eq!(run.status, RunStatus::Succeeded);
            assert_eq!(run.cost_usd, Some(0.0234));
            assert_eq!(run.finished_at, Some(finished_at));

            // A queued run can be finished directly (e.g. refused before it started).
            let queued = queue(&db, "d-2", &new_run("ask", "octo/widgets", 2)).await;
            assert!(db
                .finish(
                    &queued,
                    &Holder::Waiting("w".into()),
                    &finish(RunStatus::Failed, 0.0)
                )
                .await
                .unwrap());
            assert_eq!(
                db.get_run(&queued).await.unwrap().unwrap().status,
                RunStatus::Failed
            );
        }
    }

    #[tokio::test]
    async fn finish_refuses_unfinished_statuses_and_unknown_runs() {
        let db = Db::open("sqlite::memory:").await.unwrap();
        let run_id = queue(&db, "d-1", &new_run("code", "octo/widgets", 1)).await;
        let err = db
            .finish(
                &run_id,
                &Holder::Waiting("w".into()),
                &finish(RunStatus::Running, 0.0),
            )
            .await
            .unwrap_err();
        assert!(matches!(err, DbError::Invalid(_)), "{err}");
        assert_eq!(
            db.get_run(&run_id).await.unwrap().unwrap().status,
            RunStatus::Queued
        );
        let err = db
            .finish(
                "nope",
                &Holder::Waiting("w".into()),
                &finish(RunStatus::Failed, 0.0),
            )
            .await
            .unwrap_err();
        assert!(
            matches!(err, DbError::NotFound(ref id) if id == "nope"),
            "{err}"
        );
        let lease = Lease {
            worker: "w".into(),
            epoch: 1,
        };
        assert!(!db.set_phase("nope", &lease, "working").await.unwrap());
        let err = db.set_status_comment("nope", 1).await.unwrap_err();
        assert!(matches!(err, DbError::NotFound(_)), "{err}");
        assert_eq!(db.get_run("nope").await.unwrap(), None);
    }

    #[tokio::test]
    async fn cancel_issue_cancels_queued_runs_and_reports_running_ones() {
        let dir = tempfile::tempdir().unwrap();
        for db in each_db(&dir).await {
            let running = queue(&db, "d-1", &new_run("code", "octo/widgets", 7)).await;
            let queued_a = queue(&db, "d-2", &new_run("ask", "octo/widgets", 7)).await;
            let queued_b = queue(&db, "d-3", &new_run("code", "octo/widgets", 7)).await;
            let elsewhere = queue(&db, "d-4", &new_run("code", "octo/widgets", 8)).await;
            let finished = queue(&db, "d-5", &new_run("code", "octo/other", 7)).await;
            let control = queue(&db, "d-6", &new_run("cancel", "octo/widgets", 7)).await;
            assert_eq!(db.claim_run("w").await.unwrap().unwrap().id, running);
            assert!(db
                .finish(
                    &finished,
                    &Holder::Waiting("w".into()),
                    &finish(RunStatus::Succeeded, 0.0)
                )
                .await
                .unwrap());

            let out = db.cancel_issue("octo/widgets", 7, "bob").await.unwrap();
            let summary: Vec<(&str, bool, RunStatus)> = out
                .iter()
                .map(|c| (c.run.id.as_str(), c.was_running, c.run.status))
                .collect();
            assert_eq!(
                summary,
                vec![
                    (queued_a.as_str(), false, RunStatus::Cancelled),
                    (queued_b.as_str(), false, RunStatus::Cancelled),
                    (running.as_str(), true, RunStatus::Running),
                ]
            );
            for c in &out[..2] {
                assert_eq!(c.run.stop_reason.as_deref(), Some("cancelled"));
                assert_eq!(c.run.cancelled_by.as_deref(), Some("bob"));
                assert!(c.run.finished_at.is_some());
            }
            // The running one is asked to stop, for whichever process runs it.
            assert_eq!(out[2].run.cancelled_by.as_deref(), Some("bob"));
            assert_eq!(out[2].run.finished_at, None);
            // Nothing else was touched.
            assert_eq!(
                db.get_run(&elsewhere).await.unwrap().unwrap().status,
                RunStatus::Queued
            );
            assert_eq!(
                db.get_run(&control).await.unwrap().unwrap().status,
                RunStatus::Queued
            );
            assert_eq!(
                db.get_run(&running).await.unwrap().unwrap().status,
                RunStatus::Running
            );
            // A second cancel finds only the running run.
            let again = db.cancel_issue("octo/widgets", 7, "bob").await.unwrap();
            assert_eq!(again.len(), 1);
            assert!(again[0].was_running);
            assert!(db
                .cancel_issue("octo/widgets", 99, "bob")
                .await
                .unwrap()
                .is_empty());
        }
    }

    #[tokio::test]
    async fn recover_requeues_once_then_fails() {
        let dir = tempfile::tempdir().unwrap();
        for db in each_db(&dir).await {
            let run_id = queue(&db, "d-1", &new_run("code", "octo/widgets", 7)).await;
            let untouched = queue(&db, "d-2", &new_run("code", "octo/widgets", 8)).await;
            let claimed = db.claim_run("dead-1").await.unwrap().unwrap();
            assert_eq!(claimed.id, run_id);
            assert!(db
                .set_phase(&run_id, &claimed.lease().unwrap(), "working")
                .await
                .unwrap());

            // The process dies; a new one starts (on PostgreSQL: the lease ran out).
            db.expire_leases().await;
            let recovered = db.recover("new-1", 2).await.unwrap();
            assert_eq!(recovered.len(), 1);
            assert_eq!(recovered[0].action, RecoveryAction::Requeued);
            let run = &recovered[0].run;
            assert_eq!(run.id, run_id);
            assert_eq!(run.status, RunStatus::Queued);
            assert!(run.recovered);
            assert_eq!(run.attempts, 1);
            assert_eq!(run.worker, None);
            assert_eq!(run.phase, None);
            assert_eq!(
                db.get_run(&untouched).await.unwrap().unwrap().status,
                RunStatus::Queued
            );

            // The requeued run keeps its place at the head of the queue.
            let again = db.claim_run("new-1").await.unwrap().unwrap();
            assert_eq!(again.id, run_id);
            assert_eq!(again.attempts, 2);
            assert!(again.recovered);

            // It dies again: out of attempts.
            db.expire_leases().await;
            let recovered = db.recover("new-2", 2).await.unwrap();
            assert_eq!(recovered.len(), 1);
            assert_eq!(recovered[0].action, RecoveryAction::Failed);
            let run = db.get_run(&run_id).await.unwrap().unwrap();
            assert_eq!(run.status, RunStatus::Failed);
            assert_eq!(run.stop_reason.as_deref(), Some("internal_error"));
            let note: serde_json::Value =
                serde_json::from_str(run.result.as_deref().unwrap()).unwrap();
            assert_eq!(note["error"], "kodx restarted twice during this run");
            assert!(run.finished_at.is_some());
            assert_eq!(recovered[0].run, run);

            // Nothing running: nothing to do.
            assert!(db.recover("new-3", 2).await.unwrap().is_empty());
        }
    }

    #[tokio::test]
    async fn recover_note_counts_restarts() {
        let db = Db::open("sqlite::memory:").await.unwrap();
        let run_id = queue(&db, "d-1", &new_run("ask", "octo/widgets", 1)).await;
        for _ in 0..3 {
            db.claim_run("w").await.unwrap().unwrap();
            db.recover("w", 10).await.unwrap();
        }
        db.claim_run("w").await.unwrap().unwrap();
        let out = db.recover("w", 3).await.unwrap();
        assert_eq!(out[0].action, RecoveryAction::Failed);
        let note: serde_json::Value =
            serde_json::from_str(out[0].run.result.as_deref().unwrap()).unwrap();
        assert_eq!(note["error"], "kodx restarted 4 times during this run");
        assert_eq!(run_id, out[0].run.id);
    }
}
