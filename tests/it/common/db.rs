//! Reads of a kodx database file that only tests make (production never reads these back).

use std::path::Path;

use sqlx::sqlite::{SqliteConnectOptions, SqlitePool};

async fn pool(db_file: &Path) -> SqlitePool {
    let options = SqliteConnectOptions::new().filename(db_file);
    SqlitePool::connect_with(options)
        .await
        .unwrap_or_else(|e| panic!("open {}: {e}", db_file.display()))
}

/// The run's transcript records, in `seq` order.
pub async fn transcript(db_file: &Path, run_id: &str) -> Vec<String> {
    let pool = pool(db_file).await;
    let records =
        sqlx::query_scalar("SELECT record FROM transcripts WHERE run_id = $1 ORDER BY seq")
            .bind(run_id)
            .fetch_all(&pool)
            .await
            .unwrap();
    pool.close().await;
    records
}

/// When the run's transcript was deleted for its age; panics if there is no such run.
pub async fn transcript_pruned_at(db_file: &Path, run_id: &str) -> Option<i64> {
    let pool = pool(db_file).await;
    let at: Option<Option<i64>> =
        sqlx::query_scalar("SELECT transcript_pruned_at FROM runs WHERE id = $1")
            .bind(run_id)
            .fetch_optional(&pool)
            .await
            .unwrap();
    pool.close().await;
    at.unwrap_or_else(|| panic!("no run {run_id}"))
}
