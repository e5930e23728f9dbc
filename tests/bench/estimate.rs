//! Benchmark (ignored by default; `bash bench/estimate.sh` runs it in a release build): the
//! cost estimate's query (issue 41, item 1) with 100,000 finished runs in the database, on
//! SQLite and PostgreSQL — target: under 5 ms (median and p95 over 200 queries).
//!
//! The runs are spread over 500 repositories and every kind, most of them succeeded, some
//! failed, cancelled or refused, so each (repository, kind) has ~30 runs that count among
//! ~200; the estimate reads the newest 20 that count through the partial index
//! `runs_cost_history`. The query plan is printed too, to show the index is the one used.

use std::time::Instant;

use crate::stats::{env_usize, median, p95, verdict};
use kodx::db::{test_databases, Db};

/// Inserts `n` finished runs (and their deliveries) in one statement per table: a counter
/// from a recursive common table expression, which both backends read the same way.
const FILL_DELIVERIES: &str =
    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $1) \
     INSERT INTO deliveries (id, event, action, installation_id, repo, received_at) \
     SELECT 'd' || i, 'issue_comment', 'created', 42, 'o/r' || (i % 500), i FROM n";
const FILL_RUNS: &str =
    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $1) \
     INSERT INTO runs (id, seq, delivery_id, kind, installation_id, repo, issue_number, \
       is_pull_request, argument, author, author_id, trigger_kind, trigger_id, clone_url, \
       default_branch, context, status, api_calls, cost_usd, cost_micros, created_at, \
       started_at, finished_at) \
     SELECT 'r' || i, i, 'd' || i, \
       CASE i % 7 WHEN 0 THEN 'ask' WHEN 1 THEN 'code' WHEN 2 THEN 'continue' \
         WHEN 3 THEN 'address_reviews' WHEN 4 THEN 'repair' WHEN 5 THEN 'help' \
         ELSE 'refuse' END, \
       42, 'o/r' || (i % 500), i, 0, 'x', 'alice', 7, 'issue_comment', i, \
       'https://github.com/o/r.git', 'main', '{}', \
       CASE WHEN i % 10 = 0 THEN 'failed' WHEN i % 13 = 0 THEN 'cancelled' \
         ELSE 'succeeded' END, \
       CASE WHEN i % 7 IN (5, 6) OR i % 11 = 0 THEN 0 ELSE 1 + i % 9 END, \
       (i * 7919 % 2000000) / 1000000.0, i * 7919 % 2000000, i, i, i \
     FROM n";

pub(crate) async fn fill(db_url: &str, runs: i64) {
    macro_rules! fill_on {
        ($pool:expr) => {{
            let pool = $pool;
            sqlx::query(FILL_DELIVERIES)
                .bind(runs)
                .execute(&pool)
                .await
                .unwrap();
            sqlx::query(FILL_RUNS)
                .bind(runs)
                .execute(&pool)
                .await
                .unwrap();
            sqlx::query("ANALYZE").execute(&pool).await.unwrap();
        }};
    }
    if db_url.starts_with("sqlite:") {
        fill_on!(sqlx::SqlitePool::connect(db_url).await.unwrap());
    } else {
        fill_on!(sqlx::PgPool::connect(db_url).await.unwrap());
    }
}

/// How the backend runs the estimate's query, one line per step of its plan.
async fn plan(db_url: &str) -> Vec<String> {
    let query =
        "SELECT CAST(COALESCE(cost_micros, ROUND(COALESCE(cost_usd, 0) * 1000000)) AS BIGINT) \
         FROM runs WHERE repo = 'o/r7' AND kind = 'code' \
           AND status IN ('succeeded', 'failed') AND api_calls > 0 \
         ORDER BY finished_at DESC, seq DESC LIMIT 20";
    if db_url.starts_with("sqlite:") {
        let pool = sqlx::SqlitePool::connect(db_url).await.unwrap();
        let rows: Vec<(i64, i64, i64, String)> =
            sqlx::query_as(&format!("EXPLAIN QUERY PLAN {query}"))
                .fetch_all(&pool)
                .await
                .unwrap();
        rows.into_iter().map(|r| r.3).collect()
    } else {
        let pool = sqlx::PgPool::connect(db_url).await.unwrap();
        sqlx::query_scalar(&format!("EXPLAIN {query}"))
            .fetch_all(&pool)
            .await
            .unwrap()
    }
}

async fn measure(backend: &str, db_url: &str) {
    let runs = env_usize("KODX_BENCH_RUNS", 100_000) as i64;
    let queries = env_usize("KODX_BENCH_QUERIES", 200);
    let db = Db::open(db_url).await.expect("open the database");
    let started = Instant::now();
    fill(db_url, runs).await;
    let filled = started.elapsed();
    for line in plan(db_url).await {
        println!("estimate {backend}: plan: {line}");
    }
    let kinds = ["ask", "code", "continue", "address_reviews", "repair"];
    let mut times = Vec::with_capacity(queries);
    let mut with_history = 0;
    for q in 0..queries {
        let repo = format!("o/r{}", (q * 37) % 500);
        let kind = kinds[q % kinds.len()];
        let t = Instant::now();
        let estimate = db.cost_estimate(&repo, kind).await.unwrap();
        times.push(t.elapsed().as_secs_f64() * 1000.0);
        with_history += usize::from(estimate.is_some_and(|e| e.runs == 20));
    }
    let (p50, p95) = (median(times.clone()), p95(times));
    println!(
        "estimate {backend}: {runs} runs (filled in {:.1} s), {queries} queries \
         ({with_history} with 20 runs of history): median {p50:.3} ms, p95 {p95:.3} ms \
         (target < 5 ms: {})",
        filled.as_secs_f64(),
        verdict(p95, 5.0)
    );
}

#[tokio::test]
#[ignore = "benchmark: bash bench/estimate.sh"]
async fn estimate_query_with_100k_runs() {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = format!("sqlite://{}", dir.path().join("kodx.db").display());
    measure("sqlite", &sqlite).await;
    let admin = test_databases::postgres_admin_url()
        .expect("this benchmark needs PostgreSQL (tests/postgres/start.sh)");
    let pg = test_databases::fresh_postgres_database(&admin).await;
    measure("postgres", &pg).await;
}
