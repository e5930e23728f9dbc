//! What a run did, record by record, and pruning old transcripts of finished runs.

use futures_util::TryStreamExt;

use super::{now_ms, Db, DbError, Lease, Run};

impl Db {
    /// Stores record `seq` of the run's transcript (JSON text), while `lease` holds the run
    /// ([`DbError::NotHeld`] once it does not: nothing is stored). A `seq` already stored
    /// for the run is [`DbError::DuplicateTranscript`]; use [`Db::next_transcript_seq`] to
    /// continue a transcript after a restart.
    pub async fn append_transcript(
        &self,
        run_id: &str,
        lease: &Lease,
        seq: i64,
        record_json: &str,
    ) -> Result<(), DbError> {
        let sql = format!(
            "INSERT INTO transcripts (run_id, seq, record, created_at) \
             SELECT $1, $2, $3, $4 WHERE EXISTS (SELECT 1 FROM runs WHERE id = $1 AND {}) \
             ON CONFLICT (run_id, seq) DO NOTHING",
            super::queue::held(5, 6)
        );
        let inserted = with_pool!(&self.pool, p => sqlx::query(&sql)
        .bind(run_id)
        .bind(seq)
        .bind(record_json)
        .bind(now_ms())
        .bind(&lease.worker)
        .bind(lease.epoch)
        .execute(p).await.map(|done| done.rows_affected()));
        match inserted {
            Ok(1) => Ok(()),
            Ok(_) if !self.is_held(run_id, lease).await? => Err(self.not_held(run_id).await),
            Ok(_) => Err(DbError::DuplicateTranscript {
                run_id: run_id.to_owned(),
                seq,
            }),
            Err(sqlx::Error::Database(e)) if e.is_foreign_key_violation() => {
                Err(DbError::NotFound(run_id.to_owned()))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// One more than the largest transcript `seq` stored for the run (0 when none).
    pub async fn next_transcript_seq(&self, run_id: &str) -> Result<i64, DbError> {
        let next: i64 = with_pool!(&self.pool, p => sqlx::query_scalar(
            "SELECT COALESCE(MAX(seq), -1) + 1 FROM transcripts WHERE run_id = $1",
        )
        .bind(run_id)
        .fetch_one(p).await)?;
        Ok(next)
    }

    /// The run's transcript records in `seq` order, handed one by one to `each` as they
    /// are read (so a long transcript is never held twice); `each` stops the read by
    /// returning `Err`.
    pub async fn each_transcript_record<E>(
        &self,
        run_id: &str,
        mut each: impl FnMut(&str) -> Result<(), E>,
    ) -> Result<Result<(), E>, DbError> {
        with_pool!(&self.pool, p => {
            let mut rows = sqlx::query_scalar::<_, String>(
                "SELECT record FROM transcripts WHERE run_id = $1 ORDER BY seq",
            )
            .bind(run_id)
            .fetch(p);
            while let Some(record) = rows.try_next().await? {
                if let Err(e) = each(&record) {
                    return Ok(Err(e));
                }
            }
            Ok(Ok(()))
        })
    }

    /// When the run's transcript was deleted for its age, if it was.
    pub async fn transcript_pruned_at(&self, run_id: &str) -> Result<Option<i64>, DbError> {
        let at: Option<Option<i64>> = with_pool!(&self.pool, p => {
            sqlx::query_scalar("SELECT transcript_pruned_at FROM runs WHERE id = $1")
                .bind(run_id)
                .fetch_optional(p)
                .await
        })?;
        at.ok_or_else(|| DbError::NotFound(run_id.to_owned()))
    }

    /// The finished `code` and `continue` runs on one issue or pull request, newest first
    /// (at most `limit`): where `/kodx continue` looks for the run to go on with.
    pub async fn finished_code_runs(
        &self,
        repo: &str,
        issue_number: i64,
        limit: i64,
    ) -> Result<Vec<Run>, DbError> {
        let rows = with_pool!(&self.pool, p => sqlx::query_as::<_, Run>(concat!(
            "SELECT ",
            run_columns!(),
            " FROM runs WHERE repo = $1 AND issue_number = $2 \
              AND kind IN ('code', 'continue') \
              AND status IN ('succeeded', 'failed', 'cancelled') \
              ORDER BY seq DESC LIMIT $3"
        ))
        .bind(repo)
        .bind(issue_number)
        .bind(limit)
        .fetch_all(p)
        .await)?;
        Ok(rows)
    }

    /// Up to `limit` transcript records of `run_id` from sequence number `from` on, with
    /// their numbers, in order.
    pub async fn transcript_records(
        &self,
        run_id: &str,
        from: i64,
        limit: i64,
    ) -> Result<Vec<(i64, String)>, DbError> {
        let rows = with_pool!(&self.pool, p => sqlx::query_as(
            "SELECT seq, record FROM transcripts WHERE run_id = $1 AND seq >= $2 \
             ORDER BY seq LIMIT $3",
        )
        .bind(run_id)
        .bind(from)
        .bind(limit)
        .fetch_all(p)
        .await)?;
        Ok(rows)
    }

    /// The id of a `code` or `continue` run on the issue of run `run_id`, queued before it,
    /// that has not finished (it is queued or running).
    pub async fn unfinished_code_run_before(
        &self,
        run_id: &str,
    ) -> Result<Option<String>, DbError> {
        let row: Option<(String,)> = with_pool!(&self.pool, p => sqlx::query_as(
            "SELECT e.id FROM runs e JOIN runs r ON r.id = $1 \
             WHERE e.repo = r.repo AND e.issue_number = r.issue_number \
               AND e.kind IN ('code', 'continue') AND e.status IN ('queued', 'running') \
               AND e.seq < r.seq ORDER BY e.seq DESC LIMIT 1",
        )
        .bind(run_id)
        .fetch_optional(p)
        .await)?;
        Ok(row.map(|(id,)| id))
    }

    /// Deletes the transcripts of runs that finished before `before_ms` (unix milliseconds)
    /// and marks those runs `transcript_pruned_at`; the runs' own rows (status, cost,
    /// tokens, result) stay. Queued and running runs are never touched. Returns how many
    /// transcript records were deleted.
    pub async fn prune_transcripts(&self, before_ms: i64) -> Result<u64, DbError> {
        let deleted = with_pool!(&self.pool, pool => {
            let mut tx = pool.begin().await?;
            let deleted = sqlx::query(
                "DELETE FROM transcripts WHERE run_id IN (\
                   SELECT id FROM runs WHERE finished_at < $1 \
                   AND status IN ('succeeded', 'failed', 'cancelled') \
                   AND transcript_pruned_at IS NULL)",
            )
            .bind(before_ms)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            // The images the runs gave the model go with their transcripts.
            sqlx::query(
                "DELETE FROM run_images WHERE run_id IN (\
                   SELECT id FROM runs WHERE finished_at < $1 \
                   AND status IN ('succeeded', 'failed', 'cancelled') \
                   AND transcript_pruned_at IS NULL)",
            )
            .bind(before_ms)
            .execute(&mut *tx)
            .await?;
            sqlx::query(
                "UPDATE runs SET transcript_pruned_at = $1 WHERE finished_at < $2 \
                 AND status IN ('succeeded', 'failed', 'cancelled') \
                 AND transcript_pruned_at IS NULL",
            )
            .bind(now_ms())
            .bind(before_ms)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            deleted
        });
        Ok(deleted)
    }
}

#[cfg(test)]
mod tests {
    use crate::db::test_support::*;
    use crate::db::{now_ms, DbError, Lease, RunStatus};

    #[tokio::test]
    async fn transcripts_keep_order_and_refuse_duplicates() {
        let dir = tempfile::tempdir().unwrap();
        for db in each_db(&dir).await {
            let run_id = queue(&db, "d-1", &new_run("code", "octo/widgets", 1)).await;
            let lease = db.claim_run("w").await.unwrap().unwrap().lease().unwrap();
            assert_eq!(db.next_transcript_seq(&run_id).await.unwrap(), 0);
            // Stored out of order, read back in seq order.
            db.append_transcript(&run_id, &lease, 1, r#"{"type":"response"}"#)
                .await
                .unwrap();
            db.append_transcript(&run_id, &lease, 0, r#"{"type":"request"}"#)
                .await
                .unwrap();
            db.append_transcript(&run_id, &lease, 2, r#"{"type":"tool_call"}"#)
                .await
                .unwrap();
            assert_eq!(
                db.transcript(&run_id).await.unwrap(),
                vec![
                    r#"{"type":"request"}"#.to_owned(),
                    r#"{"type":"response"}"#.to_owned(),
                    r#"{"type":"tool_call"}"#.to_owned(),
                ]
            );
            assert_eq!(db.next_transcript_seq(&run_id).await.unwrap(), 3);
            let err = db
                .append_transcript(&run_id, &lease, 1, "{}")
                .await
                .unwrap_err();
            assert!(
                matches!(err, DbError::DuplicateTranscript { seq: 1, .. }),
                "{err}"
            );
            assert_eq!(
                db.transcript(&run_id).await.unwrap()[1],
                r#"{"type":"response"}"#
            );
            let err = db
                .append_transcript("nope", &lease, 0, "{}")
                .await
                .unwrap_err();
            assert!(matches!(err, DbError::NotFound(_)), "{err}");
            // Another claim of the run (a process that lost it) stores nothing.
            let stale = Lease {
                worker: "w".into(),
                epoch: 0,
            };
            let err = db
                .append_transcript(&run_id, &stale, 3, "{}")
                .await
                .unwrap_err();
            assert!(matches!(err, DbError::NotHeld(_)), "{err}");
            assert_eq!(db.next_transcript_seq(&run_id).await.unwrap(), 3);
            assert!(db.transcript("nope").await.unwrap().is_empty());
        }
    }

    #[tokio::test]
    async fn old_transcripts_of_finished_runs_are_pruned_and_the_runs_stay() {
        let dir = tempfile::tempdir().unwrap();
        for db in each_db(&dir).await {
            let done = queue(&db, "d-1", &new_run("ask", "octo/widgets", 1)).await;
            let running = queue(&db, "d-2", &new_run("ask", "octo/widgets", 3)).await;
            let queued = queue(&db, "d-3", &new_run("ask", "octo/widgets", 3)).await;
            for run in [&done, &running, &queued] {
                for seq in 0..3 {
                    db.put_transcript(run, seq, r#"{"type":"request"}"#).await;
                }
            }
            assert_eq!(db.claim_run("w").await.unwrap().unwrap().id, done);
            assert_eq!(db.claim_run("w").await.unwrap().unwrap().id, running);
            assert!(db
                .finish(
                    &done,
                    &db.holder_now(&done).await,
                    &finish(RunStatus::Succeeded, 0.25)
                )
                .await
                .unwrap());
            // Nothing finished before the cutoff.
            let finished_at = db
                .get_run(&done)
                .await
                .unwrap()
                .unwrap()
                .finished_at
                .unwrap();
            assert_eq!(db.prune_transcripts(finished_at).await.unwrap(), 0);
            assert_eq!(db.transcript(&done).await.unwrap().len(), 3);
            // Past it: the finished run's transcript goes, its row (cost, tokens) stays; the
            // running and queued runs keep theirs.
            assert_eq!(db.prune_transcripts(finished_at + 1).await.unwrap(), 3);
            assert!(db.transcript(&done).await.unwrap().is_empty());
            let run = db.get_run(&done).await.unwrap().unwrap();
            assert_eq!(run.status, RunStatus::Succeeded);
            assert_eq!(run.cost_usd, Some(0.25));
            assert_eq!(run.input_tokens, 1200);
            assert!(db.transcript_pruned_at(&done).await.unwrap().is_some());
            assert_eq!(db.transcript_pruned_at(&running).await.unwrap(), None);
            assert_eq!(db.transcript(&running).await.unwrap().len(), 3);
            assert_eq!(db.transcript(&queued).await.unwrap().len(), 3);
            assert_eq!(db.prune_transcripts(now_ms() + 1).await.unwrap(), 0);
            assert!(matches!(
                db.transcript_pruned_at("nope").await,
                Err(DbError::NotFound(_))
            ));
        }
    }
}
