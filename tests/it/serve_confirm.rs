//! Confirmation before paying (SPEC §12, "Quote and confirmation"): the real `kodx serve`,
//! its database (SQLite, and PostgreSQL with two processes), a fake GitHub, a scripted fake
//! Anthropic and the real Docker engine. A run whose estimate (or, without history, its cap)
//! is above the repository's `confirm_above_usd` waits, held in the queue: no container, no
//! model call, until a writer's `/kodx go` (`$N`: a lower cap); it survives restarts and
//! ends by itself after `confirm_wait_secs`.

use std::time::Duration;

use crate::common;
use crate::common::serve::{redactions, usage, Options, Served, REPO};
use kodx::db::{EndReason, RunStatus};
use serde_json::json;

const AWAITING: &str = "### ⏸️ awaiting confirmation";

/// The settings of these tests: quick status edits, and `confirm_wait_secs` as given.
fn settings(wait_secs: u64) -> &'static str {
    Box::leak(
        format!("status_interval_secs = 0.2\nshutdown_grace_secs = 5\nconfirm_wait_secs = {wait_secs}\n")
            .into_boxed_str(),
    )
}

async fn served(wait_secs: u64) -> Served {
    Served::start(Options {
        workers: true,
        settings: Some(settings(wait_secs)),
        ..Options::default()
    })
    .await
}

/// Waits until the run's row is held (`held_until` set), and a worker pass later still no
/// model request was made.
async fn held(s: &Served, run: &str) -> kodx::db::Run {
    let db = s.db().await;
    let deadline = tokio::time::Instant::now() + common::serve::WAIT;
    loop {
        let row = db.get_run(run).await.unwrap().unwrap();
        if row.is_held() {
            // Two passes of the worker's loop (one second each): still nothing claimed.
            tokio::time::sleep(Duration::from_millis(2_200)).await;
            let row = db.get_run(run).await.unwrap().unwrap();
            assert!(row.is_held(), "{row:?}");
            assert_eq!(row.attempts, 0, "never claimed: {row:?}");
            db.close().await;
            return row;
        }
        assert!(tokio::time::Instant::now() < deadline, "{}", s.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `confirm_above_usd: threshold` on `main`, then `/kodx ask what is this?` on issue #7 by
/// alice, up to its status comment saying it waits; the run.
async fn ask_held(s: &Served, threshold: &str) -> common::serve::RunId {
    s.github.set_file(
        REPO,
        ".github/kodx.yml",
        &format!("confirm_above_usd: {threshold}\n"),
    );
    s.github.add_issue(REPO, 7, "Question", "", "carol");
    let run = s.comment(7, "alice", "/kodx ask what is this?").await;
    s.bot_comment_where(7, "the run held", |c| c.body.contains(AWAITING))
        .await;
    run
}

#[tokio::test]
async fn a_run_above_the_threshold_waits_for_a_writers_go_with_a_lower_cap() {
    let _engine = common::require_engine!();
    let mut s = served(86_400).await;
    s.github.set_file(
        REPO,
        ".github/kodx.yml",
        "cost_limit: { code: 1.00 }\nconfirm_above_usd: 0.25\n",
    );
    s.github
        .add_issue(REPO, 7, "Add a greeting", "We need hello.txt.", "carol");
    s.github.add_user("bob", 1006);
    s.github.set_permission(REPO, "bob", "read");
    let run = s.comment(7, "alice", "/kodx code add hello.txt").await;
    let waiting = s
        .bot_comment_where(7, "the run held", |c| c.body.contains(AWAITING))
        .await;
    redactions(&[&run], &[(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", "[time]")]).bind(|| {
        insta::assert_snapshot!(waiting.body, @r#"
        <!-- kodx:{"run":"[run]","v":1} -->
        ### ⏸️ awaiting confirmation

        > /kodx code add hello.txt

        estimate: no history yet · cap $1.00

        This run waits for a go-ahead: with too few runs here to estimate from, its cap of $1.00 is above this repository's `confirm_above_usd` ($0.2500). Nothing has started and nothing is spent.

        A writer can start it with `/kodx go`, or with a lower cap with `/kodx go $N`; `/kodx cancel` drops it. If nobody does, it ends by itself at [time] UTC (24 hours after it was asked).

        <sub>kodx run <code>[run]</code></sub>
        "#)
    });
    s.reaction(&s.trigger(&run), "eyes").await;
    let row = held(&s, &run).await;
    assert_eq!(row.phase.as_deref(), Some("awaiting confirmation"));
    assert!(s.model.requests().is_empty(), "no model call before the go");

    // A reader's go is refused, and the run still waits.
    s.comment(7, "bob", "/kodx go").await;
    let refused = s
        .bot_comment_where(7, "bob's go refused", |c| c.body.starts_with("@bob"))
        .await;
    insta::assert_snapshot!(refused.body, @"@bob `/kodx go` can only be run by people with write, maintain or admin access to this repository; your permission here is `read`.");
    held(&s, &run).await;
    assert!(s.model.requests().is_empty());

    // The writer's go, with a lower cap: the run starts under it.
    s.model.reply(
        vec![json!({"type": "tool_use", "id": "t1", "name": "feed_chars", "input": {"chars": "echo hello > hello.txt\n"}})],
        "tool_use",
        usage(1000, 20),
    );
    s.model.reply(
        vec![json!({"type": "text", "text": "Added hello.txt."})],
        "end_turn",
        usage(1200, 10),
    );
    let go = s.comment(7, "alice", "/kodx go $0.40").await;
    s.reaction(&s.trigger(&go), "+1").await;
    let done = s.finished_status(7).await;
    assert!(done.contains("of $0.4000"), "the cap asked for: {done}");
    let db = s.db().await;
    let row = db.get_run(&run).await.unwrap().unwrap();
    assert_eq!(row.status, RunStatus::Succeeded, "{row:?}");
    assert_eq!(row.confirmed_by.as_deref(), Some("alice"));
    assert_eq!(row.confirmed_cap_usd, Some(0.4));
    let result: serde_json::Value = serde_json::from_str(row.result.as_deref().unwrap()).unwrap();
    assert_eq!(result["admission"]["cost_limit"], json!(0.4), "{result}");
    db.close().await;
    // Every model request came after the go, under the lower cap.
    assert_eq!(s.model.requests().len(), 2);
    s.finish().await;
}

#[tokio::test]
async fn a_waiting_run_survives_a_restart_and_starts_on_go() {
    let _engine = common::require_engine!();
    let mut s = served(3_600).await;
    let run = ask_held(&s, "0").await;
    held(&s, &run).await;
    s.terminate().await;
    s.restart().await;
    // Still held after the restart: the new process neither runs nor ends it.
    let row = held(&s, &run).await;
    assert!(row.held_until.unwrap() > kodx::db::now_ms() + 3_000_000);
    assert!(s.model.requests().is_empty());
    s.model.reply(
        vec![json!({"type": "text", "text": "It makes widgets."})],
        "end_turn",
        usage(1000, 10),
    );
    let go = s.comment(7, "alice", "/kodx go").await;
    s.reaction(&s.trigger(&go), "+1").await;
    let done = s.finished_status(7).await;
    assert!(done.contains("It makes widgets."), "{done}");
    s.finish().await;
}

#[tokio::test]
async fn a_waiting_run_ends_by_itself_and_a_late_go_finds_nothing() {
    let _engine = common::require_engine!();
    let mut s = served(2).await;
    let run = ask_held(&s, "0.5").await;
    let ended = s
        .bot_comment_where(7, "the run ended unconfirmed", |c| {
            c.body.contains("Nobody started it")
        })
        .await;
    redactions(&[&run], &[]).bind(|| {
        insta::assert_snapshot!(ended.body, @r#"
        <!-- kodx:{"run":"[run]","v":1} -->
        ### ❌ cancelled

        > /kodx ask what is this?

        ```text
        Nobody started it with `/kodx go` within 2 seconds, so it ended without starting; nothing was spent. Run the command again to ask anew.
        ```

        Nothing was spent: no model was called.

        <sub>kodx run <code>[run]</code></sub>
        "#)
    });
    let db = s.db().await;
    let row = db.get_run(&run).await.unwrap().unwrap();
    assert_eq!(row.status, RunStatus::Cancelled);
    assert_eq!(row.stop_reason, Some(EndReason::Unconfirmed));
    db.close().await;
    s.comment(7, "alice", "/kodx go").await;
    let answer = s
        .bot_comment_where(7, "the late go answered", |c| c.body.starts_with("@alice"))
        .await;
    insta::assert_snapshot!(answer.body, @"@alice there is no kodx run waiting for `/kodx go` here.");
    assert!(s.model.requests().is_empty(), "nothing ran");
    s.finish().await;
}

#[tokio::test]
async fn cancel_drops_a_waiting_run() {
    let _engine = common::require_engine!();
    let mut s = served(3_600).await;
    let run = ask_held(&s, "0.5").await;
    let cancel = s.comment(7, "alice", "/kodx cancel").await;
    s.reaction(&s.trigger(&cancel), "+1").await;
    s.bot_comment_where(7, "the run cancelled", |c| {
        c.body.contains("Cancelled by @alice before it started.")
    })
    .await;
    let db = s.db().await;
    assert_eq!(
        db.get_run(&run).await.unwrap().unwrap().status,
        RunStatus::Cancelled
    );
    db.close().await;
    assert!(s.model.requests().is_empty());
    s.finish().await;
}

/// Two processes on one PostgreSQL database: the run is held by the process that took the
/// command; the `/kodx go` is delivered to the other one, which starts it.
#[tokio::test]
async fn a_go_taken_by_another_process_starts_the_run_on_postgres() {
    let _engine = common::require_engine!();
    let Some(admin) = kodx::db::test_databases::postgres_admin_url() else {
        eprintln!("SKIPPED a_go_taken_by_another_process_starts_the_run_on_postgres: KODX_SKIP_POSTGRES=1");
        return;
    };
    let url = kodx::db::test_databases::fresh_postgres_database(&admin).await;
    let mut s = Served::start(Options {
        workers: true,
        settings: Some(settings(3_600)),
        database_url: Some(url),
        ..Options::default()
    })
    .await;
    let run = ask_held(&s, "0.5").await;
    held(&s, &run).await;
    let (mut other, other_url) = s.spawn_another(&["--role", "all"]).await;
    s.model.reply(
        vec![json!({"type": "text", "text": "It makes widgets."})],
        "end_turn",
        usage(1000, 10),
    );
    let id = s.github.add_comment(REPO, 7, "alice", "/kodx go", false);
    let payload = common::serve::issue_comment(&common::serve::IssueComment {
        clone_url: &s.clone_url,
        number: 7,
        comment_id: id,
        author: "alice",
        body: "/kodx go",
        ..Default::default()
    });
    let (status, answer) = s
        .deliver_to(
            &other_url,
            "issue_comment",
            &common::serve::delivery_id(),
            &payload,
        )
        .await;
    assert_eq!(status, 202, "{answer}");
    let done = s.finished_status(7).await;
    assert!(done.contains("It makes widgets."), "{done}");
    common::serve::terminate(&mut other, Duration::from_secs(30)).await;
    s.finish().await;
}
