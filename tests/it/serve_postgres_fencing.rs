//! Leases fenced to the last write, with real `kodx serve` processes on one PostgreSQL: a
//! process stopped past its lease whose run another process took over changes nothing when
//! it goes on, however far it had got; and a process whose clock runs ahead takes no live
//! run back (leases run out by the database's clock).

use std::time::Duration;

use crate::common;
use crate::common::serve::{text, tool, usage, REPO};
use crate::serve_postgres::{served_on_postgres_with, terminate, SHORT_LEASE};
use kodx::db::RunStatus;

/// The test knob that stops the server just before it writes a run's end (after every
/// check of its lease), so the test can resume it after another process took the run over.
const STOP_BEFORE_FINISH: &str = "KODX_TEST_STOP_BEFORE_FINISH";

/// Process A finishes an ask's work and is stopped (`SIGSTOP`) right before it writes the
/// run's end — past every check of its lease. Its lease runs out; process B takes the run
/// over and is in the middle of it (a model call the test holds) when A goes on
/// (`SIGCONT`): A's end changes no row and posts nothing (its answer never shows), and B's
/// result stands.
#[tokio::test]
async fn a_process_resumed_after_its_run_was_taken_over_writes_and_posts_nothing() {
    let engine = common::require_engine!();
    let Some(mut s) = served_on_postgres_with(
        "a_process_resumed_after_its_run_was_taken_over_writes_and_posts_nothing",
        &[SHORT_LEASE, &[(STOP_BEFORE_FINISH, "1")]].concat(),
    )
    .await
    else {
        return;
    };
    s.github.add_issue(REPO, 7, "Question", "", "carol");
    s.model
        .reply(text("The answer from A."), "end_turn", usage(1000, 10));
    let run = s.comment(7, "alice", "/kodx ask what is this?").await;
    s.wait_for(
        "A to stop before writing the run's end",
        Duration::from_secs(120),
        || s.is_stopped(),
    )
    .await;

    // B: a worker without the knob. It takes the run over once A's lease ran out, and is in
    // its first model call (held until A gave the run up) when A goes on.
    let b_goes_on = s
        .model
        .reply_held(tool("true"), "tool_use", usage(1000, 10));
    s.model
        .reply(text("The answer from B."), "end_turn", usage(1000, 10));
    let (mut other, _) = s
        .spawn_another_with(&["--role", "worker"], &[], &[STOP_BEFORE_FINISH])
        .await;
    s.wait_for("B's first model call", Duration::from_secs(120), || {
        s.model.requests().len() == 2
    })
    .await;
    s.signal("CONT");
    s.wait_for("A to give the run up", Duration::from_secs(60), || {
        s.log()
            .contains("run given up here: another process holds it now")
    })
    .await;
    let db = s.db().await;
    let stored = db.get_run(&run.0).await.unwrap().unwrap();
    assert_eq!(
        stored.status,
        RunStatus::Running,
        "A ended B's run: {stored:?}"
    );
    assert_eq!(stored.attempts, 2, "{stored:?}");
    b_goes_on.send_replace(true);

    // B ends the run; nothing A had was ever shown or stored.
    let done = s
        .bot_comment_where(7, "B's answer", |c| c.body.contains("The answer from B."))
        .await;
    for c in common::serve::bot_comments(&s, 7) {
        for body in c.edits.iter().chain([&c.body]) {
            assert!(!body.contains("The answer from A."), "{body}");
        }
    }
    assert_eq!(s.model.requests().len(), 3);
    let stored = db.get_run(&run.0).await.unwrap().unwrap();
    assert_eq!(stored.status, RunStatus::Succeeded, "{stored:?}");
    let result = stored.result.as_deref().unwrap_or_default();
    let parsed: kodx::db::RunResult = serde_json::from_str(result).unwrap();
    assert_eq!(parsed.last_message, "The answer from B.", "{result}");
    assert!(!result.contains("The answer from A."), "{result}");
    common::serve::redactions(&[], &[]).bind(|| {
        insta::assert_snapshot!(done.body, @r#"
    <!-- kodx:{"run":"[hex]","v":1} -->
    ### ✅ answered

    > /kodx ask what is this?

    The answer from B.

    | model | API calls | input | output | cache write | cache read | cost | duration | stop |
    |---|--:|--:|--:|--:|--:|--:|--:|---|
    | claude-sonnet-4-5 | 2 | 2,000 | 20 | 0 | 0 | $0.0063 of $1.00 | [duration] (agent [duration]) | `end_turn` |

    <sub>kodx run <code>[run]</code></sub>
    "#)
    });
    db.close().await;
    terminate(&mut other).await;
    common::assert_gone(&engine, &run.container_label()).await;
    s.reaction(&s.trigger(&run), "rocket").await;
    s.finish().await;
}

/// Process A's `/kodx code` run has pushed its change and asks GitHub for the branch's
/// pull request; GitHub holds that request, and A is stopped (`SIGSTOP`) while it waits.
/// A's lease runs out; process B takes the run over, pushes and opens the pull request, and
/// its status comment says it is done. Then A goes on (`SIGCONT`) and GitHub answers it: A
/// finds B's pull request, but checks its lease before writing anything after that read,
/// finds the run taken, and makes no write — no pull request edit, no status comment edit,
/// no push, no reaction — however its held lookup ends.
#[tokio::test]
async fn a_process_resumed_in_the_middle_of_a_github_read_writes_nothing() {
    let engine = common::require_engine!();
    let Some(mut s) = served_on_postgres_with(
        "a_process_resumed_in_the_middle_of_a_github_read_writes_nothing",
        SHORT_LEASE,
    )
    .await
    else {
        return;
    };
    s.github.add_issue(REPO, 7, "Files", "", "carol");
    s.model
        .reply(tool("echo one > one.txt"), "tool_use", usage(1000, 10));
    s.model
        .reply(text("Wrote one.txt."), "end_turn", usage(1000, 10));
    // The first lookup of the branch's pull request (A's) is held.
    let lookup = s
        .github
        .hold_next("GET", "/repos/acme/widgets/pulls", "head=");
    let run = s.comment(7, "alice", "/kodx code write one.txt").await;
    lookup.arrived(Duration::from_secs(120)).await;
    s.signal("STOP");

    // B takes the run over once A's lease ran out, and delivers it.
    s.model
        .reply(tool("echo two > two.txt"), "tool_use", usage(1000, 10));
    s.model
        .reply(text("Wrote two.txt."), "end_turn", usage(1000, 10));
    let (mut other, _) = s.spawn_another(&["--role", "worker"]).await;
    let done = s
        .bot_comment_where(7, "B to open the pull request", |c| {
            c.body.contains("✅") && c.body.contains("/pull/")
        })
        .await;
    let pulls = s.github.created_pulls(REPO);
    assert_eq!(pulls.len(), 1, "{pulls:?}");
    let db = s.db().await;
    let stored = db.get_run(&run.0).await.unwrap().unwrap();
    assert_eq!(
        (stored.status, stored.attempts),
        (RunStatus::Succeeded, 2),
        "{stored:?}"
    );
    // B is gone: every GitHub and git request from here on is A's.
    terminate(&mut other).await;
    let github_before = s.github.requests().len();
    let git_before = s.git.requests().len();
    let head = s.git.branch_sha(REPO, &pulls[0].head);

    s.signal("CONT");
    lookup.release();
    s.wait_for("A to give the run up", Duration::from_secs(60), || {
        s.log()
            .contains("run given up here: another process holds it now")
    })
    .await;
    let after: Vec<String> = s.github.requests()[github_before..]
        .iter()
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    let writes: Vec<&String> = after.iter().filter(|r| !r.starts_with("GET ")).collect();
    assert!(
        writes.is_empty(),
        "A wrote to GitHub after it lost the run: {writes:#?}\n{}",
        s.log()
    );
    let pushes: Vec<String> = s.git.requests()[git_before..]
        .iter()
        .filter(|r| r.method == "POST" && r.path_and_query.contains("git-receive-pack"))
        .map(|r| r.path_and_query.clone())
        .collect();
    assert!(
        pushes.is_empty(),
        "A pushed after it lost the run: {pushes:?}"
    );
    assert_eq!(s.git.branch_sha(REPO, &pulls[0].head), head);
    assert_eq!(s.github.created_pulls(REPO), pulls);
    let status = s
        .github
        .comments(REPO, 7)
        .into_iter()
        .find(|c| c.id == done.id)
        .expect("the status comment");
    assert_eq!(status, done);
    assert!(s.log().contains("lost the run's lease"), "{}", s.log());
    let stored = db.get_run(&run.0).await.unwrap().unwrap();
    assert_eq!(stored.status, RunStatus::Succeeded, "{stored:?}");
    let parsed: kodx::db::RunResult =
        serde_json::from_str(stored.result.as_deref().unwrap_or_default()).unwrap();
    assert_eq!(parsed.last_message, "Wrote two.txt.", "{stored:?}");
    db.close().await;
    common::assert_gone(&engine, &run.container_label()).await;
    s.reaction(&s.trigger(&run), "rocket").await;
    s.finish().await;
}

/// libfaketime, which makes a process's clock run ahead (Debian's `faketime`).
const FAKETIME_LIB: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

/// Process B's clock runs 60 s ahead (libfaketime; its monotonic clock is left alone)
/// while process A is in the middle of a code run: by B's clock A's lease (2 s) ran out
/// 58 s ago, but leases run out by the database's clock, so B's recovery — at its start and
/// every third of a lease — leaves the run alone.
#[tokio::test]
async fn a_process_whose_clock_runs_a_minute_ahead_takes_no_live_run() {
    let engine = common::require_engine!();
    assert!(
        std::path::Path::new(FAKETIME_LIB).exists(),
        "{FAKETIME_LIB} is missing: apt-get install faketime"
    );
    let Some(mut s) = served_on_postgres_with(
        "a_process_whose_clock_runs_a_minute_ahead_takes_no_live_run",
        SHORT_LEASE,
    )
    .await
    else {
        return;
    };
    let skewed = [
        ("LD_PRELOAD", FAKETIME_LIB),
        ("FAKETIME", "+60"),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
    ];
    // The preload works here: a process under it reads a clock a minute ahead.
    let date = std::process::Command::new("date")
        .arg("+%s")
        .envs(skewed)
        .output()
        .unwrap();
    let ahead: i64 = String::from_utf8_lossy(&date.stdout)
        .trim()
        .parse()
        .unwrap();
    let now = kodx::db::now_ms() / 1000;
    assert!((55..=65).contains(&(ahead - now)), "{ahead} vs {now}");

    let run = s.code_run_in_its_first_command().await;
    let (mut other, _) = s
        .spawn_another_with(&["--role", "worker"], &skewed, &[])
        .await;
    // Its recovery at start, then two more passes (one every third of a lease), each a
    // debug line of B's (its worker id holds its pid).
    let b = format!("-{}-", other.id().expect("B runs"));
    s.wait_for("B's third recovery pass", Duration::from_secs(60), || {
        s.log()
            .lines()
            .filter(|l| l.contains("looked for runs whose lease ran out") && l.contains(&b))
            .count()
            >= 3
    })
    .await;
    let db = s.db().await;
    let stored = db.get_run(&run.0).await.unwrap().unwrap();
    assert_eq!(
        (stored.status, stored.attempts, stored.recovered),
        (RunStatus::Running, 1, false),
        "the process a minute ahead took a live run: {stored:?}\n{}",
        s.log()
    );
    assert_eq!(s.model.requests().len(), 1);
    assert!(
        !s.log().contains("run left running by a dead process"),
        "{}",
        s.log()
    );

    // A still holds it: a cancel stops it there, as usual.
    let touched = db.cancel_issue(REPO, 7, "bob").await.unwrap();
    assert_eq!(touched.len(), 1);
    s.bot_comment_where(7, "the cancelled run", |c| {
        c.body.contains("Cancelled by @bob")
    })
    .await;
    let stored = db.get_run(&run.0).await.unwrap().unwrap();
    assert_eq!(stored.status, RunStatus::Cancelled, "{stored:?}");
    assert_eq!(stored.attempts, 1, "{stored:?}");
    db.close().await;
    terminate(&mut other).await;
    common::assert_gone(&engine, &run.container_label()).await;
    s.reaction(&s.trigger(&run), "confused").await;
    s.finish().await;
}
