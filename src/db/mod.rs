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
//!
//! Layout: `open` turns `DATABASE_URL` into a pool and migrates it; `models` holds the
//! rows and the types stored in them; `intake` records webhook deliveries (the group
//! commit) and installations; `queue` claims, finishes, cancels and recovers runs;
//! `transcripts` stores and prunes what a run did; `spend` sums what runs cost;
//! `estimate` reads what a repository's last runs of a kind cost; `usage` what finished
//! runs cost per repository, person, kind and day. Each adds its methods to the one facade, [`Db`].

/// Runs `$body` with `$p` bound to the pool of whichever backend `$pool` is; the body is
/// compiled once per backend, so the same SQL and code serve SQLite and PostgreSQL.
macro_rules! with_pool {
    ($pool:expr, $p:ident => $body:expr) => {
        match $pool {
            $crate::db::Pool::Sqlite($p) => $body,
            $crate::db::Pool::Postgres($p) => $body,
        }
    };
}

mod accept;
mod error;
mod estimate;
mod intake;
#[macro_use]
mod models;
mod hold;
mod images;
mod mergeable;
mod notify;
mod open;
mod pulls;
mod queue;
mod reruns;
mod result;
mod secrets;
#[macro_use]
mod spend;
mod steers;
#[doc(hidden)]
pub mod test_databases;
#[cfg(test)]
mod test_support;
mod transcripts;
mod usage;

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use accept::AcceptJob;
pub use error::DbError;
pub use estimate::{Estimate, ESTIMATE_MIN_RUNS, ESTIMATE_WINDOW};
pub use images::StoredImage;
pub use mergeable::{PullOnBase, MAX_PULLS_PER_PUSH};
pub use models::{
    Accepted, CancelledRun, EndReason, Finish, Holder, InstallationRecord, Lease, NewDelivery,
    NewRun, Recovered, RecoveryAction, Run, RunCounts, RunStatus,
};
pub use notify::{Notifications, Wakeup};
pub use open::{shown_url, DEFAULT_DATABASE_URL};
pub use pulls::{Repair, RepairTaken};
pub use queue::DEFAULT_LEASE;
pub use reruns::Rerun;
pub use result::{AdmissionRecord, Continues, RunResult};
pub use secrets::SecretEntry;
pub use spend::to_micros;
pub use steers::{SteerRow, SteerTarget};
pub use usage::{
    micros_to_usd, month_start_ms, parse_since, MonthSpend, Usage, UsageBy, UsageRow, DAY_MS,
};

/// The connection pool of the backend `DATABASE_URL` names.
#[derive(Clone)]
pub(crate) enum Pool {
    Sqlite(sqlx::SqlitePool),
    Postgres(sqlx::PgPool),
}

impl Pool {
    fn size(&self) -> u32 {
        with_pool!(self, p => p.size())
    }

    /// Which backend: `sqlite` or `postgres`.
    pub(crate) fn backend(&self) -> &'static str {
        match self {
            Pool::Sqlite(_) => "sqlite",
            Pool::Postgres(_) => "postgres",
        }
    }
}

/// The queue, the runs and everything kodx remembers. Cheap to clone (a pool handle).
#[derive(Clone)]
pub struct Db {
    pool: Pool,
    /// The group-commit writer of [`Db::accept`].
    writer: tokio::sync::mpsc::Sender<AcceptJob>,
    /// How long a claim holds a run without a renewal, in milliseconds ([`Db::with_lease`]).
    lease_ms: i64,
}

impl fmt::Debug for Db {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Db")
            .field("backend", &self.pool.backend())
            .field("connections", &self.pool.size())
            .finish_non_exhaustive()
    }
}

impl Db {
    /// The same database, whose claims hold a run for `lease` without a renewal (the
    /// setting `lease_secs`; [`DEFAULT_LEASE`] unless set). A lease is set and renewed by
    /// the process holding it, and runs out by the database's clock, so processes sharing
    /// a queue may use different lengths.
    pub fn with_lease(mut self, lease: Duration) -> Db {
        self.lease_ms = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX).max(1);
        self
    }

    /// How long a claim holds a run without a renewal.
    pub fn lease(&self) -> Duration {
        Duration::from_millis(self.lease_ms as u64)
    }
}

fn found(changed: u64, run_id: &str) -> Result<(), DbError> {
    if changed == 0 {
        Err(DbError::NotFound(run_id.to_owned()))
    } else {
        Ok(())
    }
}

/// Now, in unix milliseconds.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
