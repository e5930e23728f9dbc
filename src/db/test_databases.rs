//! Databases for tests on both backends (used by the unit tests here and by `tests/`; not
//! by production code). PostgreSQL is the server `KODX_TEST_POSTGRES_URL` names (an admin
//! URL), or else a throwaway one `tests/postgres/start.sh` starts from Debian's
//! `postgresql` binaries on loopback (once; later test processes reuse it). Every test gets
//! a database of its own. Without PostgreSQL the tests fail, saying what to install,
//! unless `KODX_SKIP_POSTGRES=1` asks to test SQLite only (never under `CI=true`).

use std::path::Path;

/// The environment variable naming the PostgreSQL server tests use.
pub const POSTGRES_ENV: &str = "KODX_TEST_POSTGRES_URL";

/// The admin URL of the test PostgreSQL server; `None` only when `KODX_SKIP_POSTGRES=1`
/// asked to test SQLite alone. Panics, saying what to do, when there is no server.
pub fn postgres_admin_url() -> Option<String> {
    static URL: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    URL.get_or_init(find_postgres).clone()
}

fn find_postgres() -> Option<String> {
    if let Ok(url) = std::env::var(POSTGRES_ENV) {
        if !url.trim().is_empty() {
            return Some(url);
        }
    }
    let ci = std::env::var("CI").as_deref() == Ok("true");
    let skip = std::env::var("KODX_SKIP_POSTGRES").is_ok_and(|v| v == "1" || v == "true");
    if skip && !ci {
        return None;
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/postgres/start.sh");
    let out = std::process::Command::new("bash")
        .arg(script)
        .output()
        .unwrap_or_else(|e| panic!("running {script}: {e}"));
    if !out.status.success() {
        panic!(
            "the database tests need PostgreSQL: {script} could not start one ({}). Install \
             Debian's `postgresql` (apt-get install postgresql), set {POSTGRES_ENV} to an \
             admin URL of a server, or set KODX_SKIP_POSTGRES=1 to test SQLite only",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Some(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Creates an empty database with a random name on the server `admin_url` points at and
/// returns its URL.
pub async fn fresh_postgres_database(admin_url: &str) -> String {
    use sqlx::Connection as _;
    let name = format!("kodx_test_{:016x}", rand::random::<u64>());
    let mut conn = sqlx::PgConnection::connect(admin_url)
        .await
        .unwrap_or_else(|e| panic!("{POSTGRES_ENV}: cannot connect to the test server: {e}"));
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut conn)
        .await
        .unwrap_or_else(|e| panic!("creating the test database {name}: {e}"));
    let _ = conn.close().await;
    let (base, _) = admin_url
        .rsplit_once('/')
        .unwrap_or_else(|| panic!("{POSTGRES_ENV} must end in /DATABASE"));
    format!("{base}/{name}")
}

/// The URL of a database for one test on every backend: a SQLite file in `dir`, and a
/// fresh PostgreSQL database when a test server is configured.
pub async fn each_backend(dir: &Path) -> Vec<String> {
    let mut urls = vec![format!("sqlite://{}", dir.join("kodx.db").display())];
    if let Some(admin) = postgres_admin_url() {
        urls.push(fresh_postgres_database(&admin).await);
    }
    urls
}
