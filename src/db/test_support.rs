//! Fixtures shared by the database's unit tests.

use super::*;
use crate::job::{Job, ReviewContext, Trigger};

pub(crate) fn delivery(id: &str) -> NewDelivery {
    NewDelivery {
        id: id.to_owned(),
        event: "issue_comment".to_owned(),
        action: Some("created".to_owned()),
        installation_id: Some(42),
        repo: Some("octo/widgets".to_owned()),
    }
}

/// A run whose trigger (comment) is new: every call gets its own comment id.
pub(crate) fn new_run(kind: &str, repo: &str, issue_number: i64) -> NewRun {
    static COMMENT: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);
    let argument = format!("do the thing on #{issue_number}");
    let job = match kind {
        "ask" => Job::Ask { question: argument },
        "code" => Job::Code {
            request: argument,
            base: None,
        },
        "continue" => Job::Continue {
            more: crate::command::More::Default,
        },
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

/// A database for the test on every backend (see [`super::test_databases`]).
pub(crate) async fn each_db(dir: &tempfile::TempDir) -> Vec<Db> {
    let mut dbs = Vec::new();
    for url in super::test_databases::each_backend(dir.path()).await {
        dbs.push(Db::open(&url).await.expect("open database"));
    }
    dbs
}

pub(crate) async fn file_db(dir: &tempfile::TempDir) -> Db {
    let url = format!("sqlite://{}", dir.path().join("kodx.db").display());
    Db::open(&url).await.expect("open database")
}

/// Queues a run from a fresh delivery and returns its id.
pub(crate) async fn queue(db: &Db, delivery_id: &str, run: &NewRun) -> String {
    match db.accept(&delivery(delivery_id), Some(run)).await.unwrap() {
        Accepted::Queued { run_id } => run_id,
        other => panic!("expected Queued, got {other:?}"),
    }
}

pub(crate) fn finish(status: RunStatus, cost: f64) -> Finish {
    Finish {
        status,
        stop_reason: "end_turn".into(),
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

pub(crate) async fn run_count(db: &Db) -> i64 {
    with_pool!(&db.pool, p => sqlx::query_scalar("SELECT COUNT(*) FROM runs")
        .fetch_one(p).await)
    .unwrap()
}

/// Reads what tests look at and production never asks for.
impl Db {
    /// Ends the lease of every running run, as if their processes had died long ago.
    pub(crate) async fn expire_leases(&self) {
        with_pool!(&self.pool, p => sqlx::query(
            "UPDATE runs SET lease_expires_at = $1 WHERE status = 'running'"
        )
        .bind(now_ms() - 1)
        .execute(p)
        .await
        .map(|done| done.rows_affected()))
        .unwrap();
    }

    /// Who holds run `run_id` now: its claim when it is running, else a waiting run's
    /// holder (worker `w`).
    pub(crate) async fn holder_now(&self, run_id: &str) -> Holder {
        match self.get_run(run_id).await.unwrap() {
            Some(run) => Holder::of(&run, run.worker.as_deref().unwrap_or("w")),
            None => Holder::Waiting("w".into()),
        }
    }

    /// Stores a transcript record as an earlier attempt of the run did (no lease checked).
    pub(crate) async fn put_transcript(&self, run_id: &str, seq: i64, record: &str) {
        with_pool!(&self.pool, p => sqlx::query(
            "INSERT INTO transcripts (run_id, seq, record, created_at) VALUES ($1, $2, $3, $4)",
        )
        .bind(run_id)
        .bind(seq)
        .bind(record)
        .bind(now_ms())
        .execute(p)
        .await
        .map(|_| ()))
        .unwrap();
    }

    /// The run's transcript records, in `seq` order.
    pub(crate) async fn transcript(&self, run_id: &str) -> Result<Vec<String>, DbError> {
        let records = with_pool!(&self.pool, p => sqlx::query_scalar("SELECT record FROM transcripts WHERE run_id = $1 ORDER BY seq")
                .bind(run_id)
                .fetch_all(p).await)?;
        Ok(records)
    }
}
