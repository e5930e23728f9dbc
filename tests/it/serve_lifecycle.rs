//! Stopping and restarting `kodx serve` with a run in flight (SPEC §9): a graceful shutdown
//! stops the run, removes its container and says so; the next start queues the run again
//! and finishes it in the same status comment. A kill -9 ends the same way.

use std::time::{Duration, Instant};

use crate::common;
use crate::common::serve::{usage, Options, Served, REPO};
use kodx::sandbox::Engine;
use serde_json::json;

const LONG: Duration = Duration::from_secs(120);

fn bot_comments(s: &Served) -> Vec<common::fake_github::FakeComment> {
    common::serve::bot_comments(s, 7)
}

async fn run_of(s: &Served, run_id: &str) -> kodx::db::Run {
    let db = kodx::db::Db::open(&format!(
        "sqlite://{}",
        s.dir.path().join("kodx.db").display()
    ))
    .await
    .unwrap();
    let run = db.get_run(run_id).await.unwrap().unwrap();
    db.close().await;
    run
}

/// Starts a run whose first tool call sleeps, and waits until the command is running.
async fn start_a_long_run(engine: &Engine, s: &Served) -> String {
    s.github.add_issue(REPO, 7, "Slow", "It is slow.", "carol");
    s.model.reply(
        vec![json!({"type": "tool_use", "id": "t1", "name": "feed_chars",
                    "input": {"chars": "sleep 300"}})],
        "tool_use",
        usage(1000, 10),
    );
    let run = s.comment(7, "alice", "/kodx ask why is it slow?").await;
    s.wait_for("the first model call", LONG, || {
        !s.model.requests().is_empty()
    })
    .await;
    // The tool call is running `sleep 300` in the container now.
    common::wait_for_process(engine, &run.container_label(), "sleep 300", LONG).await;
    run.0
}

async fn finishes_after_restart(s: &mut Served, run_id: &str) {
    s.model.reply(
        vec![json!({"type": "text", "text": "Finished after the restart."})],
        "end_turn",
        usage(1000, 10),
    );
    // How long ago the run was acknowledged, as the restart begins.
    let before_restart = kodx::db::now_ms() - run_of(s, run_id).await.created_at;
    s.restart().await;
    s.bot_comment_where(7, "the answer after the restart", |c| {
        c.body.contains("Finished after the restart.")
    })
    .await;
    let comments = bot_comments(s);
    // The wall time counts from the acknowledgement, before the restart, not from when this
    // process took the run over (shown rounded down: to 0.1 s below 10 s, else to 1 s).
    let (wall, agent) = crate::common::serve::wall_and_agent(&comments[0].body);
    let rounding = if wall < 10.0 { 0.1 } else { 1.0 };
    assert!(
        wall + rounding >= before_restart as f64 / 1000.0 && wall >= agent,
        "{wall}s (agent {agent}s), {before_restart} ms before the restart"
    );
    assert_eq!(comments.len(), 1, "the same status comment: {comments:#?}");
    assert!(
        comments[0]
            .edits
            .iter()
            .any(|e| e.contains("queued again — kodx restarted")),
        "{:#?}",
        comments[0].edits
    );
    // The process that took the run over rebuilt its status comment: its edits keep the
    // estimate line the acknowledgement showed.
    let edits = &comments[0].edits;
    let requeued = edits
        .iter()
        .position(|e| e.contains("queued again — kodx restarted"))
        .unwrap();
    assert!(
        edits[requeued + 1..].iter().any(|e| e
            .lines()
            .any(|l| l.starts_with("estimate: no history yet · cap $"))),
        "{edits:#?}"
    );
    let run = run_of(s, run_id).await;
    assert_eq!(run.status, kodx::db::RunStatus::Succeeded);
    assert_eq!(run.attempts, 2);
    // Nothing left over: no other comment, no container, no token anywhere.
    s.finish().await;
}

#[tokio::test]
async fn sigterm_mid_run_stops_it_cleanly_and_a_restart_finishes_it() {
    let engine = common::require_engine!();
    let mut s = Served::start(Options {
        workers: true,
        settings: Some("status_interval_secs = 0.2\nshutdown_grace_secs = 1\n"),
        ..Options::default()
    })
    .await;
    let run_id = start_a_long_run(&engine, &s).await;
    assert_eq!(
        common::containers_of(&engine, &format!("kodx-{run_id}"))
            .await
            .len(),
        1
    );
    let asked = Instant::now();
    let status = s.terminate().await;
    assert!(status.success(), "{status:?}\n{}", s.log());
    assert!(
        asked.elapsed() < Duration::from_secs(20),
        "the grace period is 1 s"
    );
    common::assert_gone(&engine, &format!("kodx-{run_id}")).await;
    let body = bot_comments(&s)[0].body.clone();
    common::serve::redactions(&[], &[]).bind(|| {
        insta::assert_snapshot!(body, @r#"
        <!-- kodx:{"run":"[hex]","v":1} -->
        ### ⏳ paused — kodx is restarting; this run starts again when it is back

        > /kodx ask why is it slow?

        estimate: no history yet · cap $1.00

        <sub>kodx run <code>[run]</code></sub>
        "#)
    });
    // Left `running` for the next start to pick up.
    assert_eq!(
        run_of(&s, &run_id).await.status,
        kodx::db::RunStatus::Running
    );
    finishes_after_restart(&mut s, &run_id).await;
    common::assert_gone(&engine, &format!("kodx-{run_id}")).await;
}

#[tokio::test]
async fn kill_9_mid_run_then_restart_finishes_it_and_removes_the_orphan() {
    let engine = common::require_engine!();
    let mut s = Served::with_workers().await;
    let run_id = start_a_long_run(&engine, &s).await;
    s.kill().await;
    // The dead process's container is still there until kodx starts again.
    assert_eq!(
        common::containers_of(&engine, &format!("kodx-{run_id}"))
            .await
            .len(),
        1
    );
    finishes_after_restart(&mut s, &run_id).await;
    common::assert_gone(&engine, &format!("kodx-{run_id}")).await;
}

#[tokio::test]
async fn kodx_cancel_stops_the_running_run_and_says_who() {
    let engine = common::require_engine!();
    let mut s = Served::with_workers().await;
    let run_id = start_a_long_run(&engine, &s).await;
    s.github.set_permission(REPO, "bob", "write");
    let cancel = s.comment(7, "bob", "/kodx cancel").await;
    let body = s
        .bot_comment_where(7, "the cancelled status", |c| {
            c.body.contains("Cancelled by @bob")
        })
        .await
        .body;
    common::assert_gone(&engine, &format!("kodx-{run_id}")).await;
    common::serve::redactions(&[], &[]).bind(|| {
        insta::assert_snapshot!(body, @r#"
    <!-- kodx:{"run":"[hex]","v":1} -->
    ### ❌ cancelled

    > /kodx ask why is it slow?

    ```text
    Cancelled by @bob.
    ```

    | model | API calls | input | output | cache write | cache read | cost | duration | stop |
    |---|--:|--:|--:|--:|--:|--:|--:|---|
    | claude-sonnet-4-5 | 1 | 1,000 | 10 | 0 | 0 | $0.0032 of $1.00 | [duration] (agent [duration]) | `cancelled` |

    <sub>kodx run <code>[run]</code></sub>
    "#)
    });
    let run = run_of(&s, &run_id).await;
    assert_eq!(run.status, kodx::db::RunStatus::Cancelled);
    assert_eq!(run.stop_reason.as_deref(), Some("cancelled"));
    // +1 on the cancel comment.
    s.reaction(&s.trigger(&cancel), "+1").await;
    s.finish().await;
}

#[tokio::test]
async fn a_run_interrupted_twice_fails_with_a_comment_instead_of_looping() {
    let engine = common::require_engine!();
    let mut s = Served::with_workers().await;
    let run_id = start_a_long_run(&engine, &s).await;
    s.kill().await;
    // Second attempt: the restarted run calls the model again and is killed again.
    s.model.reply(
        vec![json!({"type": "tool_use", "id": "t2", "name": "feed_chars",
                    "input": {"chars": "sleep 300"}})],
        "tool_use",
        usage(1000, 10),
    );
    s.restart().await;
    s.wait_for("the second attempt's model call", LONG, || {
        s.model.requests().len() >= 2
    })
    .await;
    common::wait_for_process(&engine, &format!("kodx-{run_id}"), "sleep 300", LONG).await;
    s.kill().await;
    s.restart().await;
    s.bot_comment_where(7, "the failure comment", |c| {
        c.body
            .contains("restarted while this run was working, more than once")
    })
    .await;
    let run = run_of(&s, &run_id).await;
    assert_eq!(run.status, kodx::db::RunStatus::Failed);
    assert_eq!(run.attempts, 2);
    assert_eq!(bot_comments(&s).len(), 1, "the same status comment");
    common::assert_gone(&engine, &format!("kodx-{run_id}")).await;
    s.finish().await;
    assert_eq!(s.model.requests().len(), 2, "not started a third time");
}

#[tokio::test]
async fn kodx_cancel_removes_a_queued_run_before_it_starts() {
    let engine = common::require_engine!();
    let s = Served::start(Options {
        workers: true,
        settings: Some(
            "status_interval_secs = 0.2\nmax_concurrent_runs = 1\nshutdown_grace_secs = 1\n",
        ),
        ..Options::default()
    })
    .await;
    // Issue 7's run takes the only slot; issue 8's waits in the queue.
    let _running = start_a_long_run(&engine, &s).await;
    s.github.add_issue(REPO, 8, "Other", "", "carol");
    let queued = s.comment(8, "alice", "/kodx ask what about this?").await;
    s.bot_comment_where(8, "the queued status comment", |c| {
        c.body.contains("queued")
    })
    .await;
    s.comment(8, "alice", "/kodx cancel").await;
    s.bot_comment_where(8, "the cancelled comment", |c| {
        c.body.contains("Cancelled by @alice before it started")
    })
    .await;
    let run = run_of(&s, &queued).await;
    assert_eq!(run.status, kodx::db::RunStatus::Cancelled);
    assert_eq!(
        s.model.requests().len(),
        1,
        "only issue 7's run called the model"
    );
}

/// The `kodx-run-*` clone directories in `tmp` (the server's TMPDIR), but `except`.
fn clone_dirs(tmp: &std::path::Path, except: &str) -> Vec<std::path::PathBuf> {
    let mut dirs: Vec<_> = std::fs::read_dir(tmp)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            name.starts_with("kodx-run-") && name != except
        })
        .collect();
    dirs.sort();
    dirs
}

async fn container_exists(engine: &kodx::sandbox::Engine, id: &str) -> bool {
    engine.docker().inspect_container(id, None).await.is_ok()
}

/// In the shipped image kodx is PID 1 of its container: after a kill -9 and a restart it is
/// PID 1 again, so a pid cannot tell its own orphan from a live container. The orphan must
/// still be removed at start, and the re-queued run must not trip over its name (409).
#[tokio::test]
async fn kill_9_of_kodx_as_pid_1_then_restart_removes_the_orphan_and_finishes_the_run() {
    let engine = common::require_engine!();
    let tmp = tempfile::tempdir().unwrap();
    // Another installation's clone in the same temporary directory: never touched.
    let foreign = "kodx-run-0123456789abcdef-otherrun-x1y2z3";
    std::fs::create_dir(tmp.path().join(foreign)).unwrap();
    let mut s = Served::start(Options {
        workers: true,
        pid_namespace: true,
        extra_env: vec![("TMPDIR".into(), tmp.path().display().to_string())],
        ..Options::default()
    })
    .await;
    let run_id = start_a_long_run(&engine, &s).await;
    let label = format!("kodx-{run_id}");
    let orphan = common::containers_of(&engine, &label).await;
    assert_eq!(orphan.len(), 1);
    let clones = clone_dirs(tmp.path(), foreign);
    assert_eq!(clones.len(), 1, "{clones:?}");
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&clones[0]).unwrap().permissions().mode() & 0o777;
        assert_eq!(
            mode, 0o700,
            "the clone of a private repository is the server's alone"
        );
    }
    let pid = s.kodx_pid();
    s.kill().await;
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "kodx serve was killed"
    );
    assert!(container_exists(&engine, &orphan[0]).await);
    assert!(clones[0].exists());

    finishes_after_restart(&mut s, &run_id).await;
    assert!(
        !container_exists(&engine, &orphan[0]).await,
        "the dead process's container was removed"
    );
    assert!(!clones[0].exists(), "the stale clone was removed at start");
    assert!(
        tmp.path().join(foreign).exists(),
        "another installation's clone stays"
    );
    let log = s.log();
    assert!(!log.contains("status code 409"), "{log}");
    assert!(!log.contains("could not be started"), "{log}");
    common::assert_gone(&engine, &label).await;
}

/// A re-queued run removes whatever container still holds its name before it makes its own:
/// here one the start-up sweep cannot know for an orphan (made by a kodx version without
/// the instance label, as after an upgrade with a run in flight).
#[tokio::test]
async fn a_requeued_run_removes_an_earlier_container_of_its_own_first() {
    use bollard::models::ContainerCreateBody;
    use bollard::query_parameters::CreateContainerOptions;
    let engine = common::require_engine!();
    let mut s = Served::with_workers().await;
    let run_id = start_a_long_run(&engine, &s).await;
    s.kill().await;
    let label = format!("kodx-{run_id}");
    for id in common::containers_of(&engine, &label).await {
        common::remove_forced(engine.docker(), &id).await.unwrap();
    }
    let old = engine
        .docker()
        .create_container(
            Some(CreateContainerOptions {
                name: Some(format!("kodx-{label}")),
                ..Default::default()
            }),
            ContainerCreateBody {
                image: Some(common::image()),
                cmd: Some(vec!["true".into()]),
                labels: Some(std::collections::HashMap::from([
                    ("kodx.run".to_string(), label.clone()),
                    ("kodx.owner".to_string(), "kodx-host/1".to_string()),
                ])),
                ..Default::default()
            },
        )
        .await
        .unwrap()
        .id;
    finishes_after_restart(&mut s, &run_id).await;
    assert!(!container_exists(&engine, &old).await);
    let log = s.log();
    assert!(
        log.contains("removed 1 container(s) of an earlier attempt"),
        "{log}"
    );
    assert!(!log.contains("status code 409"), "{log}");
    common::assert_gone(&engine, &label).await;
}
