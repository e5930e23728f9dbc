//! The run queue under concurrency and process death (SPEC §3, §9), on real SQLite files.

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kodx::agent::StopReason;
use kodx::db::test_databases::each_backend;
use kodx::db::{
    Accepted, Db, EndReason, Finish, Holder, Lease, NewDelivery, NewRun, Run, RunStatus,
};
use kodx::job::{Job, JobKind, ReviewContext, Trigger};

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
fn new_run(kind: &str, issue_number: i64) -> NewRun {
    static COMMENT: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);
    let argument = format!("work on #{issue_number}");
    NewRun {
        installation_id: 42,
        repo: "octo/widgets".to_owned(),
        issue_number,
        is_pull_request: false,
        author: "alice".to_owned(),
        author_id: 7001,
        clone_url: "https://github.com/octo/widgets.git".to_owned(),
        default_branch: "main".to_owned(),
        job: match kind {
            "ask" => Job::Ask { question: argument },
            "code" => Job::Code {
                request: argument,
                base: None,
            },
            "help" => Job::Help { unknown: None },
            other => panic!("no job kind {other}"),
        },
        trigger: Trigger::IssueComment(
            1000 + COMMENT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        ),
    }
}

fn succeeded() -> Finish {
    Finish {
        status: RunStatus::Succeeded,
        stop_reason: "end_turn".into(),
        cost_usd: 0.01,
        input_tokens: 10,
        output_tokens: 5,
        cache_read_tokens: 0,
        cache_write_tokens: 0,
        api_calls: 1,
        result: "{}".to_owned(),
        pr_url: None,
    }
}

/// The claim `run` (as its claim returned it) runs under, as the holder of its end.
fn held(run: &Run) -> Holder {
    Holder::Lease(run.lease().expect("a claimed run"))
}

fn url(path: &Path) -> String {
    format!("sqlite://{}", path.display())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_redeliveries_queue_exactly_one_run() {
    let dir = tempfile::tempdir().unwrap();
    for url in each_backend(dir.path()).await {
        // Two pools on one database, as two handles of one process (or two processes).
        let a = Db::open(&url).await.unwrap();
        let b = Db::open(&url).await.unwrap();
        for round in 0..5 {
            let id = format!("delivery-{round}");
            let mut tasks = Vec::new();
            for i in 0..24 {
                let db = if i % 2 == 0 { a.clone() } else { b.clone() };
                let id = id.clone();
                tasks.push(tokio::spawn(async move {
                    db.accept(&delivery(&id), Some(&new_run("code", round)))
                        .await
                        .unwrap()
                }));
            }
            let mut queued = Vec::new();
            let mut duplicates = 0;
            for task in tasks {
                match task.await.unwrap() {
                    Accepted::Queued { run_id } => queued.push(run_id),
                    Accepted::Duplicate => duplicates += 1,
                    other => panic!("a new delivery with a new trigger is queued, not {other:?}"),
                }
            }
            assert_eq!(queued.len(), 1, "round {round}: {queued:?}");
            assert_eq!(duplicates, 23);
            let run = a.get_run(&queued[0]).await.unwrap().unwrap();
            assert_eq!(run.delivery_id, id);
        }
        let runs = a.runs_with_status(RunStatus::Queued).await.unwrap();
        assert_eq!(runs.len(), 5);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_claimers_take_each_run_once_and_one_per_issue() {
    const RUNS: i64 = 50;
    const CONTROL: i64 = 10;
    const CLAIMERS: usize = 8;
    let dir = tempfile::tempdir().unwrap();
    for url in each_backend(dir.path()).await {
        let db = Db::open(&url).await.unwrap();
        let other = Db::open(&url).await.unwrap();
        // 50 agent runs on 4 issues, so most claim attempts find every free run's issue busy,
        // plus control runs on the same issues.
        let mut expected = HashSet::new();
        // Queue order of each run, to check each issue's runs start in that order.
        let mut order = std::collections::HashMap::new();
        for n in 0..RUNS {
            let Accepted::Queued { run_id } = db
                .accept(&delivery(&format!("d-{n}")), Some(&new_run("ask", n % 4)))
                .await
                .unwrap()
            else {
                panic!("not queued")
            };
            order.insert(run_id.clone(), (n % 4, n));
            expected.insert(run_id);
        }
        for n in 0..CONTROL {
            db.accept(&delivery(&format!("c-{n}")), Some(&new_run("help", n % 4)))
                .await
                .unwrap();
        }

        let claimed: Arc<Mutex<Vec<String>>> = Arc::default();
        let control_claimed: Arc<Mutex<Vec<String>>> = Arc::default();
        // Issues a claimer currently holds. An issue leaves the set BEFORE its run is finished
        // in the database, so finding it here on a claim means two runs were running at once.
        let busy_issues: Arc<Mutex<HashSet<i64>>> = Arc::default();
        // The most runs seen running at once: proves the claimers really overlapped.
        let peak: Arc<Mutex<usize>> = Arc::default();
        let mut tasks = Vec::new();
        for c in 0..CLAIMERS {
            let db = if c % 2 == 0 {
                db.clone()
            } else {
                other.clone()
            };
            let claimed = claimed.clone();
            let control_claimed = control_claimed.clone();
            let busy_issues = busy_issues.clone();
            let peak = peak.clone();
            tasks.push(tokio::spawn(async move {
                let worker = format!("w{c}");
                let mut idle = 0;
                while idle < 40 {
                    if let Some(run) = db.claim_control(&worker).await.unwrap() {
                        assert_eq!(run.kind(), JobKind::Help);
                        control_claimed.lock().unwrap().push(run.id.clone());
                        assert!(db.finish(&run.id, &held(&run), &succeeded()).await.unwrap());
                    }
                    let Some(run) = db.claim_run(&worker).await.unwrap() else {
                        idle += 1;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        continue;
                    };
                    idle = 0;
                    assert_eq!(run.status, RunStatus::Running);
                    assert_eq!(run.worker.as_deref(), Some(worker.as_str()));
                    assert_eq!(run.attempts, 1, "claimed twice: {}", run.id);
                    {
                        let mut busy = busy_issues.lock().unwrap();
                        assert!(
                            busy.insert(run.request.issue_number),
                            "two runs running on issue {}",
                            run.request.issue_number
                        );
                        let mut peak = peak.lock().unwrap();
                        *peak = (*peak).max(busy.len());
                    }
                    claimed.lock().unwrap().push(run.id.clone());
                    // Long enough that the other claimers keep trying this issue meanwhile.
                    tokio::time::sleep(Duration::from_millis(
                        10 + 5 * (run.request.trigger.id() % 3) as u64,
                    ))
                    .await;
                    busy_issues
                        .lock()
                        .unwrap()
                        .remove(&run.request.issue_number);
                    assert!(db.finish(&run.id, &held(&run), &succeeded()).await.unwrap());
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }

        let peak = *peak.lock().unwrap();
        assert!(
            peak >= 3,
            "claimers did not overlap: at most {peak} runs at once"
        );
        let claimed = claimed.lock().unwrap().clone();
        let unique: HashSet<String> = claimed.iter().cloned().collect();
        assert_eq!(
            claimed.len(),
            RUNS as usize,
            "every run claimed exactly once"
        );
        assert_eq!(unique, expected);
        // Each issue's runs were claimed in the order they were queued (skipping a locked
        // candidate never lets a later run of its issue go first).
        let mut last = std::collections::HashMap::new();
        for id in &claimed {
            let (issue, n) = order[id];
            if let Some(prev) = last.insert(issue, n) {
                assert!(prev < n, "issue {issue}: run {n} claimed after run {prev}");
            }
        }
        let control_claimed = control_claimed.lock().unwrap().clone();
        assert_eq!(control_claimed.len(), CONTROL as usize);
        assert_eq!(
            control_claimed.iter().collect::<HashSet<_>>().len(),
            CONTROL as usize
        );
        let counts = db.counts().await.unwrap();
        assert_eq!(counts.succeeded, RUNS + CONTROL);
        assert_eq!((counts.queued, counts.running), (0, 0));
    }
}

/// Env var that turns [`helper_child_accepts_then_waits_for_sigkill`] into the child process.
const CHILD_DB_ENV: &str = "KODX_TEST_DB_KILL_CHILD";

/// Not a test on its own: with `KODX_TEST_DB_KILL_CHILD=<db file>` it is the child process of
/// `an_accepted_run_survives_sigkill`; without it, it does nothing.
#[tokio::test]
async fn helper_child_accepts_then_waits_for_sigkill() {
    let Ok(path) = std::env::var(CHILD_DB_ENV) else {
        return;
    };
    let db = Db::open(&url(Path::new(&path))).await.unwrap();
    let Accepted::Queued { run_id } = db
        .accept(&delivery("killed-delivery"), Some(&new_run("code", 12)))
        .await
        .unwrap()
    else {
        panic!("not queued")
    };
    println!("ACCEPTED {run_id}");
    // Wait for the parent's SIGKILL, with the pool still open and nothing checkpointed.
    loop {
        std::thread::sleep(Duration::from_secs(60));
    }
}

/// A run `accept` reported is on disk even if the process is SIGKILLed the next instant:
/// a child process (this test binary again) accepts, prints the run id, and is killed.
#[cfg(unix)]
#[tokio::test]
async fn an_accepted_run_survives_sigkill() {
    use std::os::unix::process::ExitStatusExt;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kodx.db");
    let helper = crate::common::test_name(
        module_path!(),
        "helper_child_accepts_then_waits_for_sigkill",
    );
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            helper.as_str(),
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DB_ENV, &path)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    // Kill the child on every path, also when an assertion below fails.
    struct KillOnDrop(std::process::Child);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let stdout = child.stdout.take().unwrap();
    let mut child = KillOnDrop(child);
    // A plain thread, not spawn_blocking: a runtime waits for its blocking tasks on drop.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            // libtest prints "test NAME ... " before the test's own output, on the same line.
            if let Some((_, id)) = line.split_once("ACCEPTED ") {
                let _ = tx.send(id.trim().to_owned());
                return;
            }
        }
    });
    let run_id = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("the child accepts within 120 s");
    child.0.kill().unwrap(); // SIGKILL
    let status = child.0.wait().unwrap();
    assert_eq!(
        status.signal(),
        Some(9),
        "child killed by SIGKILL: {status:?}"
    );

    // The commit is in the write-ahead log, never checkpointed into the main file.
    let wal = dir.path().join("kodx.db-wal");
    assert!(
        std::fs::metadata(&wal)
            .map(|m| m.len() > 0)
            .unwrap_or(false),
        "expected a non-empty {}",
        wal.display()
    );
    let db = Db::open(&url(&path)).await.unwrap();
    let run = db
        .get_run(&run_id)
        .await
        .unwrap()
        .expect("the accepted run survives the kill");
    assert_eq!(run.status, RunStatus::Queued);
    assert_eq!(run.delivery_id, "killed-delivery");
    // And the redelivery GitHub sends next is recognised.
    assert_eq!(
        db.accept(&delivery("killed-delivery"), Some(&new_run("code", 12)))
            .await
            .unwrap(),
        Accepted::Duplicate
    );
}

/// One comment (or opened issue) starts one run, whatever delivery id it arrives under: a
/// signed body replayed with a new `X-GitHub-Delivery` is recorded and queues nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replayed_trigger_queues_no_second_run() {
    let dir = tempfile::tempdir().unwrap();
    for url in each_backend(dir.path()).await {
        let db = Db::open(&url).await.unwrap();
        let comment = new_run("code", 3);
        let Accepted::Queued { run_id } =
            db.accept(&delivery("first"), Some(&comment)).await.unwrap()
        else {
            panic!("the first delivery queues")
        };
        assert_eq!(
            db.accept(&delivery("replay"), Some(&comment))
                .await
                .unwrap(),
            Accepted::DuplicateTrigger {
                run_id: run_id.clone()
            }
        );
        // The replay's delivery id is recorded: sent again, it is a duplicate delivery.
        assert_eq!(
            db.accept(&delivery("replay"), Some(&comment))
                .await
                .unwrap(),
            Accepted::Duplicate
        );
        // The same comment id in another repository, or as another trigger kind (an issue
        // number equal to a comment id), is another trigger.
        let mut elsewhere = comment.clone();
        elsewhere.repo = "octo/gadgets".to_owned();
        let mut as_issue = comment.clone();
        as_issue.trigger = Trigger::IssueBody(comment.trigger.id());
        for (d, run) in [("elsewhere", &elsewhere), ("as-issue", &as_issue)] {
            assert!(
                matches!(
                    db.accept(&delivery(d), Some(run)).await.unwrap(),
                    Accepted::Queued { .. }
                ),
                "{d}"
            );
        }
        assert_eq!(db.counts().await.unwrap().queued, 3);
    }
}

/// Replays that arrive together land in one group-commit batch with other deliveries: the
/// batch is committed, one run is queued for the trigger, every replay names it, and the
/// other deliveries of the batch are queued as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replays_inside_one_batch_do_not_fail_the_batch() {
    let dir = tempfile::tempdir().unwrap();
    for url in each_backend(dir.path()).await {
        let db = Db::open(&url).await.unwrap();
        // A run queued before: its trigger replayed inside the batch as well.
        let earlier = new_run("ask", 1);
        let Accepted::Queued { run_id: earlier_id } = db
            .accept(&delivery("earlier"), Some(&earlier))
            .await
            .unwrap()
        else {
            panic!("queued")
        };
        let replayed = new_run("code", 2);
        let mut tasks = Vec::new();
        for i in 0..60 {
            let db = db.clone();
            let run = match i % 3 {
                0 => replayed.clone(),
                1 => earlier.clone(),
                _ => new_run("ask", 3 + i),
            };
            tasks.push(tokio::spawn(async move {
                (
                    i,
                    db.accept(&delivery(&format!("batch-{i}")), Some(&run))
                        .await
                        .unwrap(),
                )
            }));
        }
        let mut replayed_runs = HashSet::new();
        let mut fresh = 0;
        for task in tasks {
            let (i, answer) = task.await.unwrap();
            match (i % 3, answer) {
                (0, Accepted::Queued { run_id } | Accepted::DuplicateTrigger { run_id }) => {
                    replayed_runs.insert(run_id);
                }
                (1, Accepted::DuplicateTrigger { run_id }) => assert_eq!(run_id, earlier_id),
                (2, Accepted::Queued { .. }) => fresh += 1,
                (kind, other) => panic!("delivery {i} (kind {kind}) answered {other:?}"),
            }
        }
        assert_eq!(replayed_runs.len(), 1, "{replayed_runs:?}");
        assert_eq!(fresh, 20);
        // earlier + the replayed trigger's one run + 20 fresh ones.
        assert_eq!(db.counts().await.unwrap().queued, 22);
    }
}

/// A database written before the unique trigger index may already hold replays: the
/// migration keeps those rows and still refuses new ones.
#[tokio::test]
async fn the_trigger_migration_keeps_earlier_replays() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kodx.db");
    // The schema as the two earlier migrations left it.
    let old = dir.path().join("old-migrations");
    std::fs::create_dir(&old).unwrap();
    let all = Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    for name in ["0001_init.sql", "0002_runs_by_seq.sql"] {
        std::fs::copy(all.join(name), old.join(name)).unwrap();
    }
    {
        let options = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true);
        let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
        sqlx::migrate::Migrator::new(old.as_path())
            .await
            .unwrap()
            .run(&pool)
            .await
            .unwrap();
        for (seq, delivery) in [(1, "d-1"), (2, "d-2"), (3, "d-3")] {
            sqlx::query(
                "INSERT INTO deliveries (id, event, received_at) VALUES (?, 'issue_comment', 0)",
            )
            .bind(delivery)
            .execute(&pool)
            .await
            .unwrap();
            // Three runs of one comment (5555): what replays left before this fix.
            sqlx::query(
                "INSERT INTO runs (id, seq, delivery_id, kind, installation_id, repo, \
                 issue_number, is_pull_request, argument, author, author_id, trigger_kind, \
                 trigger_id, clone_url, default_branch, context, status, created_at) \
                 VALUES (?, ?, ?, 'ask', 42, 'octo/widgets', 1, 0, 'x', 'alice', 1, \
                 'issue_comment', 5555, 'u', 'main', '{}', 'succeeded', 0)",
            )
            .bind(format!("00000000000{seq}"))
            .bind(seq)
            .bind(delivery)
            .execute(&pool)
            .await
            .unwrap();
        }
        pool.close().await;
    }
    let db = Db::open(&url(&path)).await.unwrap();
    for seq in 1..=3 {
        assert!(db
            .get_run(&format!("00000000000{seq}"))
            .await
            .unwrap()
            .is_some());
    }
    let mut replay = new_run("ask", 1);
    replay.trigger = Trigger::IssueComment(5555);
    assert_eq!(
        db.accept(&delivery("d-4"), Some(&replay)).await.unwrap(),
        Accepted::DuplicateTrigger {
            run_id: "000000000001".to_owned()
        }
    );
}

/// Rows written by kodx before the typed job (kind and context as text the worker parsed)
/// read back as typed jobs and triggers, and are claimed and run as before.
#[tokio::test]
async fn runs_written_before_the_typed_job_read_and_run() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kodx.db");
    let old = dir.path().join("old-migrations");
    std::fs::create_dir(&old).unwrap();
    let all = Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    for name in [
        "0001_init.sql",
        "0002_runs_by_seq.sql",
        "0003_runs_by_trigger.sql",
        "0004_instance_and_transcript_pruning.sql",
    ] {
        std::fs::copy(all.join(name), old.join(name)).unwrap();
    }
    // (id, kind, argument, trigger_kind, trigger_id, context) as the old webhook wrote them:
    // `context` was `null`, or the review comment's JSON object (keys in serde_json's order).
    let rows = [
        ("00000000000a", "code", "add a flag", "issue", 3, "null"),
        (
            "00000000000b",
            "ask",
            "what is this?",
            "review_comment",
            77,
            r#"{"commit_id":"abc","diff_hunk":"@@ -1 +1 @@","line":4,"path":"src/lib.rs"}"#,
        ),
        ("00000000000c", "help", "", "issue_comment", 78, "null"),
        (
            "00000000000d",
            "help",
            "frobnicate",
            "issue_comment",
            79,
            "null",
        ),
        ("00000000000e", "cancel", "", "issue_comment", 80, "null"),
        (
            "00000000000f",
            "refuse",
            "`/kodx code` needs a request",
            "issue_comment",
            81,
            "{}",
        ),
    ];
    {
        let options = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true);
        let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
        sqlx::migrate::Migrator::new(old.as_path())
            .await
            .unwrap()
            .run(&pool)
            .await
            .unwrap();
        for (seq, (id, kind, argument, trigger_kind, trigger_id, context)) in
            rows.iter().enumerate()
        {
            sqlx::query(
                "INSERT INTO deliveries (id, event, received_at) VALUES (?, 'issue_comment', 0)",
            )
            .bind(id)
            .execute(&pool)
            .await
            .unwrap();
            sqlx::query(
                "INSERT INTO runs (id, seq, delivery_id, kind, installation_id, repo, \
                 issue_number, is_pull_request, argument, author, author_id, trigger_kind, \
                 trigger_id, clone_url, default_branch, context, status, created_at) \
                 VALUES (?, ?, ?, ?, 42, 'octo/widgets', ?, ?, ?, 'alice', 1, ?, ?, 'u', 'main', \
                 ?, 'queued', 0)",
            )
            .bind(id)
            .bind(seq as i64 + 1)
            .bind(id)
            .bind(kind)
            .bind(seq as i64 + 1)
            .bind(i64::from(*trigger_kind == "review_comment"))
            .bind(argument)
            .bind(trigger_kind)
            .bind(trigger_id)
            .bind(context)
            .execute(&pool)
            .await
            .unwrap();
        }
        pool.close().await;
    }
    let db = Db::open(&url(&path)).await.unwrap();
    let get = |id: &'static str| {
        let db = db.clone();
        async move { db.get_run(id).await.unwrap().expect(id).request }
    };
    let code = get("00000000000a").await;
    assert_eq!(
        code.job,
        Job::Code {
            request: "add a flag".into(),
            base: None,
        }
    );
    assert_eq!(code.trigger, Trigger::IssueBody(3));
    let ask = get("00000000000b").await;
    assert_eq!(
        ask.trigger,
        Trigger::ReviewComment {
            id: 77,
            review: Some(ReviewContext {
                path: "src/lib.rs".into(),
                line: Some(4),
                diff_hunk: "@@ -1 +1 @@".into(),
                commit_id: Some("abc".into()),
            }),
        }
    );
    assert!(ask.is_pull_request);
    assert_eq!(get("00000000000c").await.job, Job::Help { unknown: None });
    assert_eq!(
        get("00000000000d").await.job,
        Job::Help {
            unknown: Some("frobnicate".into())
        }
    );
    assert_eq!(get("00000000000e").await.job, Job::Cancel);
    assert_eq!(
        get("00000000000f").await.job,
        Job::Refuse {
            reason: "`/kodx code` needs a request".into()
        }
    );
    // They are claimed as before: work in queue order, then the control jobs.
    let first = db.claim_run("w").await.unwrap().unwrap();
    assert_eq!(first.id, "00000000000a");
    let second = db.claim_run("w").await.unwrap().unwrap();
    assert_eq!(second.id, "00000000000b");
    let mut control = Vec::new();
    while let Some(run) = db.claim_control("w").await.unwrap() {
        control.push(run.kind());
    }
    assert_eq!(
        control,
        [
            JobKind::Help,
            JobKind::Help,
            JobKind::Cancel,
            JobKind::Refuse
        ]
    );
    // A replay of an old row's comment is still recognised by the trigger index.
    let mut replay = new_run("ask", 5);
    replay.trigger = Trigger::IssueComment(78);
    assert_eq!(
        db.accept(&delivery("d-new"), Some(&replay)).await.unwrap(),
        Accepted::DuplicateTrigger {
            run_id: "00000000000c".to_owned()
        }
    );
}

/// The stop reasons kodx has written since version 1, as they are stored.
const STORED_STOP_REASONS: [&str; 14] = [
    "end_turn",
    "cost_limit_exceeded",
    "max_iterations",
    "timeout",
    "tool_error",
    "setup_failed",
    "cancelled",
    "error",
    "not_permitted",
    "refused",
    "help",
    "internal_error",
    "invalid_config",
    "budget_exceeded",
];

/// A database file as the schema before typed stop reasons left it (migrations 1–4, run by
/// sqlx from copies of those files, so `_sqlx_migrations` holds their checksums), with
/// finished runs written by raw SQL: one per stop reason kodx has stored, one with a word
/// no version knows, one without a reason.
#[tokio::test]
async fn stop_reasons_stored_before_they_were_typed_read_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kodx.db");
    let old = dir.path().join("old-migrations");
    std::fs::create_dir(&old).unwrap();
    let all = Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    for name in [
        "0001_init.sql",
        "0002_runs_by_seq.sql",
        "0003_runs_by_trigger.sql",
        "0004_instance_and_transcript_pruning.sql",
    ] {
        std::fs::copy(all.join(name), old.join(name)).unwrap();
    }
    let mut stored: Vec<(String, Option<&str>)> = STORED_STOP_REASONS
        .iter()
        .enumerate()
        .map(|(i, word)| (format!("{i:012x}"), Some(*word)))
        .collect();
    stored.push(("0000000000aa".to_owned(), Some("quota_gone_in_v9")));
    stored.push(("0000000000ab".to_owned(), None));
    {
        let options = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true);
        let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
        sqlx::migrate::Migrator::new(old.as_path())
            .await
            .unwrap()
            .run(&pool)
            .await
            .unwrap();
        for (seq, (id, reason)) in stored.iter().enumerate() {
            sqlx::query(
                "INSERT INTO deliveries (id, event, received_at) VALUES (?, 'issue_comment', 0)",
            )
            .bind(id)
            .execute(&pool)
            .await
            .unwrap();
            sqlx::query(
                "INSERT INTO runs (id, seq, delivery_id, kind, installation_id, repo, \
                 issue_number, is_pull_request, argument, author, author_id, trigger_kind, \
                 trigger_id, clone_url, default_branch, context, status, stop_reason, \
                 cost_usd, created_at, finished_at) \
                 VALUES (?, ?, ?, 'ask', 42, 'octo/widgets', 1, 0, 'why?', 'alice', 1, \
                 'issue_comment', ?, 'u', 'main', 'null', 'failed', ?, 0.5, 0, 1)",
            )
            .bind(id)
            .bind(seq as i64 + 1)
            .bind(id)
            .bind(seq as i64 + 100)
            .bind(reason)
            .execute(&pool)
            .await
            .unwrap();
        }
        pool.close().await;
    }

    let db = Db::open(&url(&path)).await.unwrap();
    for (id, reason) in &stored {
        let run = db.get_run(id).await.unwrap().expect(id);
        assert_eq!(run.stop_reason.as_deref(), *reason, "run {id}");
        assert_eq!(run.status, RunStatus::Failed);
    }
    let typed = |id: &str| {
        let db = db.clone();
        let id = id.to_owned();
        async move { db.get_run(&id).await.unwrap().unwrap().stop_reason }
    };
    assert_eq!(
        typed("000000000000").await,
        Some(EndReason::Agent(StopReason::EndTurn))
    );
    assert_eq!(
        typed("000000000006").await,
        Some(EndReason::Agent(StopReason::Cancelled))
    );
    assert_eq!(typed("000000000008").await, Some(EndReason::NotPermitted));
    assert_eq!(typed("00000000000d").await, Some(EndReason::BudgetExceeded));
    assert_eq!(
        typed("0000000000aa").await,
        Some(EndReason::Other("quota_gone_in_v9".to_owned()))
    );
    // Every row reads in the bulk reads too, and reading changed nothing in the file.
    assert_eq!(
        db.runs_with_status(RunStatus::Failed).await.unwrap().len(),
        stored.len()
    );
    assert_eq!(db.counts().await.unwrap().failed, stored.len() as i64);
    db.close().await;
    let pool = sqlx::SqlitePool::connect(&url(&path)).await.unwrap();
    let raw: Vec<(String, Option<String>)> =
        sqlx::query_as("SELECT id, stop_reason FROM runs ORDER BY seq")
            .fetch_all(&pool)
            .await
            .unwrap();
    let expected: Vec<(String, Option<String>)> = stored
        .iter()
        .map(|(id, reason)| (id.clone(), reason.map(str::to_owned)))
        .collect();
    assert_eq!(raw, expected);
    pool.close().await;
}

/// Finishing with each word (as the worker passes them today, as `&str`) stores exactly
/// that word, and reads back typed.
#[tokio::test]
async fn finishing_stores_each_stop_reason_as_its_word() {
    let dir = tempfile::tempdir().unwrap();
    for url in each_backend(dir.path()).await {
        let db = Db::open(&url).await.unwrap();
        let mut ids = Vec::new();
        for (i, word) in STORED_STOP_REASONS.iter().enumerate() {
            let run_id = match db
                .accept(&delivery(&format!("sr-{i}")), Some(&new_run("ask", 1)))
                .await
                .unwrap()
            {
                Accepted::Queued { run_id } => run_id,
                other => panic!("{other:?}"),
            };
            let fin =
                Finish::without_calls(RunStatus::Failed, *word, &kodx::db::RunResult::default());
            assert!(db
                .finish(&run_id, &Holder::Waiting("w".into()), &fin)
                .await
                .unwrap());
            let run = db.get_run(&run_id).await.unwrap().unwrap();
            assert_eq!(run.stop_reason.as_deref(), Some(*word));
            assert!(
                !matches!(run.stop_reason, Some(EndReason::Other(_))),
                "{word} is one kodx knows"
            );
            ids.push((run_id, *word));
        }
        db.close().await;
        // The words as stored, read past kodx's types.
        const RAW: &str = "SELECT stop_reason FROM runs ORDER BY seq";
        let raw: Vec<String> = if url.starts_with("sqlite") {
            let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
            let words = sqlx::query_scalar(RAW).fetch_all(&pool).await.unwrap();
            pool.close().await;
            words
        } else {
            let pool = sqlx::PgPool::connect(&url).await.unwrap();
            let words = sqlx::query_scalar(RAW).fetch_all(&pool).await.unwrap();
            pool.close().await;
            words
        };
        let words: Vec<&str> = ids.iter().map(|(_, word)| *word).collect();
        assert_eq!(raw, words);
    }
}

/// Three handles (as three `kodx serve` processes sharing one database) take a burst of
/// deliveries, each sent twice through different handles: every delivery queues exactly
/// one run, and queue numbers stay distinct (the intake is serialised across processes).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_over_three_handles_queues_each_delivery_once() {
    const DELIVERIES: usize = 200;
    let dir = tempfile::tempdir().unwrap();
    for url in each_backend(dir.path()).await {
        let handles = [
            Db::open(&url).await.unwrap(),
            Db::open(&url).await.unwrap(),
            Db::open(&url).await.unwrap(),
        ];
        let mut tasks = Vec::new();
        for n in 0..DELIVERIES {
            for copy in 0..2 {
                let db = handles[(n + copy) % 3].clone();
                tasks.push(tokio::spawn(async move {
                    // The same comment each time for one delivery: a redelivery.
                    let mut run = new_run("ask", (n % 7) as i64);
                    run.trigger = Trigger::IssueComment(5_000_000 + n as i64);
                    db.accept(&delivery(&format!("burst-{n}")), Some(&run))
                        .await
                        .unwrap()
                }));
            }
        }
        let (mut queued, mut duplicates) = (HashSet::new(), 0);
        for task in tasks {
            match task.await.unwrap() {
                Accepted::Queued { run_id } => assert!(queued.insert(run_id)),
                Accepted::Duplicate | Accepted::DuplicateTrigger { .. } => duplicates += 1,
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(
            (queued.len(), duplicates),
            (DELIVERIES, DELIVERIES),
            "{url:.9}"
        );
        // Claimed one by one, they come out in one total order with no run twice.
        let mut seen = HashSet::new();
        assert!(handles[1].claim_control("w").await.unwrap().is_none());
        for db in handles.iter().cycle().take(DELIVERIES * 2) {
            if let Some(run) = db.claim_run("w").await.unwrap() {
                assert!(seen.insert(run.id.clone()));
                assert!(db.finish(&run.id, &held(&run), &succeeded()).await.unwrap());
            }
        }
        assert_eq!(seen, queued);
    }
}

/// On PostgreSQL a running run is its worker's while its lease lasts: another process's
/// recovery leaves it alone, takes it back once the lease expired, and a renewal keeps it.
#[tokio::test]
async fn on_postgres_recovery_takes_back_only_expired_leases() {
    let Some(admin) = kodx::db::test_databases::postgres_admin_url() else {
        eprintln!(
            "SKIPPED on_postgres_recovery_takes_back_only_expired_leases: KODX_SKIP_POSTGRES=1"
        );
        return;
    };
    let url = kodx::db::test_databases::fresh_postgres_database(&admin).await;
    let a = Db::open(&url).await.unwrap();
    let b = Db::open(&url).await.unwrap();
    assert!(a.is_shared());
    let Accepted::Queued { run_id } = a
        .accept(&delivery("lease-1"), Some(&new_run("code", 1)))
        .await
        .unwrap()
    else {
        panic!("queued")
    };
    let run = a.claim_run("process-a").await.unwrap().expect("claimed");
    assert_eq!(run.id, run_id);
    // Process B starts (or sweeps) while A works: nothing of A's is touched.
    assert!(b.recover("process-b", 3).await.unwrap().is_empty());
    assert_eq!(a.renew_leases("process-a").await.unwrap(), 1);
    assert_eq!(b.renew_leases("process-b").await.unwrap(), 0);
    // A stops renewing (killed, or paused past its lease).
    let raw = sqlx::PgPool::connect(&url).await.unwrap();
    sqlx::query("UPDATE runs SET lease_expires_at = $1 WHERE id = $2")
        .bind(kodx::db::now_ms() - 1)
        .bind(&run_id)
        .execute(&raw)
        .await
        .unwrap();
    let recovered = b.recover("process-b", 3).await.unwrap();
    assert_eq!(recovered.len(), 1, "{recovered:?}");
    assert_eq!(recovered[0].run.id, run_id);
    assert!(recovered[0].run.recovered);
    assert_eq!(recovered[0].run.status, RunStatus::Queued);
    // A's late renewal no longer claims it; B takes it.
    assert_eq!(a.renew_leases("process-a").await.unwrap(), 0);
    let again = b
        .claim_run("process-b")
        .await
        .unwrap()
        .expect("claimed again");
    assert_eq!((again.id.as_str(), again.attempts), (run_id.as_str(), 2));
    raw.close().await;
}

/// The lease a claim, a renewal and a check give is the length the process was set up with
/// (`lease_secs`): a process with a one-second lease loses its run a second after its last
/// renewal, by the database's clock, while one with the default keeps it.
#[tokio::test]
async fn on_postgres_a_lease_lasts_as_long_as_its_process_set_it() {
    let Some(admin) = kodx::db::test_databases::postgres_admin_url() else {
        eprintln!(
            "SKIPPED on_postgres_a_lease_lasts_as_long_as_its_process_set_it: KODX_SKIP_POSTGRES=1"
        );
        return;
    };
    let url = kodx::db::test_databases::fresh_postgres_database(&admin).await;
    let short = Db::open(&url)
        .await
        .unwrap()
        .with_lease(Duration::from_secs(1));
    let long = Db::open(&url).await.unwrap();
    assert_eq!(short.lease(), Duration::from_secs(1));
    assert_eq!(long.lease(), kodx::db::DEFAULT_LEASE);
    for (n, db) in [(1, &short), (2, &long)] {
        db.accept(
            &delivery(&format!("lease-length-{n}")),
            Some(&new_run("code", n)),
        )
        .await
        .unwrap();
    }
    let a = short
        .claim_run("process-a")
        .await
        .unwrap()
        .expect("claimed");
    let b = long.claim_run("process-b").await.unwrap().expect("claimed");
    let expires = |id: String| {
        let url = url.clone();
        async move {
            let raw = sqlx::PgPool::connect(&url).await.unwrap();
            let at: i64 = sqlx::query_scalar("SELECT lease_expires_at FROM runs WHERE id = $1")
                .bind(id)
                .fetch_one(&raw)
                .await
                .unwrap();
            raw.close().await;
            at - kodx::db::now_ms()
        }
    };
    let left = expires(a.id.clone()).await;
    assert!((0..=1_000).contains(&left), "{left} ms");
    let left = expires(b.id.clone()).await;
    assert!((58_000..=60_000).contains(&left), "{left} ms");
    // A check extends by the same length.
    assert!(short.hold_lease(&a.id, &a.lease().unwrap()).await.unwrap());
    assert!(long.hold_lease(&b.id, &b.lease().unwrap()).await.unwrap());
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let recovered = long.recover("process-c", 3).await.unwrap();
    let ids: Vec<&str> = recovered.iter().map(|r| r.run.id.as_str()).collect();
    assert_eq!(ids, [a.id.as_str()]);
    assert!(!short.hold_lease(&a.id, &a.lease().unwrap()).await.unwrap());
    assert_eq!(short.renew_leases("process-a").await.unwrap(), 0);
    assert_eq!(long.renew_leases("process-b").await.unwrap(), 1);
}

/// On PostgreSQL a process listening hears of a queued run and of a cancel another process
/// recorded, and finds the cancel request on its own running run.
#[tokio::test]
async fn on_postgres_other_processes_hear_of_queued_runs_and_cancels() {
    let Some(admin) = kodx::db::test_databases::postgres_admin_url() else {
        eprintln!("SKIPPED on_postgres_other_processes_hear_of_queued_runs_and_cancels: KODX_SKIP_POSTGRES=1");
        return;
    };
    let url = kodx::db::test_databases::fresh_postgres_database(&admin).await;
    let a = Db::open(&url).await.unwrap();
    let b = Db::open(&url).await.unwrap();
    let mut heard = a.listen().await.unwrap().expect("PostgreSQL listens");
    b.accept(&delivery("n-1"), Some(&new_run("code", 4)))
        .await
        .unwrap();
    assert_eq!(heard_next(&mut heard).await, kodx::db::Wakeup::Queued);
    let run = a.claim_run("process-a").await.unwrap().expect("claimed");
    assert!(a.cancel_requests("process-a").await.unwrap().is_empty());
    b.cancel_issue(&run.request.repo, run.request.issue_number, "bob")
        .await
        .unwrap();
    assert_eq!(heard_next(&mut heard).await, kodx::db::Wakeup::Cancel);
    assert_eq!(
        a.cancel_requests("process-a").await.unwrap(),
        vec![(run.id.clone(), "bob".to_owned())]
    );
    // SQLite has nobody else to hear from.
    let dir = tempfile::tempdir().unwrap();
    let lite = Db::open(&format!(
        "sqlite://{}",
        dir.path().join("kodx.db").display()
    ))
    .await
    .unwrap();
    assert!(lite.listen().await.unwrap().is_none());
}

async fn heard_next(heard: &mut kodx::db::Notifications) -> kodx::db::Wakeup {
    tokio::time::timeout(Duration::from_secs(10), heard.next())
        .await
        .expect("a notification within 10 s")
        .unwrap()
}

/// Three handles on the database at `url` (three processes), and `n` code runs on issues
/// 0..n queued and claimed through the first.
async fn claimed_over_three_handles(
    url: &str,
    prefix: &str,
    n: i64,
) -> ([Db; 3], Vec<kodx::db::Run>) {
    let handles = [
        Db::open(url).await.unwrap(),
        Db::open(url).await.unwrap(),
        Db::open(url).await.unwrap(),
    ];
    let mut runs = Vec::new();
    for issue in 0..n {
        handles[0]
            .accept(
                &delivery(&format!("{prefix}-{issue}")),
                Some(&new_run("code", issue)),
            )
            .await
            .unwrap();
        runs.push(handles[0].claim_run("w").await.unwrap().expect("claimed"));
    }
    (handles, runs)
}

/// Runs starting together through several handles (processes) reserve their caps against
/// one monthly budget: together they are granted exactly the budget, never more; a run's
/// reservation settles to its cost when it ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn budget_reservations_racing_never_overspend() {
    const BUDGET: i64 = 1_000_000; // $1.00
    const WANT: i64 = 300_000; // $0.30 each
    let dir = tempfile::tempdir().unwrap();
    for url in each_backend(dir.path()).await {
        let (handles, runs) = claimed_over_three_handles(&url, "budget", 10).await;
        let since = 0;
        let mut tasks = Vec::new();
        for (i, run) in runs.iter().enumerate() {
            let db = handles[i % 3].clone();
            let id = run.id.clone();
            let lease = run.lease().unwrap();
            let inst = run.request.installation_id;
            tasks.push(tokio::spawn(async move {
                let got = db
                    .reserve_budget(&id, &lease, inst, since, WANT, BUDGET)
                    .await
                    .unwrap();
                (id, got)
            }));
        }
        let mut by_run = Vec::new();
        for t in tasks {
            by_run.push(t.await.unwrap());
        }
        let mut granted: Vec<i64> = by_run.iter().map(|(_, g)| *g).collect();
        granted.sort_unstable();
        assert_eq!(granted.iter().sum::<i64>(), BUDGET, "{url:.9}: {granted:?}");
        assert_eq!(
            granted,
            [0, 0, 0, 0, 0, 0, 100_000, 300_000, 300_000, 300_000],
            "{url:.9}"
        );
        let inst = runs[0].request.installation_id;
        let spent = handles[1].spend_since(inst, since).await.unwrap();
        assert!((spent - 1.0).abs() < 1e-9, "{spent}");
        // Every run ends; one of those granted $0.30 spent $0.05, the others nothing.
        let spender = by_run.iter().find(|(_, g)| *g == WANT).unwrap().0.clone();
        for (id, _) in &by_run {
            let mut fin = succeeded();
            fin.cost_usd = if *id == spender { 0.05 } else { 0.0 };
            let run = runs.iter().find(|r| r.id == *id).unwrap();
            assert!(handles[2].finish(id, &held(run), &fin).await.unwrap());
        }
        let spent = handles[1].spend_since(inst, since).await.unwrap();
        assert!((spent - 0.05).abs() < 1e-9, "settled to the cost: {spent}");
    }
}

/// Runs placed on one engine through several handles (processes) at once: no more of them
/// than its `max_runs` are granted a slot; a run that ends frees its slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn engine_slots_racing_never_exceed_max_runs() {
    let dir = tempfile::tempdir().unwrap();
    for url in each_backend(dir.path()).await {
        let (handles, runs) = claimed_over_three_handles(&url, "engine", 9).await;
        let tasks: Vec<_> = runs
            .iter()
            .enumerate()
            .map(|(i, run)| {
                let db = handles[i % 3].clone();
                let id = run.id.clone();
                let lease = run.lease().unwrap();
                tokio::spawn(async move {
                    let got = db
                        .take_engine_slot(&id, &lease, "builder-2", 4)
                        .await
                        .unwrap();
                    (id, got)
                })
            })
            .collect();
        let mut granted = Vec::new();
        for t in tasks {
            let (id, got) = t.await.unwrap();
            if got {
                granted.push(id);
            }
        }
        assert_eq!(granted.len(), 4, "{url:.9}: {granted:?}");
        // Another engine is counted apart.
        let other = runs.iter().find(|r| !granted.contains(&r.id)).unwrap();
        assert!(handles[1]
            .take_engine_slot(&other.id, &other.lease().unwrap(), "local", 1)
            .await
            .unwrap());
        // A run that ends frees its slot for the next.
        let first = runs.iter().find(|r| r.id == granted[0]).unwrap();
        assert!(handles[2]
            .finish(&granted[0], &held(first), &succeeded())
            .await
            .unwrap());
        let waiting = runs
            .iter()
            .find(|r| !granted.contains(&r.id) && r.id != other.id)
            .unwrap();
        assert!(handles[1]
            .take_engine_slot(&waiting.id, &waiting.lease().unwrap(), "builder-2", 4)
            .await
            .unwrap());
        assert!(!handles[0]
            .take_engine_slot(&other.id, &other.lease().unwrap(), "builder-2", 4)
            .await
            .unwrap());
    }
}

/// What kodx remembers of its pull requests (SPEC §11), on each backend: which it opened,
/// which commits are its own, and repairs taken at most once per commit, counted since a
/// maintainer's last run.
#[tokio::test]
async fn pull_commits_and_repairs_are_kept_once_per_commit() {
    let dir = tempfile::tempdir().unwrap();
    for url in each_backend(dir.path()).await {
        let db = Db::open(&url).await.unwrap();
        let (opener, _) = match db
            .accept(&delivery(&format!("d-{url}")), Some(&new_run("code", 7)))
            .await
            .unwrap()
        {
            Accepted::Queued { run_id } => (run_id, ()),
            other => panic!("{other:?}"),
        };
        let repo = "octo/widgets";
        let lease = db.claim_run("w").await.unwrap().unwrap().lease().unwrap();
        assert_eq!(db.pull_kodx_opened(repo, &[8]).await.unwrap(), None);
        db.record_pull_commit(repo, 8, "c1", &opener, &lease, "code", true)
            .await
            .unwrap();
        db.record_pull_commit(repo, 8, "c1", &opener, &lease, "code", true)
            .await
            .unwrap();
        assert_eq!(
            db.pull_kodx_opened(repo, &[5, 8]).await.unwrap(),
            Some((8, "alice".to_string(), 7001))
        );
        assert_eq!(db.pull_kodx_opened(repo, &[9]).await.unwrap(), None);
        assert_eq!(
            db.kodx_commit_run(repo, 8, "c1").await.unwrap().as_deref(),
            Some(opener.as_str())
        );
        assert_eq!(db.kodx_commit_run(repo, 8, "other").await.unwrap(), None);

        // Two events about c1 (and two processes): one repair.
        let taken = db
            .take_repair(repo, 8, "c1", "r1", "sig", true, "report one")
            .await
            .unwrap();
        assert_eq!(taken, kodx::db::RepairTaken::Taken);
        let again = db
            .take_repair(repo, 8, "c1", "r2", "sig", true, "report two")
            .await
            .unwrap();
        assert_eq!(again, kodx::db::RepairTaken::Already("r1".into()));
        assert_eq!(
            db.repair_report("r1").await.unwrap().as_deref(),
            Some("report one")
        );
        assert_eq!(db.repair_report("r2").await.unwrap(), None);
        // A decision not to repair is recorded but not counted.
        db.take_repair(repo, 8, "c2", "r3", "sig", false, "")
            .await
            .unwrap();
        assert_eq!(db.repairs_since_maintainer(repo, 8).await.unwrap().len(), 1);
        // A maintainer's run starts the count over.
        tokio::time::sleep(Duration::from_millis(5)).await;
        db.record_pull_commit(repo, 8, "c3", &opener, &lease, "continue", false)
            .await
            .unwrap();
        assert!(db
            .repairs_since_maintainer(repo, 8)
            .await
            .unwrap()
            .is_empty());
        db.close().await;
    }
}

/// Ends every running run's lease (as if its process had stopped long ago), on either backend.
async fn expire_every_lease(url: &str) {
    const SQL: &str = "UPDATE runs SET lease_expires_at = 0 WHERE status = 'running'";
    if url.starts_with("postgres") {
        let raw = sqlx::PgPool::connect(url).await.unwrap();
        sqlx::query(SQL).execute(&raw).await.unwrap();
        raw.close().await;
    } else {
        let raw = sqlx::SqlitePool::connect(url).await.unwrap();
        sqlx::query(SQL).execute(&raw).await.unwrap();
        raw.close().await;
    }
}

/// Fencing: process A claims a run, stops past its lease, and B takes the run over. Every
/// write A then makes carrying its old lease — a phase, a transcript record, a budget
/// reservation, an engine slot, a pull request's commit, the run's end — changes nothing,
/// and so does a stale claim of B's own worker (an earlier attempt); B's writes stand.
#[tokio::test]
async fn writes_with_a_lost_lease_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    for url in each_backend(dir.path()).await {
        let a = Db::open(&url).await.unwrap();
        let b = Db::open(&url).await.unwrap();
        let Accepted::Queued { run_id } = a
            .accept(
                &delivery(&format!("fence-{url}")),
                Some(&new_run("code", 1)),
            )
            .await
            .unwrap()
        else {
            panic!("queued")
        };
        let old = a
            .claim_run("process-a")
            .await
            .unwrap()
            .unwrap()
            .lease()
            .unwrap();
        assert_eq!(old.epoch, 1);
        assert!(a.set_phase(&run_id, &old, "working").await.unwrap());
        // A stops; its lease runs out and B takes the run over.
        expire_every_lease(&url).await;
        assert_eq!(b.recover("process-b", 3).await.unwrap().len(), 1);
        let run = b.claim_run("process-b").await.unwrap().unwrap();
        let lease = run.lease().unwrap();
        assert_eq!((lease.worker.as_str(), lease.epoch), ("process-b", 2));
        assert!(b.set_phase(&run_id, &lease, "setting_up").await.unwrap());
        let reserved = b
            .reserve_budget(&run_id, &lease, 42, 0, 200_000, 1_000_000)
            .await
            .unwrap();
        b.append_transcript(&run_id, &lease, 0, r#"{"by":"b"}"#)
            .await
            .unwrap();

        // A goes on, and B's own stale attempt too: nothing they write lands.
        let stale_b = Lease {
            worker: "process-b".into(),
            epoch: 1,
        };
        for stale in [&old, &stale_b] {
            assert!(!a.hold_lease(&run_id, stale).await.unwrap());
            assert!(!a.set_phase(&run_id, stale, "working").await.unwrap());
            let err = a
                .append_transcript(&run_id, stale, 1, r#"{"by":"a"}"#)
                .await
                .unwrap_err();
            assert!(matches!(err, kodx::db::DbError::NotHeld(_)), "{err}");
            let err = a
                .reserve_budget(&run_id, stale, 42, 0, 900_000, 1_000_000)
                .await
                .unwrap_err();
            assert!(matches!(err, kodx::db::DbError::NotHeld(_)), "{err}");
            assert!(!a
                .take_engine_slot(&run_id, stale, "builder", 5)
                .await
                .unwrap());
            a.record_pull_commit("octo/widgets", 8, "c-a", &run_id, stale, "code", true)
                .await
                .unwrap();
            let mut fin = succeeded();
            fin.result = r#"{"by":"a"}"#.into();
            assert!(!a
                .finish(&run_id, &Holder::Lease(stale.clone()), &fin)
                .await
                .unwrap());
        }
        // Nor does an end written as if the run were still waiting.
        assert!(!a
            .finish(&run_id, &Holder::Waiting("process-a".into()), &succeeded())
            .await
            .unwrap());
        let now = b.get_run(&run_id).await.unwrap().unwrap();
        assert_eq!(now.status, RunStatus::Running, "{now:?}");
        assert_eq!(now.lease(), Some(lease.clone()));
        assert_eq!(now.phase.as_deref(), Some("setting_up"));
        assert_eq!(b.next_transcript_seq(&run_id).await.unwrap(), 1);
        assert_eq!(
            b.kodx_commit_run("octo/widgets", 8, "c-a").await.unwrap(),
            None
        );
        assert!(b
            .take_engine_slot(&run_id, &lease, "builder", 1)
            .await
            .unwrap());

        // B's end stands.
        let mut fin = succeeded();
        fin.result = r#"{"by":"b"}"#.into();
        assert!(b
            .finish(&run_id, &Holder::Lease(lease), &fin)
            .await
            .unwrap());
        let ended = b.get_run(&run_id).await.unwrap().unwrap();
        assert_eq!(ended.status, RunStatus::Succeeded);
        assert_eq!(ended.result.as_deref(), Some(r#"{"by":"b"}"#));
        assert!(reserved > 0);
        a.close().await;
        b.close().await;
    }
}
