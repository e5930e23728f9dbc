//! The durable state of `kodx serve` (SPEC §3, §9): webhook deliveries, the run queue,
//! installations, transcripts and spend.
//!
//! SQLite is embedded (`sqlite://data/kodx.db` by default) in WAL mode with
//! `synchronous=FULL`, so a commit is on disk before the call that made it returns. A
//! delivery and the run it queues are written in one transaction ([`Db::accept`]), which is
//! what lets the webhook answer `202` only once an accepted command can no longer be lost.
//!
//! The SQL is kept portable so PostgreSQL can follow: `$1` placeholders (SQLite reads them
//! too), `BIGINT`/`TEXT`/`DOUBLE PRECISION` columns, booleans as 0/1, unix milliseconds,
//! `INSERT … ON CONFLICT`, `UPDATE … RETURNING`, no date functions and no rowid. Every
//! transaction starts with a write, so SQLite takes its write lock (waiting up to the busy
//! timeout) before reading anything and never fails with a stale snapshot.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use sqlx::{FromRow, Row};

use crate::serve::job::{RunRequest, TriggerKind};

/// The database used when `DATABASE_URL` is not set.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://data/kodx.db";

/// Connections in the pool of a database file.
const POOL_SIZE: u32 = 8;

/// How long a writer waits for another writer's lock before giving up.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// How often a new run id is drawn when the first one is taken (it never is: 48 random bits).
const RUN_ID_ATTEMPTS: usize = 8;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// What went wrong with the database. Messages name the path or setting to fix; they never
/// echo a database URL that could hold a password.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// The URL names a database this build cannot use (PostgreSQL, for now).
    #[error("{0}")]
    Unsupported(String),
    /// `DATABASE_URL` is not something kodx understands.
    #[error("{0}")]
    InvalidUrl(String),
    /// The database file or its directory cannot be created or opened.
    #[error("cannot open the database file {}: {source}", path.display())]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The directory for the database file cannot be created.
    #[error(
        "cannot create the directory {} for the database file {}: {source}",
        dir.display(),
        path.display()
    )]
    CreateDir {
        dir: PathBuf,
        path: PathBuf,
        source: std::io::Error,
    },
    /// The file exists but SQLite cannot use it (not a database, locked, corrupt …).
    #[error("cannot open the SQLite database {}: {source}", path.display())]
    Connect { path: PathBuf, source: sqlx::Error },
    /// The schema could not be brought up to date.
    #[error("database migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A query failed.
    #[error("database error: {0}")]
    Query(#[from] sqlx::Error),
    /// No run has this id.
    #[error("no run with id {0:?}")]
    NotFound(String),
    /// A transcript record with this sequence number was already stored for the run.
    #[error("run {run_id} already has transcript record {seq}")]
    DuplicateTranscript { run_id: String, seq: i64 },
    /// The caller asked for something the queue does not allow.
    #[error("{0}")]
    Invalid(String),
    /// A stored value kodx does not recognise (a newer kodx wrote it, or it was edited by hand).
    #[error("unexpected value in the database: {0}")]
    Corrupt(String),
}

/// Where a run is in its life. Stored as lowercase text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RunStatus {
    Queued,
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

impl RunStatus {
    pub const ALL: [RunStatus; 5] = [
        RunStatus::Queued,
        RunStatus::Running,
        RunStatus::Succeeded,
        RunStatus::Failed,
        RunStatus::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Queued => "queued",
            RunStatus::Running => "running",
            RunStatus::Succeeded => "succeeded",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
        }
    }

    /// Succeeded, failed or cancelled: the run will not change again.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            RunStatus::Succeeded | RunStatus::Failed | RunStatus::Cancelled
        )
    }
}

impl fmt::Display for RunStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for RunStatus {
    type Err = DbError;

    fn from_str(s: &str) -> Result<Self, DbError> {
        RunStatus::ALL
            .into_iter()
            .find(|status| status.as_str() == s)
            .ok_or_else(|| DbError::Corrupt(format!("unknown run status {s:?}")))
    }
}

/// A webhook delivery as it is recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewDelivery {
    /// GitHub's `X-GitHub-Delivery` id.
    pub id: String,
    /// `X-GitHub-Event`.
    pub event: String,
    pub action: Option<String>,
    pub installation_id: Option<i64>,
    /// `owner/name`.
    pub repo: Option<String>,
}

/// A run to queue: the typed request the webhook read.
pub use crate::serve::job::RunRequest as NewRun;

/// What [`Db::accept`] did with a delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Accepted {
    /// The delivery is new and its run is queued.
    Queued { run_id: String },
    /// The delivery is new and was recorded; it queued nothing.
    Recorded,
    /// The delivery id was seen before; nothing was written.
    Duplicate,
    /// The delivery is new (and recorded) but its trigger (the same comment or issue)
    /// already queued `run_id`: a replayed body, not a second command. Nothing is queued.
    DuplicateTrigger { run_id: String },
}

/// A stored run.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// 12 lowercase hex characters.
    pub id: String,
    pub delivery_id: String,
    /// What was asked, by whom, where: as the webhook read it.
    pub request: RunRequest,
    pub status: RunStatus,
    /// Free text for observability (`setting_up`, `working` …); cleared when claimed.
    pub phase: Option<String>,
    /// How many times a worker has claimed it.
    pub attempts: i64,
    /// The worker that claimed it last.
    pub worker: Option<String>,
    /// Put back in the queue after a process died while running it.
    pub recovered: bool,
    pub status_comment_id: Option<i64>,
    pub stop_reason: Option<String>,
    pub cost_usd: Option<f64>,
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub cache_read_tokens: i64,
    pub cache_write_tokens: i64,
    pub api_calls: i64,
    /// JSON text: the run's summary, written by [`Db::finish`] (or by [`Db::recover`]:
    /// `{"error": "…"}`).
    pub result: Option<String>,
    pub pr_url: Option<String>,
    pub cancelled_by: Option<String>,
    /// Unix milliseconds.
    pub created_at: i64,
    pub started_at: Option<i64>,
    pub finished_at: Option<i64>,
}

impl Run {
    /// True for `ask` and `code` runs, which do agent work.
    pub fn is_work(&self) -> bool {
        self.request.job.is_work()
    }

    /// What kind of job the run is (`ask`, `code`, `help` …).
    pub fn kind(&self) -> crate::serve::job::JobKind {
        self.request.job.kind()
    }
}

/// How a run ended, for [`Db::finish`].
#[derive(Debug, Clone, PartialEq)]
pub struct Finish {
    /// `Succeeded`, `Failed` or `Cancelled`.
    pub status: RunStatus,
    pub stop_reason: String,
    pub cost_usd: f64,
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub cache_read_tokens: i64,
    pub cache_write_tokens: i64,
    pub api_calls: i64,
    /// JSON text: the run's summary.
    pub result: String,
    pub pr_url: Option<String>,
}

impl Finish {
    /// A run that ends without a model call (refused, or failed before its first).
    pub fn without_calls(
        status: RunStatus,
        stop_reason: &str,
        result: serde_json::Value,
    ) -> Finish {
        Finish {
            status,
            stop_reason: stop_reason.to_string(),
            cost_usd: 0.0,
            input_tokens: 0,
            output_tokens: 0,
            cache_read_tokens: 0,
            cache_write_tokens: 0,
            api_calls: 0,
            result: result.to_string(),
            pr_url: None,
        }
    }
}

/// One run touched by [`Db::cancel_issue`].
#[derive(Debug, Clone, PartialEq)]
pub struct CancelledRun {
    /// The run as it is now: `cancelled` if it was queued, still `running` if it was running.
    pub run: Run,
    /// The run was running and was NOT changed: the caller must stop it and finish it as
    /// cancelled.
    pub was_running: bool,
}

/// What [`Db::recover`] did with a run a dead process left running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecoveryAction {
    /// Back in the queue, `recovered` set.
    Requeued,
    /// Out of attempts: failed with stop reason `internal_error`.
    Failed,
}

/// One run handled by [`Db::recover`], as it is after recovery.
#[derive(Debug, Clone, PartialEq)]
pub struct Recovered {
    pub run: Run,
    pub action: RecoveryAction,
}

/// An installation of the App, as its last `installation` event left it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallationRecord {
    pub id: i64,
    pub account: String,
    pub last_action: String,
    pub suspended: bool,
    pub deleted: bool,
    pub created_at: i64,
    pub updated_at: i64,
}

/// Run counts and spend, for `/metrics`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunCounts {
    pub queued: i64,
    pub running: i64,
    pub succeeded: i64,
    pub failed: i64,
    pub cancelled: i64,
    /// Sum of `cost_usd` over every run.
    pub spend_usd: f64,
}

impl RunCounts {
    /// The count for one status.
    pub fn get(&self, status: RunStatus) -> i64 {
        match status {
            RunStatus::Queued => self.queued,
            RunStatus::Running => self.running,
            RunStatus::Succeeded => self.succeeded,
            RunStatus::Failed => self.failed,
            RunStatus::Cancelled => self.cancelled,
        }
    }
}

/// The columns of a [`Run`], as `run_from_row` reads them (by name).
macro_rules! run_columns {
    () => {
        "id, delivery_id, kind, installation_id, repo, issue_number, is_pull_request, \
         argument, author, author_id, trigger_kind, trigger_id, clone_url, default_branch, \
         context, status, phase, attempts, worker, recovered, status_comment_id, stop_reason, \
         cost_usd, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, \
         api_calls, result, pr_url, cancelled_by, created_at, started_at, finished_at"
    };
}

/// The queue, the runs and everything kodx remembers. Cheap to clone (a pool handle).
#[derive(Clone)]
pub struct Db {
    pool: SqlitePool,
    /// The group-commit writer of [`Db::accept`].
    writer: tokio::sync::mpsc::Sender<AcceptJob>,
}

impl fmt::Debug for Db {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Db")
            .field("connections", &self.pool.size())
            .finish_non_exhaustive()
    }
}

/// Where a `DATABASE_URL` points.
#[derive(Debug, Clone, PartialEq, Eq)]
enum DbLocation {
    Memory,
    File(PathBuf),
}

impl Db {
    /// Opens (creating if needed) the database `url` names and brings its schema up to date.
    ///
    /// `sqlite://data/kodx.db` (relative to the working directory), `sqlite:///abs/kodx.db`,
    /// `sqlite:data/kodx.db`, or `sqlite::memory:` (one connection, gone when closed; for
    /// tests). Parent directories are created. `postgres://…` is refused with
    /// [`DbError::Unsupported`].
    pub async fn open(url: &str) -> Result<Db, DbError> {
        let pool = match parse_url(url)? {
            DbLocation::Memory => {
                let options = SqliteConnectOptions::new()
                    .in_memory(true)
                    .foreign_keys(true)
                    .busy_timeout(BUSY_TIMEOUT);
                // Every connection to `:memory:` is its own database: keep exactly one,
                // forever.
                SqlitePoolOptions::new()
                    .max_connections(1)
                    .min_connections(1)
                    .idle_timeout(None)
                    .max_lifetime(None)
                    .connect_with(options)
                    .await
                    .map_err(|source| DbError::Connect {
                        path: PathBuf::from(":memory:"),
                        source,
                    })?
            }
            DbLocation::File(path) => {
                prepare_file(&path)?;
                let options = SqliteConnectOptions::new()
                    .filename(&path)
                    .create_if_missing(true)
                    .journal_mode(SqliteJournalMode::Wal)
                    .synchronous(SqliteSynchronous::Full)
                    .foreign_keys(true)
                    .busy_timeout(BUSY_TIMEOUT);
                SqlitePoolOptions::new()
                    .max_connections(POOL_SIZE)
                    .connect_with(options)
                    .await
                    .map_err(|source| DbError::Connect {
                        path: path.clone(),
                        source,
                    })?
            }
        };
        MIGRATOR.run(&pool).await?;
        let (writer, rx) = tokio::sync::mpsc::channel(4 * MAX_BATCH);
        tokio::spawn(accept_writer(pool.clone(), rx));
        Ok(Db { pool, writer })
    }

    /// `SELECT 1`: the database answers.
    pub async fn ping(&self) -> Result<(), DbError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

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
        sqlx::query(
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
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The installation with this id, if an event about it was recorded.
    pub async fn installation(
        &self,
        installation_id: i64,
    ) -> Result<Option<InstallationRecord>, DbError> {
        let row = sqlx::query(
            "SELECT id, account, last_action, suspended, deleted, created_at, updated_at \
             FROM installations WHERE id = $1",
        )
        .bind(installation_id)
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else { return Ok(None) };
        Ok(Some(InstallationRecord {
            id: row.try_get("id")?,
            account: row.try_get("account")?,
            last_action: row.try_get("last_action")?,
            suspended: flag(&row, "suspended")?,
            deleted: flag(&row, "deleted")?,
            created_at: row.try_get("created_at")?,
            updated_at: row.try_get("updated_at")?,
        }))
    }

    /// Takes the oldest queued `ask`/`code` run whose issue has no `ask`/`code` run running,
    /// marks it running for `worker` and returns it. One statement, so concurrent claimers
    /// never take the same run and never start two runs on one issue.
    pub async fn claim_run(&self, worker: &str) -> Result<Option<Run>, DbError> {
        let row = sqlx::query(concat!(
            "UPDATE runs SET status = 'running', worker = $1, started_at = $2, \
             attempts = attempts + 1, phase = NULL \
             WHERE status = 'queued' AND id = (\
               SELECT q.id FROM runs q \
               WHERE q.status = 'queued' AND q.kind IN ('ask', 'code') \
               AND NOT EXISTS (\
                 SELECT 1 FROM runs r \
                 WHERE r.repo = q.repo AND r.issue_number = q.issue_number \
                 AND r.status = 'running' AND r.kind IN ('ask', 'code')) \
               ORDER BY q.seq LIMIT 1) \
             RETURNING ",
            run_columns!()
        ))
        .bind(worker)
        .bind(now_ms())
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(run_from_row).transpose()
    }

    /// Takes the oldest queued control run (any kind but `ask`/`code`: `help`, `cancel`,
    /// `refuse` …), with no per-issue exclusivity.
    pub async fn claim_control(&self, worker: &str) -> Result<Option<Run>, DbError> {
        let row = sqlx::query(concat!(
            "UPDATE runs SET status = 'running', worker = $1, started_at = $2, \
             attempts = attempts + 1, phase = NULL \
             WHERE status = 'queued' AND id = (\
               SELECT q.id FROM runs q \
               WHERE q.status = 'queued' AND q.kind NOT IN ('ask', 'code') \
               ORDER BY q.seq LIMIT 1) \
             RETURNING ",
            run_columns!()
        ))
        .bind(worker)
        .bind(now_ms())
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(run_from_row).transpose()
    }

    /// The run with this id, if any.
    pub async fn get_run(&self, run_id: &str) -> Result<Option<Run>, DbError> {
        let row = sqlx::query(concat!(
            "SELECT ",
            run_columns!(),
            " FROM runs WHERE id = $1"
        ))
        .bind(run_id)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(run_from_row).transpose()
    }

    /// Every run in `status`, oldest first (e.g. the running ones, whose containers are live).
    pub async fn runs_with_status(&self, status: RunStatus) -> Result<Vec<Run>, DbError> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            run_columns!(),
            " FROM runs WHERE status = $1 ORDER BY seq"
        ))
        .bind(status.as_str())
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(run_from_row).collect()
    }

    /// Remembers the id of the run's status comment.
    pub async fn set_status_comment(&self, run_id: &str, comment_id: i64) -> Result<(), DbError> {
        let changed = sqlx::query("UPDATE runs SET status_comment_id = $1 WHERE id = $2")
            .bind(comment_id)
            .bind(run_id)
            .execute(&self.pool)
            .await?
            .rows_affected();
        found(changed, run_id)
    }

    /// Sets the free-text phase (`setting_up`, `working` …) shown for observability.
    pub async fn set_phase(&self, run_id: &str, phase: &str) -> Result<(), DbError> {
        let changed = sqlx::query("UPDATE runs SET phase = $1 WHERE id = $2")
            .bind(phase)
            .bind(run_id)
            .execute(&self.pool)
            .await?
            .rows_affected();
        found(changed, run_id)
    }

    /// Records how a queued or running run ended. Returns `false` (and changes nothing) if
    /// the run had already finished; [`DbError::NotFound`] if there is no such run.
    pub async fn finish(&self, run_id: &str, fin: &Finish) -> Result<bool, DbError> {
        if !fin.status.is_final() {
            return Err(DbError::Invalid(format!(
                "a run cannot finish as {}; use succeeded, failed or cancelled",
                fin.status
            )));
        }
        let changed = sqlx::query(
            "UPDATE runs SET status = $1, stop_reason = $2, cost_usd = $3, input_tokens = $4, \
             output_tokens = $5, cache_read_tokens = $6, cache_write_tokens = $7, \
             api_calls = $8, result = $9, pr_url = $10, finished_at = $11 \
             WHERE id = $12 AND status IN ('queued', 'running')",
        )
        .bind(fin.status.as_str())
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
        .execute(&self.pool)
        .await?
        .rows_affected();
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
    /// are returned unchanged with `was_running` so the caller can stop them. Oldest first,
    /// cancelled ones before running ones.
    pub async fn cancel_issue(
        &self,
        repo: &str,
        issue_number: i64,
        by: &str,
    ) -> Result<Vec<CancelledRun>, DbError> {
        let mut tx = self.pool.begin().await?;
        // The queue's order (RETURNING gives none, and two runs may share a millisecond).
        let order: Vec<String> = sqlx::query_scalar(
            "SELECT id FROM runs WHERE repo = $1 AND issue_number = $2 AND status = 'queued' \
             AND kind IN ('ask', 'code') ORDER BY seq",
        )
        .bind(repo)
        .bind(issue_number)
        .fetch_all(&mut *tx)
        .await?;
        let cancelled = sqlx::query(concat!(
            "UPDATE runs SET status = 'cancelled', stop_reason = 'cancelled', \
             cancelled_by = $1, finished_at = $2 \
             WHERE repo = $3 AND issue_number = $4 AND status = 'queued' \
             AND kind IN ('ask', 'code') RETURNING ",
            run_columns!()
        ))
        .bind(by)
        .bind(now_ms())
        .bind(repo)
        .bind(issue_number)
        .fetch_all(&mut *tx)
        .await?;
        let running = sqlx::query(concat!(
            "SELECT ",
            run_columns!(),
            " FROM runs WHERE repo = $1 AND issue_number = $2 AND status = 'running' \
             AND kind IN ('ask', 'code') ORDER BY seq"
        ))
        .bind(repo)
        .bind(issue_number)
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;

        let mut cancelled = cancelled
            .iter()
            .map(run_from_row)
            .collect::<Result<Vec<_>, _>>()?;
        cancelled.sort_by_key(|run| order.iter().position(|id| *id == run.id));
        let mut out: Vec<CancelledRun> = cancelled
            .into_iter()
            .map(|run| CancelledRun {
                run,
                was_running: false,
            })
            .collect();
        for row in &running {
            out.push(CancelledRun {
                run: run_from_row(row)?,
                was_running: true,
            });
        }
        Ok(out)
    }

    /// At start-up, before any worker claims: every run left `running` by a dead process goes
    /// back to the queue with `recovered` set if it has had fewer than `max_attempts`
    /// attempts, else fails with stop reason `internal_error`. Handles every running run, so
    /// it must only be called when no other process works this database. `worker` names the
    /// recovering process in the log.
    pub async fn recover(
        &self,
        worker: &str,
        max_attempts: i64,
    ) -> Result<Vec<Recovered>, DbError> {
        let now = now_ms();
        let mut tx = self.pool.begin().await?;
        let failed = sqlx::query(concat!(
            "UPDATE runs SET status = 'failed', stop_reason = 'internal_error', \
             result = CASE WHEN attempts = 2 \
               THEN '{\"error\": \"kodx restarted twice during this run\"}' \
               ELSE '{\"error\": \"kodx restarted ' || attempts || ' times during this run\"}' \
             END, \
             finished_at = $1 \
             WHERE status = 'running' AND attempts >= $2 RETURNING ",
            run_columns!()
        ))
        .bind(now)
        .bind(max_attempts)
        .fetch_all(&mut *tx)
        .await?;
        let requeued = sqlx::query(concat!(
            "UPDATE runs SET status = 'queued', recovered = 1, worker = NULL, phase = NULL \
             WHERE status = 'running' RETURNING ",
            run_columns!()
        ))
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;

        let mut out = Vec::with_capacity(failed.len() + requeued.len());
        for (rows, action) in [
            (&requeued, RecoveryAction::Requeued),
            (&failed, RecoveryAction::Failed),
        ] {
            for row in rows {
                let run = run_from_row(row)?;
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

    /// Stores record `seq` of the run's transcript (JSON text). A `seq` already stored for the
    /// run is [`DbError::DuplicateTranscript`]; use [`Db::next_transcript_seq`] to continue a
    /// transcript after a restart.
    pub async fn append_transcript(
        &self,
        run_id: &str,
        seq: i64,
        record_json: &str,
    ) -> Result<(), DbError> {
        let inserted = sqlx::query(
            "INSERT INTO transcripts (run_id, seq, record, created_at) \
             VALUES ($1, $2, $3, $4) ON CONFLICT (run_id, seq) DO NOTHING",
        )
        .bind(run_id)
        .bind(seq)
        .bind(record_json)
        .bind(now_ms())
        .execute(&self.pool)
        .await;
        match inserted {
            Ok(done) if done.rows_affected() == 1 => Ok(()),
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
        let next: i64 = sqlx::query_scalar(
            "SELECT COALESCE(MAX(seq), -1) + 1 FROM transcripts WHERE run_id = $1",
        )
        .bind(run_id)
        .fetch_one(&self.pool)
        .await?;
        Ok(next)
    }

    /// The run's transcript records, in `seq` order.
    pub async fn transcript(&self, run_id: &str) -> Result<Vec<String>, DbError> {
        let records =
            sqlx::query_scalar("SELECT record FROM transcripts WHERE run_id = $1 ORDER BY seq")
                .bind(run_id)
                .fetch_all(&self.pool)
                .await?;
        Ok(records)
    }

    /// This installation's id: drawn at random (16 hex digits) the first time it is asked
    /// for, then kept in the database. Sandbox containers carry it
    /// ([`crate::sandbox::docker::INSTANCE_LABEL`]).
    pub async fn instance_id(&self) -> Result<String, DbError> {
        let fresh = format!("{:016x}", rand::random::<u64>());
        sqlx::query(
            "INSERT INTO kodx_meta (key, value) VALUES ('instance', $1) \
             ON CONFLICT (key) DO NOTHING",
        )
        .bind(&fresh)
        .execute(&self.pool)
        .await?;
        let id: String = sqlx::query_scalar("SELECT value FROM kodx_meta WHERE key = 'instance'")
            .fetch_one(&self.pool)
            .await?;
        Ok(id)
    }

    /// Deletes the transcripts of runs that finished before `before_ms` (unix milliseconds)
    /// and marks those runs `transcript_pruned_at`; the runs' own rows (status, cost,
    /// tokens, result) stay. Queued and running runs are never touched. Returns how many
    /// transcript records were deleted.
    pub async fn prune_transcripts(&self, before_ms: i64) -> Result<u64, DbError> {
        let mut tx = self.pool.begin().await?;
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
        Ok(deleted)
    }

    /// When the run's transcript was deleted for its age, if it was.
    pub async fn transcript_pruned_at(&self, run_id: &str) -> Result<Option<i64>, DbError> {
        let at: Option<Option<i64>> =
            sqlx::query_scalar("SELECT transcript_pruned_at FROM runs WHERE id = $1")
                .bind(run_id)
                .fetch_optional(&self.pool)
                .await?;
        at.ok_or_else(|| DbError::NotFound(run_id.to_owned()))
    }

    /// Runs by status and total spend, for `/metrics`.
    pub async fn counts(&self) -> Result<RunCounts, DbError> {
        let rows = sqlx::query(
            "SELECT status, COUNT(*) AS n, COALESCE(SUM(cost_usd), 0.0) AS spend \
             FROM runs GROUP BY status",
        )
        .fetch_all(&self.pool)
        .await?;
        let mut counts = RunCounts::default();
        for row in &rows {
            let status: RunStatus = row.try_get::<String, _>("status")?.parse()?;
            let n: i64 = row.try_get("n")?;
            let spend: f64 = row.try_get("spend")?;
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
        let spend: f64 = sqlx::query_scalar(
            "SELECT COALESCE(SUM(cost_usd), 0.0) FROM runs \
             WHERE installation_id = $1 AND created_at >= $2",
        )
        .bind(installation_id)
        .bind(since_ms)
        .fetch_one(&self.pool)
        .await?;
        Ok(spend)
    }

    /// Closes every connection, waiting for queries in flight. Later calls fail.
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

/// Reads `DATABASE_URL`. Errors never echo anything that could be a password.
fn parse_url(url: &str) -> Result<DbLocation, DbError> {
    let url = url.trim();
    let lower = url.to_ascii_lowercase();
    if lower.starts_with("postgres://") || lower.starts_with("postgresql://") {
        return Err(DbError::Unsupported(
            "DATABASE_URL: PostgreSQL is not supported by this build yet; \
             use sqlite://PATH (for example sqlite://data/kodx.db)"
                .to_owned(),
        ));
    }
    let rest = if lower.starts_with("sqlite://") {
        &url["sqlite://".len()..]
    } else if lower.starts_with("sqlite:") {
        &url["sqlite:".len()..]
    } else {
        return Err(DbError::InvalidUrl(invalid_url_message(url)));
    };
    let (path, query) = match rest.split_once('?') {
        Some((path, query)) => (path, query),
        None => (rest, ""),
    };
    if !query.is_empty() && query != "mode=rwc" {
        return Err(DbError::InvalidUrl(
            "DATABASE_URL: options after `?` are not supported for SQLite \
             (kodx sets WAL, synchronous=FULL and a busy timeout itself); remove them"
                .to_owned(),
        ));
    }
    if path == ":memory:" {
        return Ok(DbLocation::Memory);
    }
    if path.is_empty() {
        return Err(DbError::InvalidUrl(
            "DATABASE_URL: sqlite:// needs a file path, for example sqlite://data/kodx.db"
                .to_owned(),
        ));
    }
    Ok(DbLocation::File(PathBuf::from(path)))
}

fn invalid_url_message(url: &str) -> String {
    const EXPECTED: &str =
        "expected sqlite://PATH (for example sqlite://data/kodx.db) or sqlite::memory:";
    if url.is_empty() {
        return format!("DATABASE_URL is empty; {EXPECTED}");
    }
    match url.split_once(':') {
        Some((scheme, _))
            if !scheme.is_empty()
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c)) =>
        {
            format!("DATABASE_URL uses the unsupported scheme {scheme:?}; {EXPECTED}")
        }
        // A bare path is safe to show and the likely mistake; anything else might hold a
        // password.
        None if !url.contains('@') => {
            format!("DATABASE_URL {url:?} is not a URL; {EXPECTED} (sqlite://{url}?)")
        }
        _ => format!("DATABASE_URL is not a database URL; {EXPECTED}"),
    }
}

/// Creates the file's directory and the file itself (mode 0600), so a path that cannot be
/// used is reported with the OS's reason rather than SQLite's "unable to open".
fn prepare_file(path: &Path) -> Result<(), DbError> {
    let open_error = |source| DbError::Open {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| {
            // create_dir_all says only "File exists" when a file is in the way: name it.
            let source = match dir.ancestors().find(|a| a.exists() && !a.is_dir()) {
                Some(file) => std::io::Error::new(
                    std::io::ErrorKind::NotADirectory,
                    format!("{} is a file, not a directory", file.display()),
                ),
                None => source,
            };
            DbError::CreateDir {
                dir: dir.to_path_buf(),
                path: path.to_path_buf(),
                source,
            }
        })?;
    }
    let mut options = std::fs::OpenOptions::new();
    options.read(true).write(true).create(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    options.open(path).map_err(open_error)?;
    Ok(())
}

fn found(changed: u64, run_id: &str) -> Result<(), DbError> {
    if changed == 0 {
        Err(DbError::NotFound(run_id.to_owned()))
    } else {
        Ok(())
    }
}

fn run_from_row(row: &SqliteRow) -> Result<Run, DbError> {
    let status: String = row.try_get("status")?;
    Ok(Run {
        id: row.try_get("id")?,
        delivery_id: row.try_get("delivery_id")?,
        request: RunRequest::from_row(row)?,
        status: status.parse()?,
        phase: row.try_get("phase")?,
        attempts: row.try_get("attempts")?,
        worker: row.try_get("worker")?,
        recovered: flag(row, "recovered")?,
        status_comment_id: row.try_get("status_comment_id")?,
        stop_reason: row.try_get("stop_reason")?,
        cost_usd: row.try_get("cost_usd")?,
        input_tokens: row.try_get("input_tokens")?,
        output_tokens: row.try_get("output_tokens")?,
        cache_read_tokens: row.try_get("cache_read_tokens")?,
        cache_write_tokens: row.try_get("cache_write_tokens")?,
        api_calls: row.try_get("api_calls")?,
        result: row.try_get("result")?,
        pr_url: row.try_get("pr_url")?,
        cancelled_by: row.try_get("cancelled_by")?,
        created_at: row.try_get("created_at")?,
        started_at: row.try_get("started_at")?,
        finished_at: row.try_get("finished_at")?,
    })
}

/// A 0/1 column as a bool (portable: no native boolean type is assumed).
fn flag(row: &SqliteRow, column: &str) -> Result<bool, DbError> {
    match row.try_get::<i64, _>(column)? {
        0 => Ok(false),
        1 => Ok(true),
        other => Err(DbError::Corrupt(format!(
            "{column} = {other}, expected 0 or 1"
        ))),
    }
}

/// One delivery waiting for the writer.
struct AcceptJob {
    delivery: NewDelivery,
    run: Option<NewRun>,
    reply: tokio::sync::oneshot::Sender<Result<Accepted, DbError>>,
}

/// The most deliveries committed in one transaction.
/// (18 bound values per run: 4,608 per statement, under SQLite's 32,766.)
const MAX_BATCH: usize = 256;

/// Commits waiting deliveries in batches until every `Db` handle is gone.
async fn accept_writer(pool: SqlitePool, mut rx: tokio::sync::mpsc::Receiver<AcceptJob>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while rx.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let jobs: Vec<AcceptJob> = std::mem::take(&mut batch);
        match accept_batch(&pool, &jobs).await {
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

/// Writes a batch in one transaction; the answers are in the order of `jobs`.
///
/// Two multi-row statements per batch, whatever its size: the deliveries (`RETURNING` the
/// ids that were new), then the runs of the new ones, numbered after the current last
/// `seq` (read inside the transaction, which already holds the write lock).
async fn accept_batch(pool: &SqlitePool, jobs: &[AcceptJob]) -> Result<Vec<Accepted>, DbError> {
    let now = now_ms();
    let mut tx = pool.begin().await?;

    let mut insert = sqlx::QueryBuilder::<sqlx::Sqlite>::new(
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
            let mut insert = sqlx::QueryBuilder::<sqlx::Sqlite>::new(format!(
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
                } else if let Some(first) = run_of_trigger(&mut tx, run).await? {
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
    tx.commit().await?;
    Ok(answers
        .into_iter()
        .map(|a| a.expect("every job answered"))
        .collect())
}

/// The run already queued for `run`'s trigger (its comment or issue), if any.
async fn run_of_trigger(
    tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
    run: &NewRun,
) -> Result<Option<String>, DbError> {
    Ok(sqlx::query_scalar(
        "SELECT id FROM runs WHERE repo = ? AND trigger_kind = ? AND trigger_id = ? \
         AND trigger_copy = 0",
    )
    .bind(&run.repo)
    .bind(run.trigger.kind())
    .bind(run.trigger.id())
    .fetch_optional(&mut **tx)
    .await?)
}

/// A new run id: the first 12 hex characters of a random (v4) UUID, all 48 bits random.
pub fn new_run_id() -> String {
    let uuid = uuid::Uuid::new_v4();
    hex::encode(&uuid.as_bytes()[..6])
}

/// Now, in unix milliseconds.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::job::{Job, JobKind, ReviewContext, Trigger};

    fn delivery(id: &str) -> NewDelivery {
        NewDelivery {
            id: id.to_owned(),
            event: "issue_comment".to_owned(),
            action: Some("created".to_owned()),
            installation_id: Some(42),
            repo: Some("octo/widgets".to_owned()),
        }
    }

    /// A run whose trigger (comment) is new: every call gets its own comment id.
    fn new_run(kind: &str, repo: &str, issue_number: i64) -> NewRun {
        static COMMENT: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);
        let argument = format!("do the thing on #{issue_number}");
        let job = match kind {
            "ask" => Job::Ask { question: argument },
            "code" => Job::Code { request: argument },
            "cancel" => Job::Cancel,
            "help" => Job::Help { unknown: None },
            "refuse" => Job::Refuse { reason: argument },
            other => panic!("no job kind {other}"),
        };
        let id = 9_876_543_210 + COMMENT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let is_pull_request = issue_number % 2 == 0;
        // Pull requests are asked in review comments, so their context is stored too.
        let trigger = if is_pull_request {
            Trigger::ReviewComment {
                id,
                review: Some(ReviewContext {
                    path: "src/lib.rs".to_owned(),
                    line: Some(3),
                    diff_hunk: "@@ -1 +1 @@".to_owned(),
                    commit_id: None,
                }),
            }
        } else {
            Trigger::IssueComment(id)
        };
        NewRun {
            installation_id: 42,
            repo: repo.to_owned(),
            issue_number,
            is_pull_request,
            author: "alice".to_owned(),
            author_id: 7001,
            clone_url: format!("https://github.com/{repo}.git"),
            default_branch: "main".to_owned(),
            job,
            trigger,
        }
    }

    async fn file_db(dir: &tempfile::TempDir) -> Db {
        let url = format!("sqlite://{}", dir.path().join("kodx.db").display());
        Db::open(&url).await.expect("open database")
    }

    /// Queues a run from a fresh delivery and returns its id.
    async fn queue(db: &Db, delivery_id: &str, run: &NewRun) -> String {
        match db.accept(&delivery(delivery_id), Some(run)).await.unwrap() {
            Accepted::Queued { run_id } => run_id,
            other => panic!("expected Queued, got {other:?}"),
        }
    }

    fn finish(status: RunStatus, cost: f64) -> Finish {
        Finish {
            status,
            stop_reason: "end_turn".to_owned(),
            cost_usd: cost,
            input_tokens: 1200,
            output_tokens: 340,
            cache_read_tokens: 50,
            cache_write_tokens: 60,
            api_calls: 3,
            result: r#"{"summary":"done"}"#.to_owned(),
            pr_url: Some("https://github.com/octo/widgets/pull/9".to_owned()),
        }
    }

    async fn run_count(db: &Db) -> i64 {
        sqlx::query_scalar("SELECT COUNT(*) FROM runs")
            .fetch_one(&db.pool)
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn fresh_file_is_migrated_and_reopening_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nested/data/kodx.db");
        let url = format!("sqlite://{}", path.display());
        let db = Db::open(&url).await.unwrap();
        assert!(
            path.is_file(),
            "the file and its parent directories are created"
        );
        db.ping().await.unwrap();
        let run_id = queue(&db, "d-1", &new_run("code", "octo/widgets", 1)).await;
        db.close().await;
        assert!(db.ping().await.is_err(), "a closed Db answers no more");

        for _ in 0..2 {
            let db = Db::open(&url).await.unwrap();
            let run = db
                .get_run(&run_id)
                .await
                .unwrap()
                .expect("run survives reopen");
            assert_eq!(run.status, RunStatus::Queued);
            let applied: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM _sqlx_migrations")
                .fetch_one(&db.pool)
                .await
                .unwrap();
            assert_eq!(applied as usize, MIGRATOR.iter().count());
            db.close().await;
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "database file is private, mode {mode:o}");
        }
    }

    #[tokio::test]
    async fn sqlite_colon_path_and_relative_paths_are_understood() {
        assert_eq!(
            parse_url("sqlite://data/kodx.db").unwrap(),
            DbLocation::File(PathBuf::from("data/kodx.db"))
        );
        assert_eq!(
            parse_url("sqlite:///var/lib/kodx.db").unwrap(),
            DbLocation::File(PathBuf::from("/var/lib/kodx.db"))
        );
        assert_eq!(
            parse_url("sqlite:data/kodx.db?mode=rwc").unwrap(),
            DbLocation::File(PathBuf::from("data/kodx.db"))
        );
        assert_eq!(parse_url("sqlite::memory:").unwrap(), DbLocation::Memory);
        assert_eq!(
            parse_url(DEFAULT_DATABASE_URL).unwrap(),
            DbLocation::File("data/kodx.db".into())
        );

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("colon.db");
        let db = Db::open(&format!("sqlite:{}", path.display()))
            .await
            .unwrap();
        db.ping().await.unwrap();
        assert!(path.is_file());
    }

    #[tokio::test]
    async fn every_file_connection_is_wal_with_full_sync() {
        let dir = tempfile::tempdir().unwrap();
        let db = file_db(&dir).await;
        // Hold several connections at once so more than one is checked.
        let mut conns = Vec::new();
        for _ in 0..3 {
            conns.push(db.pool.acquire().await.unwrap());
        }
        for conn in &mut conns {
            let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
                .fetch_one(&mut **conn)
                .await
                .unwrap();
            assert_eq!(mode, "wal");
            let sync: i64 = sqlx::query_scalar("PRAGMA synchronous")
                .fetch_one(&mut **conn)
                .await
                .unwrap();
            assert_eq!(sync, 2, "synchronous=FULL is 2");
            let busy: i64 = sqlx::query_scalar("PRAGMA busy_timeout")
                .fetch_one(&mut **conn)
                .await
                .unwrap();
            assert_eq!(busy, BUSY_TIMEOUT.as_millis() as i64);
            let fk: i64 = sqlx::query_scalar("PRAGMA foreign_keys")
                .fetch_one(&mut **conn)
                .await
                .unwrap();
            assert_eq!(fk, 1);
        }
    }

    #[tokio::test]
    async fn memory_database_keeps_its_data_across_calls() {
        let db = Db::open("sqlite::memory:").await.unwrap();
        let run_id = queue(&db, "m-1", &new_run("ask", "octo/widgets", 3)).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(db.get_run(&run_id).await.unwrap().is_some());
    }

    #[tokio::test]
    async fn accept_queues_once_and_a_redelivery_does_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let db = file_db(&dir).await;
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

    #[tokio::test]
    async fn a_delivery_without_a_run_is_recorded_once() {
        let dir = tempfile::tempdir().unwrap();
        let db = file_db(&dir).await;
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
        let event: String = sqlx::query_scalar("SELECT event FROM deliveries WHERE id = 'p-1'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
        assert_eq!(event, "ping");
    }

    #[tokio::test]
    async fn claims_are_first_in_first_out() {
        let dir = tempfile::tempdir().unwrap();
        let db = file_db(&dir).await;
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

    #[tokio::test]
    async fn one_agent_run_per_issue_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let db = file_db(&dir).await;
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
            .finish(&first, &finish(RunStatus::Succeeded, 0.1))
            .await
            .unwrap());
        let next = db.claim_run("w").await.unwrap().unwrap();
        assert_eq!(next.id, second);
    }

    #[tokio::test]
    async fn control_runs_are_claimed_apart_and_ignore_issue_exclusivity() {
        let dir = tempfile::tempdir().unwrap();
        let db = file_db(&dir).await;
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

    #[tokio::test]
    async fn finish_records_the_outcome_once() {
        let dir = tempfile::tempdir().unwrap();
        let db = file_db(&dir).await;
        let run_id = queue(&db, "d-1", &new_run("code", "octo/widgets", 1)).await;
        db.claim_run("w").await.unwrap().unwrap();
        db.set_status_comment(&run_id, 5_000_000_001).await.unwrap();
        db.set_phase(&run_id, "working").await.unwrap();

        let fin = finish(RunStatus::Succeeded, 0.0234);
        assert!(db.finish(&run_id, &fin).await.unwrap());
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
        again.stop_reason = "error".to_owned();
        assert!(!db.finish(&run_id, &again).await.unwrap());
        let run = db.get_run(&run_id).await.unwrap().unwrap();
        assert_eq!(run.status, RunStatus::Succeeded);
        assert_eq!(run.cost_usd, Some(0.0234));
        assert_eq!(run.finished_at, Some(finished_at));

        // A queued run can be finished directly (e.g. refused before it started).
        let queued = queue(&db, "d-2", &new_run("ask", "octo/widgets", 2)).await;
        assert!(db
            .finish(&queued, &finish(RunStatus::Failed, 0.0))
            .await
            .unwrap());
        assert_eq!(
            db.get_run(&queued).await.unwrap().unwrap().status,
            RunStatus::Failed
        );
    }

    #[tokio::test]
    async fn finish_refuses_unfinished_statuses_and_unknown_runs() {
        let db = Db::open("sqlite::memory:").await.unwrap();
        let run_id = queue(&db, "d-1", &new_run("code", "octo/widgets", 1)).await;
        let err = db
            .finish(&run_id, &finish(RunStatus::Running, 0.0))
            .await
            .unwrap_err();
        assert!(matches!(err, DbError::Invalid(_)), "{err}");
        assert_eq!(
            db.get_run(&run_id).await.unwrap().unwrap().status,
            RunStatus::Queued
        );
        let err = db
            .finish("nope", &finish(RunStatus::Failed, 0.0))
            .await
            .unwrap_err();
        assert!(
            matches!(err, DbError::NotFound(ref id) if id == "nope"),
            "{err}"
        );
        let err = db.set_phase("nope", "working").await.unwrap_err();
        assert!(matches!(err, DbError::NotFound(_)), "{err}");
        let err = db.set_status_comment("nope", 1).await.unwrap_err();
        assert!(matches!(err, DbError::NotFound(_)), "{err}");
        assert_eq!(db.get_run("nope").await.unwrap(), None);
    }

    #[tokio::test]
    async fn cancel_issue_cancels_queued_runs_and_reports_running_ones() {
        let dir = tempfile::tempdir().unwrap();
        let db = file_db(&dir).await;
        let running = queue(&db, "d-1", &new_run("code", "octo/widgets", 7)).await;
        let queued_a = queue(&db, "d-2", &new_run("ask", "octo/widgets", 7)).await;
        let queued_b = queue(&db, "d-3", &new_run("code", "octo/widgets", 7)).await;
        let elsewhere = queue(&db, "d-4", &new_run("code", "octo/widgets", 8)).await;
        let finished = queue(&db, "d-5", &new_run("code", "octo/other", 7)).await;
        let control = queue(&db, "d-6", &new_run("cancel", "octo/widgets", 7)).await;
        assert_eq!(db.claim_run("w").await.unwrap().unwrap().id, running);
        assert!(db
            .finish(&finished, &finish(RunStatus::Succeeded, 0.0))
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
        assert_eq!(out[2].run.cancelled_by, None);
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

    #[tokio::test]
    async fn recover_requeues_once_then_fails() {
        let dir = tempfile::tempdir().unwrap();
        let db = file_db(&dir).await;
        let run_id = queue(&db, "d-1", &new_run("code", "octo/widgets", 7)).await;
        let untouched = queue(&db, "d-2", &new_run("code", "octo/widgets", 8)).await;
        let claimed = db.claim_run("dead-1").await.unwrap().unwrap();
        assert_eq!(claimed.id, run_id);
        db.set_phase(&run_id, "working").await.unwrap();

        // The process dies; a new one starts.
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
        let recovered = db.recover("new-2", 2).await.unwrap();
        assert_eq!(recovered.len(), 1);
        assert_eq!(recovered[0].action, RecoveryAction::Failed);
        let run = db.get_run(&run_id).await.unwrap().unwrap();
        assert_eq!(run.status, RunStatus::Failed);
        assert_eq!(run.stop_reason.as_deref(), Some("internal_error"));
        let note: serde_json::Value = serde_json::from_str(run.result.as_deref().unwrap()).unwrap();
        assert_eq!(note["error"], "kodx restarted twice during this run");
        assert!(run.finished_at.is_some());
        assert_eq!(recovered[0].run, run);

        // Nothing running: nothing to do.
        assert!(db.recover("new-3", 2).await.unwrap().is_empty());
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

    #[tokio::test]
    async fn transcripts_keep_order_and_refuse_duplicates() {
        let dir = tempfile::tempdir().unwrap();
        let db = file_db(&dir).await;
        let run_id = queue(&db, "d-1", &new_run("code", "octo/widgets", 1)).await;
        assert_eq!(db.next_transcript_seq(&run_id).await.unwrap(), 0);
        // Stored out of order, read back in seq order.
        db.append_transcript(&run_id, 1, r#"{"type":"response"}"#)
            .await
            .unwrap();
        db.append_transcript(&run_id, 0, r#"{"type":"request"}"#)
            .await
            .unwrap();
        db.append_transcript(&run_id, 2, r#"{"type":"tool_call"}"#)
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
        let err = db.append_transcript(&run_id, 1, "{}").await.unwrap_err();
        assert!(
            matches!(err, DbError::DuplicateTranscript { seq: 1, .. }),
            "{err}"
        );
        assert_eq!(
            db.transcript(&run_id).await.unwrap()[1],
            r#"{"type":"response"}"#
        );
        let err = db.append_transcript("nope", 0, "{}").await.unwrap_err();
        assert!(matches!(err, DbError::NotFound(_)), "{err}");
        assert!(db.transcript("nope").await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn old_transcripts_of_finished_runs_are_pruned_and_the_runs_stay() {
        let dir = tempfile::tempdir().unwrap();
        let db = file_db(&dir).await;
        let done = queue(&db, "d-1", &new_run("ask", "octo/widgets", 1)).await;
        let running = queue(&db, "d-2", &new_run("ask", "octo/widgets", 3)).await;
        let queued = queue(&db, "d-3", &new_run("ask", "octo/widgets", 3)).await;
        for run in [&done, &running, &queued] {
            for seq in 0..3 {
                db.append_transcript(run, seq, r#"{"type":"request"}"#)
                    .await
                    .unwrap();
            }
        }
        assert_eq!(db.claim_run("w").await.unwrap().unwrap().id, done);
        assert_eq!(db.claim_run("w").await.unwrap().unwrap().id, running);
        assert!(db
            .finish(&done, &finish(RunStatus::Succeeded, 0.25))
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

    #[tokio::test]
    async fn the_instance_id_is_drawn_once_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let db = file_db(&dir).await;
        let id = db.instance_id().await.unwrap();
        assert_eq!(id.len(), 16);
        assert!(id.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(db.instance_id().await.unwrap(), id);
        db.close().await;
        let db = file_db(&dir).await;
        assert_eq!(db.instance_id().await.unwrap(), id, "kept across restarts");
        let other = tempfile::tempdir().unwrap();
        assert_ne!(file_db(&other).await.instance_id().await.unwrap(), id);
    }

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

    #[tokio::test]
    async fn unusable_paths_name_the_path_and_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("plain-file");
        std::fs::write(&file, "x").unwrap();
        let under_file = file.join("kodx.db");
        let err = Db::open(&format!("sqlite://{}", under_file.display()))
            .await
            .unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, DbError::CreateDir { .. }), "{msg}");
        assert!(msg.contains(&under_file.display().to_string()), "{msg}");
        assert!(
            msg.contains(&format!("{} is a file, not a directory", file.display())),
            "{msg}"
        );
        // A directory that cannot be created for another reason keeps the OS's words.
        let err = Db::open("sqlite:///proc/kodx-dir/kodx.db")
            .await
            .unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, DbError::CreateDir { .. }), "{msg}");
        assert!(
            msg.contains("/proc/kodx-dir") && msg.contains("os error"),
            "{msg}"
        );

        let err = Db::open("sqlite:///proc/kodx.db").await.unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, DbError::Open { .. }), "{msg}");
        assert!(msg.contains("/proc/kodx.db"), "{msg}");

        // A file that is not a database.
        let junk = dir.path().join("junk.db");
        std::fs::write(&junk, vec![0x5a_u8; 8192]).unwrap();
        let err = Db::open(&format!("sqlite://{}", junk.display()))
            .await
            .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains(&junk.display().to_string()), "{msg}");
        assert!(msg.contains("not a database"), "{msg}");
    }

    #[tokio::test]
    async fn other_databases_are_refused_without_echoing_secrets() {
        for url in [
            "postgres://kodx:hunter2@db/kodx",
            "postgresql://kodx:hunter2@db/kodx",
        ] {
            let err = Db::open(url).await.unwrap_err();
            let msg = err.to_string();
            assert!(matches!(err, DbError::Unsupported(_)), "{msg}");
            assert!(
                msg.contains("PostgreSQL is not supported by this build yet"),
                "{msg}"
            );
            assert!(msg.contains("sqlite://"), "{msg}");
            assert!(!msg.contains("hunter2"), "{msg}");
        }
        let err = Db::open("mysql://kodx:hunter2@db/kodx").await.unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, DbError::InvalidUrl(_)), "{msg}");
        assert!(
            msg.contains("DATABASE_URL") && msg.contains("\"mysql\""),
            "{msg}"
        );
        assert!(!msg.contains("hunter2"), "{msg}");

        let err = Db::open("data/kodx.db").await.unwrap_err();
        assert!(err.to_string().contains("sqlite://data/kodx.db"), "{err}");
        let err = Db::open("").await.unwrap_err();
        assert!(err.to_string().contains("DATABASE_URL is empty"), "{err}");
        let err = Db::open("sqlite://").await.unwrap_err();
        assert!(err.to_string().contains("needs a file path"), "{err}");
        let err = Db::open("sqlite://x.db?journal_mode=delete")
            .await
            .unwrap_err();
        assert!(err.to_string().contains("not supported"), "{err}");
    }

    #[test]
    fn statuses_round_trip_as_text() {
        for status in RunStatus::ALL {
            assert_eq!(status.as_str().parse::<RunStatus>().unwrap(), status);
            assert_eq!(status.to_string(), status.as_str());
        }
        assert!("done".parse::<RunStatus>().is_err());
        assert!(!RunStatus::Running.is_final() && RunStatus::Cancelled.is_final());
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
    }
}
