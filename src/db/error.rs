//! What went wrong with the database, for every part of it and its callers.

use std::path::PathBuf;

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
    /// The PostgreSQL server cannot be reached or refused the login. `place` is
    /// host:port/database, never the URL (it may hold a password).
    #[error("cannot connect to the PostgreSQL database {place}: {source}")]
    ConnectPostgres { place: String, source: sqlx::Error },
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
    /// The run is no longer running under the lease the write carried (another process
    /// took it over, or it ended): nothing was written.
    #[error("run {0} is no longer held by this claim")]
    NotHeld(String),
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
