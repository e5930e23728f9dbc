//! Runs that wait for a writer's `/kodx go` (SPEC §12, "Quote and confirmation").
//!
//! A held run is a queue state, not a timer in memory: it stays `queued` with
//! `held_until` set (migration 0013), so no worker claims it ([`Db::claim_run`] skips it),
//! it survives restarts, and on PostgreSQL every process sees it. `/kodx go` clears the
//! hold in one statement ([`Db::confirm_held`]); once `held_until` has passed, whichever
//! process looks first ends it ([`Db::expire_hold`]), and only that one says so.

use super::models::{EndReason, Run};
use super::queue::NOTIFY_QUEUED;
use super::{now_ms, Db, DbError};

impl Db {
    /// Holds run `run_id` until `until` (unix milliseconds), with the status comment's
    /// `estimate` line: the acknowledgement's decision, written before its status comment
    /// is. A run a worker already claimed goes back to the queue, its claim (attempt
    /// included) undone: a claim of a run not yet acknowledged only waits for the
    /// acknowledgement, and sees the hold once the status comment is there. Whether the run
    /// was still there to hold (not ended, not confirmed, not acknowledged before).
    pub async fn hold(
        &self,
        run_id: &str,
        until: i64,
        estimate: Option<&str>,
    ) -> Result<bool, DbError> {
        let held = with_pool!(&self.pool, p => sqlx::query(
            "UPDATE runs SET held_until = $1, estimate = $2, phase = 'awaiting confirmation', \
             attempts = CASE WHEN status = 'running' THEN attempts - 1 ELSE attempts END, \
             status = 'queued', worker = NULL, started_at = NULL, lease_expires_at = NULL \
             WHERE id = $3 AND confirmed_by IS NULL AND status_comment_id IS NULL \
             AND status IN ('queued', 'running')",
        )
        .bind(until)
        .bind(estimate)
        .bind(run_id)
        .execute(p)
        .await
        .map(|done| done.rows_affected()))?;
        Ok(held == 1)
    }

    /// Keeps the status comment's estimate line with the run, so every later edit of the
    /// comment (a restart's note, another process's) shows it.
    pub async fn set_estimate(&self, run_id: &str, estimate: &str) -> Result<(), DbError> {
        with_pool!(&self.pool, p => sqlx::query("UPDATE runs SET estimate = $1 WHERE id = $2")
            .bind(estimate)
            .bind(run_id)
            .execute(p)
            .await
            .map(|_| ()))?;
        Ok(())
    }

    /// `/kodx go` by `by` on an issue: its oldest run waiting for confirmation is queued to
    /// start, with `cap` (USD) as its cap when one was asked for. The run, or `None` when
    /// nothing waits there. On PostgreSQL every process is told at once.
    pub async fn confirm_held(
        &self,
        repo: &str,
        issue_number: i64,
        by: &str,
        cap: Option<f64>,
    ) -> Result<Option<Run>, DbError> {
        let notify = self.is_shared();
        let run = with_pool!(&self.pool, p => {
            let mut tx = p.begin().await?;
            let run = sqlx::query_as::<_, Run>(concat!(
                "UPDATE runs SET held_until = NULL, phase = NULL, confirmed_by = $1, \
                 confirmed_cap_usd = $2 \
                 WHERE id = (SELECT id FROM runs WHERE repo = $3 AND issue_number = $4 \
                   AND status = 'queued' AND held_until IS NOT NULL ORDER BY seq LIMIT 1) \
                 AND status = 'queued' AND held_until IS NOT NULL RETURNING ",
                run_columns!()
            ))
            .bind(by)
            .bind(cap)
            .bind(repo)
            .bind(issue_number)
            .fetch_optional(&mut *tx)
            .await?;
            if notify && run.is_some() {
                sqlx::query(NOTIFY_QUEUED).execute(&mut *tx).await?;
            }
            tx.commit().await?;
            run
        });
        Ok(run)
    }

    /// Ends run `run_id` if it is still waiting for confirmation and its time has passed
    /// (`now`, unix milliseconds): `cancelled`, stop reason `unconfirmed`. The run when this
    /// call ended it (only one caller, in one process, gets it), else `None`.
    pub async fn expire_hold(&self, run_id: &str, now: i64) -> Result<Option<Run>, DbError> {
        let run = with_pool!(&self.pool, p => sqlx::query_as::<_, Run>(concat!(
            "UPDATE runs SET status = 'cancelled', stop_reason = $1, finished_at = $2, \
             phase = NULL \
             WHERE id = $3 AND status = 'queued' AND held_until IS NOT NULL AND held_until <= $4 \
             RETURNING ",
            run_columns!()
        ))
        .bind(EndReason::Unconfirmed)
        .bind(now_ms())
        .bind(run_id)
        .bind(now)
        .fetch_optional(p)
        .await)?;
        Ok(run)
    }
}

#[cfg(test)]
mod tests {
    use crate::db::test_support::*;
    use crate::db::{EndReason, RunStatus};

    #[tokio::test]
    async fn a_held_run_is_not_claimed_until_confirmed_and_holds_back_nothing() {
        let dir = tempfile::tempdir().unwrap();
        for db in each_db(&dir).await {
            let held = queue(&db, "h-1", &new_run("code", "o/r", 1)).await;
            let later = queue(&db, "h-2", &new_run("ask", "o/r", 1)).await;
            assert!(db.hold(&held, i64::MAX, Some("estimate: x")).await.unwrap());
            // The later run of the same issue is not held back by the waiting one.
            let claimed = db.claim_run("w1").await.unwrap().unwrap();
            assert_eq!(claimed.id, later);
            assert!(db.claim_run("w1").await.unwrap().is_none());
            let run = db.get_run(&held).await.unwrap().unwrap();
            assert!(run.is_held());
            assert_eq!(run.estimate.as_deref(), Some("estimate: x"));
            assert_eq!(run.phase.as_deref(), Some("awaiting confirmation"));
            // Nothing waits on another issue.
            assert!(db
                .confirm_held("o/r", 3, "bob", None)
                .await
                .unwrap()
                .is_none());
            let confirmed = db
                .confirm_held("o/r", 1, "bob", Some(0.5))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(confirmed.id, held);
            assert_eq!(confirmed.confirmed_by.as_deref(), Some("bob"));
            assert_eq!(confirmed.confirmed_cap_usd, Some(0.5));
            assert!(!confirmed.is_held());
            // Confirmed once: a second go finds nothing, and it cannot be held again.
            assert!(db
                .confirm_held("o/r", 1, "bob", None)
                .await
                .unwrap()
                .is_none());
            assert!(!db.hold(&held, i64::MAX, None).await.unwrap());
            // It starts once the issue's running run ends.
            assert!(db.claim_run("w2").await.unwrap().is_none());
            let by = db.holder_now(&later).await;
            assert!(db
                .finish(&later, &by, &finish(RunStatus::Succeeded, 0.1))
                .await
                .unwrap());
            let next = db.claim_run("w2").await.unwrap().unwrap();
            assert_eq!(next.id, held);
        }
    }

    #[tokio::test]
    async fn a_claimed_run_held_goes_back_to_the_queue_with_its_attempt() {
        let dir = tempfile::tempdir().unwrap();
        for db in each_db(&dir).await {
            let id = queue(&db, "h-1", &new_run("code", "o/r", 1)).await;
            let claimed = db.claim_run("w1").await.unwrap().unwrap();
            assert_eq!(claimed.attempts, 1);
            assert!(db.hold(&id, 10, None).await.unwrap());
            let run = db.get_run(&id).await.unwrap().unwrap();
            assert_eq!(run.status, RunStatus::Queued);
            assert_eq!((run.attempts, run.worker, run.started_at), (0, None, None));
            // A run acknowledged before (its status comment is up) is never held.
            let other = queue(&db, "h-2", &new_run("code", "o/r", 3)).await;
            db.set_status_comment(&other, 77).await.unwrap();
            assert!(!db.hold(&other, 10, None).await.unwrap());
        }
    }

    #[tokio::test]
    async fn a_hold_ends_once_its_time_has_passed() {
        let dir = tempfile::tempdir().unwrap();
        for db in each_db(&dir).await {
            let id = queue(&db, "h-1", &new_run("code", "o/r", 1)).await;
            assert!(db.hold(&id, 1_000, None).await.unwrap());
            assert!(db.expire_hold(&id, 999).await.unwrap().is_none());
            let ended = db.expire_hold(&id, 1_000).await.unwrap().unwrap();
            assert_eq!(ended.status, RunStatus::Cancelled);
            assert_eq!(ended.stop_reason, Some(EndReason::Unconfirmed));
            // Ended once, by one caller.
            assert!(db.expire_hold(&id, 2_000).await.unwrap().is_none());
            assert!(db
                .confirm_held("o/r", 1, "bob", None)
                .await
                .unwrap()
                .is_none());
        }
    }
}
