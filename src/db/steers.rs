//! `/kodx steer` (SPEC §12, "Steering and pictures"): the words a writer gave a running run,
//! a row each (`steers`) until the process running it takes them at its next step. On
//! PostgreSQL a `NOTIFY kodx 'steer'` tells every process at once; the row, not the
//! notification, is what carries the steer.

use super::models::Run;
use super::{now_ms, Db, DbError};

/// Tells the other processes (PostgreSQL) that a running run was steered.
const NOTIFY_STEER: &str = "SELECT pg_notify('kodx', 'steer')";

/// The agent kinds (a steer goes to one of these, running).
const WORK_KINDS: &str = "('ask', 'code', 'continue', 'address_reviews', 'repair', 'merge')";

/// What runs on an issue, for a steer.
#[derive(Debug, Clone, PartialEq)]
pub enum SteerTarget {
    /// The issue's running agent run.
    Running(Box<Run>),
    /// No run is running, but one is queued (`awaiting` when it waits for `/kodx go`).
    Queued { awaiting: bool },
    /// No agent run is queued or running.
    Nothing,
}

/// One steer taken by the run it was given to.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct SteerRow {
    pub author: String,
    pub body: String,
    pub comment_id: i64,
    pub created_at: i64,
}

impl Db {
    /// The agent run running on `repo`#`issue_number`, or why there is none.
    pub async fn steer_target(
        &self,
        repo: &str,
        issue_number: i64,
    ) -> Result<SteerTarget, DbError> {
        let running = with_pool!(&self.pool, p => sqlx::query_as::<_, Run>(&format!(
            "SELECT {} FROM runs WHERE repo = $1 AND issue_number = $2 \
             AND status = 'running' AND kind IN {WORK_KINDS} ORDER BY seq LIMIT 1",
            run_columns!()
        ))
        .bind(repo)
        .bind(issue_number)
        .fetch_optional(p)
        .await)?;
        if let Some(run) = running {
            return Ok(SteerTarget::Running(Box::new(run)));
        }
        let queued: Vec<Option<i64>> = with_pool!(&self.pool, p => sqlx::query_scalar(&format!(
            "SELECT held_until FROM runs WHERE repo = $1 AND issue_number = $2 \
             AND status = 'queued' AND kind IN {WORK_KINDS}"
        ))
        .bind(repo)
        .bind(issue_number)
        .fetch_all(p)
        .await)?;
        Ok(match queued.is_empty() {
            true => SteerTarget::Nothing,
            false => SteerTarget::Queued {
                awaiting: queued.iter().all(Option::is_some),
            },
        })
    }

    /// Gives `body` (cleaned and bounded by the caller) to the running run `run_id`, from
    /// comment `comment_id`; on PostgreSQL the other processes are told at once. `false`
    /// when the run is no longer running (or the comment was taken in before).
    pub async fn add_steer(
        &self,
        run_id: &str,
        author: &str,
        body: &str,
        comment_id: i64,
    ) -> Result<bool, DbError> {
        let notify = self.is_shared();
        let added = with_pool!(&self.pool, p => {
            let mut tx = p.begin().await?;
            let added = sqlx::query(
                "INSERT INTO steers (run_id, author, body, comment_id, created_at) \
                 SELECT $1, $2, $3, $4, $5 \
                 WHERE EXISTS (SELECT 1 FROM runs WHERE id = $1 AND status = 'running') \
                 ON CONFLICT (comment_id) DO NOTHING",
            )
            .bind(run_id)
            .bind(author)
            .bind(body)
            .bind(comment_id)
            .bind(now_ms())
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if notify && added > 0 {
                sqlx::query(NOTIFY_STEER).execute(&mut *tx).await?;
            }
            tx.commit().await?;
            added
        });
        Ok(added > 0)
    }

    /// Takes the run's steers nobody took yet, oldest first: one statement, so two callers
    /// never both take one.
    pub async fn take_steers(&self, run_id: &str) -> Result<Vec<SteerRow>, DbError> {
        let mut rows = with_pool!(&self.pool, p => sqlx::query_as::<_, SteerRow>(
            "UPDATE steers SET taken_at = $1 WHERE run_id = $2 AND taken_at IS NULL \
             RETURNING author, body, comment_id, created_at",
        )
        .bind(now_ms())
        .bind(run_id)
        .fetch_all(p)
        .await)?;
        rows.sort_by_key(|r| (r.created_at, r.comment_id));
        Ok(rows)
    }

    /// Who steered the run, each once, in the order of their first steer.
    pub async fn steerers(&self, run_id: &str) -> Result<Vec<String>, DbError> {
        let rows: Vec<(String, i64)> = with_pool!(&self.pool, p => sqlx::query_as(
            "SELECT author, MIN(created_at) AS first FROM steers WHERE run_id = $1 \
             GROUP BY author ORDER BY first, author",
        )
        .bind(run_id)
        .fetch_all(p)
        .await)?;
        Ok(rows.into_iter().map(|r| r.0).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::SteerTarget;
    use crate::db::test_support::*;
    use crate::db::RunStatus;

    #[tokio::test]
    async fn a_steer_is_taken_once_and_only_while_its_run_runs() {
        let dir = tempfile::tempdir().unwrap();
        for db in each_db(&dir).await {
            let backend = if db.is_shared() { "pg" } else { "sqlite" };
            assert_eq!(
                db.steer_target("o/r", 1).await.unwrap(),
                SteerTarget::Nothing,
                "{backend}"
            );
            let id = queue(&db, "s-1", &new_run("code", "o/r", 1)).await;
            assert_eq!(
                db.steer_target("o/r", 1).await.unwrap(),
                SteerTarget::Queued { awaiting: false }
            );
            assert!(db.hold(&id, i64::MAX, None).await.unwrap());
            assert_eq!(
                db.steer_target("o/r", 1).await.unwrap(),
                SteerTarget::Queued { awaiting: true }
            );
            // Not running: nothing is stored.
            assert!(!db.add_steer(&id, "bob", "x", 1).await.unwrap());
            db.confirm_held("o/r", 1, "bob", None).await.unwrap();
            let run = db.claim_run("w1").await.unwrap().unwrap();
            let SteerTarget::Running(found) = db.steer_target("o/r", 1).await.unwrap() else {
                panic!("{backend}: no running run found");
            };
            assert_eq!(found.id, run.id);
            assert!(db.add_steer(&id, "bob", "use v2", 11).await.unwrap());
            assert!(db.add_steer(&id, "carol", "and test", 12).await.unwrap());
            assert!(db.add_steer(&id, "bob", "thanks", 13).await.unwrap());
            // The same comment again adds nothing.
            assert!(!db.add_steer(&id, "bob", "use v2", 11).await.unwrap());
            // Two takers at once: each steer goes to exactly one.
            let (a, b) = tokio::join!(db.take_steers(&id), db.take_steers(&id));
            let mut taken: Vec<_> = a.unwrap().into_iter().chain(b.unwrap()).collect();
            taken.sort_by_key(|r| r.comment_id);
            let bodies: Vec<_> = taken.iter().map(|r| r.body.as_str()).collect();
            assert_eq!(bodies, ["use v2", "and test", "thanks"], "{backend}");
            assert!(db.take_steers(&id).await.unwrap().is_empty());
            assert_eq!(db.steerers(&id).await.unwrap(), ["bob", "carol"]);
            // A later steer is taken by the next call, in order.
            assert!(db.add_steer(&id, "dave", "last", 14).await.unwrap());
            let later = db.take_steers(&id).await.unwrap();
            assert_eq!(later.len(), 1);
            assert_eq!(
                (later[0].author.as_str(), later[0].comment_id),
                ("dave", 14)
            );
            let by = db.holder_now(&id).await;
            assert!(db
                .finish(&id, &by, &finish(RunStatus::Succeeded, 0.1))
                .await
                .unwrap());
            assert!(!db.add_steer(&id, "bob", "too late", 15).await.unwrap());
            assert_eq!(
                db.steer_target("o/r", 1).await.unwrap(),
                SteerTarget::Nothing
            );
        }
    }
}
