//! `DATABASE_URL` → a migrated pool: URL parsing, the database file, pragmas, migrations.

use std::path::{Path, PathBuf};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

use super::intake::{accept_writer, MAX_BATCH};
use super::{Db, DbError};

/// The database used when `DATABASE_URL` is not set.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://data/kodx.db";

/// Connections in the pool of a database file.
const POOL_SIZE: u32 = 8;

/// Connections to a PostgreSQL server, per process.
const PG_POOL_SIZE: u32 = 10;

/// How long a writer waits for another writer's lock before giving up.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");
/// Where a `DATABASE_URL` points.
#[derive(Debug, Clone, PartialEq, Eq)]
enum DbLocation {
    Memory,
    File(PathBuf),
    /// `postgres://…` / `postgresql://…`, passed to sqlx as it is (it may hold a password:
    /// never printed).
    Postgres(String),
}

impl Db {
    /// Opens (creating if needed) the database `url` names and brings its schema up to date.
    ///
    /// `sqlite://data/kodx.db` (relative to the working directory), `sqlite:///abs/kodx.db`,
    /// `sqlite:data/kodx.db`, or `sqlite::memory:` (one connection, gone when closed; for
    /// tests). Parent directories are created. `postgres://user:password@host/db` (or
    /// `postgresql://`, with libpq's query options) uses PostgreSQL; several `kodx serve`
    /// processes may share it.
    pub async fn open(url: &str) -> Result<Db, DbError> {
        let pool = match parse_url(url)? {
            DbLocation::Postgres(url) => {
                let options: PgConnectOptions = url.parse().map_err(|_| {
                    DbError::InvalidUrl(
                        "DATABASE_URL: not a PostgreSQL URL kodx can read; expected \
                         postgres://USER:PASSWORD@HOST:PORT/DATABASE"
                            .to_owned(),
                    )
                })?;
                let place = postgres_place(&options);
                let pool = PgPoolOptions::new()
                    .max_connections(PG_POOL_SIZE)
                    .acquire_timeout(BUSY_TIMEOUT)
                    .connect_with(options)
                    .await
                    .map_err(|source| DbError::ConnectPostgres { place, source })?;
                super::Pool::Postgres(pool)
            }
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
                    })
                    .map(super::Pool::Sqlite)?
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
                    })
                    .map(super::Pool::Sqlite)?
            }
        };
        // One schema and one set of migrations for both backends (the SQL is portable);
        // on PostgreSQL, sqlx holds an advisory lock while it migrates, so processes
        // starting together do not race.
        with_pool!(&pool, p => MIGRATOR.run(p).await)?;
        let (writer, rx) = tokio::sync::mpsc::channel(4 * MAX_BATCH);
        tokio::spawn(accept_writer(pool.clone(), rx));
        Ok(Db {
            pool,
            writer,
            lease_ms: i64::try_from(super::DEFAULT_LEASE.as_millis()).unwrap_or(i64::MAX),
        })
    }

    /// `SELECT 1`: the database answers.
    pub async fn ping(&self) -> Result<(), DbError> {
        with_pool!(&self.pool, p => sqlx::query("SELECT 1").execute(p).await.map(|done| done.rows_affected()))?;
        Ok(())
    }

    /// This installation's id: drawn at random (16 hex digits) the first time it is asked
    /// for, then kept in the database. Sandbox containers carry it
    /// ([`crate::sandbox::docker::INSTANCE_LABEL`]).
    pub async fn instance_id(&self) -> Result<String, DbError> {
        let fresh = format!("{:016x}", rand::random::<u64>());
        with_pool!(&self.pool, p => sqlx::query(
            "INSERT INTO kodx_meta (key, value) VALUES ('instance', $1) \
             ON CONFLICT (key) DO NOTHING",
        )
        .bind(&fresh)
        .execute(p).await.map(|done| done.rows_affected()))?;
        let id: String = with_pool!(&self.pool, p => sqlx::query_scalar("SELECT value FROM kodx_meta WHERE key = 'instance'")
            .fetch_one(p).await)?;
        Ok(id)
    }

    /// Closes every connection, waiting for queries in flight. Later calls fail.
    pub async fn close(&self) {
        with_pool!(&self.pool, p => p.close().await);
    }

    /// `sqlite` or `postgres`.
    pub fn backend(&self) -> &'static str {
        self.pool.backend()
    }
}

/// host:port/database of a PostgreSQL connection: what messages and logs show of it.
fn postgres_place(options: &PgConnectOptions) -> String {
    format!(
        "{}:{}/{}",
        options.get_host(),
        options.get_port(),
        options.get_database().unwrap_or("(default database)")
    )
}

/// `DATABASE_URL` as logs and pages may show it: a SQLite URL as it is, a PostgreSQL one as
/// `postgres://HOST:PORT/DATABASE` (no user, password or options), anything else as
/// `(DATABASE_URL)`.
pub fn shown_url(url: &str) -> String {
    match parse_url(url) {
        Ok(DbLocation::Postgres(url)) => match url.parse::<PgConnectOptions>() {
            Ok(options) => format!("postgres://{}", postgres_place(&options)),
            Err(_) => "(DATABASE_URL)".to_owned(),
        },
        Ok(_) => url.trim().to_owned(),
        Err(_) => "(DATABASE_URL)".to_owned(),
    }
}

/// Reads `DATABASE_URL`. Errors never echo anything that could be a password.
fn parse_url(url: &str) -> Result<DbLocation, DbError> {
    let url = url.trim();
    let lower = url.to_ascii_lowercase();
    if lower.starts_with("postgres://") || lower.starts_with("postgresql://") {
        return Ok(DbLocation::Postgres(url.to_owned()));
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
        "expected sqlite://PATH (for example sqlite://data/kodx.db), sqlite::memory: or \
         postgres://USER:PASSWORD@HOST:PORT/DATABASE";
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::test_support::*;
    use crate::db::{Db, DbError, RunStatus};

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
            let applied: i64 = with_pool!(&db.pool, p => sqlx::query_scalar("SELECT COUNT(*) FROM _sqlx_migrations")
                .fetch_one(p).await)
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
        let crate::db::Pool::Sqlite(pool) = &db.pool else {
            panic!("a file database is SQLite")
        };
        let mut conns = Vec::new();
        for _ in 0..3 {
            conns.push(pool.acquire().await.unwrap());
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

    #[test]
    fn shown_urls_never_carry_a_password() {
        assert_eq!(
            shown_url("postgres://kodx:hunter2@db.internal:6543/queue?sslmode=require"),
            "postgres://db.internal:6543/queue"
        );
        assert_eq!(shown_url("sqlite://data/kodx.db"), "sqlite://data/kodx.db");
        assert_eq!(shown_url("mysql://u:hunter2@x/y"), "(DATABASE_URL)");
    }

    #[tokio::test]
    async fn postgres_failures_name_the_server_never_the_password() {
        for url in [
            "postgres://kodx:hunter2@db.invalid/kodx",
            "postgresql://kodx:hunter2@db.invalid:5433/kodx",
        ] {
            let err = Db::open(url).await.unwrap_err();
            let msg = err.to_string();
            assert!(matches!(err, DbError::ConnectPostgres { .. }), "{msg}");
            assert!(
                msg.contains("cannot connect to the PostgreSQL database db.invalid:"),
                "{msg}"
            );
            assert!(msg.contains("/kodx"), "{msg}");
            assert!(!msg.contains("hunter2"), "{msg}");
        }
        let err = Db::open("postgres://kodx:hunter2@db/kodx?sslmode=bogus")
            .await
            .unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, DbError::InvalidUrl(_)), "{msg}");
        assert!(!msg.contains("hunter2"), "{msg}");
        // A wrong password on a real server.
        if let Some(admin) = crate::db::test_databases::postgres_admin_url() {
            let o: PgConnectOptions = admin.parse().unwrap();
            let wrong = format!(
                "postgres://{}:hunter2@{}:{}/postgres",
                o.get_username(),
                o.get_host(),
                o.get_port()
            );
            let err = Db::open(&wrong).await.unwrap_err();
            let msg = err.to_string();
            assert!(matches!(err, DbError::ConnectPostgres { .. }), "{msg}");
            assert!(msg.contains("password authentication failed"), "{msg}");
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
}
