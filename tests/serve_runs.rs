//! What `kodx serve` gives a run and keeps of it: the program's limits reach the sandbox and
//! the agent as they do for `kodx run`, and the transcript stores each message once.

mod common;

use std::time::Duration;

use common::serve::{bot_comments, delivery_id, issue_comment, usage, Options, Served, REPO};
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
    let id = s.github.add_comment(REPO, 7, "alice", &text, false);
    let payload = issue_comment(&s.clone_url, 7, false, id, "alice", "User", &text);
    let (status, answer) = s.deliver("issue_comment", &delivery_id(), &payload).await;
    assert_eq!(status, 202, "{answer}");
    s.wait_for("the answer", LONG, || {
        bot_comments(s, 7)
            .iter()
            .any(|c| c.body.contains("end_turn"))
    })
    .await;
    answer["run_id"].as_str().unwrap().to_string()
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
    let Some(_engine) = common::engine().await else {
        return;
    };
    let s = Served::start(Options {
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
    assert!(result.contains("still running"), "{result}");
    assert!(!result.contains("finished-sleeping"), "{result}");
    assert!(started.elapsed() < Duration::from_secs(60));
    assert!(s.model.rejected().is_empty(), "{:?}", s.model.rejected());
    // The tool description the model read says the same.
    let tools = s.model.requests()[0].body["tools"].to_string();
    assert!(tools.contains("2000 ms"), "{tools}");
}
