//! What `kodx serve` gives a run and keeps of it: the program's limits reach the sandbox and
//! the agent as they do for `kodx run`, and the transcript stores each message once.

use std::time::Duration;

use crate::common;
use crate::common::serve::{usage, Options, Served, REPO};
use serde_json::{json, Value};

const LONG: Duration = Duration::from_secs(120);

fn feed(id: &str, chars: &str) -> Value {
    json!({"type": "tool_use", "id": id, "name": "feed_chars", "input": {"chars": chars}})
}

/// `/kodx ask` on issue 7; returns the run id once the answer is posted.
async fn ask(s: &Served, question: &str) -> String {
    s.github
        .add_issue(REPO, 7, "Widgets are slow", "They are slow.", "carol");
    let text = format!("/kodx ask {question}");
    let run = s.comment(7, "alice", &text).await;
    s.bot_comment_where(7, "the answer", |c| c.body.contains("end_turn"))
        .await;
    run.0
}

/// The text of the last tool result the model was sent in request `i`.
fn last_tool_result(s: &Served, i: usize) -> String {
    let body = &s.model.requests()[i].body;
    let last = body["messages"].as_array().unwrap().last().unwrap();
    last["content"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|b| b["type"] == "tool_result")
        .map(|b| b["content"].to_string())
        .unwrap_or_default()
}

/// The server's `command_timeout_secs` (the built-in programs set no
/// `limits.command_timeout`) bounds how long one `feed_chars` waits, as `kodx run` does.
#[tokio::test]
async fn the_command_timeout_reaches_the_agent_in_serve() {
    let _engine = common::require_engine!();
    let mut s = Served::start(Options {
        workers: true,
        settings: Some("status_interval_secs = 0.2\ncommand_timeout_secs = 2\n"),
        ..Options::default()
    })
    .await;
    s.model.reply(
        vec![feed("t1", "sleep 8; echo finished-sleeping")],
        "tool_use",
        usage(1000, 10),
    );
    s.model
        .answer_from_last_tool_result(|out| format!("Saw: {out}"));
    let started = std::time::Instant::now();
    ask(&s, "how long does it take?").await;
    let result = last_tool_result(&s, 1);
    common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(result, @r#""[still running after [duration]; the command was not stopped. Call feed_chars with empty chars to read more, or \"\\x03\" to interrupt it]""#));
    assert!(!result.contains("finished-sleeping"), "{result}");
    assert!(started.elapsed() < Duration::from_secs(60));
    assert!(s.model.rejected().is_empty(), "{:?}", s.model.rejected());
    // The tool description the model read says the same.
    let tools = s.model.requests()[0].body["tools"].to_string();
    assert!(tools.contains("2000 ms"), "{tools}");
    s.finish().await;
}

async fn open_db(s: &Served) -> kodx::db::Db {
    kodx::db::Db::open(&format!(
        "sqlite://{}",
        s.dir.path().join("kodx.db").display()
    ))
    .await
    .unwrap()
}

/// Six model calls with a few KB of output each. The stored transcript replays into exactly
/// the requests the model received, holds each message once (so it grows with the
/// conversation, not with its square), and is pruned by age at start while the run's row
/// stays.
#[tokio::test]
async fn transcripts_store_each_message_once_replay_exactly_and_are_pruned_by_age() {
    let _engine = common::require_engine!();
    let mut s = Served::start(Options {
        workers: true,
        settings: Some("status_interval_secs = 0.2\ntranscript_days = 30\n"),
        ..Options::default()
    })
    .await;
    for step in 1..=5 {
        s.model.reply(
            vec![
                json!({"type": "text", "text": format!("Step {step}: counting.")}),
                feed(&format!("t{step}"), &format!("seq {step} 1500")),
            ],
            "tool_use",
            usage(1000 * step, 20),
        );
    }
    s.model.reply(
        vec![json!({"type": "text", "text": "Counted to 1500 five times."})],
        "end_turn",
        usage(8000, 20),
    );
    let run_id = ask(&s, "count for me").await;
    let received = s.model.requests();
    assert_eq!(received.len(), 6);
    assert!(s.model.rejected().is_empty(), "{:?}", s.model.rejected());

    let rows = common::db::transcript(&s.dir.path().join("kodx.db"), &run_id).await;
    let rebuilt = kodx::transcript::requests(rows.iter().map(String::as_str)).unwrap();
    assert_eq!(rebuilt.len(), 6);
    for (i, (request, got)) in rebuilt.iter().zip(&received).enumerate() {
        assert_eq!(
            kodx::providers::anthropic::request_body(request),
            got.body,
            "request {} rebuilt from the transcript differs from what the model received",
            i + 1
        );
    }
    // Linear, not quadratic: everything stored is about the last request (the whole
    // conversation but its final answer) plus the final answer and the records' own keys.
    let stored: usize = rows.iter().map(String::len).sum();
    let conversation = received.last().unwrap().body.to_string().len();
    eprintln!("transcript: {stored} bytes stored for a final request of {conversation} bytes");
    assert!(
        stored < conversation * 3 / 2,
        "{stored} bytes stored for a conversation of {conversation} bytes"
    );

    // 40 days later the transcript goes at the next start; the run's row stays.
    let db_path = s.dir.path().join("kodx.db");
    let out = std::process::Command::new("sqlite3")
        .arg(&db_path)
        .arg(format!(
            "UPDATE runs SET finished_at = finished_at - 40 * 86400000 WHERE id = '{run_id}'"
        ))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(s.terminate().await.success());
    s.restart().await;
    s.wait_for("the pruning at start", LONG, || {
        s.log()
            .contains("transcript record(s) of runs finished over 30 days ago")
    })
    .await;
    let db_file = s.dir.path().join("kodx.db");
    assert!(common::db::transcript(&db_file, &run_id).await.is_empty());
    assert!(common::db::transcript_pruned_at(&db_file, &run_id)
        .await
        .is_some());
    let db = open_db(&s).await;
    let run = db.get_run(&run_id).await.unwrap().unwrap();
    assert_eq!(run.status, kodx::db::RunStatus::Succeeded);
    assert_eq!(run.api_calls, 6);
    assert!(run.cost_usd.unwrap() > 0.0);
    db.close().await;
    s.finish().await;
}

/// The status comment follows the run at most once per `status_interval_secs`, but a run
/// that ends never waits for the interval: with 10 s between edits, five quick model steps
/// end in a posted answer well before 10 s (it waited out the interval before: about 10 s
/// of every multi-step run were spent in no phase at all).
#[tokio::test]
async fn a_finished_run_never_waits_for_the_status_interval() {
    let _engine = common::require_engine!();
    let mut s = Served::start(Options {
        workers: true,
        settings: Some("status_interval_secs = 10\n"),
        ..Options::default()
    })
    .await;
    for i in 1..=4 {
        s.model.reply(
            vec![feed(&format!("t{i}"), &format!("echo step-{i}"))],
            "tool_use",
            usage(1000, 10),
        );
    }
    s.model
        .answer_from_last_tool_result(|out| format!("Saw: {out}"));
    let started = std::time::Instant::now();
    ask(&s, "what do the steps print?").await;
    let took = started.elapsed();
    assert_eq!(s.model.requests().len(), 5);
    assert!(
        took < Duration::from_secs(8),
        "five quick steps took {took:?} with a 10 s status interval"
    );
    s.finish().await;
}
