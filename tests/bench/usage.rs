//! Benchmark (ignored by default; `bash bench/usage.sh` runs it in a release build): `kodx
//! usage`'s queries (issue 41, item 3) with 100,000 finished runs spread over 30 days, on
//! SQLite and PostgreSQL, grouped by repository (500), person (1) and kind (7): median and
//! p95 of [`kodx::db::Db::usage`] (four queries: groups, medians per group, the total's
//! median, spend per day) over 20 reads each. No target in the issue; an operator's page
//! should stay well under a second. The process's peak resident memory is printed too: the
//! medians are taken in SQL, so kodx holds one row per group, not the runs' costs.

use std::time::Instant;

use crate::stats::{env_usize, median, p95, vm_hwm_kb};
use kodx::db::{now_ms, test_databases, Db, UsageBy, DAY_MS};

async fn spread(db_url: &str, runs: i64, since: i64) {
    // Over 30 days, in creation order.
    let step = 30 * DAY_MS / runs.max(1);
    let sql = "UPDATE runs SET created_at = $1 + seq * $2";
    if db_url.starts_with("sqlite:") {
        let pool = sqlx::SqlitePool::connect(db_url).await.unwrap();
        sqlx::query(sql)
            .bind(since)
            .bind(step)
            .execute(&pool)
            .await
            .unwrap();
    } else {
        let pool = sqlx::PgPool::connect(db_url).await.unwrap();
        sqlx::query(sql)
            .bind(since)
            .bind(step)
            .execute(&pool)
            .await
            .unwrap();
    }
}

async fn measure(backend: &str, db_url: &str) {
    let runs = env_usize("KODX_BENCH_RUNS", 100_000) as i64;
    let reads = env_usize("KODX_BENCH_QUERIES", 20);
    let db = Db::open(db_url).await.expect("open the database");
    let since = now_ms() - 30 * DAY_MS - 60_000;
    crate::estimate::fill(db_url, runs).await;
    spread(db_url, runs, since).await;
    for by in [UsageBy::Repo, UsageBy::User, UsageBy::Kind] {
        let mut times = Vec::with_capacity(reads);
        let mut usage = None;
        for _ in 0..reads {
            let t = Instant::now();
            usage = Some(db.usage(since, by).await.unwrap());
            times.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        let usage = usage.unwrap();
        let (p50, p95) = (median(times.clone()), p95(times));
        println!(
            "usage {backend} --by {}: {} runs in {} groups over {} days: median {p50:.1} ms, \
             p95 {p95:.1} ms",
            by.as_str(),
            usage.total.runs,
            usage.rows.len(),
            usage.days.len()
        );
    }
    if let Some(kb) = vm_hwm_kb(std::process::id()) {
        println!(
            "usage {backend}: peak resident memory of the process {} MB",
            kb / 1024
        );
    }
}

#[tokio::test]
#[ignore = "benchmark: bash bench/usage.sh"]
async fn usage_with_100k_runs() {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = format!("sqlite://{}", dir.path().join("kodx.db").display());
    measure("sqlite", &sqlite).await;
    let admin = test_databases::postgres_admin_url()
        .expect("this benchmark needs PostgreSQL (tests/postgres/start.sh)");
    let pg = test_databases::fresh_postgres_database(&admin).await;
    measure("postgres", &pg).await;
}
