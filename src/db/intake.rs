//! Webhook intake: deliveries (deduplicated by id), the runs they queue (deduplicated by
//! trigger) committed in groups, and installations.

use sqlx::Row;

use super::accept::AcceptJob;
use super::models::{Accepted, InstallationRecord, NewDelivery, NewRun};
use super::{now_ms, Db, DbError};
use crate::job::{RunRequest, TriggerKind};

/// How often a new run id is drawn when the first one is taken (it never is: 48 random bits).
const RUN_ID_ATTEMPTS: usize = 8;

impl Db {
    /// Records `delivery` and, if it is new and `run` is given, queues `run`, in one
    /// transaction that is durable when this returns. A delivery id seen before writes
    /// nothing and gives [`Accepted::Duplicate`], also when two identical deliveries race.
    /// A new delivery whose trigger (repository, trigger kind and id) already has a run is
    /// recorded but queues nothing: [`Accepted::DuplicateTrigger`], also within one batch.
    ///
    /// Deliveries arriving together are committed together (group commit): one writer
    /// takes every request waiting for it into one transaction, so a burst costs one
    /// `fsync` per batch instead of one per delivery, and no caller sleeps on SQLite's
    /// write lock. Each caller still returns only after its own rows are on disk.
    pub async fn accept(
        &self,
        delivery: &NewDelivery,
        run: Option<&NewRun>,
    ) -> Result<Accepted, DbError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let job = AcceptJob {
            delivery: delivery.clone(),
            run: run.cloned(),
            reply,
        };
        if self.writer.send(job).await.is_err() {
            return Err(DbError::Invalid("the database writer has stopped".into()));
        }
        answer
            .await
            .map_err(|_| DbError::Invalid("the database writer has stopped".into()))?
    }

    /// Records an `installation` event: `created` / `unsuspend` clear the suspended flag,
    /// `suspend` sets it, `deleted` sets the deleted flag (`created` clears it); any other
    /// action only updates the account and last action.
    pub async fn record_installation(
        &self,
        installation_id: i64,
        account: &str,
        action: &str,
    ) -> Result<(), DbError> {
        let (suspended, deleted): (Option<i64>, Option<i64>) = match action {
            "created" => (Some(0), Some(0)),
            "deleted" => (None, Some(1)),
            "suspend" => (Some(1), None),
            "unsuspend" => (Some(0), None),
            _ => (None, None),
        };
        let now = now_ms();
        with_pool!(&self.pool, p => sqlx::query(
            "INSERT INTO installations \
             (id, account, last_action, suspended, deleted, created_at, updated_at) \
             VALUES ($1, $2, $3, COALESCE($4, 0), COALESCE($5, 0), $6, $6) \
             ON CONFLICT (id) DO UPDATE SET \
             account = excluded.account, \
             last_action = excluded.last_action, \
             suspended = COALESCE($4, installations.suspended), \
             deleted = COALESCE($5, installations.deleted), \
             updated_at = excluded.updated_at",
        )
        .bind(installation_id)
        .bind(account)
        .bind(action)
        .bind(suspended)
        .bind(deleted)
        .bind(now)
        .execute(p).await.map(|done| done.rows_affected()))?;
        Ok(())
    }

    /// The installation with this id, if an event about it was recorded.
    pub async fn installation(
        &self,
        installation_id: i64,
    ) -> Result<Option<InstallationRecord>, DbError> {
        Ok(with_pool!(&self.pool, p => sqlx::query_as(
            "SELECT id, account, last_action, suspended, deleted, created_at, updated_at \
             FROM installations WHERE id = $1",
        )
        .bind(installation_id)
        .fetch_optional(p).await)?)
    }
}

/// The most deliveries committed in one transaction.
/// (18 bound values per run: 4,608 per statement, under SQLite's 32,766.)
pub(super) const MAX_BATCH: usize = 256;

/// Commits waiting deliveries in batches until every `Db` handle is gone.
pub(super) async fn accept_writer(
    pool: super::Pool,
    mut rx: tokio::sync::mpsc::Receiver<AcceptJob>,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while rx.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let jobs: Vec<AcceptJob> = std::mem::take(&mut batch);
        let written = match &pool {
            super::Pool::Sqlite(p) => accept_batch_sqlite(p, &jobs).await,
            super::Pool::Postgres(p) => accept_batch_postgres(p, &jobs).await,
        };
        match written {
            Ok(answers) => {
                for (job, answer) in jobs.into_iter().zip(answers) {
                    let _ = job.reply.send(Ok(answer));
                }
            }
            Err(e) => {
                // Nothing of the batch was written: every caller gets the error (and
                // answers 500, so GitHub shows the delivery as failed and it can be
                // redelivered).
                let text = e.to_string();
                for job in jobs {
                    let _ = job.reply.send(Err(DbError::Invalid(text.clone())));
                }
            }
        }
    }
}

/// The group commit, written once and compiled for each backend: `$lock` is the statement
/// that makes the batch the only writer of the queue (SQLite's first write takes its one
/// write lock; PostgreSQL takes a transaction-scoped advisory lock, so `MAX(seq) + 1` is
/// right across processes); `$notify`, run before the commit when a run was queued, wakes
/// idle workers of every process (PostgreSQL `NOTIFY`, delivered on commit).
macro_rules! accept_batch_for {
    ($name:ident, $trigger:ident, $db:ty, $lock:expr, $notify:expr) => {
        /// Writes a batch in one transaction; the answers are in the order of `jobs`.
        ///
        /// Two multi-row statements per batch, whatever its size: the deliveries (`RETURNING` the
        /// ids that were new), then the runs of the new ones, numbered after the current last
        /// `seq` (read inside the transaction, which already holds the write lock).
        async fn $name(
            pool: &sqlx::Pool<$db>,
            jobs: &[AcceptJob],
        ) -> Result<Vec<Accepted>, DbError> {
            let now = now_ms();
            let mut tx = pool.begin().await?;
            if let Some(lock) = $lock {
                sqlx::query(lock).execute(&mut *tx).await?;
            }

            let mut insert = sqlx::QueryBuilder::<$db>::new(
                "INSERT INTO deliveries (id, event, action, installation_id, repo, received_at) ",
            );
            insert.push_values(jobs, |mut row, job| {
                let d = &job.delivery;
                row.push_bind(&d.id)
                    .push_bind(&d.event)
                    .push_bind(&d.action)
                    .push_bind(d.installation_id)
                    .push_bind(&d.repo)
                    .push_bind(now);
            });
            insert.push(" ON CONFLICT (id) DO NOTHING RETURNING id");
            let mut new_ids: std::collections::HashSet<String> = insert
                .build()
                .fetch_all(&mut *tx)
                .await?
                .into_iter()
                .map(|row| row.get::<String, _>(0))
                .collect();

            // A delivery is new when its id was inserted now, and only for its first job (the same
            // id twice in one batch: the second is a duplicate). A new delivery whose trigger
            // already appeared earlier in the batch queues nothing either: it answers with the run
            // of that first job (`repeats`).
            let mut answers: Vec<Option<Accepted>> = Vec::with_capacity(jobs.len());
            let mut to_queue: Vec<(usize, &NewRun)> = Vec::new();
            let mut first_of_trigger: std::collections::HashMap<(&str, TriggerKind, i64), usize> =
                std::collections::HashMap::new();
            let mut repeats: Vec<(usize, usize)> = Vec::new();
            for (i, job) in jobs.iter().enumerate() {
                if !new_ids.remove(&job.delivery.id) {
                    answers.push(Some(Accepted::Duplicate));
                    continue;
                }
                match &job.run {
                    None => answers.push(Some(Accepted::Recorded)),
                    Some(run) => {
                        answers.push(None);
                        let key = (run.repo.as_str(), run.trigger.kind(), run.trigger.id());
                        match first_of_trigger.get(&key) {
                            Some(&first) => repeats.push((i, first)),
                            None => {
                                first_of_trigger.insert(key, i);
                                to_queue.push((i, run));
                            }
                        }
                    }
                }
            }

            if !to_queue.is_empty() {
                let last_seq: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(seq), 0) FROM runs")
                    .fetch_one(&mut *tx)
                    .await?;
                let mut pending: Vec<(usize, &NewRun, String, i64)> = to_queue
                    .into_iter()
                    .enumerate()
                    .map(|(k, (i, run))| (i, run, new_run_id(), last_seq + 1 + k as i64))
                    .collect();
                for _ in 0..RUN_ID_ATTEMPTS {
                    // No conflict target: a taken run id and a trigger that already has a run both
                    // leave the row out instead of failing the batch; which one it was is looked
                    // up below for the (rare) rows left out.
                    let mut insert = sqlx::QueryBuilder::<$db>::new(format!(
                        "INSERT INTO runs (id, seq, delivery_id, {}, status, created_at) ",
                        RunRequest::COLUMNS
                    ));
                    insert.push_values(&pending, |mut row, (i, run, run_id, seq)| {
                        row.push_bind(run_id)
                            .push_bind(*seq)
                            .push_bind(&jobs[*i].delivery.id);
                        run.push_binds(&mut row);
                        row.push_bind("queued").push_bind(now);
                    });
                    insert.push(" ON CONFLICT DO NOTHING RETURNING id");
                    let inserted: std::collections::HashSet<String> = insert
                        .build()
                        .fetch_all(&mut *tx)
                        .await?
                        .into_iter()
                        .map(|row| row.get::<String, _>(0))
                        .collect();
                    let mut retry = Vec::new();
                    for (i, run, run_id, seq) in pending {
                        if inserted.contains(&run_id) {
                            answers[i] = Some(Accepted::Queued { run_id });
                        } else if let Some(first) = $trigger(&mut tx, run).await? {
                            answers[i] = Some(Accepted::DuplicateTrigger { run_id: first });
                        } else {
                            // The id was taken (48 random bits: practically never): draw again.
                            retry.push((i, run, new_run_id(), seq));
                        }
                    }
                    pending = retry;
                    if pending.is_empty() {
                        break;
                    }
                }
                if !pending.is_empty() {
                    return Err(DbError::Invalid(format!(
                        "could not draw a free run id in {RUN_ID_ATTEMPTS} attempts"
                    )));
                }
            }
            for (i, first) in repeats {
                let run_id = match &answers[first] {
                    Some(Accepted::Queued { run_id } | Accepted::DuplicateTrigger { run_id }) => {
                        run_id.clone()
                    }
                    other => unreachable!("the first job of a trigger was answered {other:?}"),
                };
                answers[i] = Some(Accepted::DuplicateTrigger { run_id });
            }
            if let Some(notify) = $notify {
                if answers
                    .iter()
                    .any(|a| matches!(a, Some(Accepted::Queued { .. })))
                {
                    sqlx::query(notify).execute(&mut *tx).await?;
                }
            }
            tx.commit().await?;
            Ok(answers
                .into_iter()
                .map(|a| a.expect("every job answered"))
                .collect())
        }

        /// The run already queued for `run`'s trigger (its comment or issue), if any.
        async fn $trigger(
            tx: &mut sqlx::Transaction<'_, $db>,
            run: &NewRun,
        ) -> Result<Option<String>, DbError> {
            Ok(sqlx::query_scalar(
                "SELECT id FROM runs WHERE repo = $1 AND trigger_kind = $2 AND trigger_id = $3 \
         AND trigger_copy = 0",
            )
            .bind(&run.repo)
            .bind(run.trigger.kind())
            .bind(run.trigger.id())
            .fetch_optional(&mut **tx)
            .await?)
        }
    };
}

/// Serialises intake across PostgreSQL sessions (any constant, the same in every process).
const PG_INTAKE_LOCK: &str = "SELECT pg_advisory_xact_lock(7393001)";

accept_batch_for!(
    accept_batch_sqlite,
    run_of_trigger_sqlite,
    sqlx::Sqlite,
    None::<&str>,
    None::<&str>
);
accept_batch_for!(
    accept_batch_postgres,
    run_of_trigger_postgres,
    sqlx::Postgres,
    Some(PG_INTAKE_LOCK),
    Some(super::queue::NOTIFY_QUEUED)
);

/// A new run id: 48 random bits as 12 lowercase hex characters.
pub(crate) fn new_run_id() -> String {
    format!("{:012x}", rand::random::<u64>() >> 16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::test_support::*;
    use crate::db::{now_ms, Accepted, Db, RunStatus};
    use crate::job::TriggerKind;

    #[tokio::test]
    async fn accept_queues_once_and_a_redelivery_does_nothing() {
        let dir = tempfile::tempdir().unwrap();
        for db in each_db(&dir).await {
            let asked = new_run("code", "octo/widgets", 12);
            let run_id = queue(&db, "d-12", &asked).await;
            assert_eq!(run_id.len(), 12);
            assert!(
                run_id.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f')),
                "{run_id}"
            );

            let run = db.get_run(&run_id).await.unwrap().unwrap();
            assert_eq!(run.delivery_id, "d-12");
            // The typed request comes back as it went in.
            assert_eq!(run.request, asked);
            assert!(run.request.is_pull_request);
            assert_eq!(run.request.trigger.kind(), TriggerKind::ReviewComment);
            assert_eq!(run.request.trigger.review().unwrap().path, "src/lib.rs");
            assert_eq!(run.status, RunStatus::Queued);
            assert_eq!(run.attempts, 0);
            assert!(!run.recovered);
            assert_eq!(run.worker, None);
            assert_eq!(run.started_at, None);
            assert!((now_ms() - run.created_at).abs() < 60_000);

            // GitHub redelivers: same id, even with a different payload.
            let again = db
                .accept(&delivery("d-12"), Some(&new_run("ask", "octo/widgets", 13)))
                .await
                .unwrap();
            assert_eq!(again, Accepted::Duplicate);
            assert_eq!(run_count(&db).await, 1);
        }
    }

    #[tokio::test]
    async fn a_delivery_without_a_run_is_recorded_once() {
        let dir = tempfile::tempdir().unwrap();
        for db in each_db(&dir).await {
            let ping = NewDelivery {
                id: "p-1".to_owned(),
                event: "ping".to_owned(),
                action: None,
                installation_id: None,
                repo: None,
            };
            assert_eq!(db.accept(&ping, None).await.unwrap(), Accepted::Recorded);
            assert_eq!(db.accept(&ping, None).await.unwrap(), Accepted::Duplicate);
            // A recorded delivery id cannot later queue a run either.
            let late = db
                .accept(&ping, Some(&new_run("ask", "octo/widgets", 1)))
                .await
                .unwrap();
            assert_eq!(late, Accepted::Duplicate);
            assert_eq!(run_count(&db).await, 0);
            let event: String = with_pool!(&db.pool, p => sqlx::query_scalar("SELECT event FROM deliveries WHERE id = 'p-1'")
                .fetch_one(p).await)
                .unwrap();
            assert_eq!(event, "ping");
        }
    }

    #[tokio::test]
    async fn installations_follow_their_events() {
        let db = Db::open("sqlite::memory:").await.unwrap();
        assert_eq!(db.installation(5).await.unwrap(), None);
        db.record_installation(5, "octo", "created").await.unwrap();
        let i = db.installation(5).await.unwrap().unwrap();
        assert_eq!(
            (i.account.as_str(), i.suspended, i.deleted),
            ("octo", false, false)
        );

        db.record_installation(5, "octo", "suspend").await.unwrap();
        let i = db.installation(5).await.unwrap().unwrap();
        assert_eq!(
            (i.last_action.as_str(), i.suspended, i.deleted),
            ("suspend", true, false)
        );
        // Other actions keep the flags.
        db.record_installation(5, "octo-renamed", "new_permissions_accepted")
            .await
            .unwrap();
        let i = db.installation(5).await.unwrap().unwrap();
        assert_eq!((i.account.as_str(), i.suspended), ("octo-renamed", true));
        db.record_installation(5, "octo", "unsuspend")
            .await
            .unwrap();
        assert!(!db.installation(5).await.unwrap().unwrap().suspended);
        db.record_installation(5, "octo", "deleted").await.unwrap();
        let i = db.installation(5).await.unwrap().unwrap();
        assert!(i.deleted);
        assert!(i.updated_at >= i.created_at);
        db.record_installation(5, "octo", "created").await.unwrap();
        assert!(!db.installation(5).await.unwrap().unwrap().deleted);
        // First seen through a deletion.
        db.record_installation(6, "gone", "deleted").await.unwrap();
        let i = db.installation(6).await.unwrap().unwrap();
        assert_eq!((i.suspended, i.deleted), (false, true));
    }

    #[test]
    fn run_ids_are_twelve_random_hex_characters() {
        let ids: std::collections::HashSet<String> = (0..1000).map(|_| new_run_id()).collect();
        assert_eq!(ids.len(), 1000);
        for id in &ids {
            assert_eq!(id.len(), 12);
            assert!(
                id.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f')),
                "{id}"
            );
        }
        // Every position is drawn, none is padding: over 1000 ids each of the 12 places
        // shows (nearly) all 16 digits.
        for place in 0..12 {
            let digits: std::collections::HashSet<u8> =
                ids.iter().map(|id| id.as_bytes()[place]).collect();
            assert!(digits.len() >= 14, "place {place}: only {digits:?}");
        }
    }
}
